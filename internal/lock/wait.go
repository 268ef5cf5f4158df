package lock

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"
)

// Subscriber opens a pub/sub subscription; *redis.Client implements it.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Stats counts what a lock's waiters did.
type Stats struct {
	// Attempts is how many times an acquisition was tried in Redis.
	Attempts uint64
	// Wakeups is how many times a waiter retried because a release was
	// announced on the lock's channel rather than when its backoff ended.
	// (A waiter handed the key by a holder of its own process is not
	// counted: that is no retry.)
	Wakeups uint64
	// Waiting is how many callers are waiting for a key now.
	Waiting int
}

// waiter is the retry loop the Redis locks share: try, and while the key is
// held, sleep with exponential backoff and full jitter.
//
// With wake-on-release it does better than poll. The waiters of one process
// queue for a key in process (keyed), first come first served, and only the
// first of them contends in Redis: it retries when a release in another
// process is announced on the lock's channel, or when its backoff ends if
// the message was missed. A holder in this process hands the key to its next
// waiter when it has released it in Redis. Polling then costs one Redis try
// per key and process instead of one per waiter, and a release wakes the one
// waiter that can use it, without a herd.
type waiter struct {
	wait, minBackoff, maxBackoff time.Duration
	// wake is nil when releases are not announced: every waiter polls.
	// Otherwise an attempt that finds the key held flags it as waited for
	// in the same round trip (the obtain scripts), so that its release is
	// announced.
	wake *wakeups
	// queue is set when the waiters of this process queue in line.
	queue    bool
	line     keyed
	attempts atomic.Uint64
}

// newWaiter returns the retry loop for a lock with opt. With subscribers,
// releases are announced and heard on each of them (every Redis whose
// release script may announce one). queue puts the waiters of this process
// in line with wake-on-release (see waiter); without it every waiter
// contends in Redis and is woken by announced releases, its own process's
// included.
func newWaiter(opt RedisOptions, queue bool, subscribers []Subscriber) *waiter {
	w := &waiter{wait: opt.Wait, minBackoff: opt.MinBackoff, maxBackoff: opt.MaxBackoff}
	if len(subscribers) > 0 {
		w.wake = newWakeups(subscribers, opt.Prefix+"released", queue)
		w.queue = queue
	}
	return w
}

// flags tells an obtain script whether to flag a key it finds held: when the
// caller will wait for it and releases are announced.
func (w *waiter) flags(wait bool) string { return w.flagArg(wait).(string) }

// The values of the obtain scripts' flag argument (see flags), boxed once.
var (
	flagOn  any = "1"
	flagOff any = "0"
)

// flagArg is flags, boxed.
func (w *waiter) flagArg(wait bool) any {
	if wait && w.wake != nil {
		return flagOn
	}
	return flagOff
}

// attemptFunc tries to take the lock once, under tryCtx, for a lease that
// lives on ctx. A key held by someone else is ErrNotObtained.
type attemptFunc func(ctx, tryCtx context.Context) (*Lease, error)

