package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// The sale of TestSaleThroughClusterFailover: failoverSKUs products of
// failoverUnits each, failoverBuyers buyers of each, one buyer after the
// other in a steady stream over failoverSpan, each retrying for
// failoverRetryFor after it came and after the Cluster served every slot
// again, whichever is later: how soon the Cluster finds a master dead is
// the machine's pace, not the service's.
const (
	failoverSKUs      = 30
	failoverUnits     = 6
	failoverBuyers    = 8
	failoverSpan      = 3 * time.Second
	failoverRetryFor  = 20 * time.Second
	failoverAfterAcks = 40 // the fault comes once this many orders are placed
	// failoverRecovery bounds how long after the promotion a client of the
	// Cluster may still miss the new master.
	failoverRecovery = 10 * time.Second
)

// A master of a Redis Cluster with replicas fails over in the middle of a
// sale on three `shop serve`: killed (SIGKILL; the Cluster promotes its
// replica once the other masters have found it down), and handed over by
// its replica (CLUSTER FAILOVER). The master that fails is the one the
// lock's release channel lives on, so the replicas' subscriptions must
// move with it, and it serves a third of the SKUs' locks. Through the
// switch:
//
//   - clients made before it, as serve makes them, reach the new master
//     within failoverRecovery of the promotion; after CLUSTER FAILOVER the
//     old master answers MOVED, which the service's client follows, and
//     the lock's client, which follows none, tries again within its wait;
//   - a waiter whose backoff is an hour, subscribed before the failover, is
//     woken by a release after it: wake-on-release moved to the new master;
//   - buyers who retry 502, 503, 504 and transport errors with their own
//     Idempotency-Key are all answered 201 or 409 sold_out, exactly the
//     stock is sold, and verify.Sale finds every invariant and every
//     acknowledged order.
func TestSaleThroughClusterFailover(t *testing.T) {
	t.Parallel()
	for _, fault := range []struct {
		name string
		fail func(*testing.T, *testenv.RedisCluster, testenv.Shard)
		// moved says the old master still answers after the switch: with
		// MOVED, for the slots it handed over.
		moved bool
	}{
		{"master killed", func(t *testing.T, c *testenv.RedisCluster, s testenv.Shard) {
			s.Master.Kill()
			c.WaitMaster(t, s.Replicas[0])
		}, false},
		{"CLUSTER FAILOVER", func(t *testing.T, c *testenv.RedisCluster, s testenv.Shard) {
			c.Failover(t, s.Replicas[0])
		}, true},
	} {
		t.Run(fault.name, func(t *testing.T) {
			t.Parallel()
			cluster := testenv.StartRedisCluster(t, 3, 1)
			crowded(t)
			db := testenv.MySQL(t)
			vars := fleetVars(t, db, map[string]string{"SHOP_REDIS_ADDR": strings.Join(cluster.Addrs(), ",")})
			cfg := testConfig(t, vars())
			if code, out := shopWith(vars(), "seed", "--products", strconv.Itoa(failoverSKUs), "--stock", strconv.Itoa(failoverUnits)); code != 0 {
				t.Fatal(out)
			}
			replicas := startReplicas(t, 3, vars)
			shard := cluster.Shard(t, cfg.Redis.Prefix+"lock:released")
			probe := newShardProbe(t, cluster, cfg, shard)
			probe.wake(t, 1)

			s := startFailoverSale(t, replicas)
			s.waitAcks(t, failoverAfterAcks)
			began := time.Now()
			fault.fail(t, cluster, shard)
			s.failoverOver()
			t.Logf("the replica %s took the slots of %s over %s after the fault", shard.Replicas[0].Addr, shard.Master.Addr,
				time.Since(began).Round(time.Millisecond))
			// A subtest: if the clients do not follow, the sale's outcome
			// below still says what that cost.
			t.Run("clients follow", func(t *testing.T) {
				probe.reach(t, fault.moved)
				probe.wake(t, 2)
			})

			answers := s.wait()
			checkFailoverSale(t, db, replicas, answers)
		})
	}
}

