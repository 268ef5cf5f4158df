package lock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed fence.lua
	fenceLua string
	//go:embed obtain.lua
	obtainLua string
	//go:embed raise.lua
	raiseLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string
	//go:embed redlock_obtain.lua
	redlockObtainLua string
	//go:embed redlock_fence.lua
	redlockFenceLua string
	//go:embed reentrant_obtain.lua
	reentrantObtainLua string
	//go:embed reentrant_release.lua
	reentrantReleaseLua string
	//go:embed reentrant_renew.lua
	reentrantRenewLua string

	// The scripts that draw a fencing token start with fence.lua, which
	// says how.
	obtainScript  = redis.NewScript(fenceLua + obtainLua)
	raiseScript   = redis.NewScript(raiseLua)
	releaseScript = redis.NewScript(releaseLua)
	renewScript   = redis.NewScript(renewLua)

	redlockObtainScript = redis.NewScript(fenceLua + redlockObtainLua)
	redlockFenceScript  = redis.NewScript(redlockFenceLua)
)

// RedisOptions configures a Redis lock. Zero fields take the defaults.
type RedisOptions struct {
	// Prefix is put before every key; default "shop:lock:".
	Prefix string
	// TTL is the lease length; default 5s. The watchdog renews at TTL/3.
	TTL time.Duration
	// Wait bounds how long Obtain waits for a held key; default 2s.
	Wait time.Duration
	// MinBackoff and MaxBackoff bound the exponential backoff between tries;
	// defaults 2ms and 100ms.
	MinBackoff, MaxBackoff time.Duration
	// NodeTimeout bounds each node's reply to a Redlock; default TTL/10, at
	// most 200ms: a dead node must not eat the lease. A Redlock goes on as
	// soon as a majority has answered, so it waits this long only when the
	// outcome hangs on a slow node.
	NodeTimeout time.Duration
	// Subscriber, when set, turns on wake-on-release: a release publishes
	// on the channel Prefix+"released", and waiters — through one
	// subscription per lock — retry as soon as their key is released instead
	// of when their backoff ends. Without it waiters poll with backoff. A
	// Redlock subscribes on every node instead (see NewRedlock).
	Subscriber Subscriber
	// NoFencing takes the lock without a fencing token (Lease.Fence is 0)
	// and keeps no counter key: for mutexes that guard no writes a database
	// checks, such as a cache rebuild.
	NoFencing bool
	// After is the timer the watchdog sleeps on, and waits for a
	// renewal's answer on; default time.After. A test freezes a holder, as a
	// stop-the-world pause would, by handing it a timer that never fires.
	After func(time.Duration) <-chan time.Time
}

func (opt RedisOptions) withDefaults() RedisOptions {
	if opt.Prefix == "" {
		opt.Prefix = "shop:lock:"
	}
	if opt.TTL <= 0 {
		opt.TTL = 5 * time.Second
	}
	if opt.Wait <= 0 {
		opt.Wait = 2 * time.Second
	}
	if opt.MinBackoff <= 0 {
		opt.MinBackoff = 2 * time.Millisecond
	}
	if opt.MaxBackoff < opt.MinBackoff {
		opt.MaxBackoff = max(100*time.Millisecond, opt.MinBackoff)
	}
	if opt.NodeTimeout <= 0 {
		opt.NodeTimeout = min(opt.TTL/10, 200*time.Millisecond)
	}
	return opt
}

// key returns the Redis key that holds the lock on key.
func (opt RedisOptions) key(key string) string { return opt.Prefix + "{" + key + "}" }

// obtainKeys returns the keys of an obtain script on key: the lock, its
// waiting flag and, with fencing, its counter.
func (opt RedisOptions) obtainKeys(key string) []string {
	k := opt.key(key)
	if opt.NoFencing {
		return []string{k, k + waitingSuffix}
	}
	return []string{k, k + waitingSuffix, k + fenceSuffix}
}

// fenceSuffix names a lock's fencing counter: the lock's key and this.
const fenceSuffix = ":fence"

// maxFence bounds the fencing tokens the scripts can count: Lua's numbers
// are exact below it.
const maxFence = 1 << 53

