package lock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// locker is what every lock family that the order path can be configured
// with offers (SHOP_LOCK_MODE): the order path uses these four methods and
// no other.
type locker interface {
	Obtain(ctx context.Context, key string) (*lock.Lease, error)
	ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*lock.Lease, error)
	RaiseFence(ctx context.Context, key string, atLeast int64) error
	Stats() lock.Stats
}

var (
	_ locker = (*lock.Redis)(nil)
	_ locker = (*lock.Redlock)(nil)
	_ locker = (*lock.MySQL)(nil)
	_ locker = (*lock.Etcd)(nil)
	_ locker = (*lock.ZooKeeper)(nil)
	_ locker = (*lock.Local)(nil)
	_ locker = lock.None{}
)

// property is what a lock family may claim, and the conformance suite
// checks for each family that claims it.
type property int

const (
	// exclusion: never two holders of a key at once, across processes.
	exclusion property = iota
	// risingTokens: fencing tokens strictly increase in the order the key
	// was held.
	risingTokens
	// boundedWaits: Obtain gives up after its wait, or when its context
	// ends, with ErrNotObtained and the context's cause, and leaves the
	// holder and the next caller alone.
	boundedWaits
	// renewal: a live holder keeps the key for many lease lengths, and a
	// released key stays free.
	renewal
	// crashExpiry: the key of a holder whose process dies passes on once
	// its lease has run out, not before, with a larger token.
	crashExpiry
	// releaseAfterLoss: a lease that the servers took from a live holder
	// ends its Context with ErrNotHeld, its Release returns ErrNotHeld and
	// frees nobody else's key, and the process goes on.
	releaseAfterLoss
	// stillEndsWait: ObtainWhile's check, once it fails, ends the wait
	// with its error, without the key.
	stillEndsWait
)

var propertyNames = map[property]string{
	exclusion:        "exclusion",
	risingTokens:     "rising tokens",
	boundedWaits:     "bounded waits",
	renewal:          "renewal",
	crashExpiry:      "expiry of a crashed holder",
	releaseAfterLoss: "release after loss",
	stillEndsWait:    "ObtainWhile",
}

func (p property) String() string { return propertyNames[p] }

// everything is what a lock with leases and fencing tokens claims.
var everything = []property{exclusion, risingTokens, boundedWaits, renewal, crashExpiry, releaseAfterLoss, stillEndsWait}

// settings are a world's lease length and wait; zero takes the lock's
// defaults (and a wait of 2 s for Local, which has none).
type settings struct {
	TTL, Wait time.Duration
	// onlyWoken has the waiters of a lock that wakes them on release try
	// again only when woken, never when a backoff ends.
	onlyWoken bool
}

// handle is one process's lock of a family, as the suite drives it.
type handle struct {
	locker
	// crash ends the process as a crash does: its connections close, and
	// it neither renews nor releases anything from then on. Nil for a
	// family with no lease to run out.
	crash func()
	// lose has the servers take lease, held by this process, from it while
	// the process lives: its lease runs out there, or its session ends.
	// Once the lease's Context has ended the process works as before. Nil
	// for a family with no lease to lose.
	lose func(t *testing.T, lease *lock.Lease)
	// holds, when not nil, returns an error unless the servers say that
	// lease holds its key now.
	holds func(lease *lock.Lease) error
	// queued, when not nil, reports whether a caller of this process that
	// found key held by another is now waiting where the release will
	// reach it; by default, whether Stats counts a caller waiting.
	queued func(t *testing.T, key string) bool
}

// waitsFor reports whether a caller of h waits for key (see queued).
func (h *handle) waitsFor(t *testing.T, key string) bool {
	if h.queued != nil {
		return h.queued(t, key)
	}
	return h.Stats().Waiting > 0
}

// world makes the handles of one test: every handle it makes contends with
// the others for the same keys. For a family with servers each is a
// process of its own (its own clients, its own session); Local's are one
// lock, in one process.
type world func() *handle

