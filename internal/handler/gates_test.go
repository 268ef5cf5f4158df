package handler_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/cache"
	"shop/internal/handler"
	"shop/internal/lock"
	"shop/internal/ratelimit"
	"shop/internal/stock"
	"shop/internal/testenv"

	"gorm.io/gorm"
)

// gatedAPI is the public API as cmd/shop wires it, on real MariaDB and
// Redis: buyers with bearer tokens, a payment window, the per-user limit
// of orders, the per-user rate limit, the product cache's Bloom filter in
// front of orders and stock reads, and the public reads under a gate of
// their own pool (public). What reached the service is counted in calls.
type gatedAPI struct {
	*api
	svc    *stock.Service
	public *gorm.DB
	calls  *calls
}

// calls counts what the API asked of the order service and the replays.
type calls struct {
	svc                         *stock.Service
	replays                     handler.Replays
	placed, replayed, cancelled atomic.Int64
}

func (c *calls) PlaceOrder(ctx context.Context, sku, user int64, key string) (stock.Order, error) {
	c.placed.Add(1)
	return c.svc.PlaceOrder(ctx, sku, user, key)
}

func (c *calls) KnownSoldOut(sku int64) bool { return c.svc.KnownSoldOut(sku) }

func (c *calls) Order(ctx context.Context, user, id int64) (stock.Order, error) {
	return c.svc.Order(ctx, user, id)
}

func (c *calls) BuyerOrder(ctx context.Context, user, id int64) (stock.Order, error) {
	return c.svc.BuyerOrder(ctx, user, id)
}

func (c *calls) Cancel(ctx context.Context, user, id int64) (stock.Order, error) {
	c.cancelled.Add(1)
	return c.svc.Cancel(ctx, user, id)
}

func (c *calls) Replay(ctx context.Context, sku, user int64, key string) (stock.Order, error) {
	c.replayed.Add(1)
	return c.replays.Replay(ctx, sku, user, key)
}

func newGatedAPI(t *testing.T, userLimit ratelimit.Limit) *gatedAPI {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	catalog := stock.NewCatalog(db.Gorm)
	if err := catalog.Seed(ctx, 3, 5); err != nil {
		t.Fatal(err)
	}
	// The public reads' pool, of one connection, which a test may hold.
	publicPool := db.OpenReads(t, 1)
	public := stock.NewCatalog(publicPool).Public(2, stock.DefaultGateWait)
	mutex := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix + "cache:mutex:", NoFencing: true})
	products := cache.New(cache.Deps{Redis: rdb, Source: catalog, Mutex: mutex}, cache.Settings{Prefix: prefix + "cache:", Bloom: true})
	t.Cleanup(products.Close)
	if _, err := products.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	svc := stock.NewService(stock.Deps{DB: db.Gorm, Public: public, Locks: lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, Wait: 10 * time.Second})},
		stock.Settings{Fencing: true, PayWindow: time.Hour, UserLimit: 3}, stock.Hooks{})
	a := &gatedAPI{api: &api{db: db, rdb: rdb, prefix: prefix, reg: prometheus.NewRegistry(), log: &testenv.Log{}},
		svc: svc, public: publicPool, calls: &calls{svc: svc, replays: public}}
	srv := serve(t, both(handler.New(handler.Deps{
		Logger:    slog.New(slog.NewJSONHandler(a.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registry:  a.reg,
		Orders:    a.calls,
		Lifecycle: a.calls,
		Replays:   a.calls,
		Auth:      hsVerifier(t),
		Products:  products,
		Stock:     public,
		Filter:    products,
		Verifier:  webhookVerifier(t),
		Payments:  svc,
		Limiter:   ratelimit.New(rdb, prefix+"limit:"),
	}, handler.Settings{Limits: handler.Limits{User: userLimit}})))
	a.url = srv.URL
	return a
}

// as is the Authorization header of buyer user.
func as(t *testing.T, user int64) map[string][]string {
	return bearer(mint(t, jwt.SigningMethodHS256, jwtSecret, strconv.FormatInt(user, 10), time.Now().Add(time.Hour)))
}

// fillPublicGate fills the public reads' gate until the test ends, as a
// flood of anonymous stock reads does: the public pool's one connection is
// held, and as many reads as the gate has places wait for it, each in its
// place. A stock read then is refused 503.
func (a *gatedAPI) fillPublicGate(t *testing.T, places int) {
	t.Helper()
	sqlDB, err := a.public.DB()
	if err != nil {
		t.Fatal(err)
	}
	held, err := sqlDB.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	flood, stop := context.WithCancel(context.Background())
	var readers sync.WaitGroup
	for range places {
		readers.Go(func() {
			req, _ := http.NewRequestWithContext(flood, "GET", a.url+"/api/v1/products/1/stock", nil)
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
			}
		})
	}
	t.Cleanup(func() {
		stop()
		readers.Wait()
		held.Close()
	})
	// Full once every reader waits for the held connection: each took its
	// place first.
	for sqlDB.Stats().WaitCount < int64(places) {
		time.Sleep(time.Millisecond)
	}
	if r := a.do(t, "GET", "/api/v1/products/2/stock", "", nil, nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("stock read through the full public gate: %d %s, want 503", r.status, r.raw)
	}
}