// raising checks a RaiseFence of key to atLeast.
func (opt RedisOptions) raising(key string, atLeast int64) error {
	switch {
	case opt.NoFencing:
		return fmt.Errorf("lock: raise fence %q: the lock keeps no fencing counter", key)
	case atLeast < 0 || atLeast >= maxFence:
		return fmt.Errorf("lock: raise fence %q: %d is not in [0, 2^53)", key, atLeast)
	}
	return nil
}

// Redis is a lock held as a lease in one Redis server.
//
// An attempt is one round trip, obtain.lua: SET key token NX PX ttl and, if
// that took the lock, draw the holder's fencing token from the key's
// counter: max(counter + 1, the server's clock in microseconds), stored
// back. Every later holder's token is larger, and a counter that Redis lost
// or restored from an older snapshot still issues tokens above every one
// handed out before, as long as the server's clock moves forward (RaiseFence
// repairs a counter the clock cannot cover). An attempt by a waiter that
// finds the lock held flags it as waited for in the same round trip (with
// wake-on-release). Release and renewal are compare-and-delete and
// compare-and-PEXPIRE scripts, so a holder whose lease expired can neither
// free nor extend the lock of whoever holds it now.
//
// An attempt whose reply is lost (the connection failed, the try's context
// ended) may still have taken the key, and a grant that arrives after the
// lease it granted ran out is of no use: either way the attempt gives the
// key back at once, so that it is not held for a whole TTL by a token
// nobody has. A release whose reply is lost is retried by the lock itself
// (see Client).
//
// Keys are hash-tagged ("{sku:42}") so a key and its counter share a slot on
// Redis Cluster.
type Redis struct {
	client   Client
	opt      RedisOptions
	waiter   *waiter
	renewals renewals
	// ttlArg is the lease length in ms, boxed once for the scripts.
	ttlArg any
}

// Client is what a Redis lock needs of its go-redis client; *redis.Client
// and *redis.ClusterClient have it.
//
// Create the client with MaxRetries: -1 — and a *redis.ClusterClient with
// MaxRedirects: -1 as well, since it retries a command whose reply was lost
// by itself, up to MaxRedirects times — so that go-redis never retries a
// command by itself: a command whose reply was lost (EOF, a reset
// connection, a read timeout) may have run, and only the lock knows what a
// second run means. go-redis would retry a release that had released the
// key, and the retry, finding no key, would report the lease lost; it would
// retry an obtain that had taken the key, and the retry would find it held
// — by the token of the try whose reply was lost — and wait for it. The lock
// retries a release itself and gives an obtain's key back (see Redis). Set
// ContextTimeoutEnabled too, so that a renewal stops waiting when the lease
// runs out rather than at the read timeout (the watchdog cancels the lease
// then in any case).
type Client interface {
	redis.Scripter
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
}

// NewRedis returns a Redis lock on client, which should not retry commands
// by itself (see Client). Close it when done if opt.Subscriber is set.
func NewRedis(client Client, opt RedisOptions) *Redis {
	opt = opt.withDefaults()
	return &Redis{client: client, opt: opt, waiter: newWaiter(opt, true, opt.subscribers()), ttlArg: opt.TTL.Milliseconds()}
}

// subscribers returns opt.Subscriber, if set, as the one subscriber of a
// lock in one Redis.
func (opt RedisOptions) subscribers() []Subscriber {
	if opt.Subscriber == nil {
		return nil
	}
	return []Subscriber{opt.Subscriber}
}

// Key returns the Redis key that holds the lock on key.
func (r *Redis) Key(key string) string { return r.opt.key(key) }

// FenceKey returns the Redis key of key's fencing counter.
func (r *Redis) FenceKey(key string) string { return r.Key(key) + fenceSuffix }

