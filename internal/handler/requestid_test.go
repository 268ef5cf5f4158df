package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/handler"
	"shop/internal/requestid"
	"shop/internal/stock"
	"shop/internal/testenv"
)

var madeID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// tracedAPI serves the API with an Orders that logs with the context it is
// given, as the real one does, and answers by SKU: 1 places the order, 2 is
// busy (503), 3 sold out (409), 4 fails unexpectedly (500), 5 panics.
func tracedAPI(t *testing.T) (url string, log *testenv.Log, reg *prometheus.Registry) {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	log, reg = &testenv.Log{}, prometheus.NewRegistry()
	logger := slog.New(requestid.LogHandler(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	orders := orderFunc(func(ctx context.Context, sku, user int64, _ string) (stock.Order, error) {
		logger.InfoContext(ctx, "fake order", "sku", sku)
		switch sku {
		case 2:
			return stock.Order{}, fmt.Errorf("%w: sku %d", stock.ErrBusy, sku)
		case 3:
			return stock.Order{}, fmt.Errorf("%w: sku %d", stock.ErrSoldOut, sku)
		case 4:
			return stock.Order{}, errors.New("something unforeseen")
		case 5:
			panic("fake order panics")
		}
		return stock.Order{ID: 1, SKUID: sku, UserID: user, Status: stock.StatusPaid}, nil
	})
	srv := serve(t, both(handler.New(handler.Deps{Logger: logger, Orders: orders, Registry: reg}, handler.Settings{})))
	t.Cleanup(srv.Close)
	return srv.URL, log, reg
}

// traced is an answer of the traced API.
type traced struct {
	status int
	ids    []string // the X-Request-ID headers
	body   string
}

// send sends method path with body (JSON when not empty) and the
// X-Request-ID headers ids, not following redirects.
func send(t *testing.T, method, url, body string, ids ...string) traced {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, id := range ids {
		req.Header.Add(requestid.Header, id)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return traced{status: res.StatusCode, ids: res.Header.Values(requestid.Header), body: string(raw)}
}

// bodyID returns the error body's request_id, and whether it has one.
func bodyID(t *testing.T, r traced) (string, bool) {
	t.Helper()
	var b struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.body), &b); err != nil || b.Error == nil {
		t.Fatalf("%d: body is not the error shape: %q", r.status, r.body)
	}
	id, ok := b.Error["request_id"].(string)
	return id, ok
}

// Every answer carries one X-Request-ID: the request's own when it is
// valid, else a new one — those gin gives without running middleware (a
// redirect) and those of a panic included.
func TestEveryAnswerHasARequestID(t *testing.T) {
	url, _, _ := tracedAPI(t)
	order := func(sku int) string { return fmt.Sprintf(`{"sku_id":%d,"user_id":1}`, sku) }
	requests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"health", "GET", "/healthz", "", 200},
		{"order placed", "POST", "/api/v1/orders", order(1), 201},
		{"busy", "POST", "/api/v1/orders", order(2), 503},
		{"panic", "POST", "/api/v1/orders", order(5), 500},
		{"no such route", "GET", "/nothing", "", 404},
		{"wrong method", "GET", "/api/v1/orders", "", 405},
		{"not JSON", "POST", "/api/v1/orders", "", 415},
		{"too large", "POST", "/api/v1/orders", strings.Repeat(" ", 8<<10) + order(1), 413},
		{"trailing slash", "GET", "/healthz/", "", 301},
	}
	long := strings.Repeat("x", 128)
	given := []string{"0123456789abcdef0123456789abcdef", "a", long, "Az09._:-", "550e8400-e29b-41d4-a716-446655440000"}
	refused := [][]string{nil, {""}, {long + "x"}, {"a b"}, {"a/b"}, {`a"b`}, {"a,b"}, {"ключ"}, {"one", "two"}}
	for _, rq := range requests {
		t.Run(rq.name, func(t *testing.T) {
			for _, id := range given {
				r := send(t, rq.method, url+rq.path, rq.body, id)
				if r.status != rq.status {
					t.Fatalf("status %d, want %d: %s", r.status, rq.status, r.body)
				}
				if len(r.ids) != 1 || r.ids[0] != id {
					t.Errorf("sent X-Request-ID %q, got back %q; want it echoed, once", id, r.ids)
				}
			}
			for _, ids := range refused {
				r := send(t, rq.method, url+rq.path, rq.body, ids...)
				if len(r.ids) != 1 || !madeID.MatchString(r.ids[0]) {
					t.Errorf("sent X-Request-ID %q, got back %q; want one new id of 32 lowercase hex digits", ids, r.ids)
				}
			}
		})
	}
	if a, b := send(t, "GET", url+"/healthz", ""), send(t, "GET", url+"/healthz", ""); a.ids[0] == b.ids[0] {
		t.Errorf("two requests without an id were both given %q", a.ids[0])
	}
}