// shardProbe asks the shard that fails over for what the service needs of
// it, through clients made before the failover as serve makes them: a
// lock key and the lock's release channel on that shard.
type shardProbe struct {
	cluster *testenv.RedisCluster
	key     string
	channel string
	// holder takes and releases key; waiter waits for it with an hour's
	// backoff, so that it obtains it only when woken; locker, without
	// wake-on-release, and rdb, the service's client, probe the switch.
	holder, waiter, locker *lock.Redis
	waiterClient, rdb      redis.UniversalClient
	// lockErrs are the errors locker's client returned; nodeErrs those the
	// nodes answered rdb, redirections included.
	lockErrs, nodeErrs *redisErrors
}

func newShardProbe(t *testing.T, cluster *testenv.RedisCluster, cfg config, shard testenv.Shard) *shardProbe {
	t.Helper()
	on := func(key string) bool { return cluster.Shard(t, key).Master == shard.Master }
	// A lock prefix of the probe's own whose channel the shard serves, and
	// a key whose lock it serves: the service's waiters are not woken by
	// the probe, nor the probe's by the service.
	prefix := ""
	for i := 0; prefix == "" || !on(prefix+"released"); i++ {
		prefix = fmt.Sprintf("%sprobe%d:", cfg.Redis.Prefix, i)
	}
	key := ""
	for i := 1; key == "" || !on(prefix+"{"+key+"}"); i++ {
		key = stock.LockKey(int64(i))
	}
	p := &shardProbe{cluster: cluster, key: key, channel: prefix + "released",
		lockErrs: &redisErrors{}, nodeErrs: &redisErrors{}}
	newLock := func(opt lock.RedisOptions, wake bool) (*lock.Redis, redis.UniversalClient) {
		c := newLockRedis(cfg.Redis, cfg.Lock.TTL)
		t.Cleanup(func() { c.Close() })
		opt.Prefix, opt.TTL = prefix, cfg.Lock.TTL
		if wake {
			opt.Subscriber = c
		} else {
			c.AddHook(p.lockErrs)
		}
		l := lock.NewRedis(c, opt)
		t.Cleanup(func() { l.Close() })
		return l, c
	}
	p.holder, _ = newLock(lock.RedisOptions{Wait: cfg.Lock.Wait}, true)
	p.locker, _ = newLock(lock.RedisOptions{Wait: cfg.Lock.Wait}, false)
	p.waiter, p.waiterClient = newLock(lock.RedisOptions{MinBackoff: time.Hour, MaxBackoff: time.Hour, Wait: time.Minute}, true)
	p.rdb = newRedis(cfg.Redis)
	t.Cleanup(func() { p.rdb.Close() })
	p.rdb.(*redis.ClusterClient).OnNewNode(func(node *redis.Client) { node.AddHook(p.nodeErrs) })
	// Both probing clients learn the slots now, before the failover.
	ctx := context.Background()
	lease, err := p.locker.Obtain(ctx, key)
	if err != nil {
		t.Fatalf("the probe's lock on %s: %v", key, err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.rdb.Set(ctx, p.holder.Key(key)+":probe", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	return p
}

// reach checks that locker and rdb reach the shard's new master. With moved,
// the old master answers them MOVED: rdb follows it, and locker's Obtain
// tries again within its wait. Otherwise the old master is gone, and each
// must reach the new one within failoverRecovery.
func (p *shardProbe) reach(t *testing.T, moved bool) {
	t.Helper()
	ctx := context.Background()
	promoted := time.Now()
	var (
		lease *lock.Lease
		err   error
	)
	if moved {
		attempts := p.locker.Stats().Attempts
		if lease, err = p.locker.Obtain(ctx, p.key); err != nil {
			t.Fatalf("Obtain(%s) on the lock's client after the failover = %v, want it obtained within the wait", p.key, err)
		}
		if !p.lockErrs.seen(isMoved) || p.locker.Stats().Attempts-attempts < 2 {
			t.Errorf("the lock's client, with the slots it learned before the failover, got %v in %d attempts; want a MOVED and a second attempt",
				p.lockErrs.all(), p.locker.Stats().Attempts-attempts)
		}
		if err := p.rdb.Set(ctx, p.holder.Key(p.key)+":probe", "after", 0).Err(); err != nil {
			t.Errorf("SET through the service's client after the failover: %v", err)
		}
		if !p.nodeErrs.seen(isMoved) {
			t.Errorf("the service's client was answered %v by the nodes; want the old master's MOVED, followed", p.nodeErrs.all())
		}
	} else {
		waitFor(t, failoverRecovery, "the lock's client reaches the new master", func() error {
			lease, err = p.locker.Obtain(ctx, p.key)
			return err
		})
		waitFor(t, failoverRecovery, "the service's client reaches the new master", func() error {
			return p.rdb.Set(ctx, p.holder.Key(p.key)+":probe", "after", 0).Err()
		})
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("the probing clients reached the new master %s after the promotion (lock's client: %v)",
		time.Since(promoted).Round(time.Millisecond), p.lockErrs.all())
}

// wake checks that a release of key by holder wakes waiter, whose backoff
// is an hour, for the wakeups-th time, once waiter is subscribed on a live
// node of the Cluster.
func (p *shardProbe) wake(t *testing.T, wakeups uint64) {
	t.Helper()
	ctx := context.Background()
	if wakeups > 1 {
		// Subscribed since its first wait: on a live node again, and so
		// with the slots as they are now.
		waitFor(t, failoverRecovery, "the waiter's subscription to "+p.channel+" is back on a live node", func() error {
			return p.subscribed(1)
		})
	}
	// The waiter's one try before it waits must reach the key's master:
	// one answered MOVED would leave the key unflagged, and the release
	// unannounced.
	waitFor(t, failoverRecovery, "the waiter's client reaches the master of "+p.key, func() error {
		return p.waiterClient.Exists(ctx, p.holder.Key(p.key)).Err()
	})
	var holder *lock.Lease
	waitFor(t, failoverRecovery, "the probe's holder takes "+p.key, func() error {
		var err error
		holder, err = p.holder.TryObtain(ctx, p.key)
		return err
	})
	got := make(chan error, 1)
	go func() {
		lease, err := p.waiter.Obtain(ctx, p.key)
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, failoverRecovery, "the waiter flagged "+p.key+" and is subscribed to "+p.channel, func() error {
		if n, err := p.rdb.Exists(ctx, p.holder.Key(p.key)+":waiting").Result(); err != nil || n != 1 {
			return fmt.Errorf("the flag: %d, %v", n, err)
		}
		return p.subscribed(1)
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiter, after the release: %v", err)
		}
	case <-time.After(failoverRecovery):
		t.Fatalf("the waiter was not woken by the release within %s: stats %+v", failoverRecovery, p.waiter.Stats())
	}
	if st := p.waiter.Stats(); st.Wakeups != wakeups {
		t.Errorf("the waiter's stats after the release: %+v, want %d wakeups", st, wakeups)
	}
}

// subscribed is nil when the live nodes have n subscriptions to the probe's
// channel, counted on every one of them: a classic subscription may be on
// any.
func (p *shardProbe) subscribed(n int64) error {
	var got int64
	for _, node := range p.cluster.Nodes() {
		if node.Pid() == 0 {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: node.Addr})
		got += c.PubSubNumSub(context.Background(), p.channel).Val()[p.channel]
		c.Close()
	}
	if got != n {
		return fmt.Errorf("%d subscriptions to %s, want %d", got, p.channel, n)
	}
	return nil
}

// redisErrors is a go-redis hook that records the errors Redis answers.
type redisErrors struct {
	mu   sync.Mutex
	errs []error
}

func (e *redisErrors) DialHook(next redis.DialHook) redis.DialHook { return next }

func (e *redisErrors) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && !errors.Is(err, redis.Nil) {
			e.mu.Lock()
			e.errs = append(e.errs, err)
			e.mu.Unlock()
		}
		return err
	}
}

func (e *redisErrors) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (e *redisErrors) all() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.errs...)
}

