package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"shop/internal/testenv"
)

// logSink collects a replica's JSON log and reports the address it listens
// on.
type logSink struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	addr chan string
	sent bool
}

var (
	listenRE = regexp.MustCompile(`"msg":"listening","addr":"([^"]+)"`)
	adminRE  = regexp.MustCompile(`"msg":"admin listener","addr":"([^"]+)"`)
)

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	if m := listenRE.FindSubmatch(s.buf.Bytes()); m != nil && !s.sent {
		s.sent = true
		s.addr <- string(m[1])
	}
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// replica is one `shop serve` run in-process, the way main runs it.
type replica struct {
	// public is the client of its public listener, admin of its
	// operators' one, with the SHOP_ADMIN_TOKEN it was started with.
	public, admin *client
	stop          context.CancelFunc
	done          chan error
	log           *logSink
}

// addr is where r's public listener is: host:port.
func (r *replica) addr() string { return strings.TrimPrefix(r.public.base, "http://") }

// errors are the lines r logged at error level: every 5xx.
func (r *replica) errors() []string {
	var lines []string
	for line := range strings.Lines(r.log.String()) {
		if strings.Contains(line, `"level":"ERROR"`) {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	return lines
}

// testDrain is the drain of the replicas tests start, unless they set
// SHOP_DRAIN: their clients keep idle connections that nothing closes, and
// each stop would otherwise wait the whole default drain.
const testDrain = "200ms"

// startReplica starts a replica with the settings vars, on a free loopback
// port, and waits until it is ready; it stops when the test ends.
func startReplica(t *testing.T, vars map[string]string) *replica {
	t.Helper()
	vars["SHOP_HTTP_ADDR"] = "127.0.0.1:0"
	if vars["SHOP_DRAIN"] == "" {
		vars["SHOP_DRAIN"] = testDrain
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{stop: cancel, done: make(chan error, 1), log: &logSink{addr: make(chan string, 1)}}
	go func() { r.done <- run(ctx, []string{"serve"}, env(vars), r.log, r.log) }()
	select {
	case addr := <-r.log.addr:
		r.public = newClient("http://" + addr)
		// Logged before the public listener's line.
		m := adminRE.FindStringSubmatch(r.log.String())
		if m == nil {
			t.Fatalf("serve logged no admin listener:\n%s", r.log)
		}
		r.admin = operators("http://"+m[1], vars["SHOP_ADMIN_TOKEN"])
	case err := <-r.done:
		t.Fatalf("serve exited: %v\n%s", err, r.log)
	case <-time.After(10 * time.Second):
		t.Fatalf("serve did not start:\n%s", r.log)
	}
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	waitReady(t, r.public)
	return r
}

// startReplicas starts n replicas, each with the settings vars returns.
func startReplicas(t *testing.T, n int, vars func() map[string]string) []*replica {
	t.Helper()
	var replicas []*replica
	for range n {
		replicas = append(replicas, startReplica(t, vars()))
	}
	// When the test ends, all stop at once, their drains side by side,
	// before each one's own cleanup waits for its end.
	t.Cleanup(func() {
		for _, r := range replicas {
			r.stop()
		}
	})
	return replicas
}

// waitReady waits until c's /readyz answers 200, asked on a connection of
// its own each time.
func waitReady(t *testing.T, c *client) {
	t.Helper()
	waitFor(t, 10*time.Second, c.base+" ready", func() error { return c.readyz(closing()).expect(http.StatusOK) })
}

// tally counts a sale's answers.
type tally struct {
	mu     sync.Mutex
	status map[int]int
	acks   []string
	errs   int
	// others are the first few answers other than 201, whole, for a test
	// that fails on one to say what it was.
	others []string
}

func (tl *tally) add(r reply[order]) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if r.err != nil {
		tl.errs++
		return
	}
	tl.status[r.status]++
	if r.status == http.StatusCreated {
		tl.acks = append(tl.acks, fmt.Sprint(r.body.ID))
	} else if len(tl.others) < 5 {
		tl.others = append(tl.others, r.String())
	}
}

// buyers starts n buyers who order, through c, each SKU sent on the
// returned channel for a user of its own (the SKU's id: a crowd, not one
// buyer held to its rate limit), into tl; close the channel, then call
// wait.
func buyers(n int, c *client, tl *tally) (skus chan<- int, wait func()) {
	skusc := make(chan int)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for sku := range skusc {
				tl.add(c.order(sku, sku))
			}
		})
	}
	return skusc, wg.Wait
}

