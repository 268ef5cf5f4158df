package lock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZooKeeperOptions configures a ZooKeeper lock. Zero fields take the
// defaults.
type ZooKeeperOptions struct {
	// Root is the znode under which every key has a znode of its own, whose
	// children are the key's holder and waiters; default "/shop/lock".
	Root string
	// TTL is the session timeout the client asks for; default 5s. It is the
	// lease: a holder whose process dies keeps the key until the server
	// expires its session. The server grants a timeout between its
	// minSessionTimeout and maxSessionTimeout (by default 2 and 20 ticks),
	// and the lock reckons with the one granted, not with TTL.
	TTL time.Duration
	// Wait bounds how long Obtain waits for a held key; default 2s.
	Wait time.Duration
	// Logger is given the client's messages (connecting, a session
	// granted, a connection lost) at debug level; nil drops them.
	Logger *slog.Logger
}

func (opt ZooKeeperOptions) withDefaults() ZooKeeperOptions {
	if opt.Root == "" {
		opt.Root = "/shop/lock"
	}
	opt.Root = "/" + strings.Trim(opt.Root, "/")
	if opt.TTL <= 0 {
		opt.TTL = 5 * time.Second
	}
	if opt.Wait <= 0 {
		opt.Wait = 2 * time.Second
	}
	return opt
}

// ZooKeeper is a lock held as an ephemeral sequential znode in a ZooKeeper
// ensemble: the classic recipe. A contender creates Root/<key>/_c_<guid>-lock-N
// (the guid lets an attempt whose reply was lost find and delete its znode)
// and lists the key's children. The lowest sequence holds the key; every
// other contender watches the znode just before its own (ExistsW) and is
// woken by the server when that one goes — no polling, and a release wakes
// one waiter, not the herd. A waiter that gives up deletes its znode, and the
// waiter behind it, woken, watches the next one ahead.
//
// The lease is the session: its znode is ephemeral, so the server deletes
// it when the session expires, and the client's pings keep the session
// while the process runs. The fencing token is the znode's czxid: zxids are
// handed out in one total order by the ensemble's leader, their upper half
// being the leader's epoch, so a later holder — whose znode was created
// after the earlier holder's — has a larger one, across failovers and
// restarts too. The client cannot return the Stat with the create (it does
// not speak create2), so an acquisition reads it with an Exists sent
// together with the listing: an uncontended Obtain is a create and then a
// pipelined children list and exists, two round trips and three requests.
//
// The waiters of one process queue in line per key (keyed) first, so that
// only the first of them has a znode at the server.
//
// The lock owns its connection: it must see the session's events.
type ZooKeeper struct {
	conn *zk.Conn
	opt  ZooKeeperOptions
	line keyed

	attempts, wakeups atomic.Uint64
	// waiting counts the waiters that watch a predecessor at the server.
	waiting atomic.Int64
	// negotiated is the session timeout the server granted, in
	// nanoseconds (see zkLogger).
	negotiated atomic.Int64

	mu     sync.Mutex
	closed bool
	sess   *zkSession // the session as last seen; nil before the first
	leases int        // leases held, for the keeper
	kick   chan struct{}

	done      chan struct{} // closed by Close
	closeOnce sync.Once
	bg        sync.WaitGroup // the keeper and the clean-ups
}

// zkSession is one ZooKeeper session as far as the lock can vouch for it.
// Its ctx is cancelled, with a cause wrapping ErrNotHeld, when the session
// expired or was replaced, or when the lock cannot be sure any more that
// it has not expired: the server expires a session the timeout after it
// last heard from the client, and the lock knows only when it sent the
// requests the server answered. A session that lapsed that way but was
// alive gets a new zkSession on its next answer; the leases of the old one
// stay lost.
type zkSession struct {
	id     int64
	ctx    context.Context
	cancel context.CancelCauseFunc
	// Guarded by ZooKeeper.mu.
	until  time.Time // the server cannot have expired the session before
	timer  *time.Timer
	leases map[*Lease]struct{}
}

