package lock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// lockClientOn is a client of the deployment as the order lock has it
// (serve's newLockRedis): go-redis never retries a command by itself (see
// lock.Client) and ends a command at its context's deadline.
func lockClientOn(t *testing.T, topo testenv.Topology) redis.UniversalClient {
	t.Helper()
	opt := topo.Options()
	opt.MaxRetries = -1
	opt.MaxRedirects = -1 // as serve's: a ClusterClient retries lost replies itself otherwise
	opt.ContextTimeoutEnabled = true
	return topo.Client(t, opt)
}

// lockRedisOn returns a lock client of the deployment and a key prefix of
// the test's own, whose keys are deleted from every master at the end.
func lockRedisOn(t *testing.T, topo testenv.Topology) (redis.UniversalClient, string) {
	t.Helper()
	_, prefix := testenv.RedisOn(t, topo)
	return lockClientOn(t, topo), prefix
}

// newRedisOn is newRedis on the deployment.
func newRedisOn(t *testing.T, topo testenv.Topology, opt lock.RedisOptions) (*lock.Redis, redis.UniversalClient) {
	t.Helper()
	c, prefix := lockRedisOn(t, topo)
	opt.Prefix = prefix
	return lock.NewRedis(c, opt), c
}

// newReentrantOn is newReentrant on the deployment.
func newReentrantOn(t *testing.T, topo testenv.Topology, opt lock.RedisOptions) (*lock.Reentrant, redis.UniversalClient) {
	t.Helper()
	c, prefix := lockRedisOn(t, topo)
	opt.Prefix = prefix
	l := lock.NewReentrant(c, opt)
	t.Cleanup(func() { l.Close() })
	return l, c
}

// wokenProcess is a process's lock on the deployment, with keys under
// prefix, whose waiters are woken on release and otherwise wait an hour:
// one that obtains the lock within a test was woken. It returns the lock
// and its client.
func wokenProcess(t *testing.T, topo testenv.Topology, prefix string) (*lock.Redis, redis.UniversalClient) {
	t.Helper()
	c := lockClientOn(t, topo)
	l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, Subscriber: c, MinBackoff: never, MaxBackoff: never, Wait: time.Minute})
	t.Cleanup(func() { l.Close() })
	return l, c
}

// clusterMasters is how many masters the test Cluster has.
const clusterMasters = 3

// keysOnEachMaster returns a key per master whose lock (by l.Key) lives
// there: on a Cluster, one on each of its masters; elsewhere, three keys.
func keysOnEachMaster(t *testing.T, c redis.UniversalClient, l interface{ Key(string) string }) []string {
	t.Helper()
	cluster, ok := c.(*redis.ClusterClient)
	if !ok {
		return []string{"sku:1", "sku:2", "sku:3"}
	}
	ctx := context.Background()
	var keys []string
	seen := map[string]bool{}
	for i := 0; len(keys) < clusterMasters; i++ {
		if i == 1000 {
			t.Fatalf("the Cluster's masters serve the keys of %d of its %d masters", len(keys), clusterMasters)
		}
		key := "sku:" + strconv.Itoa(i)
		node, err := cluster.MasterForKey(ctx, l.Key(key))
		if err != nil {
			t.Fatal(err)
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			keys = append(keys, key)
		}
	}
	return keys
}

// subscribers counts the subscriptions to channel: on a Cluster, over
// every node, as a classic subscription may be on any of them.
func subscribers(c redis.UniversalClient, channel string) int64 {
	ctx := context.Background()
	cluster, ok := c.(*redis.ClusterClient)
	if !ok {
		return c.PubSubNumSub(ctx, channel).Val()[channel]
	}
	var (
		mu sync.Mutex
		n  int64
	)
	cluster.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		n += node.PubSubNumSub(ctx, channel).Val()[channel]
		return nil
	})
	return n
}

// keyLocker is a lock as TestScriptsKeepToOneSlot drives it: the Redis
// lock, with and without fencing, and the reentrant lock for one owner.
type keyLocker interface {
	Obtain(context.Context, string) (*lock.Lease, error)
	Key(string) string
}

