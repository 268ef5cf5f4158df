package lock_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// mysqlPool opens a pool of its own on dsn, closed when the test ends.
func mysqlPool(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// newMySQL returns a MySQL lock on a pool of its own on dsn: each is
// another process as far as the lock knows.
func newMySQL(t *testing.T, dsn string, opt lock.MySQLOptions) *lock.MySQL {
	t.Helper()
	l := lock.NewMySQL(mysqlPool(t, dsn), opt)
	t.Cleanup(func() { l.Close() })
	return l
}

// mysqlHolder is l.Holder, failing the test on an error.
func mysqlHolder(t *testing.T, l *lock.MySQL, key string) (owner string, fence int64, until time.Time) {
	t.Helper()
	owner, fence, until, err := l.Holder(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return owner, fence, until
}

// mysqlFamily is the MySQL lock table, on a database of its own, as the
// conformance suite runs it. Each process has a pool of its own.
func mysqlFamily() family {
	return family{name: "mysql table", claims: everything, ttl: 2 * time.Second,
		servers: func(t *testing.T) func(*testing.T, settings) world {
			dsn := mysqlDB(t).DSN
			admin := mysqlPool(t, dsn)
			return func(t *testing.T, opt settings) world {
				return func() *handle {
					db := mysqlPool(t, dsn)
					l := lock.NewMySQL(db, lock.MySQLOptions{TTL: opt.TTL, Wait: opt.Wait, MaxBackoff: 20 * time.Millisecond})
					return &handle{locker: l, crash: crashing(t, l, db.Close),
						// The lease ran out on the server while its holder
						// was paused.
						lose: func(t *testing.T, lease *lock.Lease) {
							if _, err := admin.Exec("UPDATE shop_locks SET expires_at = UTC_TIMESTAMP(6) WHERE name = ?", lease.Key()); err != nil {
								t.Fatal(err)
							}
						},
						holds: func(lease *lock.Lease) error {
							owner, fence, until, err := l.Holder(context.Background(), lease.Key())
							if err != nil {
								return err
							}
							if owner == "" || fence != lease.Fence() {
								return errHolds(lease, "owner %q, fence %d, until %v", owner, fence, until)
							}
							return nil
						},
					}
				}
			}
		}}
}

// mysqlHeldBy fails the test unless key is held on the server by the
// holding whose token is fence.
func mysqlHeldBy(t *testing.T, l *lock.MySQL, key string, fence int64) {
	t.Helper()
	owner, got, until := mysqlHolder(t, l, key)
	if owner == "" || got != fence {
		t.Fatalf("%q on the server: owner %q, fence %d, until %v; want held with fence %d", key, owner, got, until, fence)
	}
}

// mysqlNow is the server's clock.
func mysqlNow(t *testing.T, db *sql.DB) time.Time {
	t.Helper()
	var us int64
	if err := db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))").Scan(&us); err != nil {
		t.Fatal(err)
	}
	return time.UnixMicro(us)
}

// withSession returns dsn with session settings that a caller's DSN may
// bring: MariaDB's SIMULTANEOUS_ASSIGNMENT (the UPDATE part of an INSERT …
// ON DUPLICATE KEY UPDATE sees the old row in every assignment), affected
// rows counted as found rows, and a session time zone far from UTC.
func withSession(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["sql_mode"] = "'STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT'"
	cfg.Params["time_zone"] = "'+05:00'"
	return cfg.FormatDSN()
}