// RaiseFence raises key's fencing counter to at least atLeast, and never
// lowers it, so that the next acquisition's token is above atLeast. It is
// the repair for a counter that went back further than the server's clock
// can cover (a replica promoted on a machine whose clock is behind): a
// caller whose write the database refused because the row's fence is at or
// above its token raises the counter to that fence. atLeast must be below
// 2^53.
func (r *Redis) RaiseFence(ctx context.Context, key string, atLeast int64) error {
	if err := r.opt.raising(key, atLeast); err != nil {
		return err
	}
	_, _, err := retryLost(ctx, func(ctx context.Context) (int64, error) {
		return raiseScript.Run(ctx, r.client, []string{r.FenceKey(key)}, atLeast).Int64()
	})
	if err != nil {
		return fmt.Errorf("lock: raise fence %q: %w", key, err)
	}
	return nil
}

// Stats reports what the lock's waiters have done so far.
func (r *Redis) Stats() Stats { return r.waiter.stats() }

// Close ends the subscription to releases, if there is one.
func (r *Redis) Close() error { return r.waiter.close() }

// Obtain takes the lock on key. While the key is held by someone else it
// retries with exponential backoff and full jitter — or at once when the
// release is announced — for at most the configured wait and never past
// ctx; then it returns an error wrapping ErrNotObtained and the context's
// cause. A Redis error ends the wait at once, but for a failover's — a
// demoted master's refusal, a connection closed under the attempt: the
// waiter backs off and tries again (see failingOver).
//
// The lease's watchdog renews it every TTL/3 until Release. If a renewal finds
// the lock gone, or the lease runs out while Redis cannot be reached, the
// lease's Context is cancelled with a cause wrapping ErrNotHeld.
func (r *Redis) Obtain(ctx context.Context, key string) (*Lease, error) {
	return r.ObtainWhile(ctx, key, nil)
}

// ObtainWhile is Obtain for a caller whose reason to wait may go away while
// the key is held: when the key has been released, before trying again, it
// calls still, and gives up with its error if it returns one. A buyer waiting for a SKU that the holder may be
// selling out checks the stock there. still may be nil.
func (r *Redis) ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*Lease, error) {
	return r.waiter.obtain(ctx, key, func(ctx, tryCtx context.Context) (*Lease, error) {
		return r.attempt(ctx, tryCtx, key, true)
	}, still)
}

// TryObtain takes the lock on key if it is free and otherwise returns
// ErrNotObtained at once. The lease is watched as Obtain's is.
func (r *Redis) TryObtain(ctx context.Context, key string) (*Lease, error) {
	return r.waiter.tryObtain(ctx, key, func(ctx, tryCtx context.Context) (*Lease, error) {
		return r.attempt(ctx, tryCtx, key, false)
	})
}

// attempt runs the obtain script once, under tryCtx; the lease lives on ctx.
// A key held by someone else is ErrNotObtained; wait says the caller will
// wait for it.
func (r *Redis) attempt(ctx, tryCtx context.Context, key string, wait bool) (*Lease, error) {
	a := r.newAttempt(key, rand.Text(), wait)
	start := time.Now()
	fence, err := r.take(tryCtx, a)
	if err := settle(tryCtx, key, start, r.opt.TTL, fence, err, func() { r.cleanup(ctx, a) }); err != nil {
		return nil, err
	}
	a.lease = leaseIn(ctx, r.opt, &r.renewals, key, fence, start, a.release, a.renew)
	return a.lease, nil
}

// redisAttempt is one attempt on a key and, if it takes the lock, its
// lease: the scripts' keys and arguments, built once for the obtain, the
// renewals and the release (each string boxed in an interface is an
// allocation).
type redisAttempt struct {
	r     *Redis
	lease *Lease
	// keys are obtain.lua's KEYS: the lock, its waiting flag and, with
	// fencing, its counter; release.lua's are the first one or two.
	keys       []string
	obtainArgs [3]any
	// releaseArgs are release.lua's ARGV: the token and, with
	// wake-on-release, the channel and the message.
	releaseArgs [3]any
	nRelease    int
	// renewArgs are renew.lua's ARGV.
	renewArgs [2]any
	// names are the lock's key, its waiting flag's and its counter's,
	// which keys and releaseKeys slice.
	names [3]string
}

