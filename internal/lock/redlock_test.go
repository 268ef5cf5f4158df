package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// cluster is N independent redis-server processes and a client of each.
type cluster struct {
	procs   []*testenv.RedisProc
	clients []*redis.Client
}

func newCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{}
	for range n {
		p := testenv.StartRedis(t)
		c.procs = append(c.procs, p)
		c.clients = append(c.clients, nodeClient(t, p.Addr))
	}
	return c
}

// loadedNodeTimeout is the node timeout of the tests whose property does
// not depend on it. On a loaded machine a node's answer to a new client's
// first command (a dial, a handshake, the script loaded) can take longer
// than the service's 200 ms: the attempt then fails without a majority,
// and its grant, landing late on a node, holds the key there until it is
// given back — where a test expects the next attempt's token on every node.
const loadedNodeTimeout = time.Second

// nodeClient is a client as serve.go builds them for Redlock: no retries
// (another node answers instead) and contexts that bound every command.
func nodeClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, PoolSize: 100})
	t.Cleanup(func() { c.Close() })
	return c
}

// lock returns a Redlock on every node of the cluster, with clients of its
// own, as a separate replica would have. Its node timeout, unless opt sets
// one, is loadedNodeTimeout.
func (c *cluster) lock(t *testing.T, opt lock.RedisOptions) *lock.Redlock {
	t.Helper()
	nodes := make([]redis.Scripter, len(c.procs))
	for i, p := range c.procs {
		nodes[i] = nodeClient(t, p.Addr)
	}
	if opt.Prefix == "" {
		opt.Prefix = "test:"
	}
	if opt.NodeTimeout == 0 {
		opt.NodeTimeout = loadedNodeTimeout
	}
	l, err := lock.NewRedlock(nodes, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// holders lists, per node, the token that holds key there ("" when free;
// "down" when the node does not answer).
func (c *cluster) holders(l *lock.Redlock, key string) []string {
	out := make([]string, len(c.clients))
	for i, cl := range c.clients {
		v, err := cl.Get(context.Background(), l.Key(key)).Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			out[i] = "down"
		default:
			out[i] = v
		}
	}
	return out
}

// heldOn counts the nodes where key is held.
func (c *cluster) heldOn(l *lock.Redlock, key string) int {
	n := 0
	for _, h := range c.holders(l, key) {
		if h != "" && h != "down" {
			n++
		}
	}
	return n
}

// redlockFamily is a Redlock on three masters of its own as the
// conformance suite runs it, its waiters woken on release as the service
// has them. Each process has clients of its own.
func redlockFamily() family {
	return family{name: "redlock", claims: everything, woken: true, ttl: 2 * time.Second,
		servers: func(t *testing.T) func(*testing.T, settings) world {
			c := newCluster(t, 3)
			return func(t *testing.T, opt settings) world {
				return func() *handle {
					nodes := make([]redis.Scripter, len(c.procs))
					closeClients := make([]func() error, len(c.procs))
					for i, p := range c.procs {
						cl := nodeClient(t, p.Addr)
						nodes[i], closeClients[i] = cl, cl.Close
					}
					o := lock.RedisOptions{Prefix: "test:", TTL: opt.TTL, Wait: opt.Wait, NodeTimeout: loadedNodeTimeout,
						Subscriber: nodes[0].(*redis.Client)}
					if opt.onlyWoken {
						o.MinBackoff, o.MaxBackoff = never, never
					}
					l, err := lock.NewRedlock(nodes, o)
					if err != nil {
						t.Fatal(err)
					}
					return &handle{locker: l, crash: crashing(t, l, closeClients...),
						// Every master lost the key: it expired while its
						// holder was paused.
						lose: func(t *testing.T, lease *lock.Lease) {
							for _, cl := range c.clients {
								if err := cl.Del(context.Background(), l.Key(lease.Key())).Err(); err != nil {
									t.Fatal(err)
								}
							}
						},
						// A majority holds the key, and has the lease's token
						// as its counter.
						holds: func(lease *lock.Lease) error {
							held, fenced := 0, 0
							for _, cl := range c.clients {
								ctx := context.Background()
								if cl.Exists(ctx, l.Key(lease.Key())).Val() == 1 {
									held++
								}
								if n, err := cl.Get(ctx, l.Key(lease.Key())+":fence").Int64(); err == nil && n == lease.Fence() {
									fenced++
								}
							}
							if held < 2 || fenced < 2 {
								return errHolds(lease, "held on %d masters of 3, the token stored on %d", held, fenced)
							}
							return nil
						},
					}
				}
			}
		}}
}

func TestRedlockQuorumWithOneNodeDown(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	l := c.lock(t, lock.RedisOptions{TTL: 5 * time.Second})
	ctx := context.Background()
	c.procs[2].Kill()

	lease := obtain(t, l, "k")
	if lease.Fence() <= 0 {
		t.Errorf("fence = %d, want a token", lease.Fence())
	}
	h := c.holders(l, "k")
	if h[0] == "" || h[0] != h[1] || h[2] != "down" {
		t.Fatalf("holders = %q, want one token on nodes 0 and 1, node 2 down", h)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release with 2 of 3 nodes: %v", err)
	}
	if n := c.heldOn(l, "k"); n != 0 {
		t.Errorf("held on %d nodes after Release, want 0: %q", n, c.holders(l, "k"))
	}
}

func TestRedlockRefusedWithTwoNodesDown(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	l := c.lock(t, lock.RedisOptions{TTL: 5 * time.Second, Wait: 30 * time.Second})
	c.procs[1].Kill()
	c.procs[2].Kill()

	lease, err := l.Obtain(context.Background(), "k")
	if err == nil {
		lease.Release(context.Background())
		t.Fatal("obtained with 1 of 3 nodes up")
	}
	// No majority can answer: that is an outage to report at once, not a
	// held lock to wait 30 s for.
	if errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("err = %v, want the nodes' errors, not ErrNotObtained", err)
	}
	// A grant that arrived after the refusal is given back too.
	waitFor(t, "the live node no longer holds the lock", func() bool { return c.holders(l, "k")[0] == "" })
}