// The take, renewal and release statements on the real server, on every
// path (a new row, a held one, a free one, an expired one), whichever order
// the server assigns the columns of the UPDATE in, whether it reports found
// or changed rows, and whatever the session's time zone: holders of other
// settings agree on who holds the key.
func TestMySQLStatementsInEverySession(t *testing.T) {
	t.Parallel()
	base := mysqlDB(t).DSN
	for _, tc := range []struct{ name, dsn string }{
		{"default", base},
		{"simultaneous assignment, found rows, +05:00", withSession(t, base)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if tc.dsn != base {
				var mode, zone string
				if err := mysqlPool(t, tc.dsn).QueryRow("SELECT @@sql_mode, @@time_zone").Scan(&mode, &zone); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(mode, "SIMULTANEOUS_ASSIGNMENT") || zone != "+05:00" {
					t.Fatalf("session sql_mode %q, time_zone %q: the settings did not take", mode, zone)
				}
			}
			key := "k:" + testenv.Name()
			l := newMySQL(t, tc.dsn, lock.MySQLOptions{TTL: 2 * time.Second})
			// Every take is by a holder of the session under test; one of the
			// default session checks that they agree on who holds the key.
			other := newMySQL(t, tc.dsn, lock.MySQLOptions{TTL: 2 * time.Second})
			db := mysqlPool(t, base)
			before := mysqlNow(t, db)

			// A new row: taken, with a token from the clock.
			a, err := l.TryObtain(ctx, key)
			if err != nil {
				t.Fatalf("TryObtain of a new key: %v", err)
			}
			owner, fence, until := mysqlHolder(t, l, key)
			if owner == "" || fence != a.Fence() {
				t.Fatalf("after the insert: owner %q, fence %d; want held with fence %d", owner, fence, a.Fence())
			}
			if a.Fence() < before.UnixMicro() {
				t.Errorf("first token %d is below the server's clock %d µs", a.Fence(), before.UnixMicro())
			}
			if now := mysqlNow(t, db); !until.After(now) || until.After(now.Add(2*time.Second)) {
				t.Errorf("lease until %v, want in (%v, +2s]", until, now)
			}

			// A held row: left as it is, for a holder of either session.
			for _, l2 := range []*lock.MySQL{other, newMySQL(t, base, lock.MySQLOptions{})} {
				if _, err := l2.TryObtain(ctx, key); !errors.Is(err, lock.ErrNotObtained) {
					t.Fatalf("TryObtain of a held key = %v, want ErrNotObtained", err)
				}
			}
			if o, f, u := mysqlHolder(t, l, key); o != owner || f != fence || !u.Equal(until) {
				t.Fatalf("a refused take changed the row: %q %d %v, was %q %d %v", o, f, u, owner, fence, until)
			}

			// Release frees the row and keeps its counter.
			if err := a.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if o, f, _ := mysqlHolder(t, l, key); o != "" || f != a.Fence() {
				t.Fatalf("after release: owner %q, fence %d; want free with fence %d", o, f, a.Fence())
			}

			// A free row: taken with a larger token.
			b, err := other.TryObtain(ctx, key)
			if err != nil {
				t.Fatalf("TryObtain of a free key: %v", err)
			}
			if b.Fence() <= a.Fence() {
				t.Errorf("token %d after %d", b.Fence(), a.Fence())
			}
			mysqlHeldBy(t, l, key, b.Fence())
			// The lease is b's own, not what was left of a's (released
			// before it ran out).
			if _, _, u := mysqlHolder(t, l, key); !u.After(until) {
				t.Errorf("the free row taken runs out at %v, no later than the released lease's %v", u, until)
			}
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}

			// An expired row: taken by another; the expired holder's
			// release neither succeeds nor frees the new holder.
			paused := newMySQL(t, tc.dsn, lock.MySQLOptions{TTL: 200 * time.Millisecond, After: frozen})
			c := obtain(t, paused, key)
			waitFor(t, "the paused lease runs out on the server", func() bool {
				o, _, _ := mysqlHolder(t, l, key)
				return o == ""
			})
			d, err := other.TryObtain(ctx, key)
			if err != nil {
				t.Fatalf("TryObtain of an expired key: %v", err)
			}
			if d.Fence() <= c.Fence() || c.Fence() <= b.Fence() {
				t.Errorf("tokens %d, %d, %d: not increasing", b.Fence(), c.Fence(), d.Fence())
			}
			if err := c.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
				t.Errorf("release of the expired lease = %v, want ErrNotHeld", err)
			}
			mysqlHeldBy(t, l, key, d.Fence())
			if err := d.Release(ctx); err != nil {
				t.Fatal(err)
			}

			// Renewal: a lease held for its length stays held, renewed
			// every third of it (each renewal has two thirds, a second, to
			// answer: room on a loaded machine).
			const ttl = 1500 * time.Millisecond
			short := newMySQL(t, tc.dsn, lock.MySQLOptions{TTL: ttl})
			e := obtain(t, short, key)
			first := e.Until()
			time.Sleep(ttl)
			if err := e.Context().Err(); err != nil {
				t.Fatalf("renewed lease lost: %v", context.Cause(e.Context()))
			}
			mysqlHeldBy(t, l, key, e.Fence())
			if !e.Until().After(first.Add(ttl / 3)) {
				t.Errorf("Until %v after %v, was %v: not renewed", e.Until(), ttl, first)
			}
			if err := e.Release(ctx); err != nil {
				t.Fatalf("release of a renewed lease: %v", err)
			}

			// A lease that ran out, with nobody taking the key over, is not
			// released as if it had been held.
			f := obtain(t, paused, key)
			waitFor(t, "the paused lease runs out on the server", func() bool {
				o, _, _ := mysqlHolder(t, l, key)
				return o == ""
			})
			if err := f.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
				t.Errorf("release of a lease that ran out = %v, want ErrNotHeld", err)
			}
		})
	}
}