func (e *redisErrors) seen(match func(error) bool) bool {
	for _, err := range e.all() {
		if match(err) {
			return true
		}
	}
	return false
}

func isMoved(err error) bool {
	_, ok := redis.IsMovedError(err)
	return ok
}

// failoverSale is the sale's buyers, under way.
type failoverSale struct {
	acks atomic.Int64
	// over is when the Cluster served every slot again; nil until then.
	over atomic.Pointer[time.Time]
	// fault is when the fault came (faultNow); nil until then.
	fault   atomic.Pointer[time.Time]
	mu      sync.Mutex
	answers []buyerAnswer
	// placed is when the first order placed by a try sent after the fault
	// was answered; zero until then.
	placed time.Time
	wg     sync.WaitGroup
}

// faultNow records that the fault comes now, and returns when.
func (s *failoverSale) faultNow() time.Time {
	now := time.Now()
	s.fault.Store(&now)
	return now
}

// placedAfterFault returns when the first order placed by a try sent after
// the fault was answered, and whether there is one yet.
func (s *failoverSale) placedAfterFault() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.placed, !s.placed.IsZero()
}

// failoverOver records that the Cluster serves every slot again.
func (s *failoverSale) failoverOver() {
	now := time.Now()
	s.over.Store(&now)
}

// retrying reports whether a buyer who came at start still retries.
func (s *failoverSale) retrying(start time.Time) bool {
	over := s.over.Load()
	return time.Since(start) < failoverRetryFor || over == nil || time.Since(*over) < failoverRetryFor
}