// DialZooKeeper returns a ZooKeeper lock on the ensemble at servers
// (host:port). It connects in the background, as zk.Connect does: the
// first Obtain waits for the session within its wait. connOpts are the
// client's options (a dialer that counts round trips, say), applied before
// the lock's own logger and event callback, which replace any in connOpts:
// the lock learns the negotiated session timeout from the client's log and
// session events from its callback. Close the lock when done.
func DialZooKeeper(servers []string, opt ZooKeeperOptions, connOpts ...func(*zk.Conn)) (*ZooKeeper, error) {
	opt = opt.withDefaults()
	z := &ZooKeeper{opt: opt, kick: make(chan struct{}, 1), done: make(chan struct{})}
	theirs := func(c *zk.Conn) {
		for _, o := range connOpts {
			o(c)
		}
	}
	conn, _, err := zk.Connect(servers, opt.TTL, theirs,
		zk.WithLogger(zkLogger{negotiated: &z.negotiated, log: opt.Logger}), zk.WithLogInfo(true), zk.WithEventCallback(z.event))
	if err != nil {
		return nil, fmt.Errorf("lock: dial ZooKeeper %v: %w", servers, err)
	}
	z.conn = conn
	z.bg.Go(z.keep)
	return z, nil
}

// zkLogger passes the client's messages on to the lock's Logger, if any,
// and takes from them the session timeout the server granted: the client
// logs it ("authenticated: id=…, timeout=…") before it sends any request on
// the session, and keeps no other record of it that it shows.
type zkLogger struct {
	negotiated *atomic.Int64
	log        *slog.Logger
}

func (l zkLogger) Printf(format string, args ...any) {
	if format == "authenticated: id=%d, timeout=%d" && len(args) == 2 {
		if ms, ok := args[1].(int32); ok {
			l.negotiated.Store(int64(ms) * int64(time.Millisecond))
		}
	}
	if l.log != nil {
		l.log.Debug(fmt.Sprintf(format, args...), "component", "zookeeper")
	}
}

// timeout returns the session timeout the server granted. Every answer on
// a session comes after the client logged it, so the requested TTL is only
// a fallback that is never used.
func (z *ZooKeeper) timeout() time.Duration {
	if t := time.Duration(z.negotiated.Load()); t > 0 {
		return t
	}
	return z.opt.TTL
}

// validity is how long after a request that the server answered was sent
// the session is sure to live: the timeout, less a tenth for the touch a
// follower has not yet passed on to the leader, which expires sessions.
// Followers report touches every half tick, so the margin covers it for a
// session of at least 5 ticks (the server allows 2 to 20 by default).
func (z *ZooKeeper) validity() time.Duration { return z.timeout() * 9 / 10 }

// event takes the client's session events; it runs on the client's
// goroutine and must not block.
func (z *ZooKeeper) event(ev zk.Event) {
	if ev.Type != zk.EventSession || ev.State != zk.StateExpired {
		return
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.sess != nil {
		z.sess.end(fmt.Errorf("%w: ZooKeeper session 0x%x expired", ErrNotHeld, z.sess.id))
	}
}

// sessionFor returns the zkSession of session id if it is the client's
// session now, nil otherwise: the session is gone, and with it every
// ephemeral znode it created.
func (z *ZooKeeper) sessionFor(id int64) *zkSession {
	z.mu.Lock()
	defer z.mu.Unlock()
	if id == 0 || z.conn.SessionID() != id {
		return nil
	}
	if s := z.sess; s != nil && s.id == id && s.ctx.Err() == nil {
		return s
	}
	if s := z.sess; s != nil && s.id != id {
		s.end(fmt.Errorf("%w: ZooKeeper session 0x%x was replaced by 0x%x", ErrNotHeld, s.id, id))
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	z.sess = &zkSession{id: id, ctx: ctx, cancel: cancel, leases: map[*Lease]struct{}{}}
	return z.sess
}

// end cancels s and, at once rather than on their AfterFuncs' goroutines,
// its leases: a holder is told before the call that ends s returns. The
// caller holds ZooKeeper.mu.
func (s *zkSession) end(cause error) {
	s.cancel(cause)
	for l := range s.leases {
		l.cancel(fmt.Errorf("lease on %q: %w", l.key, cause))
	}
}

// confirm records that the server answered a request of session s sent at
// sent: s lives at least until sent plus the validity. A session replaced
// meanwhile is not confirmed.
func (z *ZooKeeper) confirm(s *zkSession, sent time.Time) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if s.ctx.Err() != nil || z.conn.SessionID() != s.id {
		return
	}
	until := sent.Add(z.validity())
	if !until.After(s.until) {
		return
	}
	s.until = until
	for l := range s.leases {
		l.until.Store(until.UnixNano())
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(until), func() { z.lapse(s) })
	} else {
		s.timer.Reset(time.Until(until))
	}
}