// newAttempt builds the attempt's keys, all three in one string, and the
// scripts' arguments.
func (r *Redis) newAttempt(key, token string, wait bool) *redisAttempt {
	a := &redisAttempt{r: r}
	n := len(r.opt.Prefix) + len(key) + 2
	all := r.opt.Prefix + "{" + key + "}" + waitingSuffix + r.opt.Prefix + "{" + key + "}" + fenceSuffix
	a.names = [3]string{all[:n], all[:n+len(waitingSuffix)], all[n+len(waitingSuffix):]}
	a.keys = a.names[:]
	if r.opt.NoFencing {
		a.keys = a.names[:2]
	}
	t := any(token)
	a.obtainArgs = [3]any{t, r.ttlArg, r.waiter.flagArg(wait)}
	a.renewArgs = [2]any{t, r.ttlArg}
	a.releaseArgs[0], a.nRelease = t, 1
	if w := r.waiter.wake; w != nil {
		a.releaseArgs[1], a.releaseArgs[2], a.nRelease = w.channelArg, w.id+key, 3
	}
	return a
}

// releaseKeys are release.lua's KEYS: the lock and, with wake-on-release,
// its waiting flag.
func (a *redisAttempt) releaseKeys() []string {
	if a.r.waiter.wake == nil {
		return a.names[:1]
	}
	return a.names[:2]
}

// release is the lease's: it frees the lock and reports whether it was
// still held.
func (a *redisAttempt) release(ctx context.Context) (bool, error) {
	n, err := a.r.release(ctx, a)
	a.lease.contended.Store(n == releasedAnnounced)
	return n >= released, err
}

// renew is the lease's: it extends the lock and returns 1 if it was held.
func (a *redisAttempt) renew(ctx context.Context) (int64, error) {
	return renewScript.Run(ctx, a.r.client, a.names[:1], a.renewArgs[:]...).Int64()
}

// settle decides an attempt in one Redis that started at start, from the
// obtain script's reply (fence, err): nil when it holds the lock. After an
// error — the script may have run although its reply was lost, or failed
// halfway — and after a grant that arrived when its lease had already run
// out (a slow or paused Redis: its holder might write before the watchdog
// noticed), it calls cleanup, which gives back what the attempt may hold,
// and the attempt has failed: the second case is ErrNotObtained, for the
// caller to try again within its wait.
func settle(tryCtx context.Context, key string, start time.Time, ttl time.Duration, fence int64, err error, cleanup func()) error {
	switch {
	case err != nil:
		cleanup()
		if ended(tryCtx) {
			return notObtained(tryCtx)
		}
		return fmt.Errorf("lock: obtain %q: %w", key, err)
	case fence < 0:
		return ErrNotObtained
	case !time.Now().Before(start.Add(ttl)):
		cleanup()
		return ErrNotObtained
	}
	return nil
}

// leaseIn is a lease on key in one Redis, taken at start: release frees the
// lock and reports whether it was still held; renew extends it and returns 1
// if it was held. rs, if not nil, starts its watchdog (see Lease.watch).
func leaseIn(ctx context.Context, opt RedisOptions, rs *renewals, key string, fence int64, start time.Time,
	release func(context.Context) (bool, error), renew func(context.Context) (int64, error)) *Lease {
	l := newLease(ctx, key, fence, func(ctx context.Context) error {
		released, err := release(ctx)
		switch {
		case err != nil:
			return fmt.Errorf("lock: release %q: %w", key, err)
		case !released:
			return fmt.Errorf("lock: release %q: %w", key, ErrNotHeld)
		}
		return nil
	})
	l.watch(rs, opt.After, opt.TTL/3, start.Add(opt.TTL), func(ctx context.Context, validUntil time.Time) (time.Time, error) {
		start := time.Now()
		ctx, cancel := context.WithDeadline(ctx, validUntil)
		defer cancel()
		n, err := renew(ctx)
		switch {
		case err != nil:
			return validUntil, err
		case n != 1:
			return validUntil, ErrNotHeld
		}
		// Reckoned from before the command was sent: never overestimated.
		return start.Add(opt.TTL), nil
	})
	return l
}