// Every script a lock runs in one Redis touches keys of one hash slot,
// so that a Redis Cluster runs it rather than refusing it with CROSSSLOT:
// the lock, its waiting flag and its fencing counter are hash-tagged by the
// key. Each script runs here on keys of every master of the Cluster: obtain
// (a free key, and a held one, which it flags as waited for), release
// (announcing the release to the flagged waiter), renew and RaiseFence.
func TestScriptsKeepToOneSlot(t *testing.T) {
	t.Parallel()
	topo := testenv.TopologyNamed(t, "cluster")
	if topo.Name != "cluster" {
		t.Fatalf("topology %q, want the cluster", topo.Name)
	}
	ctx := context.Background()
	c, prefix := lockRedisOn(t, topo)
	// A short TTL, so that every lease is renewed while it is held (a
	// renewal has a second to answer); a waiter of another process flags
	// each key as waited for, and is woken by its release. The waits are
	// long: on a busy machine an answer that comes after the TTL is
	// refused, and the holder must try again.
	opt := lock.RedisOptions{TTL: 1500 * time.Millisecond, Wait: 10 * time.Second, Subscriber: c}
	lockers := map[string]func(prefix string) keyLocker{
		"redis": func(prefix string) keyLocker {
			o := opt
			o.Prefix = prefix
			l := lock.NewRedis(c, o)
			t.Cleanup(func() { l.Close() })
			return l
		},
		"redis without fencing": func(prefix string) keyLocker {
			o := opt
			o.Prefix, o.NoFencing = prefix, true
			l := lock.NewRedis(c, o)
			t.Cleanup(func() { l.Close() })
			return l
		},
		"reentrant": func(prefix string) keyLocker {
			o := opt
			o.Prefix = prefix
			l := lock.NewReentrant(c, o)
			t.Cleanup(func() { l.Close() })
			return ownerLock{l, lock.WithOwner(ctx, lock.NewOwner())}
		},
	}
	for name, newLocker := range lockers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			holder, waiter := newLocker(prefix+name+":"), newLocker(prefix+name+":")
			keys := keysOnEachMaster(t, c, holder)
			leases := make([]*lock.Lease, len(keys))
			waiters := make([]<-chan obtained, len(keys))
			for i, key := range keys {
				lease, err := holder.Obtain(ctx, key)
				if err != nil {
					t.Fatalf("obtain %q: %v", key, err)
				}
				leases[i] = lease
				waiters[i] = obtainAsync(waiter, key)
				waitFor(t, "the held "+key+" is flagged as waited for", func() bool {
					return c.Exists(ctx, holder.Key(key)+":waiting").Val() == 1
				})
			}
			time.Sleep(opt.TTL / 2) // each renewed at TTL/3
			for i, key := range keys {
				lease := leases[i]
				if err := lease.Context().Err(); err != nil {
					t.Fatalf("lease on %q lost: %v", key, context.Cause(lease.Context()))
				}
				if err := lease.Release(ctx); err != nil {
					t.Fatalf("release %q: %v", key, err)
				}
				received(t, waiters[i]).Release(ctx)
				if l, ok := holder.(*lock.Redis); ok && !strings.Contains(name, "without fencing") {
					if err := l.RaiseFence(ctx, key, lease.Fence()+1000); err != nil {
						t.Fatalf("raise the fence of %q: %v", key, err)
					}
				}
			}
		})
	}
}

