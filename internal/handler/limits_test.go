package handler_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"shop/internal/handler"
	"shop/internal/ratelimit"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// fakeLimiter answers every Take with wait and err, but those of a buyer's
// actions other than orders (user-action:) with actions and err.
type fakeLimiter struct {
	wait    time.Duration
	actions time.Duration
	err     error
	keys    []string
}

func (f *fakeLimiter) Take(_ context.Context, key string, _ ratelimit.Limit) (time.Duration, error) {
	f.keys = append(f.keys, key)
	if strings.HasPrefix(key, "user-action:") {
		return f.actions, f.err
	}
	return f.wait, f.err
}

func (f *fakeLimiter) Give(context.Context, string, ratelimit.Limit) error { return nil }

// countingOrders places every order it is asked for and counts them.
type countingOrders struct {
	n       atomic.Int64
	soldOut atomic.Bool // every product, from memory
}

func (o *countingOrders) KnownSoldOut(int64) bool { return o.soldOut.Load() }

func (o *countingOrders) PlaceOrder(_ context.Context, sku, user int64, _ string) (stock.Order, error) {
	o.n.Add(1)
	if o.soldOut.Load() {
		return stock.Order{}, stock.ErrSoldOut
	}
	return stock.Order{ID: 1, SKUID: sku, UserID: user, Status: stock.StatusPaid, CreatedAt: time.Now()}, nil
}

// replaysFunc is a handler.Replays of a function.
type replaysFunc func(ctx context.Context, sku, user int64, key string) (stock.Order, error)

func (f replaysFunc) Replay(ctx context.Context, sku, user int64, key string) (stock.Order, error) {
	return f(ctx, sku, user, key)
}

// post sends an order of SKU 1 for user 7 with key (none when empty).
func post(t *testing.T, url, key string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/api/v1/orders", strings.NewReader(`{"sku_id":1,"user_id":7}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res
}