// take sets a's key's lock to its token if it is free and returns the
// fencing token (0 without fencing), or -1 if the lock is held; then, if the
// attempt waits and waiters are woken on release, it flags the lock as
// waited for.
func (r *Redis) take(ctx context.Context, a *redisAttempt) (int64, error) {
	if r.opt.NoFencing && a.obtainArgs[2] == flagOff {
		// No counter and no flag: a plain SET NX does it.
		ok, err := r.client.SetNX(ctx, a.names[0], a.obtainArgs[0], r.opt.TTL).Result()
		if err != nil || !ok {
			return -1, err
		}
		return 0, nil
	}
	return obtainScript.Run(ctx, r.client, a.keys, a.obtainArgs[:]...).Int64()
}

// cleanupTimeout bounds the clean-up of an attempt that failed: long enough
// for a release and its retries, short enough not to hold up the caller
// for long when Redis does not answer (the key then expires on its own).
const cleanupTimeout = time.Second

// cleanup gives back the lock after an attempt a that may hold it, if a's
// token holds it, on a context of its own: the attempt's may have ended.
func (r *Redis) cleanup(ctx context.Context, a *redisAttempt) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = r.release(ctx, a)
}

// What release.lua answers when the caller held the lock.
const (
	released          = 1
	releasedAnnounced = 2 // and a waiter was told
)

// release deletes a's key's lock if a's token holds it and announces it
// when waiters are woken on release. It returns release.lua's answer; a
// "not held" that follows a try whose reply was lost is that try's release.
func (r *Redis) release(ctx context.Context, a *redisAttempt) (int64, error) {
	return releaseLost(ctx, a.runRelease)
}

// runRelease runs release.lua once.
func (a *redisAttempt) runRelease(ctx context.Context) (int64, error) {
	return releaseScript.Run(ctx, a.r.client, a.releaseKeys(), a.releaseArgs[:a.nRelease]...).Int64()
}

// releaseLost runs a release script (release.lua) with retryLost and
// answers released when a retry finds the lock gone: the try whose reply
// was lost released it (and whether it told a waiter is not known).
func releaseLost(ctx context.Context, release func(context.Context) (int64, error)) (int64, error) {
	n, lost, err := retryLost(ctx, release)
	if err == nil && lost && n == 0 {
		n = released
	}
	return n, err
}

// retryTries bounds the tries of a script that retryLost retries after a
// lost reply; movedTries those after an answer that the key's slot moved.
const (
	retryTries = 3
	movedTries = 6
)

// movedPause is how long retryLost lets a client that was told its key's
// slot has moved (MOVED, READONLY…) learn where it went before trying
// again, times the tries so far: the answer has the client reload the
// slots in the background, which a loaded machine may take a few hundred
// milliseconds to finish (50 ms to 250 ms between tries, 750 ms in all).
const movedPause = 50 * time.Millisecond

// retryLost runs script — one whose second run, after a first that
// succeeded, changes nothing: a release, a raise — until it gets Redis's
// answer: again while its reply was lost on the way (see replyLost), at
// most retryTries times, and, after a pause, while the answer says that
// the key's slot is moving to another node and the script did not run
// (see slotMoving), at most movedTries times; and while ctx lasts. It
// reports whether a try's reply was lost, after which the answer may be
// the answer to a script that had already run.
func retryLost(ctx context.Context, script func(context.Context) (int64, error)) (n int64, lost bool, err error) {
	for try, moved := 1, 0; ; try++ {
		n, err = script(ctx)
		switch {
		case try >= retryTries+movedTries:
		case try-moved < retryTries && replyLost(ctx, err):
			lost = true
			continue
		case moved < movedTries-1 && slotMoving(err) && sleep(ctx, time.Duration(moved+1)*movedPause):
			moved++
			continue
		}
		return n, lost, err
	}
}

// sleep waits d, or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// replyLost reports whether err leaves it unknown whether a command ran:
// the connection failed after the command may have been sent (EOF, a reset,
// a read timeout). Not when Redis answered, even with an error, nor when no
// connection was made (refused, the pool exhausted or closed), nor when ctx
// has ended, which ends the tries.
func replyLost(ctx context.Context, err error) bool {
	if err == nil {
		return false // before the variables that errors.As moves to the heap
	}
	var (
		answer redis.Error
		op     *net.OpError
	)
	switch {
	case ended(ctx), errors.As(err, &answer),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.As(err, &op) && op.Op == "dial":
		return false
	}
	return true
}