// lapse cancels s once its time is up without a fresher answer.
func (z *ZooKeeper) lapse(s *zkSession) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if d := time.Until(s.until); d > 0 {
		s.timer.Reset(d)
		return
	}
	s.end(fmt.Errorf("%w: ZooKeeper session 0x%x unanswered since %s: the server may have expired it",
		ErrNotHeld, s.id, s.until.Add(-z.validity()).Format(time.StampMilli)))
}

// keep is the watchdog: while leases are held it sends a Sync every third
// of the session timeout, as the client's pings go, and confirms the
// session with each answer, so that a lease stays valid while the server
// answers and is lost (its Context cancelled) once it could have expired.
// A Sync, unlike a read, goes through the leader: a follower cut off from
// it answers reads for a while without passing the session's touches on.
func (z *ZooKeeper) keep() {
	for {
		z.mu.Lock()
		held := z.leases > 0
		z.mu.Unlock()
		if !held {
			select {
			case <-z.kick:
				continue
			case <-z.done:
				return
			}
		}
		t := time.NewTimer(z.timeout() / 3)
		select {
		case <-t.C:
		case <-z.done:
			t.Stop()
			return
		}
		id := z.conn.SessionID()
		sent := time.Now()
		if _, err := z.conn.Sync("/"); err == nil {
			if s := z.sessionFor(id); s != nil {
				z.confirm(s, sent)
			}
		}
	}
}

// Stats reports what the lock's waiters have done so far: Attempts counts
// the znodes created, Wakeups the waits a watch ended.
func (z *ZooKeeper) Stats() Stats {
	return Stats{Attempts: z.attempts.Load(), Wakeups: z.wakeups.Load(),
		Waiting: z.line.waiting() + int(z.waiting.Load())}
}

// RaiseFence does nothing and returns nil. A ZooKeeper lease's fencing
// token is its znode's czxid, a transaction id that the ensemble's leader
// hands out, its epoch in the upper half: there is no counter of the lock's
// own to raise, and the zxids go back only in an ensemble rebuilt without
// its data. A row fenced above them (by a lock of another family, or before
// such a rebuild) stays refused until the zxids pass it.
func (z *ZooKeeper) RaiseFence(context.Context, string, int64) error { return nil }

// Close closes the connection and with it the session, whose znodes the
// server deletes at once; leases still held are lost. It waits for the
// lock's goroutines.
func (z *ZooKeeper) Close() error {
	z.closeOnce.Do(func() {
		z.mu.Lock()
		z.closed = true
		z.mu.Unlock()
		close(z.done)
		z.conn.Close()
		z.mu.Lock()
		if z.sess != nil {
			z.sess.end(fmt.Errorf("%w: the ZooKeeper lock was closed", ErrNotHeld))
		}
		z.mu.Unlock()
	})
	z.bg.Wait()
	return nil
}

// Obtain takes the lock on key. While the key is held it waits — in line
// behind this process's other waiters, then watching the znode ahead of its
// own — for at most the configured wait and never past ctx; then it returns
// an error wrapping ErrNotObtained and the context's cause. A connection
// lost meanwhile (a failover) is waited out within the wait.
//
// The lease's Context is cancelled with a cause wrapping ErrNotHeld when
// the session expires, or once it could have: when the server has not
// answered for the session timeout (less a margin) since the last request
// it answered was sent.
func (z *ZooKeeper) Obtain(ctx context.Context, key string) (*Lease, error) {
	return z.ObtainWhile(ctx, key, nil)
}

// ObtainWhile is Obtain for a caller whose reason to wait may go away while
// the key is held: each time its wait moves up the line (a holder of this
// process released the key, or the znode ahead was deleted), it calls still,
// and gives up with its error if it returns one. still may be nil.
func (z *ZooKeeper) ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*Lease, error) {
	return z.obtain(ctx, key, still, true)
}

// TryObtain takes the lock on key if it is free and otherwise returns
// ErrNotObtained without waiting for it. It waits for the server's answers
// for at most the configured wait. The lease is watched as Obtain's is.
func (z *ZooKeeper) TryObtain(ctx context.Context, key string) (*Lease, error) {
	return z.obtain(ctx, key, nil, false)
}

// errZooKeeperClosed ends the obtains of a closed lock at once: its
// requests fail as a lost connection's do, and would be retried.
var errZooKeeperClosed = errors.New("lock: the ZooKeeper lock is closed")

