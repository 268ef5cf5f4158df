package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"shop/internal/payments"
	"shop/internal/stock"
	"shop/internal/stripepay"
	"shop/internal/striperec"
	"shop/internal/testenv"
)

// testStripeWebhookSecret signs the tests' Stripe events.
const testStripeWebhookSecret = "whsec_c3RyaXBlIHRlc3RzJyB3ZWJob29rIHNlY3JldCEhIQ=="

// checkout is a checkout's answer.
type checkout struct {
	OrderID       int64  `json:"order_id"`
	PaymentIntent string `json:"payment_intent"`
	ClientSecret  string `json:"client_secret"`
	Amount        int64  `json:"amount_cents"`
	Currency      string `json:"currency"`
}

// checkout is POST /api/v1/orders/{id}/checkout.
func (c *client) checkout(id int64, user int) reply[checkout] {
	return call[checkout](c, "POST", fmt.Sprintf("/api/v1/orders/%d/checkout", id), fmt.Sprintf(`{"user_id":%d}`, user))
}

// stripeEvent sends a Stripe event of type typ about object, signed with
// testStripeWebhookSecret: POST /api/v1/payments/stripe.
func (c *client) stripeEvent(typ string, object map[string]any) reply[event] {
	now := time.Now()
	body, err := json.Marshal(map[string]any{"id": fmt.Sprintf("evt_%d", now.UnixNano()), "object": "event",
		"api_version": stripe.APIVersion, "created": now.Unix(), "type": typ, "data": map[string]any{"object": object}})
	if err != nil {
		return reply[event]{err: err}
	}
	p := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testStripeWebhookSecret, Timestamp: now})
	return call[event](c, "POST", "/api/v1/payments/stripe", string(body), withHeader("Stripe-Signature", p.Header))
}

// intentSucceeded is Stripe's payment_intent.succeeded of a checkout.
func (c *client) intentSucceeded(co checkout, amount int64) reply[event] {
	return c.stripeEvent("payment_intent.succeeded", map[string]any{"id": co.PaymentIntent, "object": "payment_intent",
		"amount": amount, "amount_received": amount, "currency": strings.ToLower(co.Currency), "status": "succeeded",
		"metadata": map[string]string{"order_id": fmt.Sprint(co.OrderID)}})
}

// SHOP_PAYMENTS=stripe on stripe-mock, behind the recording proxy: a
// checkout creates one PaymentIntent for the order's amount, however often
// it is asked; the provider's payment_intent.succeeded pays the order; a
// cancelled reservation's PaymentIntent is cancelled, and a payment that
// comes for it all the same is owed back and refunded through the Refund
// API, with the refund id as the Idempotency-Key, once.
func TestStripeMode(t *testing.T) {
	t.Parallel()
	rec := testenv.StartStripeRecorder(t, testenv.StripeMock(t))
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_PAYMENTS": "stripe", "SHOP_STRIPE_SECRET_KEY": "sk_test_123",
		"SHOP_STRIPE_WEBHOOK_SECRET": testStripeWebhookSecret, "SHOP_STRIPE_API_BASE": rec.URL, "SHOP_PAY_WINDOW": "1h"})
	if code, out := shop(t, db, "seed", "--products", "2", "--stock", "2", "--price-cents", "1250", "--currency", "EUR"); code != 0 {
		t.Fatal(out)
	}
	r := startReplica(t, vars())

	o := r.public.order(1, 7)
	if o.expect(201) != nil {
		t.Fatal(o)
	}
	first := r.public.checkout(o.body.ID, 7)
	if first.expect(200) != nil || first.body.Amount != 1250 || first.body.Currency != "EUR" || !strings.HasPrefix(first.body.PaymentIntent, "pi_") ||
		first.body.ClientSecret == "" {
		t.Fatalf("checkout: %v", first)
	}
	if again := r.public.checkout(o.body.ID, 7); again.expect(200) != nil || again.body.PaymentIntent != first.body.PaymentIntent {
		t.Errorf("checkout again: %v; want the same PaymentIntent %s", again, first.body.PaymentIntent)
	}
	if other := r.public.checkout(o.body.ID, 8); other.status != 404 {
		t.Errorf("another buyer's checkout: %v, want 404", other)
	}
	var creates []string
	for _, c := range rec.Calls(t) {
		if c.Method == "POST" && c.Path == "/v1/payment_intents" {
			creates = append(creates, c.IdempotencyKey)
			if c.Form["amount"] != "1250" || c.Form["currency"] != "eur" || c.Form["metadata[order_id]"] != fmt.Sprint(o.body.ID) {
				t.Errorf("PaymentIntent created with %v", c.Form)
			}
		}
	}
	if len(creates) != 1 || creates[0] == "" {
		t.Errorf("PaymentIntents created: %v; want one, with an Idempotency-Key", creates)
	}
	if e := r.public.intentSucceeded(first.body, 1250); e.expect(200) != nil || e.body.Result != "applied" {
		t.Fatalf("payment_intent.succeeded: %v", e)
	}
	if g := r.public.getOrder(o.body.ID, 7); g.expect(200) != nil || g.body.Status != "paid" || *g.body.PaymentID != first.body.PaymentIntent {
		t.Errorf("order after its payment: %v", g)
	}

	// A reservation cancelled after its checkout: its PaymentIntent is
	// cancelled, and a payment that comes anyway is refunded.
	c := r.public.order(2, 7)
	if c.expect(201) != nil {
		t.Fatal(c)
	}
	co := r.public.checkout(c.body.ID, 7)
	if co.expect(200) != nil {
		t.Fatal(co)
	}
	if x := r.public.send("POST", fmt.Sprintf("/api/v1/orders/%d/cancel", c.body.ID), `{"user_id":7}`); x.expect(200) != nil {
		t.Fatal(x)
	}
	if x := r.public.checkout(c.body.ID, 7); x.status != 200 || x.body.PaymentIntent != co.body.PaymentIntent {
		t.Errorf("checkout of the cancelled order: %v; want its stored PaymentIntent", x)
	}
	e := r.public.intentSucceeded(co.body, 1250)
	if e.expect(200) != nil || e.body.Result != "owed" || e.body.Reason != "order_cancelled" {
		t.Fatalf("payment of the cancelled order: %v", e)
	}
	waitFor(t, 20*time.Second, "the refund is refunded", func() error {
		var state, ref string
		if err := db.Gorm.Raw("SELECT state, COALESCE(provider_refund_id, '') FROM refunds WHERE refund_id = ?", e.body.RefundID).Row().Scan(&state, &ref); err != nil {
			return err
		}
		if state != "refunded" || !strings.HasPrefix(ref, "re_") {
			return fmt.Errorf("state %s, reference %q", state, ref)
		}
		return nil
	})
	var cancels, refunds int
	for _, call := range rec.Calls(t) {
		switch {
		case call.Method == "POST" && call.Path == "/v1/payment_intents/"+co.body.PaymentIntent+"/cancel":
			cancels++
		case call.Method == "POST" && call.Path == "/v1/refunds":
			refunds++
			if call.IdempotencyKey != e.body.RefundID || call.Form["payment_intent"] != co.body.PaymentIntent || call.Form["amount"] != "1250" {
				t.Errorf("Refund API call %+v; want key %s, the PaymentIntent, 1250", call, e.body.RefundID)
			}
		}
	}
	if cancels != 1 || refunds != 1 {
		t.Errorf("%d cancellations of the lapsed PaymentIntent, %d Refund API calls; want 1, 1", cancels, refunds)
	}
	if x := r.public.send("POST", "/api/v1/payments/events", `{}`); x.status != 404 {
		t.Errorf("the webhook route in stripe mode: %v, want 404", x)
	}
	if code, out := shop(t, db, "verify"); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}