// buyerAnswer is a buyer's last answer, after tries.
type buyerAnswer struct {
	sku, user int
	last      reply[order]
	tries     int
	// sent is when the last try was sent, at when it was answered.
	sent, at time.Time
	// seen counts the answers of every try, by status and error code
	// ("503 busy"), "error" for a transport error.
	seen map[string]int
}

// answered reports whether the buyer's last answer was final: a 2xx or a
// 4xx.
func (a buyerAnswer) answered() bool {
	return a.last.err == nil && a.last.status >= 200 && a.last.status < 500
}

// startFailoverSale starts the sale's buyers on the replicas, one after the
// other over failoverSpan; the i-th buyer, user i+1, wants SKU i mod
// failoverSKUs + 1 through replica i mod 3, and each retry goes to the next
// replica, as nginx would send it. A test that ends first stops them.
func startFailoverSale(t *testing.T, replicas []*replica) *failoverSale {
	s := &failoverSale{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		s.wg.Wait()
	})
	const buyers = failoverSKUs * failoverBuyers
	start := time.Now()
	for i := range buyers {
		s.wg.Go(func() {
			time.Sleep(time.Until(start.Add(failoverSpan * time.Duration(i) / buyers)))
			a := buyRetrying(ctx, replicas, i, i%failoverSKUs+1, i+1, s.retrying)
			if a.last.status == http.StatusCreated {
				s.acks.Add(1)
			}
			s.mu.Lock()
			s.answers = append(s.answers, a)
			if fault := s.fault.Load(); a.last.status == http.StatusCreated && fault != nil && a.sent.After(*fault) &&
				(s.placed.IsZero() || a.at.Before(s.placed)) {
				s.placed = a.at
			}
			s.mu.Unlock()
		})
	}
	return s
}

// waitAcks waits until n orders are placed.
func (s *failoverSale) waitAcks(t *testing.T, n int64) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d orders placed", n), func() error {
		if got := s.acks.Load(); got < n {
			return fmt.Errorf("%d placed", got)
		}
		return nil
	})
}

// wait waits for every buyer's last answer.
func (s *failoverSale) wait() []buyerAnswer {
	s.wg.Wait()
	return s.answers
}

