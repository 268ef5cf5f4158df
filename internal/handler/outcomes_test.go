package handler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/handler"
	"shop/internal/lock"
	"shop/internal/stock"
)

// orderFunc is an Orders that answers with a function.
type orderFunc func(ctx context.Context, sku, user int64, key string) (stock.Order, error)

func (f orderFunc) PlaceOrder(ctx context.Context, sku, user int64, key string) (stock.Order, error) {
	return f(ctx, sku, user, key)
}

// KnownSoldOut knows of no product sold out: every order is asked of f.
func (orderFunc) KnownSoldOut(int64) bool { return false }

// noSoldOut is the memory of a fake Orders that knows of no product sold
// out: every order is asked of its PlaceOrder.
type noSoldOut struct{}

func (noSoldOut) KnownSoldOut(int64) bool { return false }

// An order whose COMMIT was sent but whose answer was lost may have been
// placed: 503 outcome_unknown, which tells the client to retry with its
// key, not busy (which says nothing was written) nor a 500.
func TestOutcomeUnknown(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	reg := prometheus.NewRegistry()
	lost := fmt.Errorf("%w: %w: sku 1: commit: %w", stock.ErrBusy, stock.ErrOutcomeUnknown, io.ErrUnexpectedEOF)
	srv := serve(t, both(handler.New(handler.Deps{
		Orders: orderFunc(func(context.Context, int64, int64, string) (stock.Order, error) {
			return stock.Order{}, lost
		}),
		Registry: reg,
	}, handler.Settings{})))
	a := &api{url: srv.URL}
	r := a.order(t, `{"sku_id":1,"user_id":1}`, map[string][]string{"Idempotency-Key": {"k1"}})
	if r.status != 503 || errorCode(t, r) != "outcome_unknown" || r.header.Get("Retry-After") == "" {
		t.Errorf("lost commit: %d %s, Retry-After %q; want 503 outcome_unknown with Retry-After", r.status, r.raw, r.header.Get("Retry-After"))
	}
	if msg := r.body["error"].(map[string]any)["message"]; msg != "the order may or may not have been placed; retry with the same Idempotency-Key" {
		t.Errorf("message %q", msg)
	}
	if s := series(t, reg, "shop_orders_total"); s["result=outcome_unknown"] != 1 || len(s) != 1 {
		t.Errorf("shop_orders_total = %v, want result=outcome_unknown 1 alone", s)
	}
	if s := series(t, reg, "shop_orders_busy_total"); total(s) != 0 {
		t.Errorf("shop_orders_busy_total = %v, want none counted: the order was not refused busy", s)
	}
}

// A buyer who gives up while the order waits (here for the SKU lock, which
// the test holds) is not the service's failure: 499 in the metrics, not
// 503 busy, and no error in the log.
func TestClientGoneIsNotBusy(t *testing.T) {
	a := newAPI(t, "")
	held, err := lock.NewRedis(a.rdb, lock.RedisOptions{Prefix: a.prefix}).Obtain(context.Background(), stock.LockKey(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Release(context.Background()) })

	client := &http.Client{Timeout: 300 * time.Millisecond}
	_, err = client.Post(a.url+"/api/v1/orders", "application/json", strings.NewReader(`{"sku_id":1,"user_id":1}`))
	if err == nil {
		t.Fatal("the order was answered while its SKU lock was held")
	}
	// The server sees the client go and ends the wait. The order is
	// counted in the handler; the request is counted, then logged, in the
	// middleware after it.
	const route = "code=499,method=POST,route=/api/v1/orders"
	deadline := time.Now().Add(10 * time.Second)
	for series(t, a.reg, "shop_orders_total")["result=client_closed_request"] == 0 ||
		series(t, a.reg, "shop_http_requests_total")[route] == 0 || !strings.Contains(a.log.String(), `"status":499`) {
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned order was not counted as client_closed_request, counted and logged as 499: %v, %v\n%s",
				series(t, a.reg, "shop_orders_total"), series(t, a.reg, "shop_http_requests_total"), a.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s := series(t, a.reg, "shop_orders_total"); len(s) != 1 {
		t.Errorf("shop_orders_total = %v, want client_closed_request alone", s)
	}
	if s := series(t, a.reg, "shop_orders_busy_total"); total(s) != 0 {
		t.Errorf("shop_orders_busy_total = %v, want none counted", s)
	}
	if s := series(t, a.reg, "shop_http_requests_total"); s[route] != 1 {
		t.Errorf("shop_http_requests_total = %v, want one 499", s)
	}
	log := a.log.String()
	if strings.Contains(log, `"level":"ERROR"`) || !strings.Contains(log, `"status":499`) {
		t.Errorf("log: want the 499 below error level:\n%s", log)
	}
	if st := a.state(t); st.Orders != 0 {
		t.Errorf("the abandoned order was placed: %+v", st)
	}
	if errors.Is(context.Cause(held.Context()), lock.ErrNotHeld) {
		t.Error("the test's lease was lost")
	}
}

// A product change whose COMMIT was sent but whose answer was lost may have
// been made: 503 outcome_unknown, as for an order, but with the advice that
// fits a change, which has no key to retry with — read the product first —
// and not the order's.
func TestChangeOutcomeUnknown(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	lost := fmt.Errorf("%w: sku 1: connection lost at COMMIT: %w", stock.ErrChangeOutcomeUnknown, io.ErrUnexpectedEOF)
	srv := serve(t, both(handler.New(handler.Deps{
		Admin: handler.ChangeProductFunc(func(context.Context, int64, stock.Change) (stock.Product, []string, error) {
			return stock.Product{}, nil, lost
		}),
		Registry: prometheus.NewRegistry(),
	}, handler.Settings{AdminToken: adminToken})))
	a := &api{url: srv.URL}
	r := a.patch(t, "1", `{"add_stock":5}`)
	if r.status != 503 || errorCode(t, r) != "outcome_unknown" || r.header.Get("Retry-After") == "" {
		t.Errorf("lost commit of a restock: %d %s, Retry-After %q; want 503 outcome_unknown with Retry-After", r.status, r.raw, r.header.Get("Retry-After"))
	}
	if msg := r.body["error"].(map[string]any)["message"]; msg != "the change may or may not have been made; read the product before sending it again" {
		t.Errorf("message %q", msg)
	}
}