func TestRedlockMinorityIsNotHeld(t *testing.T) {
	// Not in parallel with the other tests: its leases last 300 ms.
	ctx := context.Background()
	t.Run("acquire", func(t *testing.T) {
		c := newCluster(t, 3)
		l := c.lock(t, lock.RedisOptions{TTL: 5 * time.Second, Wait: 100 * time.Millisecond})
		// Someone else holds nodes 0 and 1; node 2 is free.
		for _, cl := range c.clients[:2] {
			cl.Set(ctx, l.Key("k"), "other", time.Minute)
		}
		if _, err := l.Obtain(ctx, "k"); !errors.Is(err, lock.ErrNotObtained) {
			t.Fatalf("Obtain against a majority held elsewhere = %v, want ErrNotObtained", err)
		}
		if h := c.holders(l, "k"); h[0] != "other" || h[1] != "other" || h[2] != "" {
			t.Errorf("holders = %q: the share taken on node 2 must be given back, the others left alone", h)
		}
	})
	t.Run("renew", func(t *testing.T) {
		c := newCluster(t, 3)
		l := c.lock(t, lock.RedisOptions{TTL: 300 * time.Millisecond, NodeTimeout: 200 * time.Millisecond})
		lease := obtain(t, l, "k")
		// Nodes 0 and 1 lose the lock: someone else holds it there now (they
		// restarted empty, say, and another client took it). Obtain returns
		// once a majority granted the lock, so a grant may still be on its
		// way; overwriting rather than deleting keeps a late one from
		// landing, whichever node it was for.
		for _, cl := range c.clients[:2] {
			cl.Set(ctx, l.Key("k"), "other", time.Minute)
		}
		select {
		case <-lease.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("lease held on 1 of 3 nodes was not given up")
		}
		if cause := context.Cause(lease.Context()); !errors.Is(cause, lock.ErrNotHeld) {
			t.Errorf("cause = %v, want ErrNotHeld", cause)
		}
		if err := lease.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("Release = %v, want ErrNotHeld", err)
		}
		// Release returns once the majority has said no; node 2's share is
		// deleted by the call already on its way there, well before the
		// share's own TTL could run out.
		deadline := time.Now().Add(100 * time.Millisecond)
		for c.holders(l, "k")[2] != "" && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if h := c.holders(l, "k"); h[0] != "other" || h[1] != "other" || h[2] != "" {
			t.Errorf("holders 100ms after Release = %q, want node 2 free and the others left alone", h)
		}
	})
	t.Run("majority keeps it", func(t *testing.T) {
		c := newCluster(t, 3)
		const ttl = 300 * time.Millisecond
		// A node timeout well above the default TTL/10 (30ms), so that on a
		// loaded machine nodes 1 and 2 both take their grant.
		l := c.lock(t, lock.RedisOptions{TTL: ttl, NodeTimeout: 200 * time.Millisecond})
		lease := obtain(t, l, "k")
		// Node 0 loses the lock to someone else; as above, overwritten so
		// that a grant still on its way there cannot land.
		c.clients[0].Set(ctx, l.Key("k"), "other", time.Minute)
		time.Sleep(3 * ttl) // several renewals
		if err := lease.Context().Err(); err != nil {
			t.Fatalf("lease on 2 of 3 nodes was given up: %v", context.Cause(lease.Context()))
		}
		if h := c.holders(l, "k"); h[0] != "other" || h[1] == "" || h[1] != h[2] {
			t.Errorf("holders = %q, want node 0 someone else's and the lease renewed on nodes 1 and 2", h)
		}
		if err := lease.Release(ctx); err != nil {
			t.Errorf("Release: %v", err)
		}
	})
}

