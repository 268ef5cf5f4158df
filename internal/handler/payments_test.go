package handler_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"shop/internal/handler"
	"shop/internal/lock"
	"shop/internal/payments"
	"shop/internal/ratelimit"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// webhookSecret signs the tests' payment events: 32 bytes, base64.
const webhookSecret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

func webhookVerifier(t *testing.T) payments.Verifier {
	t.Helper()
	v, err := payments.NewStandard(webhookSecret)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// signed are the Standard Webhooks headers of body, sent as message id at
// time at, signed with secret.
func signed(t *testing.T, secret, id string, at time.Time, body string) map[string][]string {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := wh.Sign(id, at, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]string{"webhook-id": {id}, "webhook-timestamp": {strconv.FormatInt(at.Unix(), 10)}, "webhook-signature": {sig}}
}

// event sends a payment event with header.
func (a *api) event(t *testing.T, body string, header map[string][]string) response {
	t.Helper()
	return a.do(t, "POST", "/api/v1/payments/events", "application/json", strings.NewReader(body), header)
}

// paid is a payment.succeeded event.
func paid(order int64, payment string, amount int64, currency string) string {
	return fmt.Sprintf(`{"type":"payment.succeeded","data":{"order_id":%d,"payment_id":%q,"amount_cents":%d,"currency":%q}}`,
		order, payment, amount, currency)
}

// newPaymentsAPI serves the public API with a payment window of an hour,
// payments signed with webhookSecret, and a per-address limit of one
// request a second, which the provider's events are not held to.
func newPaymentsAPI(t *testing.T) (*api, *stock.Service) {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), 3, 5); err != nil {
		t.Fatal(err)
	}
	locks := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, Wait: 10 * time.Second})
	orders := stock.NewService(stock.Deps{DB: db.Gorm, Locks: locks}, stock.Settings{Fencing: true, PayWindow: time.Hour}, stock.Hooks{})
	a := &api{db: db, rdb: rdb, prefix: prefix, reg: prometheus.NewRegistry(), log: &testenv.Log{}}
	srv := serve(t, both(handler.New(handler.Deps{
		Logger:    slog.New(slog.NewJSONHandler(a.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registry:  a.reg,
		Orders:    orders,
		Lifecycle: orders,
		Verifier:  webhookVerifier(t),
		Payments:  orders,
		Limiter:   ratelimit.New(rdb, prefix+"limit:"),
	}, handler.Settings{Limits: handler.Limits{Client: ratelimit.PerSecond(1, 0)}})))
	a.url = srv.URL
	return a, orders
}

// rows counts the payments and refunds MySQL holds.
func (a *api) moneyRows(t *testing.T) (ledger, refunds int64) {
	t.Helper()
	if err := a.db.Gorm.Raw("SELECT COUNT(*) FROM payments").Scan(&ledger).Error; err != nil {
		t.Fatal(err)
	}
	if err := a.db.Gorm.Raw("SELECT COUNT(*) FROM refunds").Scan(&refunds).Error; err != nil {
		t.Fatal(err)
	}
	return ledger, refunds
}

// A signed payment of the right amount pays the reservation, 200, and the
// same event again is 200 and changes nothing; the order shows what it
// owes. Events are not held to the per-address limit.
func TestPaymentEvent(t *testing.T) {
	a, orders := newPaymentsAPI(t)
	o, err := orders.PlaceOrder(context.Background(), 1, 7, "")
	if err != nil {
		t.Fatal(err)
	}
	body := paid(o.ID, "pay_1", *o.AmountCents, "usd")
	for i := range 3 {
		r := a.event(t, body, signed(t, webhookSecret, "msg_1", time.Now(), body))
		if r.status != 200 || r.body["result"] != "applied" || (i > 0) != (r.body["again"] == true) {
			t.Fatalf("delivery %d: %d %s; want 200 applied", i, r.status, r.raw)
		}
	}
	if got, err := orders.Order(context.Background(), 7, o.ID); err != nil || got.Status != stock.StatusPaid || *got.PaymentID != "pay_1" {
		t.Errorf("order after the event: %+v, %v; want paid by pay_1", got, err)
	}
	late := paid(1<<40, "pay_2", 500, "EUR")
	r := a.event(t, late, signed(t, webhookSecret, "msg_2", time.Now(), late))
	if r.status != 200 || r.body["result"] != "owed" || r.body["reason"] != "unknown_order" {
		t.Errorf("payment for no order: %d %s; want 200 owed unknown_order", r.status, r.raw)
	}
	if ledger, refunds := a.moneyRows(t); ledger != 2 || refunds != 1 {
		t.Errorf("ledger %d, refunds %d; want 2, 1", ledger, refunds)
	}
}

// Every bad event is refused as it should be, with nothing written.
func TestPaymentEventRefused(t *testing.T) {
	a, orders := newPaymentsAPI(t)
	o, err := orders.PlaceOrder(context.Background(), 1, 7, "")
	if err != nil {
		t.Fatal(err)
	}
	good := paid(o.ID, "pay_1", *o.AmountCents, "USD")
	now := time.Now()
	otherSecret := "whsec_" + strings.Repeat("QUJD", 8)
	noHeader := func(name string) map[string][]string {
		h := signed(t, webhookSecret, "msg_1", now, good)
		delete(h, name)
		return h
	}
	for _, c := range []struct {
		name   string
		body   string
		header map[string][]string
		status int
	}{
		{"unsigned", good, nil, 401},
		{"no webhook-id", good, noHeader("webhook-id"), 401},
		{"no webhook-timestamp", good, noHeader("webhook-timestamp"), 401},
		{"no webhook-signature", good, noHeader("webhook-signature"), 401},
		{"other secret", good, signed(t, otherSecret, "msg_1", now, good), 401},
		{"tampered", strings.Replace(good, `"pay_1"`, `"pay_9"`, 1), signed(t, webhookSecret, "msg_1", now, good), 401},
		{"six minutes old", good, signed(t, webhookSecret, "msg_1", now.Add(-6*time.Minute), good), 401},
		{"not JSON", "nope", signed(t, webhookSecret, "msg_1", now, "nope"), 400},
		{"order 0", paid(0, "pay_1", 100, "USD"), signed(t, webhookSecret, "msg_1", now, paid(0, "pay_1", 100, "USD")), 400},
		{"amount 0", paid(o.ID, "pay_1", 0, "USD"), signed(t, webhookSecret, "msg_1", now, paid(o.ID, "pay_1", 0, "USD")), 400},
		{"currency", paid(o.ID, "pay_1", 100, "US"), signed(t, webhookSecret, "msg_1", now, paid(o.ID, "pay_1", 100, "US")), 400},
		{"too large", good + strings.Repeat(" ", payments.MaxBody), nil, 413},
	} {
		r := a.event(t, c.body, c.header)
		if r.status != c.status {
			t.Errorf("%s: %d %s; want %d", c.name, r.status, r.raw, c.status)
		}
	}
	if ledger, refunds := a.moneyRows(t); ledger != 0 || refunds != 0 {
		t.Errorf("bad events wrote %d payments, %d refunds", ledger, refunds)
	}
	if got, err := orders.Order(context.Background(), 7, o.ID); err != nil || got.Status != stock.StatusReserved {
		t.Errorf("order after bad events: %+v, %v; want reserved", got, err)
	}
	// The other provider's route, and the buyer's /pay, are not there.
	if r := a.do(t, "POST", "/api/v1/payments/stripe", "application/json", strings.NewReader(good), nil); r.status != 404 {
		t.Errorf("stripe route in webhook mode: %d, want 404", r.status)
	}
	if r := a.do(t, "POST", fmt.Sprintf("/api/v1/orders/%d/pay", o.ID), "application/json",
		strings.NewReader(`{"user_id":7,"payment_id":"nothing-was-paid"}`), nil); r.status != 404 {
		t.Errorf("POST /pay: %d %s, want 404", r.status, r.raw)
	}
}
