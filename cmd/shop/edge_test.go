package main

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"shop/internal/testenv"
)

// ordersOf counts user's orders in MySQL.
func ordersOf(t *testing.T, db *testenv.DB, user int) int {
	t.Helper()
	var n int
	if err := db.Gorm.Raw("SELECT COUNT(*) FROM orders WHERE user_id = ?", user).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// A buyer's orders are limited over the whole fleet: sent to three
// replicas in turn, one buyer's orders get the burst and what the rate
// adds while they are sent, not three bursts; the rest are 429 with
// Retry-After and write nothing. A key that placed an order is answered
// with it even over the limit, and a key refused by the limit is refused
// again, each taking from the buyer's allowance of actions: once that is
// spent too, replays over the limit are 429 as well, and read nothing. A
// scalper with one user id and many connections gets 429s the same way.
func TestOrdersRateLimitedPerBuyerAcrossReplicas(t *testing.T) {
	// Not in parallel (see parallel_test.go): a refused key is sent again while
	// the buyer is over the limit, which a slow second would refill.
	const rate, burst, skus = 1, 3, 80
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_RATE_USER": fmt.Sprint(rate), "SHOP_RATE_USER_BURST": fmt.Sprint(burst)})
	if code, out := shopWith(vars(), "seed", "--products", fmt.Sprint(skus), "--stock", "5"); code != 0 {
		t.Fatal(out)
	}
	replicas := startReplicas(t, 3, vars)

	const user = 7
	began := time.Now()
	var placed, limited []int
	for sku := 1; sku <= 12; sku++ {
		// Only the first, which the burst places, has a key: a refused
		// order with a key would take from the allowance of actions that
		// the replays below need (see replayOver).
		var opts []option
		if sku == 1 {
			opts = append(opts, withKey("k1"))
		}
		o := replicas[sku%3].public.order(sku, user, opts...)
		switch {
		case o.status == http.StatusCreated:
			placed = append(placed, sku)
		case o.rateLimited():
			limited = append(limited, sku)
		default:
			t.Fatalf("order %d: %v; want 201, or 429 rate_limited with Retry-After", sku, o)
		}
	}
	// The burst, and one more for each second the orders took to send.
	most := burst + int(time.Since(began).Seconds()*rate) + 1
	if len(placed) < burst || len(placed) > most || len(limited) == 0 || placed[0] != 1 {
		t.Errorf("12 orders of one buyer through 3 replicas: placed %v, limited %v; want %d to %d placed (the fleet's one burst, the first among them), the rest limited",
			placed, limited, burst, most)
	}
	if n := ordersOf(t, db, user); n != len(placed) {
		t.Errorf("the buyer has %d orders in MySQL; want the %d answered 201: a 429 writes nothing", n, len(placed))
	}

	// Over the limit still: the first key is answered with its order, a
	// refused one is refused again.
	if o := replicas[1].public.order(1, user, withKey("k1")); o.status != http.StatusCreated || !o.replayed() {
		t.Errorf("the key of a placed order, over the limit: %v; want 201 Idempotent-Replayed", o)
	}
	for i := range 2 {
		if o := replicas[2].public.order(limited[0], user, withKey("k-refused")); !o.rateLimited() {
			t.Errorf("a key over the limit, try %d: %v; want 429 rate_limited", i+1, o)
		}
	}
	// Each of those took an action; the allowance (the burst, and what the
	// rate adds meanwhile) runs out within as many more replays.
	sent, refused := 0, 0
	for ; sent < burst+2 && refused == 0; sent++ {
		switch o := replicas[sent%3].public.order(1, user, withKey("k1")); {
		case o.rateLimited():
			refused++
		case o.status != http.StatusCreated || !o.replayed():
			t.Fatalf("replay %d over the limit: %v; want 201 Idempotent-Replayed or 429 rate_limited", sent+1, o)
		}
	}
	if refused == 0 {
		t.Errorf("%d more replays over the limit were all answered 201; want the buyer's allowance of actions to run out, then 429", sent)
	}
	if n := ordersOf(t, db, user); n != len(placed) {
		t.Errorf("after the retries the buyer has %d orders; want %d", n, len(placed))
	}

	// A scalper: one user id, 60 connections at once, over the replicas.
	const scalper, conns = 8, 60
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	began = time.Now()
	for i := range conns {
		wg.Go(func() {
			o := replicas[i%3].public.order(13+i, scalper)
			mu.Lock()
			defer mu.Unlock()
			if o.status == http.StatusTooManyRequests && !o.rateLimited() {
				t.Errorf("scalper's 429: %v; want rate_limited with Retry-After", o)
			}
			statuses[o.status]++
		})
	}
	wg.Wait()
	// On a loaded machine a limiter call may outlast ratelimit.Timeout
	// and let its order through: those are counted.
	failedOpen := 0
	for _, r := range replicas {
		n, err := r.admin.metric(`shop_rate_limit_total{limit="user",result="failed_open"}`)
		if err != nil {
			t.Fatal(err)
		}
		failedOpen += int(n)
	}
	most = burst + int(time.Since(began).Seconds()*rate) + 1 + failedOpen
	if statuses[201] > most || statuses[429] < conns-most || statuses[201]+statuses[429] != conns {
		t.Errorf("scalper's %d orders at once: %v; want at most %d × 201, the rest 429", conns, statuses, most)
	}
	if n := ordersOf(t, db, scalper); n != statuses[201] {
		t.Errorf("the scalper has %d orders in MySQL; want %d", n, statuses[201])
	}
	if code, out := shopWith(vars(), "verify"); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}

// With its Redis gone, the limiter lets orders through and counts them:
// a rate limit guards the sale and must not end it. (The lock is the
// in-process one here, so that orders need no Redis at all.)
func TestRateLimitFailsOpenWithoutRedis(t *testing.T) {
	// Not in parallel: the second order must come before the limit refills, a
	// second after the first.
	db := testenv.MySQL(t)
	srv := testenv.StartRedis(t)
	vars := map[string]string{"SHOP_MYSQL_DSN": db.DSN, "SHOP_REDIS_ADDR": srv.Addr, "SHOP_LOCK_MODE": "local",
		"SHOP_RATE_USER": "1", "SHOP_RATE_USER_BURST": "1", "SHOP_PAYMENT_WEBHOOK_SECRET": testWebhookSecret}
	if code, out := shopWith(vars, "seed", "--products", "10", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	r := startReplica(t, vars)
	if o := r.public.order(1, 5); o.expect(http.StatusCreated) != nil {
		t.Fatalf("first order: %v", o)
	}
	if o := r.public.order(2, 5); !o.rateLimited() {
		t.Fatalf("second order at once with 1 a second, burst 1: %v; want 429", o)
	}
	srv.Kill()
	// At once: each waits for the limiter's answer and, after its commit, the
	// cache's, which do not come.
	var wg sync.WaitGroup
	for sku := 3; sku <= 6; sku++ {
		wg.Go(func() {
			if o := r.public.order(sku, 5); o.expect(http.StatusCreated) != nil {
				t.Errorf("order of SKU %d with Redis down: %v; want 201 (the limiter fails open)", sku, o)
			}
		})
	}
	wg.Wait()
	if n := ordersOf(t, db, 5); n != 5 {
		t.Errorf("the buyer has %d orders; want 5", n)
	}
	if n, err := r.admin.metric(`shop_rate_limit_total{limit="user",result="failed_open"}`); err != nil || n != 4 {
		t.Errorf("failed_open count %v, %v; want 4", n, err)
	}
}

// SHOP_RATE_IP limits each client address's API requests, never the
// probes; the address is X-Forwarded-For's only from a trusted proxy
// (loopback by default), else the socket's.
func TestRequestsRateLimitedPerClientAddress(t *testing.T) {
	// Not in parallel: the ten reads must come before the limit refills much.
	db := testenv.MySQL(t)
	for _, tt := range []struct {
		trusted string
		spread  bool // whether X-Forwarded-For gives each request its own address
	}{{"", true}, {"none", false}, {"10.9.0.0/16", false}} {
		t.Run("trusted="+tt.trusted, func(t *testing.T) {
			vars := fleetVars(t, db, map[string]string{"SHOP_RATE_IP": "2", "SHOP_TRUSTED_PROXIES": tt.trusted})()
			if code, out := shopWith(vars, "seed", "--products", "1", "--stock", "1"); code != 0 {
				t.Fatal(out)
			}
			r := startReplica(t, vars)
			statuses := map[int]int{}
			for i := range 10 {
				p := r.public.product(1, withHeader("X-Forwarded-For", fmt.Sprintf("10.1.0.%d", i+1)))
				if p.err != nil {
					t.Fatal(p.err)
				}
				statuses[p.status]++
			}
			switch {
			case tt.spread && statuses[200] != 10:
				t.Errorf("10 reads from 10 addresses behind a trusted proxy: %v; want 10 × 200", statuses)
			case !tt.spread && (statuses[429] < 6 || statuses[200]+statuses[429] != 10):
				t.Errorf("10 reads from one untrusted peer at 2 a second: %v; want at least 6 × 429", statuses)
			}
			for range 5 {
				if h := r.public.healthz(); h.expect(200) != nil {
					t.Errorf("/healthz over the limit: %v; want 200", h)
				}
			}
		})
	}
}

// The operators have a door of their own: the admin API and /metrics are
// served on SHOP_ADMIN_ADDR and answer 404 on the public listener, whatever
// the token. Failed token checks are limited per address, ten a minute;
// past them even the right token is 429, so that the limit bounds guesses.
// Each is logged at info with its request id.
func TestOperatorsHaveTheirOwnDoor(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	const token = "0123456789abcdef-admin"
	vars := fleetVars(t, db, map[string]string{"SHOP_ADMIN_TOKEN": token})()
	r := startReplica(t, vars)

	for _, p := range []struct{ method, path, body string }{
		{"GET", "/metrics", ""}, {"POST", "/api/v1/admin/seed", `{"products":3,"stock":1}`}, {"GET", "/api/v1/admin/refunds", ""},
		{"PATCH", "/api/v1/admin/products/1", `{"add_stock":1}`},
	} {
		if a := r.public.send(p.method, p.path, p.body, withBearer(token)); a.status != 404 || a.code() != "not_found" {
			t.Errorf("%s %s on the public listener: %v; want 404 not_found", p.method, p.path, a)
		}
	}
	if s := r.admin.seed(3, 1); s.expect(200) != nil {
		t.Fatalf("seed on the admin listener: %v", s)
	}
	if n, err := r.admin.metric("shop_orders_queued"); err != nil || n != 0 {
		t.Errorf("shop_orders_queued on the admin listener: %v, %v; want 0", n, err)
	}
	if !strings.Contains(r.log.String(), `"msg":"seed: catalog reset"`) {
		t.Errorf("a seed is not logged at info:\n%s", r.log)
	}

	for i := range 10 {
		if a := r.admin.send("GET", "/api/v1/admin/refunds", "", withBearer("wrong-"+strconv.Itoa(i)),
			withHeader("X-Request-ID", "guess-"+strconv.Itoa(i))); a.status != 401 {
			t.Fatalf("wrong token %d: %v; want 401", i, a)
		}
	}
	for _, bearer := range []string{"wrong-again", token} {
		if a := r.admin.send("GET", "/api/v1/admin/refunds", "", withBearer(bearer)); !a.rateLimited() {
			t.Errorf("after ten wrong tokens a minute, %q: %v; want 429 rate_limited", bearer, a)
		}
	}
	logged := 0
	for line := range strings.Lines(r.log.String()) {
		if strings.Contains(line, `"msg":"admin: missing or wrong token"`) && strings.Contains(line, `"level":"INFO"`) &&
			strings.Contains(line, `"request_id":"guess-`) {
			logged++
		}
	}
	if logged != 10 {
		t.Errorf("%d failed token checks logged at info with their request id; want 10", logged)
	}
	if n, err := r.admin.metric(`shop_rate_limit_total{limit="admin_auth",result="limited"}`); err != nil || n != 2 {
		t.Errorf("admin_auth limited count %v, %v; want 2", n, err)
	}
}