// buyRetrying is a buyer who retries as bin/loadtest -retry does, while
// retrying says so: 502, 503, 504 and transport errors, with the buyer's
// own Idempotency-Key, after a random wait between 50 ms and the longer of
// an exponential backoff (100 ms, doubling) and Retry-After, at most 1 s.
func buyRetrying(ctx context.Context, replicas []*replica, first, sku, user int, retrying func(start time.Time) bool) buyerAnswer {
	a := buyerAnswer{sku: sku, user: user, seen: map[string]int{}}
	key := fmt.Sprintf("cf-%d-%d", sku, user)
	backoff := 100 * time.Millisecond
	for start := time.Now(); ; backoff = min(2*backoff, time.Second) {
		a.sent = time.Now()
		a.last = replicas[(first+a.tries)%len(replicas)].public.order(sku, user, withKey(key), withContext(ctx))
		a.at = time.Now()
		a.tries++
		a.seen[a.last.summary()]++
		status := a.last.status
		retry := a.last.err != nil || status == http.StatusBadGateway || status == http.StatusServiceUnavailable ||
			status == http.StatusGatewayTimeout
		if !retry || !retrying(start) {
			return a
		}
		wait := min(max(backoff, a.last.retryAfter()), time.Second)
		select {
		case <-ctx.Done():
			return a
		case <-time.After(50*time.Millisecond + rand.N(wait-50*time.Millisecond+1)):
		}
	}
}

// checkFailoverSale checks the sale's outcome: every buyer answered 201 or
// 409 sold_out, exactly the stock sold, and every invariant and every
// acknowledged order in MySQL (verify.Sale).
func checkFailoverSale(t *testing.T, db *testenv.DB, replicas []*replica, answers []buyerAnswer) {
	t.Helper()
	var (
		acks           []verify.Ack
		statuses       = map[string]int{}
		seen           = map[string]int{}
		retried, tries int
		unanswered     []string
	)
	for _, a := range answers {
		code := a.last.code()
		statuses[a.last.summary()]++
		for k, n := range a.seen {
			seen[k] += n
		}
		tries += a.tries
		if a.tries > 1 {
			retried++
		}
		switch {
		case !a.answered():
			unanswered = append(unanswered, fmt.Sprintf("user %d sku %d: %v after %d tries", a.user, a.sku, a.last, a.tries))
		case a.last.status == http.StatusCreated:
			o := a.last.body
			if o.ID == 0 {
				t.Errorf("user %d's 201 names no order: %v", a.user, a.last)
			}
			acks = append(acks, verify.Ack{OrderID: o.ID, SKUID: o.SKU, UserID: o.User})
		case a.last.status != http.StatusConflict || code != "sold_out":
			t.Errorf("user %d sku %d: %v; want 201, or 409 sold_out", a.user, a.sku, a.last)
		}
	}
	t.Logf("%d buyers: last answers %v; %d retried, %d requests in all, answered %v", len(answers), statuses, retried, tries, seen)
	if len(unanswered) > 0 {
		t.Errorf("%d buyers unanswered, retrying for %s after they came and after the failover, first: %s", len(unanswered), failoverRetryFor, strings.Join(unanswered[:min(5, len(unanswered))], "; "))
		for i, r := range replicas {
			errs := r.errors()
			t.Logf("replica %d logged %d errors, the last: %s", i, len(errs), strings.Join(errs[max(0, len(errs)-3):], "\n"))
		}
	}
	const stockTotal = failoverSKUs * failoverUnits
	if len(acks) != stockTotal {
		t.Errorf("%d orders acknowledged, want the whole stock, %d", len(acks), stockTotal)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	report, err := verify.Sale(ctx, db.Gorm, acks)
	if err != nil {
		t.Fatal(err)
	}
	if !report.OK() || report.Stock != 0 || report.Orders != stockTotal {
		t.Errorf("after the sale, want every unit sold once (stock 0, %d orders):\n%s", stockTotal, report)
	}
}