// Waiters are woken by releases of their keys wherever the keys live. On a
// Redis Cluster the release script PUBLISHes on the master of the key's
// slot and the waiters' one subscription, on the master of the channel's
// slot, hears it over the cluster bus: B's waiters, whose backoff is an
// hour, are woken by the releases of keys on each of the three masters.
func TestWakeOnReleaseFromEveryMaster(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
		ctx := context.Background()
		_, prefix := testenv.RedisOn(t, topo)
		a, c := wokenProcess(t, topo, prefix)
		b, _ := wokenProcess(t, topo, prefix)
		keys := keysOnEachMaster(t, c, a)

		var (
			holders []*lock.Lease
			got     []<-chan obtained
		)
		for i, key := range keys {
			holders = append(holders, obtain(t, a, key))
			got = append(got, obtainAsync(b, key))
			waitFor(t, "B's waiter waits", func() bool { return b.Stats().Waiting == i+1 })
		}
		waitFor(t, "B subscribed and flagged every key", func() bool {
			for _, key := range keys {
				if c.Exists(ctx, a.Key(key)+":waiting").Val() != 1 {
					return false
				}
			}
			return subscribers(c, prefix+"released") == 1
		})
		for i, holder := range holders {
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			received(t, got[i]).Release(ctx)
			if s := b.Stats(); s.Wakeups != uint64(i+1) {
				t.Errorf("after the release of %q: B's stats = %+v, want %d wakeups", keys[i], s, i+1)
			}
		}
		if s := b.Stats(); s.Attempts != uint64(2*len(keys)) {
			t.Errorf("B's stats = %+v, want %d attempts: one before and one after each wakeup", s, 2*len(keys))
		}
	})
}

// A Sentinel failover leaves the waiters of a lock on the FailoverClient
// woken on release, and at worst polling, never hung. go-redis keeps the
// subscription where it is when the master changes (it drops only its
// command connections to the old master): the demoted master, now a
// replica, still hears the releases, as a master propagates PUBLISH to its
// replicas. When that node dies, go-redis resubscribes on the master the
// Sentinel names.
func TestWakeOnReleaseAcrossFailover(t *testing.T) {
	t.Parallel()
	s := testenv.StartRedisSentinel(t)
	ctx := context.Background()
	client := func() redis.UniversalClient {
		c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{s.Sentinel}, MasterName: s.MasterName,
			MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	ca, cb := client(), client()
	// A holds the keys; B waits for them, with an hour's backoff (woken)
	// and with the default one (polling when the message is lost).
	newLock := func(c redis.UniversalClient, prefix string, backoff time.Duration) *lock.Redis {
		l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Subscriber: c,
			MinBackoff: backoff, MaxBackoff: backoff, Wait: time.Minute})
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, woken := newLock(ca, "woken:", 0), newLock(cb, "woken:", never)
	aPoll, polling := newLock(ca, "polling:", 0), newLock(cb, "polling:", 0)
	nodes := func() []*redis.Client {
		var live []*redis.Client
		for _, n := range s.Nodes {
			if n.Pid() != 0 {
				live = append(live, testenv.RedisAt(t, n.Addr))
			}
		}
		return live
	}
	// hold takes key on l once the clients write to the current master.
	hold := func(l *lock.Redis, key string) *lock.Lease {
		t.Helper()
		var lease *lock.Lease
		waitFor(t, "A takes "+key, func() bool {
			var err error
			lease, err = l.Obtain(ctx, key)
			return err == nil
		})
		return lease
	}
	// wake checks that the release of key by A wakes B's waiter, whose
	// backoff is an hour, once B is subscribed on a live node.
	wake := func(key string, wakeups uint64) {
		t.Helper()
		holder := hold(a, key)
		// B's client too must write to the current master first: after a
		// failover it may still be on the demoted one, where B's first try
		// is refused, and B, whose backoff is an hour, would not try again
		// within the test (a loaded machine's switch lagged so).
		waitFor(t, "B writes to the master", func() bool { return cb.Set(ctx, "woken:probe", 1, 0).Err() == nil })
		got := obtainAsync(woken, key)
		// Registered for a wake-up too (Waiting): a release announced
		// between B's subscription and its registration would be missed, and
		// only its backoff, an hour, would retry.
		waitFor(t, "B subscribed, flagged "+key+" and waits for a wake-up", func() bool {
			var n int64
			for _, c := range nodes() {
				n += c.PubSubNumSub(ctx, "woken:released").Val()["woken:released"]
			}
			return n >= 1 && ca.Exists(ctx, a.Key(key)+":waiting").Val() == 1 && woken.Stats().Waiting == 1
		})
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		received(t, got).Release(ctx)
		if st := woken.Stats(); st.Wakeups != wakeups {
			t.Errorf("after the release of %q: B's stats = %+v, want %d wakeups", key, st, wakeups)
		}
	}

	wake("before", 1)

	// Failed over while B polls for a key A holds.
	holder := hold(aPoll, "during")
	got := obtainAsync(polling, "during")
	waitFor(t, "B waits", func() bool { return polling.Stats().Waiting == 1 })
	master := s.Failover(t)
	holder.Release(ctx) // lost with the old master, or released on the new one
	received(t, got).Release(ctx)

	wake("after", 2)

	// The demoted master dies; B's subscription moves to the master.
	for _, n := range s.Nodes {
		if n.Addr != master {
			n.Kill()
		}
	}
	wake("demoted master dead", 3)
}