func TestMySQLObtainRelease(t *testing.T) {
	t.Parallel()
	dsn := mysqlDB(t).DSN
	key := "sku:" + testenv.Name()
	l := newMySQL(t, dsn, lock.MySQLOptions{})
	ctx := context.Background()
	a := obtain(t, l, key)
	mysqlHeldBy(t, l, key, a.Fence())
	if s := l.Stats(); s.Attempts != 1 || s.Waiting != 0 {
		t.Errorf("Stats after an uncontended obtain = %+v, want one attempt, nobody waiting", s)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Context().Err(); err == nil {
		t.Error("a released lease's Context is not done")
	}
	if o, f, _ := mysqlHolder(t, l, key); o != "" || f != a.Fence() {
		t.Fatalf("after release: owner %q, fence %d", o, f)
	}
	b := obtain(t, l, key)
	if b.Fence() <= a.Fence() {
		t.Errorf("second token %d, first %d", b.Fence(), a.Fence())
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Errorf("second Release = %v, want the first's result", err)
	}
	long := strings.Repeat("x", 256)
	if _, err := l.Obtain(ctx, long); err == nil || errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("Obtain of a 256-byte key = %v, want an error of its own", err)
	}
}

// The waiters of one process wait in line, and only the first of them
// tries at the server. Here three of them wait for a key held by another
// process: the first tries once, then sleeps for good; the two behind it
// never reach the server. Their waits end together (one deadline): a
// waiter whose own wait ended a moment after the first's would rightly be
// handed its turn and try once.
func TestMySQLWaitersInLine(t *testing.T) {
	t.Parallel()
	dsn := mysqlDB(t).DSN
	key := "k:" + testenv.Name()
	ctx := context.Background()
	holder := newMySQL(t, dsn, lock.MySQLOptions{})
	held := obtain(t, holder, key)

	line := newMySQL(t, dsn, lock.MySQLOptions{Wait: 10 * time.Second, MinBackoff: never, MaxBackoff: never})
	together, cancelTogether := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelTogether()
	got := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := line.Obtain(together, key)
			got <- err
		}()
	}
	waitFor(t, "two waiters are in line behind the first", func() bool { return line.Stats().Waiting == 2 })
	for range 3 {
		if err := <-got; !errors.Is(err, lock.ErrNotObtained) {
			t.Errorf("waiter = %v, want ErrNotObtained", err)
		}
	}
	if n := line.Stats().Attempts; n != 1 {
		t.Errorf("%d attempts at the server, want 1: only the first in line polls", n)
	}
	mysqlHeldBy(t, holder, key, held.Fence())
}

// A lease whose row changed hands behind its back (here by hand) is told
// by its watchdog: its Context ends with ErrNotHeld, its renewals do not
// extend the new holder's row, and its release does not free it.
func TestMySQLLostLeaseCancelsContext(t *testing.T) {
	t.Parallel()
	dsn := mysqlDB(t).DSN
	key := "k:" + testenv.Name()
	db := mysqlPool(t, dsn)
	ctx := context.Background()
	l := newMySQL(t, dsn, lock.MySQLOptions{TTL: 300 * time.Millisecond})
	lease := obtain(t, l, key)
	if _, err := db.Exec("UPDATE shop_locks SET owner = 'intruder', expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE name = ?", key); err != nil {
		t.Fatal(err)
	}
	_, _, until := mysqlHolder(t, l, key)
	select {
	case <-lease.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease Context not cancelled after the row changed hands")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, lock.ErrNotHeld) {
		t.Errorf("cause = %v, want ErrNotHeld", cause)
	}
	if err := lease.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Release = %v, want ErrNotHeld", err)
	}
	if o, _, u := mysqlHolder(t, l, key); o != "intruder" || !u.Equal(until) {
		t.Errorf("the other holder's row: owner %q until %v, was intruder until %v", o, u, until)
	}
}

