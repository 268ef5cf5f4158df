package handler_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

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
	if r := a.refunds(t, withToken); r.status != 200 || r.raw != `{"refunds":[],"next":null}` {
		t.Errorf("no refund owed: %d %s; want 200 {\"refunds\":[],\"next\":null}", r.status, r.raw)
	}
	// Three payments for orders that do not exist: owed back.
	var ids []string
	for i := range 3 {
		body := paid(int64(1<<40+i), fmt.Sprintf("pay_%d", i), int64(100+i), "USD")
		r := a.event(t, body, signed(t, webhookSecret, fmt.Sprintf("msg_%d", i), time.Now(), body))
		if r.status != 200 || r.body["result"] != "owed" {
			t.Fatalf("event %d: %d %s", i, r.status, r.raw)
		}
		ids = append(ids, r.body["refund_id"].(string))
	}
	r := a.do(t, "GET", "/api/v1/admin/refunds?limit=2", "", nil, withToken)
	list, _ := r.body["refunds"].([]any)
	if r.status != 200 || len(list) != 2 || r.body["next"] != ids[1] || r.header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Fatalf("first page: %d %s; want 2 refunds, next %s", r.status, r.raw, ids[1])
	}
	first := list[0].(map[string]any)
	if first["refund_id"] != ids[0] || first["payment_id"] != "pay_0" || first["amount_cents"] != 100.0 || first["currency"] != "USD" ||
		first["reason"] != "unknown_order" || first["state"] != "owed" || first["user_id"] != nil || first["settled_at"] != nil {
		t.Errorf("first refund: %v", first)
	}
	r = a.do(t, "GET", "/api/v1/admin/refunds?after="+ids[1], "", nil, withToken)
	if list, _ := r.body["refunds"].([]any); r.status != 200 || len(list) != 1 || r.body["next"] != nil {
		t.Errorf("second page: %d %s; want the last refund", r.status, r.raw)
	}

	// Settled by hand: again with the same reference is the same; another
	// is 409; an unknown refund 404; a bad body 400.
	settle := func(id, body string) response {
		return a.do(t, "POST", "/api/v1/admin/refunds/"+id+"/settle", "application/json", strings.NewReader(body), withToken)
	}
	for range 2 {
		if r := settle(ids[0], `{"provider_refund_id":"re_0"}`); r.status != 200 || r.body["state"] != "refunded" || r.body["provider_refund_id"] != "re_0" {
			t.Errorf("settle: %d %s; want 200 refunded", r.status, r.raw)
		}
	}
	for _, c := range []struct {
		id, body string
		status   int
		code     string
	}{
		{ids[0], `{"provider_refund_id":"re_other"}`, 409, "refund_settled"},
		{stock.NewRefundID(), `{"provider_refund_id":"re_x"}`, 404, "not_found"},
		{"nope", `{"provider_refund_id":"re_x"}`, 400, "invalid_argument"},
		{ids[1], `{}`, 400, "invalid_argument"},
	} {
		if r := settle(c.id, c.body); r.status != c.status || errorCode(t, r) != c.code {
			t.Errorf("settle %s %s: %d %s; want %d %s", c.id, c.body, r.status, r.raw, c.status, c.code)
		}
	}
	r = a.do(t, "GET", "/api/v1/admin/refunds?state=refunded", "", nil, withToken)
	if list, _ := r.body["refunds"].([]any); r.status != 200 || len(list) != 1 {
		t.Errorf("refunded: %d %s; want one", r.status, r.raw)
	}
	for _, q := range []string{"state=paid", "limit=0", "limit=1001", "limit=x", "after=x"} {
		if r := a.do(t, "GET", "/api/v1/admin/refunds?"+q, "", nil, withToken); r.status != 400 || errorCode(t, r) != "invalid_argument" {
			t.Errorf("?%s: %d %s; want 400", q, r.status, r.raw)
		}
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

	// A seed refuses while refunds are unsettled, then deletes them when
	// told to, keeping the settled one.
	seed := func(body string) response {
		return a.do(t, "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(body), withToken)
	}
	if r := seed(`{"products":1,"stock":1}`); r.status != 409 || errorCode(t, r) != "refunds_unsettled" || !strings.Contains(r.raw, "2 refunds") {
		t.Fatalf("seed with unsettled refunds: %d %s; want 409 refunds_unsettled naming 2", r.status, r.raw)
	}
	if r := seed(`{"products":1,"stock":1,"discard_refunds":true}`); r.status != 200 {
		t.Fatalf("seed discarding refunds: %d %s", r.status, r.raw)
	}
	if r := a.refunds(t, withToken); r.status != 200 || !strings.Contains(r.raw, ids[0]) || strings.Contains(r.raw, ids[1]) {
		t.Errorf("refunds after a seed: %d %s; want the settled one only", r.status, r.raw)
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

func (f refundsFunc) Refunds(ctx context.Context, _ stock.RefundQuery) ([]stock.Refund, bool, error) {
	r, err := f(ctx)
	return r, false, err
}

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
