package handler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"shop/internal/cache"
	"shop/internal/handler"
	"shop/internal/lock"
	"shop/internal/readiness"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

const adminToken = "s3cret"

type api struct {
	url string
	db  *testenv.DB
	// rdb and prefix are the Redis client and key prefix the API uses.
	rdb    *redis.Client
	prefix string
	// reg has the API's metrics, log its log (debug level and up).
	reg *prometheus.Registry
	log *testenv.Log
}

// newAPI serves the whole API on real MariaDB and Redis with products 1..3
// of 5 units each.
func newAPI(t *testing.T, adminToken string) *api {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	catalog := stock.NewCatalog(db.Gorm)
	if err := catalog.Seed(context.Background(), 3, 5); err != nil {
		t.Fatal(err)
	}
	locks := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, Wait: 10 * time.Second})
	mutex := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix + "cache:mutex:", NoFencing: true})
	products := cache.New(cache.Deps{Redis: rdb, Source: catalog, Mutex: mutex}, cache.Settings{Prefix: prefix + "cache:", Bloom: true})
	t.Cleanup(products.Close)
	if _, err := products.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := &api{db: db, rdb: rdb, prefix: prefix, reg: prometheus.NewRegistry(), log: &testenv.Log{}}
	orders := stock.NewService(stock.Deps{DB: db.Gorm, Locks: locks, Announcer: products}, stock.Settings{Fencing: true}, stock.Hooks{})
	srv := serve(t, both(handler.New(handler.Deps{
		Logger:   slog.New(slog.NewJSONHandler(a.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Orders:   orders,
		Products: products,
		Stock:    catalog,
		Seeder: handler.SeedFunc(func(ctx context.Context, n, units int, o stock.SeedOptions) ([]string, error) {
			if err := catalog.SeedWith(ctx, n, units, o); err != nil {
				return nil, err
			}
			_, err := products.Reset(ctx)
			return nil, err
		}),
		// As cmd/shop wires it, but for the other replicas' announcement.
		Admin: handler.ChangeProductFunc(func(ctx context.Context, id int64, c stock.Change) (stock.Product, []string, error) {
			p, err := orders.ChangeProduct(ctx, id, c)
			if err != nil {
				return stock.Product{}, nil, err
			}
			return p, nil, products.Invalidate(ctx, id)
		}),
		Refunds:  catalog,
		Verifier: webhookVerifier(t),
		Payments: orders,
		Ready:    probed(t, "redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() }),
		Registry: a.reg,
	}, handler.Settings{AdminToken: adminToken})))
	a.url = srv.URL
	return a
}

// probed is /readyz's answer as cmd/shop wires it, a readiness.Tracker's,
// for one dependency, after one probe of check.
func probed(t *testing.T, name string, check readiness.Check) func() []string {
	t.Helper()
	tr := readiness.New([]readiness.Dependency{{Name: name, Check: check}}, readiness.Options{})
	tr.Probe(context.Background())
	return tr.Failing
}

type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (a *api) do(t *testing.T, method, path, contentType string, body io.Reader, header map[string][]string) response {
	t.Helper()
	req, err := http.NewRequest(method, a.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := response{status: res.StatusCode, header: res.Header, raw: string(raw)}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("%s %s: body is not JSON: %q", method, path, raw)
	}
	return r
}

func (a *api) order(t *testing.T, body string, header map[string][]string) response {
	t.Helper()
	return a.do(t, "POST", "/api/v1/orders", "application/json", strings.NewReader(body), header)
}

// errorCode returns the code of the JSON error shape, failing if the body
// has another shape.
func errorCode(t *testing.T, r response) string {
	t.Helper()
	e, ok := r.body["error"].(map[string]any)
	if !ok || len(r.body) != 1 {
		t.Fatalf("body %s is not {\"error\":{…}}", r.raw)
	}
	code, _ := e["code"].(string)
	msg, _ := e["message"].(string)
	if code == "" || msg == "" {
		t.Fatalf("error without code or message: %s", r.raw)
	}
	for _, leak := range []string{"goroutine", ".go:", "SELECT", "UPDATE", "Error 1"} {
		if strings.Contains(msg, leak) {
			t.Errorf("message leaks internals (%q): %s", leak, msg)
		}
	}
	return code
}

func (a *api) state(t *testing.T) verify.Report {
	t.Helper()
	r, err := verify.Sale(context.Background(), a.db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBadRequestsChangeNothing(t *testing.T) {
	a := newAPI(t, adminToken)
	before := a.state(t)
	h := func(kv ...string) map[string][]string {
		m := map[string][]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = append(m[kv[i]], kv[i+1])
		}
		return m
	}
	ok := `{"sku_id":1,"user_id":1}`
	tests := []struct {
		name        string
		method      string
		path        string
		contentType string
		body        io.Reader
		header      map[string][]string
		status      int
		code        string
	}{
		{"malformed JSON", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,`), nil, 400, "invalid_argument"},
		{"not JSON at all", "POST", "/api/v1/orders", "application/json", strings.NewReader(`sku_id=1`), nil, 400, "invalid_argument"},
		{"empty body", "POST", "/api/v1/orders", "application/json", strings.NewReader(``), nil, 400, "invalid_argument"},
		{"null", "POST", "/api/v1/orders", "application/json", strings.NewReader(`null`), nil, 400, "invalid_argument"},
		{"array", "POST", "/api/v1/orders", "application/json", strings.NewReader(`[1,2]`), nil, 400, "invalid_argument"},
		{"missing sku_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"user_id":1}`), nil, 400, "invalid_argument"},
		{"missing user_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1}`), nil, 400, "invalid_argument"},
		{"null sku_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":null,"user_id":1}`), nil, 400, "invalid_argument"},
		{"zero sku_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":0,"user_id":1}`), nil, 400, "invalid_argument"},
		{"negative sku_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":-1,"user_id":1}`), nil, 400, "invalid_argument"},
		{"zero user_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"user_id":0}`), nil, 400, "invalid_argument"},
		{"negative user_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"user_id":-5}`), nil, 400, "invalid_argument"},
		{"sku_id past int64", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":9223372036854775808,"user_id":1}`), nil, 400, "invalid_argument"},
		{"huge user_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"user_id":1e400}`), nil, 400, "invalid_argument"},
		{"fractional sku_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1.5,"user_id":1}`), nil, 400, "invalid_argument"},
		{"exponent sku_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1e2,"user_id":1}`), nil, 400, "invalid_argument"},
		{"string sku_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":"1","user_id":1}`), nil, 400, "invalid_argument"},
		{"string user_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"user_id":"7"}`), nil, 400, "invalid_argument"},
		{"bool sku_id", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":true,"user_id":1}`), nil, 400, "invalid_argument"},
		{"unknown field", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"user_id":1,"qty":2}`), nil, 400, "invalid_argument"},
		{"trailing data", "POST", "/api/v1/orders", "application/json", strings.NewReader(ok + `{}`), nil, 400, "invalid_argument"},
		{"field name in capitals", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"SKU_ID":1,"user_id":1}`), nil, 400, "invalid_argument"},
		{"field name in mixed case", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"User_Id":1}`), nil, 400, "invalid_argument"},
		{"field given twice", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"sku_id":2,"user_id":1}`), nil, 400, "invalid_argument"},
		{"field given twice, once in capitals", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"user_id":1,"SKU_ID":2}`), nil, 400, "invalid_argument"},
		{"no such SKU", "POST", "/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":9223372036854775807,"user_id":1}`), nil, 404, "not_found"},
		{"text/plain", "POST", "/api/v1/orders", "text/plain", strings.NewReader(ok), nil, 415, "unsupported_media_type"},
		{"no content type", "POST", "/api/v1/orders", "", strings.NewReader(ok), nil, 415, "unsupported_media_type"},
		{"form content type", "POST", "/api/v1/orders", "application/x-www-form-urlencoded", strings.NewReader(ok), nil, 415, "unsupported_media_type"},
		{"oversized body", "POST", "/api/v1/orders", "application/json", strings.NewReader(strings.Repeat(" ", 8<<10) + ok), nil, 413, "too_large"},
		{"oversized chunked body", "POST", "/api/v1/orders", "application/json", io.MultiReader(strings.NewReader(strings.Repeat(" ", 8<<10)), strings.NewReader(ok)), nil, 413, "too_large"},
		{"key with space", "POST", "/api/v1/orders", "application/json", strings.NewReader(ok), h("Idempotency-Key", "a b"), 400, "invalid_argument"},
		{"key too long", "POST", "/api/v1/orders", "application/json", strings.NewReader(ok), h("Idempotency-Key", strings.Repeat("k", 65)), 400, "invalid_argument"},
		{"empty key", "POST", "/api/v1/orders", "application/json", strings.NewReader(ok), h("Idempotency-Key", ""), 400, "invalid_argument"},
		{"two keys", "POST", "/api/v1/orders", "application/json", strings.NewReader(ok), h("Idempotency-Key", "a", "Idempotency-Key", "b"), 400, "invalid_argument"},
		{"non-ASCII key", "POST", "/api/v1/orders", "application/json", strings.NewReader(ok), h("Idempotency-Key", "ключ"), 400, "invalid_argument"},
		{"GET orders", "GET", "/api/v1/orders", "", nil, nil, 405, "method_not_allowed"},
		{"product id text", "GET", "/api/v1/products/abc", "", nil, nil, 400, "invalid_argument"},
		{"product id zero", "GET", "/api/v1/products/0", "", nil, nil, 400, "invalid_argument"},
		{"product id negative", "GET", "/api/v1/products/-3", "", nil, nil, 400, "invalid_argument"},
		{"product id huge", "GET", "/api/v1/products/99999999999999999999", "", nil, nil, 400, "invalid_argument"},
		{"product id with plus sign", "GET", "/api/v1/products/+5", "", nil, nil, 400, "invalid_argument"},
		{"product id with leading zeros", "GET", "/api/v1/products/007", "", nil, nil, 400, "invalid_argument"},
		{"stock id with leading zero", "GET", "/api/v1/products/01/stock", "", nil, nil, 400, "invalid_argument"},
		{"stock id with plus sign", "GET", "/api/v1/products/+1/stock", "", nil, nil, 400, "invalid_argument"},
		{"product missing", "GET", "/api/v1/products/4", "", nil, nil, 404, "not_found"},
		{"stock id text", "GET", "/api/v1/products/x/stock", "", nil, nil, 400, "invalid_argument"},
		{"stock missing", "GET", "/api/v1/products/4/stock", "", nil, nil, 404, "not_found"},
		{"unknown route", "GET", "/api/v1/nothing", "", nil, nil, 404, "not_found"},
		{"seed without token", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1,"stock":1}`), nil, 401, "unauthorized"},
		{"seed wrong token", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1,"stock":1}`), h("Authorization", "Bearer nope"), 401, "unauthorized"},
		{"seed bad body", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":-1,"stock":1}`), h("Authorization", "Bearer "+adminToken), 400, "invalid_argument"},
		{"seed missing stock", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1}`), h("Authorization", "Bearer "+adminToken), 400, "invalid_argument"},
		{"seed field given twice", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1,"stock":1,"products":2}`), h("Authorization", "Bearer "+adminToken), 400, "invalid_argument"},
		{"seed field in capitals", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"Products":1,"stock":1}`), h("Authorization", "Bearer "+adminToken), 400, "invalid_argument"},
		{"seed scheme without token", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1,"stock":1}`), h("Authorization", "bearer"), 401, "unauthorized"},
		{"seed other scheme", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1,"stock":1}`), h("Authorization", "Basic "+adminToken), 401, "unauthorized"},
		{"seed token in other case", "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1,"stock":1}`), h("Authorization", "Bearer "+strings.ToUpper(adminToken)), 401, "unauthorized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := a.do(t, tt.method, tt.path, tt.contentType, tt.body, tt.header)
			if r.status != tt.status {
				t.Errorf("status = %d, want %d (%s)", r.status, tt.status, r.raw)
			}
			if code := errorCode(t, r); code != tt.code {
				t.Errorf("code = %q, want %q", code, tt.code)
			}
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type = %q", ct)
			}
		})
	}
	after := a.state(t)
	if after.Orders != before.Orders || after.Stock != before.Stock || after.Products != before.Products {
		t.Errorf("bad requests changed the database: before %+v, after %+v", before, after)
	}
}