// An order over its buyer's limit is 429 with Retry-After in whole
// seconds, rounded up, and never reaches the order path; one whose key
// placed an order is answered with it, its look-up taken from the buyer's
// allowance of actions, and 429 once that is used up too; when the limiter
// cannot tell, the order goes on, counted.
func TestOrderOverItsLimit(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	lim := &fakeLimiter{wait: 1500 * time.Millisecond}
	orders := &countingOrders{}
	reg := prometheus.NewRegistry()
	placed := stock.Order{ID: 9, SKUID: 1, UserID: 7, Status: stock.StatusReserved, CreatedAt: time.Now(), Replayed: true}
	srv := serve(t, both(handler.New(handler.Deps{
		Orders: orders,
		Replays: replaysFunc(func(_ context.Context, sku, user int64, key string) (stock.Order, error) {
			if key == "placed" {
				return placed, nil
			}
			return stock.Order{}, stock.ErrOrderNotFound
		}),
		Limiter:  lim,
		Registry: reg,
	}, handler.Settings{Limits: handler.Limits{User: ratelimit.PerSecond(5, 10)}})))

	if res := post(t, srv.URL, ""); res.StatusCode != 429 || res.Header.Get("Retry-After") != "2" {
		t.Errorf("over the limit: %d, Retry-After %q; want 429 and 2", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if res := post(t, srv.URL, "never-placed"); res.StatusCode != 429 {
		t.Errorf("over the limit, a key that placed nothing: %d; want 429", res.StatusCode)
	}
	if res := post(t, srv.URL, "placed"); res.StatusCode != 201 || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("over the limit, a key that placed an order: %d; want 201 Idempotent-Replayed", res.StatusCode)
	}
	if n := orders.n.Load(); n != 0 {
		t.Errorf("%d orders reached the order path over the limit; want none", n)
	}
	lim.actions = time.Second
	if res := post(t, srv.URL, "placed"); res.StatusCode != 429 {
		t.Errorf("over the limit and the actions' allowance, a key that placed an order: %d; want 429", res.StatusCode)
	}
	lim.actions = 0
	if want := []string{"user:7", "user:7", "user-action:7", "user:7", "user-action:7", "user:7", "user-action:7"}; strings.Join(lim.keys, ",") != strings.Join(want, ",") {
		t.Errorf("limited keys %q; want %q", lim.keys, want)
	}

	// A malformed order is refused before the limit is asked: it costs no
	// Redis call.
	req, _ := http.NewRequest("POST", srv.URL+"/api/v1/orders", strings.NewReader(`{"sku_id":0,"user_id":7}`))
	req.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 400 {
		t.Errorf("sku_id 0: %v, %v; want 400", res, err)
	} else {
		res.Body.Close()
	}
	if len(lim.keys) != 7 {
		t.Errorf("the limiter was asked %d times; want 7, not for the malformed order", len(lim.keys))
	}

	// A product known sold out is refused from memory before the limit is
	// asked, but for an order with a key, which may be a replay.
	orders.soldOut.Store(true)
	if res := post(t, srv.URL, ""); res.StatusCode != 409 {
		t.Errorf("over the limit, a product known sold out: %d; want 409", res.StatusCode)
	}
	if res := post(t, srv.URL, "placed"); res.StatusCode != 201 {
		t.Errorf("over the limit, a product known sold out, a key that placed an order: %d; want 201", res.StatusCode)
	}
	if len(lim.keys) != 9 {
		t.Errorf("the limiter was asked %d times; want 9: for the key and its look-up, not for the order refused from memory", len(lim.keys))
	}
	orders.soldOut.Store(false)

	lim.wait, lim.err = 0, errors.New("redis: connection refused")
	if res := post(t, srv.URL, ""); res.StatusCode != 201 {
		t.Errorf("limiter down: %d; want 201 (fail open)", res.StatusCode)
	}
	if n := counterValue(t, reg, "shop_rate_limit_total", map[string]string{"limit": "user", "result": "failed_open"}); n != 1 {
		t.Errorf("failed_open %v; want 1", n)
	}
}

// counterValue is the value of reg's counter name with labels.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

// stockFunc is a handler.Stock of a function.
type stockFunc func(ctx context.Context, id int64) (int, error)

func (f stockFunc) Stock(ctx context.Context, id int64) (int, error) { return f(ctx, id) }

// filterFunc is a handler.Filter of a function.
type filterFunc func(ctx context.Context, id int64) error

func (f filterFunc) RuleOut(ctx context.Context, id int64) error { return f(ctx, id) }

// An id the filter rules out is 404 without a read of the stock; any
// other is read.
func TestStockOfAnIdTheFilterRulesOut(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	var reads atomic.Int64
	srv := serve(t, both(handler.New(handler.Deps{
		Stock: stockFunc(func(_ context.Context, id int64) (int, error) {
			reads.Add(1)
			return 3, nil
		}),
		Filter: filterFunc(func(_ context.Context, id int64) error {
			if id > 100 {
				return stock.ErrNotFound
			}
			return nil
		}),
	}, handler.Settings{})))
	for path, want := range map[string]int{"/api/v1/products/101/stock": 404, "/api/v1/products/1/stock": 200} {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("GET %s: %d; want %d", path, res.StatusCode, want)
		}
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d stock reads; want 1, for the id the filter let through", n)
	}
}

// guessed is the admin API, its token's guesses limited as cmd/shop limits
// them, with the allowances in rl, and the public listener trusting the
// loopback proxies, cmd/shop's default.
type guessed struct {
	url   string
	seeds atomic.Int64 // seeds the right token made
	log   *testenv.Log // debug and up
	reg   *prometheus.Registry
}