// reserve places an order of sku for each of users through the service,
// returning them in the same order.
func (a *gatedAPI) reserve(t *testing.T, sku int64, users ...int64) []stock.Order {
	t.Helper()
	var placed []stock.Order
	for _, u := range users {
		o, err := a.svc.PlaceOrder(context.Background(), sku, u, "")
		if err != nil {
			t.Fatal(err)
		}
		placed = append(placed, o)
	}
	return placed
}

// A burst of what buyers and the provider send near pay_by, all at once
// while anonymous reads fill the public gate: the provider's payment
// events, cancellations, and the buyers' own order reads (with their
// bearer tokens). None is refused: they are not public reads. (An order
// read without a token, SHOP_AUTH=none, is one; it is refused 503 then.)
func TestLifecycleBurstBesideAFullPublicGate(t *testing.T) {
	a := newGatedAPI(t, ratelimit.PerSecond(5, 10))
	orders := append(a.reserve(t, 1, 11, 12, 13), a.reserve(t, 2, 14, 15, 16)...)
	a.fillPublicGate(t, 2)

	type sent struct {
		what   string
		status int
		raw    string
	}
	results := make(chan sent, 3*len(orders))
	var burst sync.WaitGroup
	send := func(what, method, path, body string, header map[string][]string) {
		burst.Go(func() {
			req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
			if err != nil {
				results <- sent{what, 0, err.Error()}
				return
			}
			req.Header.Set("Content-Type", "application/json")
			for k, vs := range header {
				req.Header[k] = vs
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- sent{what, 0, err.Error()}
				return
			}
			defer res.Body.Close()
			var raw strings.Builder
			_, _ = io.Copy(&raw, res.Body)
			results <- sent{what, res.StatusCode, raw.String()}
		})
	}
	for i, o := range orders {
		path := fmt.Sprintf("/api/v1/orders/%d", o.ID)
		send("order read "+path, "GET", path, "", as(t, o.UserID))
		if i%2 == 0 {
			body := paid(o.ID, fmt.Sprintf("pay_%d", o.ID), *o.AmountCents, *o.Currency)
			send("payment of "+path, "POST", "/api/v1/payments/events", body, signed(t, webhookSecret, fmt.Sprintf("msg_%d", o.ID), time.Now(), body))
		} else {
			send("cancel of "+path, "POST", path+"/cancel", "{}", as(t, o.UserID))
		}
	}
	burst.Wait()
	close(results)
	for r := range results {
		if r.status != http.StatusOK {
			t.Errorf("%s beside the full public gate: %d %s, want 200", r.what, r.status, r.raw)
		}
	}
	for i, o := range orders {
		want := stock.StatusPaid
		if i%2 == 1 {
			want = stock.StatusCancelled
		}
		if got := a.orderStatus(t, o.ID); got != want {
			t.Errorf("order %d: %s, want %s", o.ID, got, want)
		}
	}
}