// obtain runs attempt until it returns anything but ErrNotObtained, for at
// most the wait and never past ctx. If still is not nil, it is called
// before a retry that follows a release of the key (announced, or handed on
// in this process; before every retry when releases are not announced); an
// error from it ends the wait with that error.
func (w *waiter) obtain(ctx context.Context, key string, attempt attemptFunc, still func(context.Context) error) (*Lease, error) {
	// Uncontended: first in line at once, and the key free in Redis.
	first := w.queue && w.line.tryLock(key)
	if first {
		l, err := w.try(ctx, ctx, attempt)
		if err == nil {
			return w.inLine(l, key), nil
		}
		if !errors.Is(err, ErrNotObtained) && !failingOver(err) {
			w.line.unlock(key)
			return nil, err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, w.wait)
	defer cancel()
	if !w.queue {
		return w.poll(ctx, waitCtx, key, attempt, still, false)
	}
	if !first && !w.line.lock(waitCtx, key) {
		return nil, notObtained(waitCtx)
	}
	if !first && ended(waitCtx) {
		// Handed the key as the wait ended: no try is left in it.
		w.line.unlock(key)
		return nil, notObtained(waitCtx)
	}
	if !first && still != nil {
		// Waited in line behind a holder of this process.
		if err := still(waitCtx); err != nil {
			w.line.unlock(key)
			return nil, err
		}
	}
	l, err := w.poll(ctx, waitCtx, key, attempt, still, first)
	if err != nil {
		w.line.unlock(key)
		return nil, err
	}
	return w.inLine(l, key), nil
}

// inLine makes l's release hand key to the next waiter of this process.
func (w *waiter) inLine(l *Lease, key string) *Lease {
	release := l.release
	l.release = func(ctx context.Context) error {
		defer w.line.unlock(key)
		return release(ctx)
	}
	return l
}

// tryObtain runs attempt once, if no waiter of this process is ahead.
func (w *waiter) tryObtain(ctx context.Context, key string, attempt attemptFunc) (*Lease, error) {
	if !w.queue {
		return w.try(ctx, ctx, attempt)
	}
	if !w.line.tryLock(key) {
		return nil, ErrNotObtained
	}
	l, err := w.try(ctx, ctx, attempt)
	if err != nil {
		w.line.unlock(key)
		return nil, err
	}
	return w.inLine(l, key), nil
}

// poll retries attempt with backoff — and, with wake-on-release, as soon as
// a release of key is announced — until waitCtx ends. If tried is set, the
// key was just found held: it waits before the first try.
func (w *waiter) poll(ctx, waitCtx context.Context, key string, attempt attemptFunc, still func(context.Context) error, tried bool) (*Lease, error) {

	b := &backoff.ExponentialBackOff{
		InitialInterval: w.minBackoff,
		// Full jitter: each sleep is drawn uniformly from [0, 2×interval].
		RandomizationFactor: 1,
		Multiplier:          2,
		MaxInterval:         w.maxBackoff,
	}
	b.Reset()
	var (
		timer *time.Timer
		woken <-chan struct{}
		// switching is the last answer's error if Redis refused the try or
		// dropped it while failing over (see failingOver); the wait's
		// error carries it.
		switching error
	)
	gaveUp := func() error { return errors.Join(notObtained(waitCtx), switching) }
	for ; ; tried = false {
		if !tried {
			l, err := w.try(ctx, waitCtx, attempt)
			switch {
			case failingOver(err):
				switching = err
			case !errors.Is(err, ErrNotObtained):
				return l, err
			case !ended(waitCtx):
				// Redis answered that the key is held.
				switching = nil
			}
			// A try cut short by the end of the wait answered nothing:
			// the last answer still stands.
		}
		if waitCtx.Err() != nil {
			return nil, gaveUp()
		}
		if w.wake != nil {
			if woken == nil {
				// Registered after the first failure, so the uncontended
				// path pays nothing; a release in between is caught by
				// the backoff.
				ch, done := w.wake.add(waitCtx, key)
				defer done()
				woken = ch
			}
			// The attempt flagged the lock as waited for. A flag set just
			// after the release is missed: the backoff covers it.
		}
		d := b.NextBackOff()
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		released := w.wake == nil // without announcements, every retry may follow one
		select {
		case <-waitCtx.Done():
			return nil, gaveUp()
		case <-timer.C:
		case <-woken:
			w.wake.woken.Add(1)
			released = true
		}
		if still != nil && released {
			if err := still(waitCtx); err != nil {
				return nil, err
			}
		}
	}
}

// failingOver reports whether err is Redis refusing a write, or dropping
// the connection it came on, while its topology changes: a replica refusing
// it (READONLY) because the master was demoted by a Sentinel failover and
// the client has not yet heard of the new one, which it does within moments
// (go-redis follows the Sentinels' +switch-master); a connection closed
// under the command (see connectionDropped), as a failover closes them; and
// on a Redis Cluster, a node sending it to another (MOVED, ASK: the lock's
// client follows no redirection, see serve's lockRedisOptions, and reloads
// the slots meanwhile), a slot being moved (TRYAGAIN) or the Cluster
// refusing writes until a failover completes (CLUSTERDOWN). A waiter treats
// them as a key it found held — it backs off and tries again within its
// wait — rather than failing every order that tries during the switch. It
// is a design choice: a client pointed at a replica for good waits out every
// wait before it fails, with the error in the wait's, instead of failing at
// once. Any other Redis error ends the wait at once, a Redis that refuses
// connections among them.
func failingOver(err error) bool { return slotMoving(err) || connectionDropped(err) }

// slotMoving reports whether err is Redis's answer that a command did not
// run because its key's slot is not served there now: the slot moved to
// another node of a Cluster (MOVED, ASK), is moving (TRYAGAIN), is served
// by no one for a moment (CLUSTERDOWN), or the node was demoted to a
// replica (READONLY).
func slotMoving(err error) bool {
	if err == nil {
		return false
	}
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	return moved || ask || redis.IsReadOnlyError(err) || redis.IsTryAgainError(err) || redis.IsClusterDownError(err)
}

// connectionDropped reports whether err is the connection a command went on
// closing under it. The server closed it (EOF, a reset): a master demoted by
// a Sentinel failover closes its clients' connections (CLIENT KILL), and so
// does a server going down. Or the client did: go-redis closes its
// connections to a demoted master, those in use included, when it hears of
// the new one. The command may have run; the attempt's cleanup has given
// back whatever it may have taken, and the next try dials afresh, which
// fails at once if the server is gone.
func connectionDropped(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// try makes one attempt and counts it.
func (w *waiter) try(ctx, tryCtx context.Context, attempt attemptFunc) (*Lease, error) {
	w.attempts.Add(1)
	return attempt(ctx, tryCtx)
}

// release returns the keys and the extra arguments of a release script on
// lockKey, the Redis key of key: with wake-on-release, the lock's waiting
// flag, and the channel and message the script publishes when the flag was
// set.
func (w *waiter) release(lockKey, key string, args ...any) ([]string, []any) {
	if w.wake == nil {
		return []string{lockKey}, args
	}
	return []string{lockKey, lockKey + waitingSuffix}, append(args, w.wake.channel, w.wake.id+key)
}

// waitingSuffix names a lock's waiting flag: the lock's key and this.
const waitingSuffix = ":waiting"

func (w *waiter) stats() Stats {
	s := Stats{Attempts: w.attempts.Load()}
	if w.wake != nil {
		s.Wakeups = w.wake.woken.Load()
		s.Waiting = w.wake.len() + w.line.waiting()
	}
	return s
}

func (w *waiter) close() error {
	if w.wake == nil {
		return nil
	}
	return w.wake.close()
}

// wakeups is a process's subscription to a lock's release channel — on
// every Redis that announces releases — fanned out by key to the waiters
// first in line. A message lost (a subscription reconnecting, a node that
// hangs) costs a waiter no more than its backoff.
//
// A Redlock's release is announced by each node where the key was flagged,
// as it is released there, and every message wakes the waiter: woken by
// the first node, it may find the key still held on the next, whose own
// message wakes it again once it is released there. A message that finds
// the waiter already woken adds nothing.
type wakeups struct {
	subs    []Subscriber
	channel string
	// channelArg is channel, boxed once for the release scripts.
	channelArg any
	// id prefixes this process's messages, so that it can skip them when
	// skipOwn is set: its waiters queue in line and are handed the key.
	id      string
	skipOwn bool
	woken   atomic.Uint64

	mu        sync.Mutex
	waiting   map[string][]chan struct{}
	pubsubs   []*redis.PubSub
	subscribe sync.Once
	listening chan struct{} // closed once listen has returned
	closed    bool
	receiving sync.WaitGroup // the goroutines reading the subscriptions
}

func newWakeups(subs []Subscriber, channel string, skipOwn bool) *wakeups {
	return &wakeups{subs: subs, channel: channel, channelArg: channel, id: rand.Text(), skipOwn: skipOwn,
		waiting: make(map[string][]chan struct{}), listening: make(chan struct{})}
}

// add puts a waiter for key in line and returns the channel that wakes it
// and the function that takes it out of line. The first waiter opens the
// subscriptions; every waiter waits for them as listen does, but never past
// ctx, its own wait. Once the lock is closed nothing is opened: the waiter
// keeps to its backoff.
func (w *wakeups) add(ctx context.Context, key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	if closed {
		return ch, func() {}
	}
	w.subscribe.Do(func() {
		go func() {
			defer close(w.listening)
			w.listen()
		}()
	})
	select {
	case <-w.listening:
	case <-ctx.Done():
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting[key] = append(w.waiting[key], ch)
	return ch, func() { w.remove(key, ch) }
}

func (w *wakeups) remove(key string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	line := w.waiting[key]
	for i, c := range line {
		if c == ch {
			line = append(line[:i], line[i+1:]...)
			break
		}
	}
	if len(line) == 0 {
		delete(w.waiting, key)
	} else {
		w.waiting[key] = line
	}
}

func (w *wakeups) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, line := range w.waiting {
		n += len(line)
	}
	return n
}

// one wakes the first waiter of key that is not already woken.
func (w *wakeups) one(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.waiting[key] {
		select {
		case ch <- struct{}{}:
			return
		default:
		}
	}
}

// subscribeWait bounds how long the first waiter of a process waits for
// the subscriptions to be sent: long enough for a Redis that answers, short
// enough that one that hangs costs the waiters little of their wait.
const subscribeWait = time.Second

// listen subscribes on every subscriber, each on its own, and returns once a
// majority of them have sent their SUBSCRIBE (so that a release announced
// after the waiter was flagged is heard), or after subscribeWait: a Redis
// that hangs (its SUBSCRIBE waits for the connection's handshake) holds up
// neither the others nor the waiters for longer. go-redis resubscribes by
// itself after a lost connection.
func (w *wakeups) listen() {
	sent := make(chan struct{}, len(w.subs))
	for _, sub := range w.subs {
		go func() {
			ps := sub.Subscribe(context.Background(), w.channel)
			sent <- struct{}{}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.closed {
				ps.Close()
				return
			}
			w.pubsubs = append(w.pubsubs, ps)
			msgs := ps.Channel()
			w.receiving.Go(func() {
				for m := range msgs {
					if len(m.Payload) >= len(w.id) && (!w.skipOwn || m.Payload[:len(w.id)] != w.id) {
						w.one(m.Payload[len(w.id):])
					}
				}
			})
		}()
	}
	timeout := time.NewTimer(subscribeWait)
	defer timeout.Stop()
	for range len(w.subs)/2 + 1 {
		select {
		case <-sent:
		case <-timeout.C:
			return
		}
	}
}

// close ends the subscriptions opened so far (one still being opened ends
// as soon as it is) and waits for their goroutines.
func (w *wakeups) close() error {
	w.mu.Lock()
	w.closed = true
	pubsubs := w.pubsubs
	w.mu.Unlock()
	var errs []error
	for _, ps := range pubsubs {
		errs = append(errs, ps.Close())
	}
	w.receiving.Wait()
	return errors.Join(errs...)
}
