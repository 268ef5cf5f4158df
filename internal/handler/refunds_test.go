package handler_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"shop/internal/handler"
	"shop/internal/stock"
)

// refunds sends GET /api/v1/admin/refunds with header.
func (a *api) refunds(t *testing.T, header map[string][]string) response {
	t.Helper()
	return a.do(t, "GET", "/api/v1/admin/refunds", "", nil, header)
}

var withToken = map[string][]string{"Authorization": {"Bearer " + adminToken}}

func TestRefunds(t *testing.T) {
	a := newAPI(t, adminToken)
	if r := a.refunds(t, withToken); r.status != 200 || r.raw != `{"refunds":[]}` {
		t.Errorf("no refund owed: %d %s; want 200 {\"refunds\":[]}", r.status, r.raw)
	}

	// Two late payments, as /pay records them: order 1 expired and was
	// paid twice by two payments, order 2 was cancelled and then paid.
	for _, q := range []string{
		`INSERT INTO orders (id, sku_id, user_id, status, pay_by, returned_at) VALUES
			(1, 1, 7, 'expired', '2030-01-02 03:00:00', '2030-01-02 03:00:01'),
			(2, 2, 8, 'cancelled', '2030-01-02 03:00:00', '2030-01-02 02:59:00')`,
		`INSERT INTO refunds (order_id, payment_id, user_id, sku_id, reason, received_at) VALUES
			(2, 'pay-B', 8, 2, 'order_cancelled', '2030-01-02 03:04:05.123456'),
			(1, 'pay_A', 7, 1, 'order_expired', '2030-01-02 03:04:05.123456'),
			(1, 'pay-C', 7, 1, 'order_expired', '2030-01-02 03:04:00')`,
	} {
		if err := a.db.Gorm.Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	want := `{"refunds":[` +
		`{"order_id":1,"user_id":7,"sku_id":1,"payment_id":"pay-C","received_at":"2030-01-02T03:04:00Z","reason":"order_expired"},` +
		`{"order_id":1,"user_id":7,"sku_id":1,"payment_id":"pay_A","received_at":"2030-01-02T03:04:05.123456Z","reason":"order_expired"},` +
		`{"order_id":2,"user_id":8,"sku_id":2,"payment_id":"pay-B","received_at":"2030-01-02T03:04:05.123456Z","reason":"order_cancelled"}]}`
	r := a.refunds(t, withToken)
	if r.status != 200 || r.raw != want || r.header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Errorf("refunds owed: %d %s %s\nwant 200\n%s", r.status, r.header.Get("Content-Type"), r.raw, want)
	}

	for name, header := range map[string]map[string][]string{
		"no token":     nil,
		"wrong token":  {"Authorization": {"Bearer nope"}},
		"other scheme": {"Authorization": {"Basic " + adminToken}},
	} {
		if r := a.refunds(t, header); r.status != 401 || errorCode(t, r) != "unauthorized" {
			t.Errorf("%s: %d %s; want 401 unauthorized", name, r.status, r.raw)
		}
	}
	if r := a.do(t, "POST", "/api/v1/admin/refunds", "application/json", nil, withToken); r.status != 405 ||
		errorCode(t, r) != "method_not_allowed" {
		t.Errorf("POST: %d %s; want 405 method_not_allowed", r.status, r.raw)
	}

	// A seed deletes the refunds owed with the orders.
	if r := a.do(t, "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(`{"products":1,"stock":1}`), withToken); r.status != 200 {
		t.Fatalf("seed: %d %s", r.status, r.raw)
	}
	if r := a.refunds(t, withToken); r.status != 200 || r.raw != `{"refunds":[]}` {
		t.Errorf("refunds after a seed: %d %s; want none", r.status, r.raw)
	}
}

func TestRefundsAdminOff(t *testing.T) {
	a := newAPI(t, "")
	if r := a.refunds(t, withToken); r.status != 404 || errorCode(t, r) != "not_found" {
		t.Errorf("refunds with the admin API off: %d %s; want 404 not_found", r.status, r.raw)
	}
}

// refundsFunc is a function that is a handler.Refunds.
type refundsFunc func(ctx context.Context) ([]stock.Refund, error)

func (f refundsFunc) Refunds(ctx context.Context) ([]stock.Refund, error) { return f(ctx) }

// MySQL down is 503 busy with Retry-After; a failure it does not know is
// 500, without its words.
func TestRefundsFailures(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	for _, tt := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("%w: connection refused", stock.ErrBusy), 503, "busy"},
		{errors.New("stock: refunds: Error 1146: Table 'refunds' doesn't exist"), 500, "internal"},
	} {
		srv := serve(t, both(handler.New(handler.Deps{
			Logger:  slog.New(slog.DiscardHandler),
			Refunds: refundsFunc(func(context.Context) ([]stock.Refund, error) { return nil, tt.err }),
		}, handler.Settings{AdminToken: adminToken})))
		a := &api{url: srv.URL}
		r := a.refunds(t, withToken)
		if r.status != tt.status || errorCode(t, r) != tt.code {
			t.Errorf("%v: %d %s; want %d %s", tt.err, r.status, r.raw, tt.status, tt.code)
		}
		if tt.status == http.StatusServiceUnavailable && r.header.Get("Retry-After") == "" {
			t.Errorf("%v: 503 without Retry-After", tt.err)
		}
	}
}