func (z *ZooKeeper) obtain(ctx context.Context, key string, still func(context.Context) error, wait bool) (*Lease, error) {
	dir, err := z.dir(key)
	if err != nil {
		return nil, err
	}
	select {
	case <-z.done:
		return nil, fmt.Errorf("lock: obtain %q: %w", key, errZooKeeperClosed)
	default:
	}
	waitCtx, cancel := context.WithTimeout(ctx, z.opt.Wait)
	defer cancel()
	// In line behind the callers of this process; still is called if it
	// waited there.
	if !wait {
		if !z.line.tryLock(key) {
			return nil, ErrNotObtained
		}
	} else if err := z.line.lockWhile(waitCtx, key, still); err != nil {
		return nil, err
	}
	l, err := z.contend(ctx, waitCtx, key, dir, still, wait)
	if err != nil {
		z.line.unlock(key)
		return nil, err
	}
	release := l.release
	l.release = func(ctx context.Context) error {
		defer z.line.unlock(key)
		return release(ctx)
	}
	return l, nil
}

// dir returns the znode whose children are key's contenders.
func (z *ZooKeeper) dir(key string) (string, error) {
	name := url.PathEscape(key)
	if name == "" || name == "." || name == ".." {
		return "", fmt.Errorf("lock: obtain %q: not a key ZooKeeper can name", key)
	}
	return z.opt.Root + "/" + name, nil
}

// retryable reports whether err is the connection failing under a request
// (a server going down, a failover, the session moving to another
// server): the request may have run, and the next one may go through.
func retryable(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, zk.ErrSessionMoved) || errors.Is(err, zk.ErrSessionExpired)
}

// contend creates key's znode and waits until it is the lowest, within
// waitCtx; the lease lives on ctx. A key held by someone else is
// ErrNotObtained unless wait is set.
func (z *ZooKeeper) contend(ctx, waitCtx context.Context, key, dir string, still func(context.Context) error, wait bool) (*Lease, error) {
	var lastErr error // a connection failure the wait went through
	gaveUp := func(err error) error {
		if ended(waitCtx) {
			return errors.Join(notObtained(waitCtx), lastErr)
		}
		return fmt.Errorf("lock: obtain %q: %w", key, err)
	}
	for try := 0; ; try++ {
		if try > 0 && !sleep(waitCtx, min(time.Duration(try)*20*time.Millisecond, 200*time.Millisecond)) {
			return nil, gaveUp(lastErr)
		}
		select {
		case <-z.done:
			return nil, fmt.Errorf("lock: obtain %q: %w", key, errZooKeeperClosed)
		default:
		}
		node, err := z.create(waitCtx, dir)
		if retryable(err) {
			lastErr = err
			continue
		}
		if err != nil {
			return nil, gaveUp(err)
		}
		l, err := z.await(ctx, waitCtx, key, dir, node, still, wait)
		if retryable(err) {
			lastErr = err
			continue
		}
		return l, err
	}
}

// await waits until node is the lowest of dir's children and returns its
// lease. On failure it gives node up.
func (z *ZooKeeper) await(ctx, waitCtx context.Context, key, dir, node string, still func(context.Context) error, wait bool) (l *Lease, err error) {
	defer func() {
		if l == nil {
			z.abandon(node, 0)
		}
	}()
	name := node[len(dir)+1:]
	for {
		sent := time.Now()
		children, stat, err := z.look(waitCtx, dir, node)
		switch {
		case err != nil && ended(waitCtx):
			return nil, notObtained(waitCtx)
		case err != nil:
			return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
		case stat == nil:
			// The session expired under the wait and took node along.
			return nil, zk.ErrSessionExpired
		}
		ahead := predecessor(children, name)
		if ahead == "" {
			s := z.sessionFor(stat.EphemeralOwner)
			if s == nil {
				return nil, zk.ErrSessionExpired
			}
			z.confirm(s, sent)
			return z.lease(ctx, key, node, stat.Czxid, s)
		}
		if !wait {
			return nil, ErrNotObtained
		}
		exists, watch, err := z.watch(waitCtx, dir+"/"+ahead)
		switch {
		case err != nil && ended(waitCtx):
			return nil, notObtained(waitCtx)
		case err != nil:
			return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
		case !exists:
			continue
		}
		z.waiting.Add(1)
		select {
		case <-watch:
			z.waiting.Add(-1)
			z.wakeups.Add(1)
		case <-waitCtx.Done():
			z.waiting.Add(-1)
			return nil, notObtained(waitCtx)
		}
		if still != nil {
			if err := still(waitCtx); err != nil {
				return nil, err
			}
		}
	}
}