// family is a lock family as the conformance suite runs it.
type family struct {
	name   string
	claims []property
	// woken is set when the family's waiters do not poll: a release (or
	// the key handed over in process) moves them, and ObtainWhile's check
	// runs then and only then.
	woken bool
	// ttl is the lease length for the properties that wait for a lease to
	// run out or to be renewed: short, but with room for renewals to
	// answer on a loaded machine.
	ttl time.Duration
	// servers finds or starts what the family runs on, for the family's
	// tests, and returns how to open a world of its lock there.
	servers func(t *testing.T) func(t *testing.T, opt settings) world
}

func (f family) claim(p property) bool {
	for _, c := range f.claims {
		if c == p {
			return true
		}
	}
	return false
}

// TestConformance runs the conformance suite for every lock family the
// order path can be configured with: each runs the checks of the
// properties it claims, and skips the others. ZooKeeper's runs in
// TestZooKeeper, on the ensemble that its failover and restart stop once
// the suite is done with it.
func TestConformance(t *testing.T) {
	t.Parallel()
	var families []family
	for _, topo := range testenv.Topologies(t) {
		families = append(families, redisFamily(topo, true), redisFamily(topo, false))
	}
	families = append(families, redlockFamily(), mysqlFamily(), etcdFamily(), localFamily(), noneFamily())
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			conformance(t, f)
		})
	}
}

// conformance is the suite: a subtest for each property, run for f if f
// claims it and skipped if not, and one that every family runs. Every
// process it opens is warmed up first.
func conformance(t *testing.T, f family) {
	servers := f.servers(t)
	open := func(t *testing.T, opt settings) world {
		newProcess := servers(t, opt)
		return func() *handle {
			h := newProcess()
			if err := warm(h); err != nil {
				t.Fatalf("a new process of %s: %v", f.name, err)
			}
			return h
		}
	}
	t.Run("lease", func(t *testing.T) {
		t.Parallel()
		testLease(t, f, open)
	})
	for _, p := range everything {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			if !f.claim(p) {
				t.Skipf("%s does not claim it", f.name)
			}
			checks[p](t, f, open)
		})
	}
}

var checks = map[property]func(t *testing.T, f family, open func(*testing.T, settings) world){
	exclusion:        testExclusion,
	risingTokens:     testRisingTokens,
	boundedWaits:     testBoundedWaits,
	renewal:          testRenewal,
	crashExpiry:      testCrashExpiry,
	releaseAfterLoss: testReleaseAfterLoss,
	stillEndsWait:    testStillEndsWait,
}

// warm has l obtain and release a key of its own, trying again for up to
// 10 s: once it has, l's process is connected, and has a session where the
// family keeps one. A process that is still connecting gives up a short
// wait without having contended, and proves nothing.
func warm(l interface {
	Obtain(context.Context, string) (*lock.Lease, error)
}) error {
	key := "warm:" + testenv.Name()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lease, err := l.Obtain(context.Background(), key)
		if err == nil {
			return lease.Release(context.Background())
		}
		if !errors.Is(err, lock.ErrNotObtained) || time.Now().After(deadline) {
			return err
		}
	}
}

// newKey is a key of the test's own.
func newKey() string { return "sku:" + testenv.Name() }

// mustHold fails the test unless the servers say lease holds its key, when
// h can ask them.
func mustHold(t *testing.T, h *handle, lease *lock.Lease) {
	t.Helper()
	if h.holds == nil {
		return
	}
	if err := h.holds(lease); err != nil {
		t.Fatal(err)
	}
}

// stillHeld fails the test unless lease still holds its key: its Context
// is live, the servers say so, and another caller cannot take it.
func stillHeld(t *testing.T, h, other *handle, lease *lock.Lease) {
	t.Helper()
	if err := lease.Context().Err(); err != nil {
		t.Fatalf("the lease on %q ended: %v", lease.Key(), context.Cause(lease.Context()))
	}
	mustHold(t, h, lease)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if l, err := other.Obtain(ctx, lease.Key()); !errors.Is(err, lock.ErrNotObtained) {
		if err == nil {
			l.Release(context.Background())
		}
		t.Fatalf("another caller's Obtain of the held %q = %v, want ErrNotObtained", lease.Key(), err)
	}
}