func TestRedlockValidityCountsElapsedTime(t *testing.T) {
	// Not in parallel with the other tests: its margins are fractions of a second.
	ctx := context.Background()
	// Nodes 1 and 2 hang for a while: the majority answers only then.
	const hang = 450 * time.Millisecond
	c := newCluster(t, 3)
	stall := func() {
		for _, p := range c.procs[1:] {
			p.Pause()
			time.AfterFunc(hang, p.Resume)
		}
	}

	t.Run("shortened", func(t *testing.T) {
		const ttl = 2 * time.Second
		l := c.lock(t, lock.RedisOptions{TTL: ttl, NodeTimeout: time.Second})
		stall()
		lease := obtain(t, l, "a")
		defer lease.Release(ctx)
		// The lease counts from when the first command was sent, not from
		// when the majority answered, and leaves room for clock drift. (A
		// third of the hang is slack for the scheduler.)
		drift := ttl/100 + 2*time.Millisecond
		if left, most := time.Until(lease.Until()), ttl-drift-hang*2/3; left > most {
			t.Errorf("validity left %v, want at most TTL − elapsed − drift ≈ %v", left, ttl-drift-hang)
		}
	})
	t.Run("used up", func(t *testing.T) {
		// All three grant the lock, but the majority answered after the TTL:
		// no time would be left to work in.
		const ttl = hang * 2 / 3
		l := c.lock(t, lock.RedisOptions{TTL: ttl, NodeTimeout: time.Second})
		stall()
		lease, err := l.TryObtain(ctx, "b")
		if err == nil {
			lease.Release(ctx)
			t.Fatal("obtained with no validity left")
		}
		if !errors.Is(err, lock.ErrNotObtained) {
			t.Fatalf("err = %v, want ErrNotObtained", err)
		}
		// Given back: at once where the grant came with the majority, as
		// it lands where it came later (nodes 1 and 2 resume together; one
		// of them may answer after the decision). Either way well before
		// the shares' own TTL, counted from the resume, frees them.
		deadline := time.Now().Add(ttl / 2)
		for c.heldOn(l, "b") != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if h := c.holders(l, "b"); h[0]+h[1]+h[2] != "" {
			t.Errorf("holders %q after giving up, want none", h)
		}
	})
}