// A request's id is on its access log line and on the lines its work logs
// with its context; a 5xx body carries it, other errors do not.
func TestRequestIDInLogsAndFailures(t *testing.T) {
	url, log, _ := tracedAPI(t)
	tests := []struct {
		name, method, path, body string
		status                   int
		// logged are the messages the request's lines must include.
		logged []string
	}{
		{"placed", "POST", "/api/v1/orders", `{"sku_id":1,"user_id":1}`, 201, []string{"fake order", "request"}},
		{"busy", "POST", "/api/v1/orders", `{"sku_id":2,"user_id":1}`, 503, []string{"fake order", "request"}},
		{"sold out", "POST", "/api/v1/orders", `{"sku_id":3,"user_id":1}`, 409, []string{"fake order", "request"}},
		{"unforeseen", "POST", "/api/v1/orders", `{"sku_id":4,"user_id":1}`, 500, []string{"fake order", "request"}},
		{"panic", "POST", "/api/v1/orders", `{"sku_id":5,"user_id":1}`, 500, []string{"fake order", "panic", "request"}},
		{"invalid", "POST", "/api/v1/orders", `{"sku_id":1}`, 400, []string{"request"}},
		{"no such route", "GET", "/nothing", "", 404, []string{"request"}},
		{"not JSON", "POST", "/api/v1/orders", "", 415, []string{"request"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf("trace-%d", i)
			r := send(t, tt.method, url+tt.path, tt.body, id)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			if r.status >= 400 {
				switch got, ok := bodyID(t, r); {
				case r.status >= 500 && got != id:
					t.Errorf("%d body %s: want request_id %q", r.status, r.body, id)
				case r.status < 500 && ok:
					t.Errorf("%d body %s: want no request_id below 500", r.status, r.body)
				}
			}
			if missing := linesOf(t, log.String(), id, tt.logged); len(missing) > 0 {
				t.Errorf("no line %q with request_id %q in the log:\n%s", missing, id, log)
			}
		})
	}
}

// A panic is answered 500, and is a request like any other: logged with
// its status on the access log line and counted.
func TestPanicIsLoggedAndCounted(t *testing.T) {
	url, log, reg := tracedAPI(t)
	if r := send(t, "POST", url+"/api/v1/orders", `{"sku_id":5,"user_id":1}`, "panic-1"); r.status != 500 {
		t.Fatalf("status %d, want 500: %s", r.status, r.body)
	}
	if !strings.Contains(log.String(), `"msg":"request","method":"POST","path":"/api/v1/orders","status":500`) {
		t.Errorf("no access log line with status 500 for the panic:\n%s", log)
	}
	if s := series(t, reg, "shop_http_requests_total"); s["code=500,method=POST,route=/api/v1/orders"] != 1 {
		t.Errorf("shop_http_requests_total = %v, want the panic counted as a 500", s)
	}
}

// linesOf returns those of msgs that no line of log carries with
// request_id id.
func linesOf(t *testing.T, log, id string, msgs []string) []string {
	t.Helper()
	seen := map[string]bool{}
	for line := range strings.Lines(log) {
		var rec struct {
			Msg string `json:"msg"`
			ID  string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if rec.ID == id {
			seen[rec.Msg] = true
		}
	}
	var missing []string
	for _, m := range msgs {
		if !seen[m] {
			missing = append(missing, m)
		}
	}
	return missing
}