// acksFile writes acks, the order ids of the 201s (or "order_id sku_id
// user_id"), one a line, to a file for `shop verify --acks`, and returns
// its path.
func acksFile(t *testing.T, acks []string) string {
	t.Helper()
	return writeFile(t, "acks", []byte(strings.Join(acks, "\n")+"\n"))
}

// TestThreeReplicasSellEachUnitOnce is the acceptance run in small: three
// `shop serve` on one MariaDB and a Redis — one server, a Redis Cluster of
// three masters, a master managed by Sentinels — (and, in redlock mode,
// three more Redis masters for the lock; in the other families' modes, the
// MySQL lock table, a private etcd cluster, a private ZooKeeper ensemble),
// every SKU wanted by four buyers
// at once through different replicas; then `shop verify --acks`. The seed
// runs on the same Redis: on a Cluster its cache reset covers every master.
func TestThreeReplicasSellEachUnitOnce(t *testing.T) {
	t.Parallel()
	type sale struct {
		name string
		run  func(t *testing.T)
	}
	var sales []sale
	for _, topo := range testenv.Topologies(t) {
		sales = append(sales, sale{topo.Name, func(t *testing.T) {
			sellEachUnitOnce(t, topo, map[string]string{"SHOP_LOCK_MODE": "redis"})
		}})
	}
	single := func(t *testing.T) testenv.Topology { return testenv.TopologyNamed(t, "single") }
	sales = append(sales,
		sale{"redlock", func(t *testing.T) {
			var addrs []string
			for range 3 {
				addrs = append(addrs, testenv.StartRedis(t).Addr)
			}
			sellEachUnitOnce(t, single(t), map[string]string{
				"SHOP_LOCK_MODE": "redlock", "SHOP_REDLOCK_ADDRS": strings.Join(addrs, ","),
			})
		}},
		sale{"mysql", func(t *testing.T) {
			sellEachUnitOnce(t, single(t), map[string]string{"SHOP_LOCK_MODE": "mysql"})
		}},
		sale{"etcd", func(t *testing.T) {
			cluster := testenv.StartEtcdCluster(t)
			sellEachUnitOnce(t, single(t), map[string]string{
				"SHOP_LOCK_MODE": "etcd", "SHOP_ETCD_ENDPOINTS": strings.Join(cluster.Endpoints(), ","),
			})
		}},
		sale{"zookeeper", func(t *testing.T) {
			ensemble := testenv.StartZooKeeper(t)
			sellEachUnitOnce(t, single(t), map[string]string{
				"SHOP_LOCK_MODE": "zookeeper", "SHOP_ZK_SERVERS": strings.Join(ensemble.Servers(), ","),
			})
		}},
	)
	// The sales run side by side, each once its servers have started and
	// it has its turn (crowded), as subtests run from goroutines of this
	// test's own: as parallel subtests, those waiting for their turn would
	// each hold one of the places (-parallel) of the tests that wait on
	// timers meanwhile.
	var wg sync.WaitGroup
	for _, s := range sales {
		wg.Go(func() { t.Run(s.name, s.run) })
	}
	wg.Wait()
}