func TestOrderFlow(t *testing.T) {
	a := newAPI(t, "")
	if r := a.do(t, "GET", "/api/v1/products/2", "", nil, nil); r.status != 200 || r.body["stock"] != 5.0 {
		t.Fatalf("product before any order: %d %s", r.status, r.raw)
	}
	r := a.order(t, `{"sku_id":2,"user_id":42}`, nil)
	if r.status != 201 {
		t.Fatalf("status %d: %s", r.status, r.raw)
	}
	for _, k := range []string{"order_id", "sku_id", "user_id", "created_at"} {
		if _, ok := r.body[k]; !ok {
			t.Errorf("201 body lacks %q: %s", k, r.raw)
		}
	}
	if r.body["sku_id"] != 2.0 || r.body["user_id"] != 42.0 {
		t.Errorf("body = %s", r.raw)
	}
	// The cached product shows the order at once: it was invalidated.
	if r := a.do(t, "GET", "/api/v1/products/2", "", nil, nil); r.status != 200 || r.body["stock"] != 4.0 {
		t.Errorf("cached product after one order: %d %s", r.status, r.raw)
	}
	if r := a.order(t, `{"sku_id":2,"user_id":42}`, nil); r.status != 409 || errorCode(t, r) != "already_ordered" {
		t.Errorf("second order of a user: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "GET", "/api/v1/products/2/stock", "", nil, nil); r.status != 200 || r.body["stock"] != 4.0 {
		t.Errorf("stock after one order: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "GET", "/api/v1/products/2", "", nil, nil); r.status != 200 || r.body["name"] != "Product 2" {
		t.Errorf("product: %d %s", r.status, r.raw)
	}
	for user := 1; user <= 4; user++ {
		a.order(t, fmt.Sprintf(`{"sku_id":2,"user_id":%d}`, user), nil)
	}
	if r := a.order(t, `{"sku_id":2,"user_id":5}`, nil); r.status != 409 || errorCode(t, r) != "sold_out" {
		t.Errorf("sixth buyer of five units: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "GET", "/readyz", "", nil, nil); r.status != 200 {
		t.Errorf("readyz: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1,"stock":1}`), nil); r.status != 404 {
		t.Errorf("admin API without a token configured: %d, want 404", r.status)
	}
}

func TestAdminSeed(t *testing.T) {
	a := newAPI(t, adminToken)
	a.order(t, `{"sku_id":1,"user_id":1}`, nil)
	if r := a.do(t, "GET", "/api/v1/products/1", "", nil, nil); r.status != 200 || r.body["stock"] != 4.0 {
		t.Fatalf("product 1 before the seed: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "GET", "/api/v1/products/9", "", nil, nil); r.status != 404 {
		t.Fatalf("product 9 before the seed: %d %s", r.status, r.raw)
	}
	// The scheme is case-insensitive (RFC 7235).
	r := a.do(t, "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":10,"stock":2}`),
		map[string][]string{"Authorization": {"bearer " + adminToken}})
	if r.status != 200 {
		t.Fatalf("seed: %d %s", r.status, r.raw)
	}
	if s := a.state(t); s.Products != 10 || s.Stock != 20 || s.Orders != 0 {
		t.Errorf("after seed: %+v", s)
	}
	// The seed reset the cache and the Bloom filter: the cached product 1
	// is gone and product 9 now exists.
	if r := a.do(t, "GET", "/api/v1/products/1", "", nil, nil); r.status != 200 || r.body["stock"] != 2.0 {
		t.Errorf("product 1 after the seed: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "GET", "/api/v1/products/9", "", nil, nil); r.status != 200 || r.body["stock"] != 2.0 {
		t.Errorf("product 9 after the seed: %d %s", r.status, r.raw)
	}
}

func TestIdempotencyKeyConcurrent(t *testing.T) {
	a := newAPI(t, "")
	const n = 50
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = map[any]int{}
		bad []string
	)
	for range n {
		wg.Go(func() {
			r := a.order(t, `{"sku_id":3,"user_id":9}`, map[string][]string{"Idempotency-Key": {"retry-me_1"}})
			mu.Lock()
			defer mu.Unlock()
			if r.status != 201 {
				bad = append(bad, fmt.Sprintf("%d %s", r.status, r.raw))
				return
			}
			ids[r.body["order_id"]]++
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("%d of %d requests failed, first: %s", len(bad), n, bad[0])
	}
	if len(ids) != 1 {
		t.Errorf("responses name %d different orders, want 1: %v", len(ids), ids)
	}
	if s := a.state(t); s.Orders != 1 || s.Stock != 14 {
		t.Errorf("MySQL has %d orders and %d units; want 1 and 14", s.Orders, s.Stock)
	}
}

// With Redis down an order cannot be locked: 503 busy with Retry-After, and
// nothing written; /readyz says so too. Product pages still answer.
func TestRedisDownIsBusy(t *testing.T) {
	db := testenv.MySQL(t)
	catalog := stock.NewCatalog(db.Gorm)
	if err := catalog.Seed(context.Background(), 1, 1); err != nil {
		t.Fatal(err)
	}
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { dead.Close() })
	srv := serve(t, both(handler.New(handler.Deps{
		Orders:   stock.NewService(stock.Deps{DB: db.Gorm, Locks: lock.NewRedis(dead, lock.RedisOptions{})}, stock.Settings{}, stock.Hooks{}),
		Products: cache.New(cache.Deps{Redis: dead, Source: catalog, Mutex: lock.NewRedis(dead, lock.RedisOptions{NoFencing: true})}, cache.Settings{Bloom: true}),
		Stock:    catalog,
		Ready:    probed(t, "redis", func(ctx context.Context) error { return dead.Ping(ctx).Err() }),
	}, handler.Settings{})))
	a := &api{url: srv.URL, db: db}

	r := a.order(t, `{"sku_id":1,"user_id":1}`, nil)
	if r.status != 503 || errorCode(t, r) != "busy" || r.header.Get("Retry-After") == "" {
		t.Errorf("order with Redis down: %d %s, Retry-After %q", r.status, r.raw, r.header.Get("Retry-After"))
	}
	if r := a.do(t, "GET", "/readyz", "", nil, nil); r.status != 503 || errorCode(t, r) != "unavailable" || !strings.Contains(r.raw, "redis") {
		t.Errorf("readyz with Redis down: %d %s; want 503 unavailable naming redis", r.status, r.raw)
	}
	// Product reads fall back to MySQL (within a limit the cache tests
	// exercise).
	if r := a.do(t, "GET", "/api/v1/products/1", "", nil, nil); r.status != 200 || r.body["stock"] != 1.0 {
		t.Errorf("product with Redis down: %d %s", r.status, r.raw)
	}
	if s := a.state(t); s.Orders != 0 || s.Stock != 1 {
		t.Errorf("a refused order changed the database: %+v", s)
	}
}
