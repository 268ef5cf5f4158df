package handler

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/auth"
	"shop/internal/ratelimit"
	"shop/internal/requestid"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// benchOrders answers orders from memory: benchSoldOut is known sold out,
// every other product places an order at once. What it costs is not the
// HTTP path's.
type benchOrders struct{}

const benchSoldOut = 2

func (benchOrders) KnownSoldOut(sku int64) bool { return sku == benchSoldOut }

func (benchOrders) PlaceOrder(_ context.Context, sku, user int64, _ string) (stock.Order, error) {
	if sku == benchSoldOut {
		return stock.Order{}, stock.ErrSoldOut
	}
	pay := time.Date(2026, 11, 28, 12, 15, 0, 0, time.UTC)
	amount, currency := int64(1999), "USD"
	return stock.Order{ID: 42, SKUID: sku, UserID: user, CreatedAt: pay.Add(-15 * time.Minute), Status: stock.StatusReserved,
		PayBy: &pay, AmountCents: &amount, Currency: &currency}, nil
}

// benchStack is which layers of the public listener a benchmark's handler
// has. The zero value has every layer addRoutes and New wire, with the
// access log at info (the default), so the public routes' lines, at debug,
// are off; each no* field leaves one layer out.
type benchStack struct {
	noRequestID, noObserve, noRecovery, noClientLimit, noBodyCheck bool
	// logOn logs every request (the level at debug); jwt authenticates
	// buyers with an HS256 token; userLimit takes each order from its
	// buyer's allowance in Redis, a limit never reached.
	logOn, jwt, userLimit bool
}

// handler builds the public listener's handler of healthz and orders with
// s's layers, in addRoutes's order.
func (s benchStack) handler(b *testing.B) (http.Handler, http.Header) {
	level := slog.LevelInfo
	if s.logOn {
		level = slog.LevelDebug
	}
	log := slog.New(requestid.LogHandler(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: level})))
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	var (
		store  RateLimiter
		limits Limits
	)
	if s.userLimit {
		rdb, prefix := testenv.Redis(b)
		store, limits.User = ratelimit.New(rdb, prefix), ratelimit.PerSecond(1<<30, 1<<30)
	}
	lim := newLimiter(store, limits, log, reg)
	header := http.Header{"Content-Type": {"application/json"}}
	var v Authenticator
	if s.jwt {
		secret := []byte("the benchmark's secret, 32 bytes")
		verifier, err := auth.New(auth.Options{Secret: secret})
		if err != nil {
			b.Fatal(err)
		}
		token, err := jwt.NewWithClaims(jwt.SigningMethodHS256,
			jwt.MapClaims{"sub": "7", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(secret)
		if err != nil {
			b.Fatal(err)
		}
		v = verifier
		header.Set("Authorization", "Bearer "+token)
	}

	r := newEngine(nil)
	if !s.noObserve {
		r.Use(observe(log, m, slog.LevelDebug))
	}
	if !s.noRecovery {
		r.Use(recovery(log))
	}
	r.GET("/healthz", handleHealthz())
	var chain []gin.HandlerFunc
	if !s.noClientLimit {
		chain = append(chain, lim.perClient())
	}
	chain = append(chain, authenticate(v, log))
	if !s.noBodyCheck {
		chain = append(chain, jsonBody())
	}
	r.POST("/api/v1/orders", append(chain, handlePlaceOrder(benchOrders{}, nil, nil, lim, m))...)
	if s.noRequestID {
		return r, header
	}
	return withRequestID(r), header
}

// benchBody is a request body the handler reads once per request, reset
// for the next without an allocation.
type benchBody struct{ bytes.Reader }

func (*benchBody) Close() error { return nil }

// benchWriter is a ResponseWriter that keeps the status and drops the
// body, reused from request to request.
type benchWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *benchWriter) Header() http.Header { return w.header }
func (w *benchWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *benchWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(p)
}

// BenchmarkHTTP measures the public listener in process, without a
// socket: GET /healthz, an order placed (201) and an order of a product
// known sold out (409, the hot SKU's usual answer), through each stack of
// layers. "served" is New's wiring; "all" is the same built layer by
// layer, and each "-x" row leaves layer x out, so that a layer's cost is
// "all" minus its row. The orders' answers come from memory. Each
// operation includes one allocation of the benchmark's own (the request's
// copy).
//
//	go test -run '^$' -bench HTTP -benchmem ./internal/handler
func BenchmarkHTTP(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	stacks := []struct {
		name  string
		stack benchStack
	}{
		{"all", benchStack{}},
		{"-requestid", benchStack{noRequestID: true}},
		{"-observe", benchStack{noObserve: true}},
		{"-recovery", benchStack{noRecovery: true}},
		{"-clientlimit", benchStack{noClientLimit: true}},
		{"-bodycheck", benchStack{noBodyCheck: true}},
		{"none", benchStack{noRequestID: true, noObserve: true, noRecovery: true, noClientLimit: true, noBodyCheck: true}},
		{"+log", benchStack{logOn: true}},
		{"+jwt", benchStack{jwt: true}},
		{"+userlimit", benchStack{userLimit: true}},
	}
	routes := []struct {
		name, method, path, body string
		status                   int
	}{
		{"healthz", http.MethodGet, "/healthz", "", http.StatusOK},
		{"order201", http.MethodPost, "/api/v1/orders", `{"sku_id":1,"user_id":7}`, http.StatusCreated},
		{"order409", http.MethodPost, "/api/v1/orders", `{"sku_id":` + strconv.Itoa(benchSoldOut) + `,"user_id":7}`, http.StatusConflict},
	}
	served := func(b *testing.B) (http.Handler, http.Header) {
		log := slog.New(requestid.LogHandler(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})))
		return New(Deps{Logger: log, Orders: benchOrders{}}, Settings{}).Public, http.Header{"Content-Type": {"application/json"}}
	}
	type build struct {
		name  string
		build func(*testing.B) (http.Handler, http.Header)
	}
	for _, rt := range routes {
		all := []build{{"served", served}}
		for _, s := range stacks {
			if rt.method == http.MethodGet && (s.stack.noClientLimit || s.stack.noBodyCheck || s.stack.jwt || s.stack.userLimit) {
				continue // the layers of the API's routes only
			}
			all = append(all, build{s.name, s.stack.handler})
		}
		for _, st := range all {
			b.Run(rt.name+"/"+st.name, func(b *testing.B) {
				h, header := st.build(b)
				tmpl := httptest.NewRequest(rt.method, rt.path, nil)
				tmpl.RemoteAddr = "192.0.2.1:40000"
				if rt.body != "" {
					tmpl.Header = header
					tmpl.ContentLength = int64(len(rt.body))
				}
				var (
					raw  = []byte(rt.body)
					body = &benchBody{}
					w    = &benchWriter{header: http.Header{}}
				)
				serve := func() {
					req := new(http.Request)
					*req = *tmpl
					if rt.body != "" {
						body.Reset(raw)
						req.Body = body
					}
					clear(w.header)
					w.status = 0
					w.body.Reset()
					h.ServeHTTP(w, req)
				}
				serve()
				if w.status != rt.status || w.body.Len() == 0 {
					b.Fatalf("%s %s: %d %s, want %d", rt.method, rt.path, w.status, w.body.String(), rt.status)
				}
				b.ReportAllocs()
				for b.Loop() {
					serve()
				}
			})
		}
	}
}