// orderStatus is order id's status as MySQL has it.
func (a *gatedAPI) orderStatus(t *testing.T, id int64) string {
	t.Helper()
	var status string
	if err := a.db.Gorm.Raw("SELECT status FROM orders WHERE id = ?", id).Scan(&status).Error; err != nil {
		t.Fatal(err)
	}
	return status
}

// Orders for products the Bloom filter rules out are answered 404 before
// anything else: no order slot, no MySQL read (the order service is never
// asked), no counter row under the per-user limit, and nothing taken from
// the buyer's rate limit, which still lets a real order through.
func TestOrdersForAbsentProductsStopAtTheFilter(t *testing.T) {
	a := newGatedAPI(t, ratelimit.Limit{Rate: 1, Burst: 1, Period: time.Minute})
	for sku := 1000; sku < 1005; sku++ {
		r := a.order(t, fmt.Sprintf(`{"sku_id":%d}`, sku), as(t, 9))
		if r.status != http.StatusNotFound || errorCode(t, r) != "not_found" {
			t.Errorf("order of absent product %d: %d %s, want 404 not_found", sku, r.status, r.raw)
		}
	}
	if n := a.calls.placed.Load(); n != 0 {
		t.Errorf("the order service was asked %d times for absent products, want 0", n)
	}
	var counters int64
	if err := a.db.Gorm.Raw("SELECT COUNT(*) FROM user_orders WHERE user_id = 9").Scan(&counters).Error; err != nil {
		t.Fatal(err)
	}
	if counters != 0 {
		t.Errorf("user 9 has %d counter rows after orders of absent products, want none", counters)
	}
	if r := a.order(t, `{"sku_id":1}`, as(t, 9)); r.status != http.StatusCreated {
		t.Errorf("an order of a product after them: %d %s, want 201 within the rate limit", r.status, r.raw)
	}
}

// Past the per-user order limit, keyed orders that replay nothing and
// cancellations are held to the buyer's allowance of actions: beyond its
// burst they are answered 429 without reaching MySQL.
func TestReplaysAndCancelsHeldPerBuyer(t *testing.T) {
	const burst = 2
	a := newGatedAPI(t, ratelimit.Limit{Rate: 1, Burst: burst, Period: time.Minute})
	for i := range burst {
		if r := a.order(t, fmt.Sprintf(`{"sku_id":%d}`, i+1), as(t, 9)); r.status != http.StatusCreated {
			t.Fatalf("order %d within the limit: %d %s", i, r.status, r.raw)
		}
	}
	const tries = 6
	for i := range tries {
		h := as(t, 9)
		h["Idempotency-Key"] = []string{fmt.Sprintf("never-placed-%d", i)}
		if r := a.order(t, `{"sku_id":3}`, h); r.status != http.StatusTooManyRequests {
			t.Errorf("keyed order %d over the limit: %d %s, want 429", i, r.status, r.raw)
		}
	}
	if n := a.calls.replayed.Load(); n != burst {
		t.Errorf("%d replay look-ups for %d keyed orders over the limit, want the allowance's %d", n, tries, burst)
	}

	// Another buyer, whose allowance of actions is whole.
	o := a.reserve(t, 3, 10)[0]
	codes := map[int]int{}
	for range tries {
		r := a.do(t, "POST", fmt.Sprintf("/api/v1/orders/%d/cancel", o.ID), "application/json", strings.NewReader("{}"), as(t, 10))
		codes[r.status]++
	}
	if n := a.calls.cancelled.Load(); n != burst || codes[http.StatusOK] != burst || codes[http.StatusTooManyRequests] != tries-burst {
		t.Errorf("%d cancellations sent: %d reached the service, answers %v; want %d, each 200, the rest 429", tries, n, codes, burst)
	}
}