// The refunder on MySQL (refundStore) and stripe-mock, killed between the
// Refund API call and its record: its claim holds the refund until the
// lease runs out, then another replica's refunder claims it and calls
// again with the same Idempotency-Key. Stripe's key window has passed for
// the second call, which is answered charge_already_refunded, and the
// refund found in the PaymentIntent's list is recorded: refunded once,
// with one key.
func TestRefunderKilledBetweenCallAndRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := testenv.StartStripeRecorder(t, testenv.StripeMock(t))
	db := testenv.MySQL(t)
	svc := stock.NewService(stock.Deps{DB: db.Gorm}, stock.Settings{}, stock.Hooks{})
	owed, err := svc.Receive(ctx, stock.Payment{Provider: payments.ProviderStripe, PaymentID: "pi_killed", OrderID: 1 << 40,
		AmountCents: 990, Currency: "USD", EventID: "evt_1"})
	if err != nil || owed.Outcome != stock.OutcomeOwed {
		t.Fatal(owed, err)
	}
	client, err := stripepay.New(stripepay.Config{SecretKey: "sk_test_123", APIBase: rec.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const lease = 7 * time.Second // a call's timeout and a record's, and more
	called, killed := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(killed) })
	dead := &stripepay.Refunder{Store: refundStore{svc}, Client: client, Lease: lease,
		Hooks: stripepay.Hooks{BetweenCallAndRecord: func(context.Context, string) {
			close(called)
			<-killed // the process is gone: nothing after the call runs
		}}}
	go dead.Once(ctx)
	<-called
	var state string
	if err := db.Gorm.Raw("SELECT state FROM refunds WHERE refund_id = ?", owed.RefundID).Scan(&state).Error; err != nil || state != stock.RefundRequested {
		t.Fatalf("refund after the call, before the record: %q, %v; want requested", state, err)
	}
	rec.Inject("POST", "/v1/refunds", 400,
		`{"error":{"type":"invalid_request_error","code":"charge_already_refunded","message":"Charge has already been refunded."}}`)
	successor := &stripepay.Refunder{Store: refundStore{svc}, Client: client, Lease: lease}
	if n, err := successor.Once(ctx); n != 0 || err != nil {
		t.Fatalf("another refunder within the lease claimed %d, %v; want none", n, err)
	}
	// Until the successor has recorded it: a claim whose Claim statement
	// took more of the lease than a call and its record leave (a busy
	// machine) is left to run out without a call, and claimed again.
	var ref string
	waitFor(t, 3*lease, "the successor claims the refund once the lease ran out, and records it", func() error {
		if _, err := successor.Once(ctx); err != nil {
			return err
		}
		if err := db.Gorm.Raw("SELECT state, COALESCE(provider_refund_id, '') FROM refunds WHERE refund_id = ?", owed.RefundID).Row().Scan(&state, &ref); err != nil {
			return err
		}
		if state != stock.RefundRefunded || !strings.HasPrefix(ref, "re_") {
			return fmt.Errorf("refund %s, %q; want refunded with Stripe's reference", state, ref)
		}
		return nil
	})
	calls := striperec.Refunds(rec.Calls(t))[owed.RefundID]
	if calls == nil || calls.Calls != 2 || len(calls.Keys) != 1 {
		t.Errorf("Refund API calls for the refund: %+v; want 2 calls with one key", calls)
	}
}