func TestRedlockReleaseCleansAllNodes(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	// A node timeout that a loaded machine meets: a node that does not
	// answer within it never gets the grant.
	l := c.lock(t, lock.RedisOptions{Wait: 10 * time.Second, NodeTimeout: 5 * time.Second})
	lease := obtain(t, l, "k")
	// Obtain returns once a majority granted the lock; the third node's
	// grant lands a moment later.
	waitFor(t, "all three nodes hold the lock", func() bool { return c.heldOn(l, "k") == 3 })
	if h := c.holders(l, "k"); h[0] != h[1] || h[1] != h[2] {
		t.Fatalf("holders = %q, want the same token on all three", h)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Release returns once a majority released; the third follows.
	waitFor(t, "no node holds the lock", func() bool { return c.heldOn(l, "k") == 0 })
	next := obtain(t, l, "k")
	if next.Fence() <= lease.Fence() {
		t.Errorf("next fence %d, want > %d", next.Fence(), lease.Fence())
	}
	next.Release(context.Background())
}

func TestRedlockFencingSurvivesEmptyRestarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCluster(t, 3)
	l := c.lock(t, lock.RedisOptions{TTL: 5 * time.Second, Wait: 10 * time.Second})
	// A long history: counters above any node's clock in microseconds (and
	// below 2^53, where Lua's numbers stay exact), so a node restarted empty
	// (whose counter starts from its clock) is behind, and only the majority
	// rule keeps tokens rising.
	const history = int64(1) << 52
	for _, cl := range c.clients {
		if err := cl.Set(ctx, l.Key("k")+":fence", history, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	last := history
	take := func(step string) {
		t.Helper()
		for range 3 {
			lease, err := l.Obtain(ctx, "k")
			if err != nil {
				t.Fatalf("%s: %v (holders %q)", step, err, c.holders(l, "k"))
			}
			if lease.Fence() <= last {
				t.Fatalf("%s: token %d after %d: not increasing", step, lease.Fence(), last)
			}
			last = lease.Fence()
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("%s: %v", step, err)
			}
		}
	}
	take("all nodes up")
	c.procs[2].Kill()
	take("node 2 down")
	c.procs[2].Restart()
	take("node 2 back empty")
	// A master restarted empty that the last token reached only with one
	// other (the third's share came too late for the fence round) leaves it
	// on a minority: with counters above any clock, the next majority may
	// read a smaller one, which MySQL's fence check then refuses (see
	// Redlock). The majority rule covers a master outside the majority that
	// stored it, and any master once every one has it.
	wiped := 0
	for i, cl := range c.clients {
		if n, err := cl.Get(ctx, l.Key("k")+":fence").Int64(); err == nil && n < last {
			wiped = i
			break
		}
	}
	c.procs[wiped].Kill()
	c.procs[wiped].Restart()
	take(fmt.Sprintf("node %d restarted empty", wiped))
	down := (wiped + 1) % len(c.procs)
	c.procs[down].Kill()
	take(fmt.Sprintf("node %d down, node %d restarted empty", down, wiped))
	if last != history+15 {
		t.Errorf("last token %d, want %d: one per acquisition", last, history+15)
	}
}

func TestRedlockMutualExclusionWhileANodeDies(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	const replicas, workers = 3, 60
	locks := make([]*lock.Redlock, replicas)
	for i := range locks {
		locks[i] = c.lock(t, lock.RedisOptions{TTL: 2 * time.Second, Wait: 30 * time.Second})
	}
	var (
		inside, maxInside atomic.Int32
		mu                sync.Mutex
		fences            []int64
		wg                sync.WaitGroup
		done              atomic.Int32
	)
	for i := range workers {
		wg.Go(func() {
			lease, err := locks[i%replicas].Obtain(context.Background(), "sku:1")
			if err != nil {
				t.Error(err)
				return
			}
			if n := inside.Add(1); n > maxInside.Load() {
				maxInside.Store(n)
			}
			mu.Lock()
			fences = append(fences, lease.Fence())
			mu.Unlock()
			time.Sleep(time.Millisecond)
			inside.Add(-1)
			if err := lease.Release(context.Background()); err != nil {
				t.Error(err)
			}
			done.Add(1)
		})
	}
	for deadline := time.Now().Add(30 * time.Second); done.Load() < workers/3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	c.procs[1].Kill()
	wg.Wait()
	if got := maxInside.Load(); got != 1 {
		t.Errorf("%d holders inside at once, want 1", got)
	}
	if len(fences) != workers {
		t.Fatalf("%d of %d workers got the lock", len(fences), workers)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d = %d after %d: not increasing in holding order", i, fences[i], fences[i-1])
		}
	}
}