func sellEachUnitOnce(t *testing.T, topo testenv.Topology, lockVars map[string]string) {
	const skus, buyers = 150, 4
	crowded(t)
	db := testenv.MySQL(t)
	_, prefix := testenv.RedisOn(t, topo)
	vars := func() map[string]string {
		// A buyer waits for three others' holds of its SKU's lock, each of
		// them round trips to the lock's servers (a Redlock's to three
		// masters, twice: lock, then fence; the other families commit each
		// hold on a server of their own, etcd and ZooKeeper on a majority
		// of three) and a transaction: on a machine shared with the other
		// tests and packages that may take longer than the default wait of
		// 2 s, and a 503 busy would say so, not that a unit was sold twice.
		// So every mode waits SHOP_LOCK_WAIT's most, 10 s.
		m := map[string]string{
			"SHOP_MYSQL_DSN":    db.DSN,
			"SHOP_STOCK_UPDATE": "naive",
			"SHOP_REDIS_PREFIX": prefix,
			"SHOP_LOCK_WAIT":    "10s",

			"SHOP_PAYMENT_WEBHOOK_SECRET": testWebhookSecret,
		}
		maps.Copy(m, topo.Env())
		maps.Copy(m, lockVars)
		return m
	}
	if code, out := shopWith(vars(), "seed", "--products", fmt.Sprint(skus), "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	replicas := startReplicas(t, 3, vars)

	// Product pages cached before the sale. On a machine this loaded a
	// read may be answered 503 busy (its replica logs why, at error
	// level): it is asked again, for a while.
	for sku := 1; sku <= skus; sku++ {
		r := replicas[sku%3]
		waitFor(t, 10*time.Second, fmt.Sprintf("product %d before the sale", sku), func() error {
			p := r.public.product(sku)
			switch {
			case p.status == http.StatusServiceUnavailable:
				t.Logf("product %d before the sale: %v; its replica's errors: %q", sku, p, r.errors())
				return fmt.Errorf("%v", p)
			case p.expect(http.StatusOK) != nil || p.body.Stock != 1:
				t.Fatalf("product %d before the sale: %v; want stock 1", sku, p)
			}
			return nil
		})
	}
	tl := &tally{status: map[int]int{}}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for sku := 1; sku <= skus; sku++ {
		for j := range buyers {
			c := replicas[(sku+j)%len(replicas)].public
			wg.Go(func() {
				<-start
				tl.add(c.order(sku, sku*10+j))
			})
		}
	}
	close(start)
	wg.Wait()
	if tl.status[201] != skus || tl.status[409] != skus*(buyers-1) || tl.errs != 0 {
		t.Errorf("responses %v, transport errors %d; want %d×201 and %d×409", tl.status, tl.errs, skus, skus*(buyers-1))
		logErrors(t, replicas)
	}
	if code, out := shopWith(vars(), "verify", "--acks", acksFile(t, tl.acks)); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
	// ...show the sale at once on every replica: each order invalidated its
	// product. An invalidation is given stock.InvalidateTimeout, after the
	// commit; one that Redis does not answer in time (on a machine so loaded
	// that connecting to Redis takes longer) leaves the entry until its TTL,
	// as the service means it to, and is logged: that product may show its
	// old stock.
	failed := invalidationsFailed(t, replicas)
	for sku := 1; sku <= skus; sku++ {
		p := replicas[(sku+1)%3].public.product(sku)
		switch {
		case p.expect(200) != nil || (p.body.Stock != 0 && !failed[int64(sku)]):
			t.Errorf("product %d after the sale: %v; want cached stock 0", sku, p)
		case p.body.Stock != 0:
			t.Logf("product %d after the sale: cached stock %d, its invalidation logged as failed", sku, p.body.Stock)
		}
	}
	metrics := replicas[0].admin.metrics()
	if err := metrics.expect(200); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"shop_cache_hits_total", "shop_cache_misses_total", "shop_cache_loads_total", "shop_cache_bloom_rejects_total",
		"shop_lock_attempts_total", "shop_lock_wakeups_total", "shop_lock_waiting"} {
		if !bytes.Contains(metrics.raw, []byte("\n"+name+" ")) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	// Replica 0 took locks for its share of the 201s.
	if attempts, err := replicas[0].admin.metric("shop_lock_attempts_total"); err != nil || attempts < 1 {
		t.Errorf("shop_lock_attempts_total = %v, %v on a replica that placed orders", attempts, err)
	}
}

// invalidationsFailed returns the SKUs whose invalidation after an order
// the replicas logged as failed.
func invalidationsFailed(t *testing.T, replicas []*replica) map[int64]bool {
	t.Helper()
	failed := map[int64]bool{}
	for _, r := range replicas {
		for line := range strings.Lines(r.log.String()) {
			var rec struct {
				Msg string `json:"msg"`
				SKU int64  `json:"sku"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "invalidate cached product" {
				t.Logf("a replica logged: %s", strings.TrimSpace(line))
				failed[rec.SKU] = true
			}
		}
	}
	return failed
}

// logErrors logs the lines the replicas logged at error level: every 5xx.
func logErrors(t *testing.T, replicas []*replica) {
	t.Helper()
	for _, r := range replicas {
		for _, line := range r.errors() {
			t.Log(line)
		}
	}
}

// TestShutdownLosesNoAcknowledgedOrder stops a replica while orders are in
// flight: every 201 it sent must be in MySQL, and the process must exit
// cleanly.
func TestShutdownLosesNoAcknowledgedOrder(t *testing.T) {
	t.Parallel()
	const skus = 300 // the catalog; the buyers stop after the 50th acknowledgement
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", fmt.Sprint(skus+30), "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	r := startReplica(t, fleetVars(t, db, nil)())
	tl := &tally{status: map[int]int{}}
	skusc, wait := buyers(30, r.public, tl)
	for sku := 1; sku <= skus; sku++ {
		skusc <- sku
		tl.mu.Lock()
		acked := len(tl.acks)
		tl.mu.Unlock()
		if acked >= 50 {
			break
		}
	}
	r.stop() // what SIGTERM does in main, with orders in flight
	for sku := 1; sku <= 30; sku++ {
		skusc <- skus + sku // more buyers keep coming; the stopped server refuses them
	}
	close(skusc)
	wait()
	if err := <-r.done; err != nil {
		t.Errorf("serve after shutdown: %v", err)
	}
	r.done <- nil // for the cleanup
	if tl.status[201] == 0 {
		t.Fatalf("no order was acknowledged before shutdown: %v", tl.status)
	}
	code, out := shop(t, db, "verify", "--acks", acksFile(t, tl.acks))
	if code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
	t.Logf("acknowledged %d, refused connection %d; %s", tl.status[201], tl.errs, strings.SplitN(out, "\n", 2)[0])
	if !strings.Contains(r.log.String(), `"msg":"stopped"`) {
		t.Errorf("no clean stop in the log:\n%s", r.log)
	}
}

// fleetVars returns what gives, on each call, a new map of the settings of a
// replica on db and the test's own Redis key space, with extra added.
func fleetVars(t *testing.T, db *testenv.DB, extra map[string]string) func() map[string]string {
	return func() map[string]string {
		m := map[string]string{
			"SHOP_MYSQL_DSN":    db.DSN,
			"SHOP_REDIS_ADDR":   testenv.RedisAddr(t),
			"SHOP_REDIS_PREFIX": redisPrefix(t),
			// The provider's secret: without it, the default payment
			// window refuses to start.
			"SHOP_PAYMENT_WEBHOOK_SECRET": testWebhookSecret,
		}
		maps.Copy(m, extra)
		return m
	}
}

// What one replica learns of a product reaches the others through the
// announcements: a page another replica holds shows each order (with a
// TTL of a minute, only the announcement drops it), and a sell-out found
// on one is refused by the other from memory, without a read of its own:
// stock raised behind the service's back is not seen.
func TestOneReplicasChangesReachTheOthers(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_CACHE_LOCAL_TTL": "1m"})
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", "2"); code != 0 {
		t.Fatal(out)
	}
	a, b := startReplica(t, vars()), startReplica(t, vars())
	// A replica believes no other's sell-out for 2 s after it subscribed
	// (it may have missed a return that came after it: stock.soldOutQuiet).
	time.Sleep(2*time.Second + 100*time.Millisecond)
	if p := b.public.product(1); p.expect(200) != nil || p.body.Stock != 2 {
		t.Fatalf("before the orders, the other replica's page: %v; want stock 2", p)
	}
	for user, left := range []int{1, 0} {
		if o := a.public.order(1, user+1); o.expect(201) != nil {
			t.Fatalf("order of user %d: %v", user+1, o)
		}
		if p := a.public.product(1); p.expect(200) != nil || p.body.Stock != left {
			t.Fatalf("right after its 201, the page of the replica that placed it: %v; want stock %d", p, left)
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("the other replica's page shows stock %d", left), func() error {
			if p := b.public.product(1); p.expect(200) != nil || p.body.Stock != left {
				return fmt.Errorf("it shows %v", p)
			}
			return nil
		})
	}
	if err := db.Gorm.Exec("UPDATE products SET stock = 1 WHERE id = 1").Error; err != nil {
		t.Fatal(err)
	}
	if o := b.public.order(1, 3); o.expect(409) != nil {
		t.Errorf("after a sell-out found on the other replica: %v; want 409 from memory", o)
	}
	if err := db.Gorm.Exec("UPDATE products SET stock = 0 WHERE id = 1").Error; err != nil {
		t.Fatal(err)
	}
	if code, out := shop(t, db, "verify"); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}

// Each replica remembers the products it found sold out and refuses them
// without asking MySQL; a reseed must make all three forget at once.
func TestReseedClearsSoldOutOnEveryReplica(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	replicas := startReplicas(t, 3, fleetVars(t, db, nil))
	order := func(r *replica, user int, want int) {
		t.Helper()
		if o := r.public.order(1, user); o.expect(want) != nil {
			t.Fatalf("order of user %d via %s: %v; want %d", user, r.public.base, o, want)
		}
	}
	order(replicas[0], 1, 201)
	for i, r := range replicas {
		order(r, 10+i, 409) // each replica finds the product sold out
	}
	// Stock raised behind the service's back is not seen: the refusal
	// comes from memory.
	if err := db.Gorm.Exec("UPDATE products SET stock = 1 WHERE id = 1").Error; err != nil {
		t.Fatal(err)
	}
	for i, r := range replicas {
		order(r, 20+i, 409)
	}
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", "3"); code != 0 {
		t.Fatal(out)
	}
	for i, r := range replicas {
		order(r, 30+i, 201)
	}
	if code, out := shop(t, db, "verify"); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}