// An attempt that ran, and whose reply was lost, gives the key back at
// once rather than leaving it held for a TTL by a token nobody has:
// TryObtain fails, and Obtain takes the key again within its wait. A
// release whose reply was lost is a release.
func TestMySQLReplyLost(t *testing.T) {
	t.Parallel()
	dsn := mysqlDB(t).DSN
	key := "k:" + testenv.Name()
	ctx := context.Background()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProxy(t, cfg.Addr)
	cfg.Addr = p.Addr
	cfg.InterpolateParams = true // the statements go as text, for the proxy to spot
	l := newMySQL(t, cfg.FormatDSN(), lock.MySQLOptions{TTL: time.Minute, Wait: 2 * time.Second})
	take := []byte("INSERT INTO `shop_locks`")

	cut := p.CutReply(take)
	if lease, err := l.TryObtain(ctx, key); err == nil {
		lease.Release(ctx)
		t.Fatal("obtained although the reply was lost")
	}
	cutDone(t, cut)
	owner, fence, _ := mysqlHolder(t, l, key)
	if fence == 0 {
		t.Fatal("the cut take never ran: the test proves nothing")
	}
	if owner != "" {
		t.Fatal("the failed take left the key held by a token nobody has")
	}

	attempts := l.Stats().Attempts
	cut = p.CutReply(take)
	lease, err := l.Obtain(ctx, key)
	cutDone(t, cut)
	if err != nil {
		t.Fatalf("Obtain with its first reply lost = %v, want the key taken again within the wait", err)
	}
	if n := l.Stats().Attempts - attempts; n != 2 {
		t.Errorf("Obtain made %d attempts, want 2: the lost one and the next", n)
	}
	mysqlHeldBy(t, l, key, lease.Fence())

	cut = p.CutReply([]byte("UPDATE `shop_locks` SET owner"))
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release with its reply lost = %v, want released", err)
	}
	cutDone(t, cut)
	if o, _, _ := mysqlHolder(t, l, key); o != "" {
		t.Fatal("the key is still held after Release")
	}
}

// A holder paused past its lease (its watchdog frozen, as in a
// stop-the-world pause) has its key taken over; when it resumes, MySQL
// refuses its fenced write, and the row keeps the new holder's.
func TestMySQLPausedHolderWriteRefused(t *testing.T) {
	t.Parallel()
	dsn := mysqlDB(t).DSN
	ctx := context.Background()
	row := newFencedRow(t)
	key := "k:" + testenv.Name()

	paused := newMySQL(t, dsn, lock.MySQLOptions{TTL: 500 * time.Millisecond, After: frozen})
	a := obtain(t, paused, key)
	if n := row.write("A before the pause", a.Fence()); n != 1 {
		t.Fatalf("A's fenced write while it holds the key: %d rows", n)
	}
	_, _, until := mysqlHolder(t, paused, key)

	other := newMySQL(t, dsn, lock.MySQLOptions{Wait: 5 * time.Second, MaxBackoff: 20 * time.Millisecond})
	b := obtain(t, other, key)
	if time.Now().Before(until) {
		t.Errorf("B obtained before A's lease ran out at %v", until)
	}
	if b.Fence() <= a.Fence() {
		t.Fatalf("B's token %d, A's %d", b.Fence(), a.Fence())
	}
	if n := row.write("B", b.Fence()); n != 1 {
		t.Fatalf("B's fenced write: %d rows, want 1", n)
	}

	// A resumes, unaware: its watchdog never ran.
	if err := a.Context().Err(); err != nil {
		t.Fatalf("the paused holder's Context ended (%v): the pause was not one", err)
	}
	if n := row.write("A after the pause", a.Fence()); n != 0 {
		t.Errorf("A's stale fenced write changed %d rows, want 0", n)
	}
	row.holds("B", b.Fence())
	if err := a.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("A's release = %v, want ErrNotHeld", err)
	}
	mysqlHeldBy(t, other, key, b.Fence())
}