// wakingLock is a Redlock on every node of the cluster, with clients of its
// own, whose waiters are woken by releases.
func (c *cluster) wakingLock(t *testing.T, opt lock.RedisOptions) *lock.Redlock {
	t.Helper()
	nodes := make([]redis.Scripter, len(c.procs))
	for i, p := range c.procs {
		nodes[i] = nodeClient(t, p.Addr)
	}
	opt.Prefix = "test:"
	opt.Subscriber = nodes[0].(*redis.Client)
	l, err := lock.NewRedlock(nodes, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A hung first master must not stall the waiters while a majority is
// healthy: they flag the key and hear its release on every node.
func TestRedlockWaitersSurviveHungFirstNode(t *testing.T) {
	// Not in parallel with the other tests: six acquisitions share the 2 s
	// wait, and each split vote between the two replicas costs a node
	// timeout, as the hung node never answers.
	ctx := context.Background()
	t.Run("contended", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, 3)
		const replicas, workers = 2, 6
		locks := make([]*lock.Redlock, replicas)
		for i := range locks {
			// The service's default wait. A split vote waits for the hung
			// node's reply, the node timeout (TTL/10), before it is lost.
			locks[i] = c.wakingLock(t, lock.RedisOptions{TTL: time.Second, Wait: 2 * time.Second})
		}
		c.procs[0].Pause()
		t.Cleanup(c.procs[0].Resume)
		var (
			inside, maxInside atomic.Int32
			wg                sync.WaitGroup
		)
		for i := range workers {
			wg.Go(func() {
				lease, err := locks[i%replicas].Obtain(ctx, "sku:1")
				if err != nil {
					t.Errorf("worker %d: %v", i, err)
					return
				}
				if n := inside.Add(1); n > maxInside.Load() {
					maxInside.Store(n)
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					t.Errorf("worker %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		if got := maxInside.Load(); got > 1 {
			t.Errorf("%d holders inside at once, want 1", got)
		}
	})
	t.Run("woken", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, 3)
		a := c.wakingLock(t, lock.RedisOptions{TTL: 5 * time.Second})
		b := c.wakingLock(t, lock.RedisOptions{TTL: 5 * time.Second, MinBackoff: never, MaxBackoff: never, Wait: time.Minute})
		c.procs[0].Pause()
		t.Cleanup(c.procs[0].Resume)

		holder := obtain(t, a, "k")
		got := obtainAsync(b, "k")
		waitFor(t, "the waiter listens on nodes 1 and 2 and flagged the key there", func() bool {
			for _, cl := range c.clients[1:] {
				if cl.PubSubNumSub(ctx, "test:released").Val()["test:released"] != 1 ||
					cl.Exists(ctx, b.Key("k")+":waiting").Val() != 1 {
					return false
				}
			}
			return true
		})
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lease := received(t, got)
		defer lease.Release(ctx)
		// Its backoff is an hour: every try after the first followed a
		// wake-up. (Each node announces the release as it releases: woken
		// by the first, the waiter may find the key still held on the
		// second, which wakes it again.)
		if s := b.Stats(); s.Wakeups < 1 || s.Attempts > 1+s.Wakeups {
			t.Errorf("stats = %+v, want a try after each wakeup and none without", s)
		}
	})
}

// A waiter keeps to its wait even when the subscriptions cannot be opened:
// with two masters of three hung, the first waiter of a process must not wait
// for them (up to a second) past its own wait.
func TestRedlockWaitKeepsItsBoundWithMajorityHung(t *testing.T) {
	// Not in parallel with the other tests: its margin is 600 ms.
	ctx := context.Background()
	c := newCluster(t, 3)
	holder := c.wakingLock(t, lock.RedisOptions{TTL: 10 * time.Second})
	lease, err := holder.Obtain(ctx, "sku:1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Release(ctx) })
	const wait = 200 * time.Millisecond
	waiter := c.wakingLock(t, lock.RedisOptions{TTL: 10 * time.Second, Wait: wait})
	for _, p := range c.procs[1:] {
		p.Pause()
		t.Cleanup(p.Resume)
	}
	start := time.Now()
	_, err = waiter.Obtain(ctx, "sku:1")
	took := time.Since(start)
	if !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("Obtain with the key held and two masters hung: %v, want ErrNotObtained", err)
	}
	// The subscriptions alone would hold it for a second.
	if took > wait+600*time.Millisecond {
		t.Errorf("Obtain gave up after %s; its wait is %s", took.Round(time.Millisecond), wait)
	}
}