// lease returns the lease of node, which holds key for session s.
func (z *ZooKeeper) lease(ctx context.Context, key, node string, fence int64, s *zkSession) (*Lease, error) {
	var l *Lease
	var stop func() bool
	l = newLease(ctx, key, fence, func(ctx context.Context) error {
		stop()
		z.unhold(s, l)
		if cause := context.Cause(l.ctx); errors.Is(cause, ErrNotHeld) {
			// Lost, as far as the lock can tell: the znode is being
			// deleted already (see below).
			return fmt.Errorf("lock: release %q: %w", key, cause)
		}
		_, err := call(ctx, func() (struct{}, error) { return struct{}{}, z.conn.Delete(node, -1) })
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return fmt.Errorf("lock: release %q: %w", key, ErrNotHeld)
		case err != nil:
			// Perhaps deleted, perhaps not: make sure.
			z.abandon(node, s.id)
			return fmt.Errorf("lock: release %q: %w", key, err)
		}
		return nil
	})
	z.mu.Lock()
	if s.ctx.Err() != nil {
		z.mu.Unlock()
		return nil, zk.ErrSessionExpired
	}
	s.leases[l] = struct{}{}
	l.until.Store(s.until.UnixNano())
	z.leases++
	z.mu.Unlock()
	select {
	case z.kick <- struct{}{}:
	default:
	}
	stop = context.AfterFunc(s.ctx, func() {
		l.cancel(fmt.Errorf("lease on %q: %w", key, context.Cause(s.ctx)))
		// The znode may live on with the session, if it lapsed only as
		// far as the lock can tell: it must not keep the key.
		z.abandon(node, s.id)
	})
	return l, nil
}

// unhold takes l out of the leases the keeper keeps alive.
func (z *ZooKeeper) unhold(s *zkSession, l *Lease) {
	z.mu.Lock()
	defer z.mu.Unlock()
	delete(s.leases, l)
	z.leases--
}

// create creates an ephemeral sequential znode under dir, creating dir
// (and Root) first if it is missing, and returns its path. A create whose
// answer the wait does not see (waitCtx ended, the connection failed) may
// still have created the znode: it is found by its guid and deleted in the
// background.
func (z *ZooKeeper) create(waitCtx context.Context, dir string) (string, error) {
	guid := strings.ToLower(rand.Text())
	prefix := dir + "/_c_" + guid + "-lock-"
	// The server deletes an empty container a moment after it is made, at
	// worst: a few rounds of mkdir and create.
	for made := 0; ; made++ {
		z.attempts.Add(1)
		id := z.conn.SessionID()
		type created struct {
			path string
			err  error
		}
		done := make(chan created, 1)
		go func() {
			path, err := z.conn.Create(prefix, nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
			done <- created{path, err}
		}()
		var c created
		select {
		case c = <-done:
		case <-waitCtx.Done():
			z.spawn(func() {
				if c := <-done; c.err == nil {
					z.abandon(c.path, 0)
				} else if retryable(c.err) {
					z.sweep(dir, guid, id)
				}
			})
			return "", notObtained(waitCtx)
		}
		switch {
		case c.err == nil:
			return c.path, nil
		case errors.Is(c.err, zk.ErrNoNode) && made < 3:
			if err := z.mkdir(waitCtx, dir); err != nil {
				return "", err
			}
			continue
		case retryable(c.err):
			z.spawn(func() { z.sweep(dir, guid, id) })
		}
		return "", c.err
	}
}

// mkdir creates dir as a container znode — the server deletes it once its
// last child is gone — and Root's znodes as persistent ones.
func (z *ZooKeeper) mkdir(ctx context.Context, dir string) error {
	acl := zk.WorldACL(zk.PermAll)
	do := func(f func() error) error {
		_, err := call(ctx, func() (struct{}, error) { return struct{}{}, f() })
		if errors.Is(err, zk.ErrNodeExists) {
			return nil
		}
		return err
	}
	container := func() error {
		return do(func() error {
			_, err := z.conn.CreateContainer(dir, nil, zk.FlagContainer, acl)
			if errors.Is(err, zk.ErrUnknown) {
				// A server before 3.5.3 has no containers.
				_, err = z.conn.Create(dir, nil, zk.FlagPersistent, acl)
			}
			return err
		})
	}
	err := container()
	if !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	parts := strings.Split(strings.TrimPrefix(z.opt.Root, "/"), "/")
	for i := range parts {
		p := "/" + strings.Join(parts[:i+1], "/")
		if err := do(func() error { _, err := z.conn.Create(p, nil, zk.FlagPersistent, acl); return err }); err != nil {
			return err
		}
	}
	return container()
}

// look lists dir's children and reads node's Stat, both requests sent at
// once (the client pipelines them on its connection): nil when node is
// gone.
func (z *ZooKeeper) look(ctx context.Context, dir, node string) ([]string, *zk.Stat, error) {
	type listing struct {
		children []string
		err      error
	}
	listed := make(chan listing, 1)
	go func() {
		children, _, err := z.conn.Children(dir)
		listed <- listing{children, err}
	}()
	stat, err := call(ctx, func() (*zk.Stat, error) {
		exists, stat, err := z.conn.Exists(node)
		if !exists {
			stat = nil
		}
		return stat, err
	})
	if err != nil {
		return nil, nil, err
	}
	select {
	case l := <-listed:
		return l.children, stat, l.err
	case <-ctx.Done():
		return nil, nil, context.Cause(ctx)
	}
}

// watch reads whether node exists and, if it does, returns the channel its
// deletion is told on.
func (z *ZooKeeper) watch(ctx context.Context, node string) (bool, <-chan zk.Event, error) {
	type watched struct {
		exists bool
		ch     <-chan zk.Event
	}
	w, err := call(ctx, func() (watched, error) {
		exists, _, ch, err := z.conn.ExistsW(node)
		return watched{exists, ch}, err
	})
	return w.exists, w.ch, err
}

// predecessor returns the child of children just before name in sequence
// order, "" if name is the lowest. Children without a sequence are not
// contenders.
func predecessor(children []string, name string) string {
	own, ok := sequence(name)
	if !ok {
		return ""
	}
	ahead, best := "", int64(-1)
	for _, c := range children {
		if n, ok := sequence(c); ok && n < own && n > best {
			ahead, best = c, n
		}
	}
	return ahead
}

// sequence parses the sequence number the server appended to a znode's
// name: ten digits after the last '-'.
func sequence(name string) (int64, bool) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || len(name)-i-1 != 10 {
		return 0, false
	}
	n, err := strconv.ParseInt(name[i+1:], 10, 64)
	return n, err == nil
}