// dialCounter counts the connections a pool failed to open.
type dialCounter struct{ failed atomic.Int32 }

func (d *dialCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		d.failed.Add(1)
	}
	return c, err
}

// Restarts of a private MariaDB, which keeps its data: a clean one in the
// middle of a holding, and a crash.
func TestMySQLRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartMariaDB(t)

	// The holder's lease outlasts the restart: its renewals fail while the
	// server is down, then succeed; nobody else obtains the key meanwhile;
	// and the token after its release is larger.
	t.Run("MidHold", func(t *testing.T) {
		const ttl = 9 * time.Second // renewals every 3s
		dsn := srv.Database(t)
		ctx := context.Background()
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		var dials dialCounter
		cfg.DialFunc = dials.dial
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		t.Cleanup(func() { db.Close() })
		holder := lock.NewMySQL(db, lock.MySQLOptions{TTL: ttl})
		a := obtain(t, holder, "k")

		other := newMySQL(t, dsn, lock.MySQLOptions{})
		var (
			stop     = make(chan struct{})
			tried    sync.WaitGroup
			obtained atomic.Int32
			tries    atomic.Int32
		)
		tried.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				tries.Add(1)
				if l, err := other.TryObtain(ctx, "k"); err == nil {
					obtained.Add(1)
					l.Release(ctx)
				}
			}
		})

		before := a.Until()
		srv.Stop()
		waitFor(t, "a renewal fails", func() bool { return dials.failed.Load() > 0 })
		srv.Restart()
		waitFor(t, "a renewal succeeds", func() bool { return a.Until().After(before.Add(time.Second)) })
		if err := a.Context().Err(); err != nil {
			t.Fatalf("the lease did not survive the restart: %v", context.Cause(a.Context()))
		}
		mysqlHeldBy(t, other, "k", a.Fence())
		close(stop)
		tried.Wait()
		if n := obtained.Load(); n != 0 || tries.Load() == 0 {
			t.Fatalf("another process obtained the key %d times in %d tries while it was held", n, tries.Load())
		}
		if err := a.Release(ctx); err != nil {
			t.Fatalf("release after the restart: %v", err)
		}
		b := obtain(t, other, "k")
		if b.Fence() <= a.Fence() {
			t.Errorf("token %d after the restart, %d before", b.Fence(), a.Fence())
		}
		t.Logf("%d dials failed during the restart", dials.failed.Load())
	})

	// Tokens after a crash and restart are larger than every token before
	// it, and the rows kept their counters: the tokens do not rest on the
	// clock alone. A key held at the crash is held until its lease runs
	// out.
	t.Run("TokensAfterCrash", func(t *testing.T) {
		dsn := srv.Database(t)
		ctx := context.Background()
		l := newMySQL(t, dsn, lock.MySQLOptions{Wait: 10 * time.Second, MaxBackoff: 20 * time.Millisecond})
		keys := []string{"a", "b", "c"}
		last := map[string]int64{}
		for range 3 {
			for _, k := range keys {
				lease := obtain(t, l, k)
				if lease.Fence() <= last[k] {
					t.Fatalf("%q: token %d after %d", k, lease.Fence(), last[k])
				}
				last[k] = lease.Fence()
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		// Long enough to outlast the crash and restart on a busy machine.
		paused := newMySQL(t, dsn, lock.MySQLOptions{TTL: 4 * time.Second, After: frozen})
		held := obtain(t, paused, "held")
		last["held"] = held.Fence()

		crashed := time.Now()
		srv.Kill()
		srv.Restart()
		t.Logf("crashed and restarted in %v", time.Since(crashed))

		for _, k := range keys {
			if _, f, _ := mysqlHolder(t, l, k); f != last[k] {
				t.Errorf("%q: counter %d after the crash, %d before", k, f, last[k])
			}
		}
		mysqlHeldBy(t, l, "held", held.Fence())
		for _, k := range append(keys, "held") {
			lease := obtain(t, l, k)
			if lease.Fence() <= last[k] {
				t.Errorf("%q: token %d after the crash, %d before", k, lease.Fence(), last[k])
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}