// On a Redis Cluster a lock attempt sent to a node that does not own the
// key's slot is answered MOVED and did not run: the lock's client follows
// no redirection (serve's lockRedisOptions) and reloads the slots, and the
// waiter backs off and tries again within its wait, as it does on
// READONLY, rather than failing the order at once. Here a plain client of
// one node stays pointed at it: two of the three nodes answer MOVED for the
// key, every time, and the wait ends with ErrNotObtained and the MOVED.
// The wait leaves room for several tries on a loaded machine, where a new
// client's first try (a dial, a handshake) may take most of a second: a
// wait that ends before a node has answered has no MOVED to report. The
// nodes are tried at once.
func TestWaitOutlastsMoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	topo := testenv.TopologyNamed(t, "cluster")
	_, prefix := testenv.RedisOn(t, topo)
	errs := make([]error, len(topo.Addrs))
	attempts := make([]uint64, len(topo.Addrs))
	var wg sync.WaitGroup
	for i, addr := range topo.Addrs {
		c := lockClient(t, addr, true)
		l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, Wait: 2 * time.Second})
		wg.Go(func() {
			lease, err := l.Obtain(ctx, "k")
			if err == nil {
				lease.Release(ctx)
			}
			errs[i], attempts[i] = err, l.Stats().Attempts
		})
	}
	wg.Wait()
	moved := 0
	for i, addr := range topo.Addrs {
		err := errs[i]
		if err == nil {
			continue
		}
		if _, ok := redis.IsMovedError(err); !ok || !errors.Is(err, lock.ErrNotObtained) {
			t.Fatalf("Obtain through %s = %v, want ErrNotObtained with a MOVED", addr, err)
		}
		if n := attempts[i]; n < 2 {
			t.Errorf("Obtain through %s tried %d times in its wait, want it to back off and try again", addr, n)
		}
		moved++
	}
	if moved != len(topo.Addrs)-1 {
		t.Errorf("%d of %d nodes answered MOVED, want all but the key's own", moved, len(topo.Addrs))
	}
}

// A release, and a fence raised, that a Redis Cluster answers MOVED — the
// key's master handed its slots to its replica in between — go to the new
// master and do their work there, instead of leaving the key held until
// its TTL.
func TestReleaseFollowsAClusterFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := testenv.StartRedisCluster(t, 3, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), MaxRetries: -1, MaxRedirects: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	// A wait long enough for the client to learn the new master on a
	// loaded machine: the last Obtain's first tries may find the old one.
	l := lock.NewRedis(c, lock.RedisOptions{Prefix: "failover:", TTL: time.Minute, Wait: 10 * time.Second})
	lease := obtain(t, l, "k")
	shard := cluster.Shard(t, l.Key("k"))
	cluster.Failover(t, shard.Replicas[0])

	if err := l.RaiseFence(ctx, "k", lease.Fence()+1000); err != nil {
		t.Errorf("RaiseFence after the failover: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release after the failover: %v", err)
	}
	newMaster := testenv.RedisAt(t, shard.Replicas[0].Addr)
	if n, err := newMaster.Exists(ctx, l.Key("k")).Result(); err != nil || n != 0 {
		t.Errorf("the key on the new master after Release: %d, %v; want it gone", n, err)
	}
	if next := obtain(t, l, "k"); next.Fence() <= lease.Fence()+1000 {
		t.Errorf("next token %d, want above the raised fence %d", next.Fence(), lease.Fence()+1000)
	}
}