func newGuessed(t *testing.T, rl handler.RateLimiter, limits handler.Limits, d handler.Deps) *guessed {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	g := &guessed{log: &testenv.Log{}, reg: prometheus.NewRegistry()}
	d.Logger = slog.New(slog.NewJSONHandler(g.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d.Registry = g.reg
	d.Limiter = rl
	d.Seeder = handler.SeedFunc(func(context.Context, int, int, stock.SeedOptions) ([]string, error) {
		g.seeds.Add(1)
		return nil, nil
	})
	srv := serve(t, both(handler.New(d, handler.Settings{AdminToken: adminToken,
		TrustedProxies: []string{"127.0.0.0/8", "::1"}, Limits: limits})))
	g.url = srv.URL
	return g
}

// seed asks for a seed with bearer, from forwarded when it is not empty,
// and returns the status.
func (g *guessed) seed(t *testing.T, bearer, forwarded string) int {
	req, err := http.NewRequest("POST", g.url+"/api/v1/admin/seed", strings.NewReader(`{"products":1,"stock":1}`))
	if err != nil {
		t.Error(err)
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+bearer)
	if forwarded != "" {
		req.Header.Set("X-Forwarded-For", forwarded)
		req.Header.Set("X-Real-IP", forwarded)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// warnings counts the log's warn lines whose message contains msg.
func (g *guessed) warnings(msg string) int {
	n := 0
	for line := range strings.Lines(g.log.String()) {
		if strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, msg) {
			n++
		}
	}
	return n
}

// guessLimit is handler.AdminAuthLimit's burst at a rate that gives no
// guess back while a test runs, however slow the machine: ten an hour.
var guessLimit = ratelimit.Limit{Rate: 10, Burst: handler.AdminAuthLimit().Burst, Period: time.Hour}

// failing is a RateLimiter that counts its Takes that failed: each sends
// its guess to the replica's own allowance, which allows up to a burst
// more, so that a Redis too slow to answer within ratelimit.Timeout on a
// loaded machine is told apart from a limit that does not hold.
//
// With hold set, it holds each Take until hold of them have come, so that
// a burst's requests are all in flight before any guess is counted.
type failing struct {
	handler.RateLimiter
	failed atomic.Int64

	hold     int64
	arrivals atomic.Int64
	all      chan struct{}
}

func (f *failing) Take(ctx context.Context, key string, l ratelimit.Limit) (time.Duration, error) {
	if f.hold > 0 {
		if f.arrivals.Add(1) == f.hold {
			close(f.all)
		}
		select {
		case <-f.all:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	wait, err := f.RateLimiter.Take(ctx, key, l)
	if err != nil {
		f.failed.Add(1)
	}
	return wait, err
}

// most is how many wrong guesses may be compared: a burst in Redis, and as
// many more in memory as Takes failed, up to a burst.
func (f *failing) most() int { return guessLimit.Burst + min(guessLimit.Burst, int(f.failed.Load())) }

func adminGuessLimit() handler.Limits { return handler.Limits{AdminAuth: guessLimit} }

// downRedis is a client of a Redis that was killed, which fails each
// command at once: without the client's retries and its waits between
// dials, which would only make each request slower.
func downRedis(t *testing.T) *redis.Client {
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	srv.Kill()
	return rdb
}

// The operators' listener trusts no proxy: guesses from loopback that name
// a new address in X-Forwarded-For (and X-Real-IP) each time are one
// address's, 429 past ten, the right token too.
func TestAdminGuessesWithRotatedForwardedFor(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	rl := &failing{RateLimiter: ratelimit.New(rdb, prefix)}
	g := newGuessed(t, rl, adminGuessLimit(), handler.Deps{})
	statuses := map[int]int{}
	for i := range 25 {
		statuses[g.seed(t, "wrong", fmt.Sprintf("10.7.%d.%d", i/250, i%250+1))]++
	}
	if statuses[401] > rl.most() || statuses[401]+statuses[429] != 25 {
		t.Errorf("25 wrong tokens, each naming another address in X-Forwarded-For: %v; want at most %d × 401, the rest 429", statuses, rl.most())
	}
	// Unless a Take failed, which left room in the replica's memory.
	if s := g.seed(t, adminToken, "10.7.9.9"); s != 429 && rl.failed.Load() == 0 {
		t.Errorf("the right token past the limit, from a fresh X-Forwarded-For: %d; want 429", s)
	}
}

// A burst of wrong tokens at once, with the right one among them: no more
// wrong tokens are compared (logged, and answered 401) than the limit allows, however
// many arrive together. The right one, if compared (200), gives its guess
// back, which one more wrong token may then take. The limiter holds the
// guesses until every wrong one has come to it, so that all are in flight
// before any is counted.
func TestAdminGuessesAtOnce(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	const wrong = 40
	rl := &failing{RateLimiter: ratelimit.New(rdb, prefix), hold: wrong, all: make(chan struct{})}
	g := newGuessed(t, rl, adminGuessLimit(), handler.Deps{})
	answers := make(chan int, wrong+1)
	start := make(chan struct{})
	for i := range wrong + 1 {
		bearer := fmt.Sprintf("wrong-%d", i)
		if i == wrong/2 {
			bearer = adminToken
		}
		go func() {
			<-start
			answers <- g.seed(t, bearer, "")
		}()
	}
	close(start)
	statuses := map[int]int{}
	for range wrong + 1 {
		statuses[<-answers]++
	}
	// Each wrong token compared is logged, whatever it is answered.
	compared := strings.Count(g.log.String(), `"msg":"admin: missing or wrong token"`)
	if limit := rl.most(); compared > limit || statuses[401] != compared || statuses[401]+statuses[200]+statuses[429] != wrong+1 {
		t.Errorf("%d tokens at once, one of them right: %v, %d wrong ones compared; want at most %d compared and answered 401, the rest 429 or 200",
			wrong+1, statuses, compared, limit)
	}
	if n := g.seeds.Load(); n != int64(statuses[200]) {
		t.Errorf("%d seeds; want %d, one per 200", n, statuses[200])
	}
}

// Without Redis the guesses are limited in the replica's memory, at the
// same rate: the right token gets in while within the limit, and costs
// nothing of it; past ten failed checks every token is 429. The outage is
// logged at warn, once, not once a guess.
func TestAdminGuessesWithoutRedis(t *testing.T) {
	g := newGuessed(t, ratelimit.New(downRedis(t), "rl:"), adminGuessLimit(), handler.Deps{})
	for i := range 9 {
		if s := g.seed(t, "wrong", ""); s != 401 {
			t.Fatalf("wrong token %d without Redis: %d; want 401", i+1, s)
		}
	}
	for i := range 3 {
		if s := g.seed(t, adminToken, ""); s != 200 {
			t.Errorf("right token %d after 9 wrong ones, without Redis: %d; want 200", i+1, s)
		}
	}
	if s := g.seed(t, "wrong", ""); s != 401 {
		t.Errorf("tenth wrong token without Redis: %d; want 401", s)
	}
	for _, bearer := range []string{"wrong", adminToken} {
		if s := g.seed(t, bearer, ""); s != 429 {
			t.Errorf("%q past ten wrong tokens, without Redis: %d; want 429", bearer, s)
		}
	}
	if n := g.seeds.Load(); n != 3 {
		t.Errorf("%d seeds; want 3", n)
	}
	if n := g.warnings("Redis did not answer"); n != 1 {
		t.Errorf("%d warn lines of Redis not answering for %d guesses; want 1:\n%s", n, 15, g.log)
	}
}

// When Redis does not answer, a public limit lets requests through and
// says so at warn: once for a burst of failures, not once each.
func TestRateLimitFailureLoggedAtWarn(t *testing.T) {
	g := newGuessed(t, ratelimit.New(downRedis(t), "rl:"), handler.Limits{Client: ratelimit.PerSecond(1000, 0)},
		handler.Deps{Stock: stockFunc(func(context.Context, int64) (int, error) { return 1, nil })})
	const n = 20
	for i := range n {
		res, err := http.Get(g.url + "/api/v1/products/1/stock")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("read %d without Redis: %d; want 200 (fail open)", i+1, res.StatusCode)
		}
	}
	if got := counterValue(t, g.reg, "shop_rate_limit_total", map[string]string{"limit": "client", "result": "failed_open"}); got != n {
		t.Errorf("failed_open %v; want %d", got, n)
	}
	if got := g.warnings(`"msg":"rate limit: Redis did not answer; let through"`); got != 1 {
		t.Errorf("%d warn lines for %d requests let through; want 1:\n%s", got, n, g.log)
	}
}