// testLease is what every family does, None included: Obtain hands out a
// lease on the key whose Context lives until Release; ObtainWhile takes a
// free key without calling its check; RaiseFence to a value below the
// tokens changes nothing; and Stats counts nobody waiting once nobody does.
func testLease(t *testing.T, f family, open func(*testing.T, settings) world) {
	ctx := context.Background()
	h := open(t, settings{})()
	key := newKey()
	lease := obtain(t, h, key)
	if lease.Key() != key {
		t.Errorf("the lease's Key = %q, want %q", lease.Key(), key)
	}
	if err := lease.Context().Err(); err != nil {
		t.Fatalf("a fresh lease's Context ended: %v", context.Cause(lease.Context()))
	}
	tokens := f.claim(risingTokens)
	if got := lease.Fence(); tokens && got <= 0 || !tokens && got != 0 {
		t.Errorf("Fence = %d; want a token above 0 from a family with tokens, 0 from one without", got)
	}
	mustHold(t, h, lease)
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if lease.Context().Err() == nil {
		t.Error("a released lease's Context is live")
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("a second Release = %v, want the first's result", err)
	}

	called := false
	again, err := h.ObtainWhile(ctx, key, func(context.Context) error {
		called = true
		return errors.New("not wanted")
	})
	if err != nil {
		t.Fatalf("ObtainWhile of a free key: %v", err)
	}
	if called {
		t.Error("ObtainWhile of a free key called its check")
	}
	if tokens && again.Fence() <= lease.Fence() {
		t.Errorf("token %d after %d", again.Fence(), lease.Fence())
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.RaiseFence(ctx, key, 1); err != nil {
		t.Fatalf("RaiseFence below the tokens: %v", err)
	}
	next := obtain(t, h, key)
	if tokens && next.Fence() <= again.Fence() {
		t.Errorf("token %d after RaiseFence(1), %d before: a counter was lowered", next.Fence(), again.Fence())
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if s := h.Stats(); s.Waiting != 0 {
		t.Errorf("Stats = %+v with nobody waiting", s)
	}
}

// testExclusion runs callers in three processes, four in each, who take
// one key in turn: never two inside at once, and a counter that they read
// and write back under the lock loses no increment.
func testExclusion(t *testing.T, f family, open func(*testing.T, settings) world) {
	const processes, callers, rounds = 3, 4, 5
	newProcess := open(t, settings{Wait: 30 * time.Second})
	key := newKey()
	var (
		inside, overlaps, waiting, contended atomic.Int32
		counter                              atomic.Int64 // read, and written back a moment later
		wg                                   sync.WaitGroup
		errs                                 = make(chan error, processes*callers*rounds)
		handles                              []*handle
	)
	for range processes {
		h := newProcess()
		handles = append(handles, h)
		for range callers {
			wg.Go(func() {
				for range rounds {
					waiting.Add(1)
					lease, err := h.Obtain(context.Background(), key)
					waiting.Add(-1)
					if err != nil {
						errs <- err
						return
					}
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					if waiting.Load() > 0 {
						contended.Add(1)
					}
					if h.holds != nil {
						if err := h.holds(lease); err != nil {
							errs <- err
						}
					}
					n := counter.Load()
					time.Sleep(time.Millisecond)
					counter.Store(n + 1)
					inside.Add(-1)
					if err := lease.Release(context.Background()); err != nil {
						errs <- err
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d holders found another inside", n)
	}
	if n, want := counter.Load(), int64(processes*callers*rounds); n != want {
		t.Errorf("counter = %d, want %d: increments were lost", n, want)
	}
	if contended.Load() == 0 {
		t.Error("no holder ever had a caller waiting for the key: the test proves nothing")
	}
	for i, h := range handles {
		if s := h.Stats(); s.Waiting != 0 {
			t.Errorf("process %d: Stats = %+v after every caller is done, want nobody waiting", i, s)
		}
	}
}

// testRisingTokens has callers in two processes take one key in turn: the
// tokens, in the order the key was held, strictly increase.
func testRisingTokens(t *testing.T, f family, open func(*testing.T, settings) world) {
	const processes, callers, rounds = 2, 3, 5
	newProcess := open(t, settings{Wait: 30 * time.Second})
	key := newKey()
	var (
		mu     sync.Mutex
		tokens []int64 // in the order the key was held
		wg     sync.WaitGroup
	)
	for range processes {
		h := newProcess()
		for range callers {
			wg.Go(func() {
				for range rounds {
					lease, err := h.Obtain(context.Background(), key)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					tokens = append(tokens, lease.Fence())
					mu.Unlock()
					if err := lease.Release(context.Background()); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	if len(tokens) != processes*callers*rounds {
		t.Fatalf("%d holdings, want %d", len(tokens), processes*callers*rounds)
	}
	if tokens[0] <= 0 {
		t.Errorf("first token %d, want above 0", tokens[0])
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("holding %d had token %d after %d: tokens must increase in holding order (%v)", i, tokens[i], tokens[i-1], tokens)
		}
	}
}

// boundedSlack is how long past its wait (or its context's end) a waiter
// may take to give up on a loaded machine.
const boundedSlack = time.Second

// obtainFree obtains key, which no one holds, through h, whose wait may
// be shorter than a loaded machine takes to grant even a free key (a
// ZooKeeper node's create): a give-up is tried again, as a waiter that
// gave up may, for up to 10 s.
func obtainFree(t *testing.T, h *handle, key string) *lock.Lease {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lease, err := h.Obtain(context.Background(), key)
		if err == nil {
			return lease
		}
		if !errors.Is(err, lock.ErrNotObtained) || time.Now().After(deadline) {
			t.Fatalf("obtain the free key %q: %v", key, err)
		}
	}
}

// testBoundedWaits has a key held while others wait for it: in another
// process and in the holder's, each gives up after its wait; a caller
// whose context ends first gives up then; and each says why, leaves the
// holder holding, and leaves nothing in the next holder's way.
func testBoundedWaits(t *testing.T, f family, open func(*testing.T, settings) world) {
	gaveUp := func(t *testing.T, err error, cause error, took, want time.Duration) {
		t.Helper()
		if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, cause) {
			t.Errorf("Obtain = %v, want ErrNotObtained joined with %v", err, cause)
		}
		if took < want || took > want+boundedSlack {
			t.Errorf("Obtain gave up after %v, want %v or a little more", took, want)
		}
	}
	// scene holds a key in one process of a world with wait, runs the
	// waits on it, and checks that the holder still holds it and that,
	// once it is released, the key is free at once.
	scene := func(t *testing.T, wait time.Duration, waits func(key string, holder, other *handle)) {
		newProcess := open(t, settings{Wait: wait})
		holder, other := newProcess(), newProcess()
		key := newKey()
		lease := obtainFree(t, holder, key)
		waits(key, holder, other)
		stillHeld(t, holder, other, lease)
		if err := lease.Release(context.Background()); err != nil {
			t.Fatalf("the holder's Release after the waits: %v", err)
		}
		// A process of its own first: a key a waiter left queued on the
		// servers would be taken over by the waiter's own process.
		for _, h := range []*handle{newProcess(), other} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			next, err := h.Obtain(ctx, key)
			if err != nil {
				t.Fatalf("Obtain after the release: %v; a waiter that gave up is in the way", err)
			}
			next.Release(context.Background())
		}
	}
	t.Run("wait", func(t *testing.T) {
		t.Parallel()
		const wait = 300 * time.Millisecond
		scene(t, wait, func(key string, holder, other *handle) {
			for _, w := range []struct {
				name string
				h    *handle
			}{{"another process", other}, {"the holder's process", holder}} {
				start := time.Now()
				_, err := w.h.Obtain(context.Background(), key)
				t.Run(w.name, func(t *testing.T) { gaveUp(t, err, context.DeadlineExceeded, time.Since(start), wait) })
			}
		})
	})
	t.Run("caller's deadline", func(t *testing.T) {
		t.Parallel()
		const deadline = 100 * time.Millisecond
		scene(t, time.Minute, func(key string, _, other *handle) {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			_, err := other.Obtain(ctx, key)
			gaveUp(t, err, context.DeadlineExceeded, time.Since(start), deadline)
		})
	})
	t.Run("caller's cancel", func(t *testing.T) {
		t.Parallel()
		scene(t, time.Minute, func(key string, _, other *handle) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			start := time.Now()
			_, err := other.Obtain(ctx, key)
			gaveUp(t, err, context.Canceled, time.Since(start), 0)
		})
	})
}

// testRenewal has a holder keep a key of a short lease for two and a half
// lease lengths: its Context stays live and nobody else gets the key.
// Released, the key stays free: nothing renews it after the release.
func testRenewal(t *testing.T, f family, open func(*testing.T, settings) world) {
	newProcess := open(t, settings{TTL: f.ttl})
	holder, other := newProcess(), newProcess()
	key := newKey()
	lease := obtain(t, holder, key)
	time.Sleep(2*f.ttl + f.ttl/2)
	stillHeld(t, holder, other, lease)
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release after %v: %v", 2*f.ttl+f.ttl/2, err)
	}
	time.Sleep(f.ttl / 2) // longer than a renewal's interval
	next, err := other.Obtain(context.Background(), key)
	if err != nil {
		t.Fatalf("Obtain half a lease length after the release = %v: the released key was held again", err)
	}
	next.Release(context.Background())
}

// testCrashExpiry has a holder's process crash: its key stays held until
// its lease runs out, and then passes on, with a larger token.
func testCrashExpiry(t *testing.T, f family, open func(*testing.T, settings) world) {
	newProcess := open(t, settings{TTL: f.ttl, Wait: 15 * time.Second})
	crashing, next := newProcess(), newProcess()
	key := newKey()
	lease := obtain(t, crashing, key)
	crashing.crash()
	crashed := time.Now()

	// At once, the key is still held: every family's lease runs out a
	// length after it was last renewed, at most a third of a length before
	// the crash, so it lasts two thirds of a length after it at least. (A
	// check that comes late on a loaded machine proves nothing either way.)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if early, err := next.Obtain(ctx, key); err == nil {
		early.Release(context.Background())
		if took := time.Since(crashed); took < f.ttl/2 {
			t.Fatalf("the key passed on %v after its holder crashed, before its lease of %v could run out", took, f.ttl)
		}
	} else if !errors.Is(err, lock.ErrNotObtained) {
		t.Fatal(err)
	}

	got, err := next.Obtain(context.Background(), key)
	if err != nil {
		t.Fatalf("the crashed holder's key did not pass on: %v", err)
	}
	obtained := time.Now()
	defer got.Release(context.Background())
	if took := obtained.Sub(crashed); took > f.ttl+3*time.Second {
		t.Errorf("the key passed on %v after its holder crashed, want about its lease, %v", took, f.ttl)
	}
	// The holder's own reckoning of its lease, where it keeps one, is
	// never later than the servers'.
	if until := lease.Until(); !until.IsZero() && obtained.Before(until) {
		t.Errorf("the key passed on at %v, before the crashed holder's lease ran out at %v", obtained, until)
	}
	if got.Fence() <= lease.Fence() {
		t.Errorf("token after the crash %d, want above the crashed holder's %d", got.Fence(), lease.Fence())
	}
	mustHold(t, next, got)
}

// testReleaseAfterLoss has the servers take a lease from its live holder:
// its Context ends with ErrNotHeld, another process gets the key with a
// larger token, the lost lease's Release returns ErrNotHeld and leaves the
// new holder holding, and the process that lost it takes the key again
// after the new holder.
func testReleaseAfterLoss(t *testing.T, f family, open func(*testing.T, settings) world) {
	ctx := context.Background()
	newProcess := open(t, settings{TTL: f.ttl, Wait: 15 * time.Second})
	losing, next := newProcess(), newProcess()
	key := newKey()
	lost := obtain(t, losing, key)
	losing.lose(t, lost)
	waitForLoss(t, lost)
	if cause := context.Cause(lost.Context()); !errors.Is(cause, lock.ErrNotHeld) {
		t.Errorf("the lost lease's cause = %v, want ErrNotHeld", cause)
	}
	got := obtain(t, next, key)
	if got.Fence() <= lost.Fence() {
		t.Errorf("token after the loss %d, want above the lost lease's %d", got.Fence(), lost.Fence())
	}
	if err := lost.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Release of the lost lease = %v, want ErrNotHeld", err)
	}
	stillHeld(t, next, losing, got)
	if err := got.Release(ctx); err != nil {
		t.Fatalf("the new holder's Release: %v", err)
	}
	again := obtain(t, losing, key)
	if again.Fence() <= got.Fence() {
		t.Errorf("token of the process that lost the key, taken again, %d after %d", again.Fence(), got.Fence())
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// testStillEndsWait has a caller wait with ObtainWhile — behind a holder
// of another process, and of its own — and its reason to wait go away: its
// check fails, and ObtainWhile returns the check's error at once, without
// the key. A waiter that polls checks before each try, and gives up while
// the key is still held; one that is woken (by the release, or handed the
// key in process) checks once, when the release wakes it.
func testStillEndsWait(t *testing.T, f family, open func(*testing.T, settings) world) {
	errSoldOut := errors.New("sold out")
	for _, sameProcess := range []bool{false, true} {
		name := map[bool]string{false: "another process", true: "the holder's process"}[sameProcess]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			newProcess := open(t, settings{Wait: 10 * time.Second, onlyWoken: true})
			holder := newProcess()
			waiter := holder
			if !sameProcess {
				waiter = newProcess()
			}
			key := newKey()
			held := obtain(t, holder, key)
			w := obtainWhileAsync(ctx, waiter, key, errSoldOut)
			waitFor(t, "the waiter waits", func() bool {
				if sameProcess {
					return w.checks.Load() > 0 || waiter.Stats().Waiting > 0
				}
				return w.checks.Load() > 0 || waiter.waitsFor(t, key)
			})
			// The check fails from now on, before the checks are counted:
			// a poll between the two would count a check that passed.
			w.wanted.Store(false)
			polls := w.checks.Load() > 0
			if polls && f.woken {
				t.Errorf("ObtainWhile checked %d times while the key was held; its waiters do not poll", w.checks.Load())
			}
			if !polls {
				if err := held.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-w.ended:
				if !errors.Is(err, errSoldOut) || errors.Is(err, lock.ErrNotObtained) {
					t.Fatalf("ObtainWhile = %v, want the check's error alone", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("ObtainWhile still waits 5 s after its check began to fail")
			}
			if polls {
				stillHeld(t, holder, waiter, held)
				if err := held.Release(ctx); err != nil {
					t.Fatal(err)
				}
			} else if n := w.checks.Load(); n != 1 {
				t.Errorf("ObtainWhile checked %d times, want once, when the release woke it", n)
			}
			// The waiter did not keep the key, nor its place in line: a
			// process of its own, then the waiter's, takes the key at once.
			for _, h := range []*handle{newProcess(), waiter} {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				next, err := h.Obtain(ctx, key)
				if err != nil {
					t.Fatalf("Obtain after the wait ended: %v", err)
				}
				next.Release(context.Background())
			}
		})
	}
}

// crashing closes l when the test ends, and returns what ends l's process
// as a crash does: l closed, and the clients it runs on (closeClients), so
// that it neither renews nor releases anything from then on.
func crashing(t *testing.T, l io.Closer, closeClients ...func() error) func() {
	t.Cleanup(func() { l.Close() })
	return func() {
		l.Close()
		for _, closeClient := range closeClients {
			closeClient()
		}
	}
}

// waitForLoss waits until lease's Context has ended, for at most 10 s.
func waitForLoss(t *testing.T, lease *lock.Lease) {
	t.Helper()
	select {
	case <-lease.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the lease on %q is live 10 s after the servers took it", lease.Key())
	}
}

// errHolds is the error of a holds check that found another holder.
func errHolds(lease *lock.Lease, format string, args ...any) error {
	return fmt.Errorf("the servers say the lease on %q (token %d) does not hold it: %s", lease.Key(), lease.Fence(), fmt.Sprintf(format, args...))
}