// abandonPause is how long the clean-ups wait between tries while the
// connection is down.
const abandonPause = 200 * time.Millisecond

// abandon deletes node in the background, trying again while the
// connection is down, until it is gone, the session that owns it (owner;
// 0 for the current one) has ended, which takes it along, or the lock is
// closed.
func (z *ZooKeeper) abandon(node string, owner int64) {
	if owner == 0 {
		owner = z.conn.SessionID()
	}
	z.spawn(func() {
		for {
			err := z.conn.Delete(node, -1)
			if !retryable(err) || z.conn.SessionID() != owner {
				return
			}
			select {
			case <-time.After(abandonPause):
			case <-z.done:
				return
			}
		}
	})
}

// sweepRounds is how many times sweep looks for a znode it did not find.
const sweepRounds = 3

// sweep deletes the znode under dir whose name has guid: a create whose
// answer was lost may have made it. It syncs with the leader before each
// look, so that a create the leader committed late is seen, and stops once
// it deleted one, after sweepRounds looks that found none, or when the
// session owner that sent the create has ended (and took the znode along).
func (z *ZooKeeper) sweep(dir, guid string, owner int64) {
	for round := 0; round < sweepRounds; {
		if owner != 0 && z.conn.SessionID() != owner {
			return
		}
		_, err := z.conn.Sync(dir)
		var children []string
		if err == nil {
			children, _, err = z.conn.Children(dir)
		}
		switch {
		case errors.Is(err, zk.ErrNoNode):
			round++
		case err == nil:
			for _, c := range children {
				if strings.Contains(c, guid) {
					z.abandon(dir+"/"+c, owner)
					return
				}
			}
			round++
		case !retryable(err):
			return
		}
		select {
		case <-time.After(abandonPause):
		case <-z.done:
			return
		}
	}
}

// spawn runs f in the background unless the lock is closed: Close waits
// for it.
func (z *ZooKeeper) spawn(f func()) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.closed {
		return
	}
	z.bg.Go(f)
}

// call runs f, which the client cannot cancel, and waits for its answer
// until ctx ends. An abandoned f ends on its own: the server answers it,
// or the connection fails, or the lock is closed.
func call[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, context.Cause(ctx)
	}
}
