package handler_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/handler"
	"shop/internal/ratelimit"
	"shop/internal/stock"
)

// fakeLimiter answers every Take and Check with wait and err, but those of
// a buyer's actions other than orders (user-action:), which it lets
// through while actions is zero.
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

func (f *fakeLimiter) Check(ctx context.Context, key string, l ratelimit.Limit) (time.Duration, error) {
	return f.Take(ctx, key, l)
}

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
