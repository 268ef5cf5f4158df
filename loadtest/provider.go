package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"shop/internal/payments"
)

// provider is the payment provider the payers play: where its events go,
// what a payment's event says, and how each delivery of it is signed.
type provider interface {
	// name is the provider as SHOP_PAYMENTS names it.
	name() string
	// path is the service's route for the provider's events.
	path() string
	// event is the body of pm's event: the same on every delivery, as a
	// provider sends one event again until it is answered.
	event(pm payment) ([]byte, error)
	// sign sets the headers that sign one delivery of body, made at now.
	sign(h http.Header, pm payment, body []byte, now time.Time) error
	// checkout says whether a payment of kind is made on the PaymentIntent
	// of the order's checkout (Stripe), rather than under an id of the
	// payer's own.
	checkout(kind string) bool
	// paymentID is the id of a payment of kind for order that is not made
	// on a checkout: run makes the ids of a run's payments for orders that
	// do not exist its own.
	paymentID(kind string, order int64, run string) string
}

// messageID is the id of every delivery of a payment's event: derived
// from the payment, so that the service can tell a payment delivered again
// from another.
func messageID(paymentID string) string { return "msg_" + paymentID }

// standardProvider signs payment.succeeded events by Standard Webhooks
// (SHOP_PAYMENTS=webhook).
type standardProvider struct {
	// hooks holds one Webhook per secret of -webhook-secret; a delivery
	// carries one signature of each, space-separated, as a sender that is
	// rotating its secret does.
	hooks []*standardwebhooks.Webhook
}

// newStandardProvider takes secrets as SHOP_PAYMENT_WEBHOOK_SECRET holds
// them: a comma list of whsec_ + base64. It refuses what the service
// refuses, with the service's own check, so that a bad secret is told at
// the start rather than by a 401 for every payment.
func newStandardProvider(secrets string) (*standardProvider, error) {
	if _, err := payments.NewStandard(secrets); err != nil {
		return nil, err
	}
	p := &standardProvider{}
	for _, s := range strings.Split(secrets, ",") {
		hook, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			return nil, err
		}
		p.hooks = append(p.hooks, hook)
	}
	return p, nil
}

func (p *standardProvider) name() string { return payments.ProviderWebhook }

func (p *standardProvider) path() string { return "/api/v1/payments/events" }

// standardPayment is a payment.succeeded event.
type standardPayment struct {
	Type string `json:"type"`
	Data struct {
		OrderID     int64  `json:"order_id"`
		PaymentID   string `json:"payment_id"`
		AmountCents int64  `json:"amount_cents"`
		Currency    string `json:"currency"`
	} `json:"data"`
}

func (p *standardProvider) event(pm payment) ([]byte, error) {
	e := standardPayment{Type: payments.TypePaymentSucceeded}
	e.Data.OrderID, e.Data.PaymentID, e.Data.AmountCents, e.Data.Currency = pm.order, pm.id, pm.amount, pm.currency
	return json.Marshal(e)
}

func (p *standardProvider) sign(h http.Header, pm payment, body []byte, now time.Time) error {
	id := messageID(pm.id)
	sigs := make([]string, len(p.hooks))
	for i, hook := range p.hooks {
		sig, err := hook.Sign(id, now, body)
		if err != nil {
			return fmt.Errorf("sign payment %s: %w", pm.id, err)
		}
		sigs[i] = sig
	}
	h.Set(standardwebhooks.HeaderWebhookID, id)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, strings.Join(sigs, " "))
	return nil
}

func (p *standardProvider) checkout(string) bool { return false }

// paymentID: pay-<order_id> for the order's own payment, pay-<order_id>-dup
// for a second one, and pay-<order_id>-<run> for an order that does not
// exist, whose id every run sends again.
func (p *standardProvider) paymentID(kind string, order int64, run string) string {
	id := "pay-" + strconv.FormatInt(order, 10)
	switch kind {
	case duplicate:
		return id + "-dup"
	case unknown:
		return id + "-" + run
	}
	return id
}

// stripeProvider signs payment_intent.succeeded events as Stripe does
// (SHOP_PAYMENTS=stripe), with stripe-go's test helper.
type stripeProvider struct {
	secret string // the endpoint's signing secret, whsec_…
}

func newStripeProvider(secret string) (*stripeProvider, error) {
	if _, err := payments.NewStripe(secret); err != nil {
		return nil, err
	}
	return &stripeProvider{secret: secret}, nil
}

func (p *stripeProvider) name() string { return payments.ProviderStripe }

func (p *stripeProvider) path() string { return "/api/v1/payments/stripe" }

// event is a stripe.Event on stripe-go's API version, whose object is the
// PaymentIntent pm.id: amount_received the payment's amount, currency in
// lower case as Stripe writes it, and metadata.order_id. The event id is
// derived from the PaymentIntent, as Stripe sends one event again under
// its id.
func (p *stripeProvider) event(pm payment) ([]byte, error) {
	pi, err := json.Marshal(stripe.PaymentIntent{
		ID:             pm.id,
		Object:         "payment_intent",
		Amount:         pm.amount,
		AmountReceived: pm.amount,
		Currency:       stripe.Currency(strings.ToLower(pm.currency)),
		Status:         stripe.PaymentIntentStatusSucceeded,
		Metadata:       map[string]string{"order_id": strconv.FormatInt(pm.order, 10)},
	})
	if err != nil {
		return nil, err
	}
	return json.Marshal(stripe.Event{
		ID:         "evt_" + pm.id,
		Object:     "event",
		APIVersion: stripe.APIVersion,
		Created:    time.Now().Unix(),
		Type:       payments.TypePaymentIntentSucceeded,
		Data:       &stripe.EventData{Raw: pi},
	})
}

func (p *stripeProvider) sign(h http.Header, _ payment, body []byte, now time.Time) error {
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: p.secret, Timestamp: now})
	h.Set("Stripe-Signature", signed.Header)
	return nil
}

// checkout: a payment of the order's own is made on its checkout's
// PaymentIntent; a second payment of an order, and one for an order that
// does not exist, have none.
func (p *stripeProvider) checkout(kind string) bool { return kind != duplicate && kind != unknown }

// paymentID: pi_dup_<order_id> for a second payment of an order, and
// pi_unknown_<order_id>_<run> for an order that does not exist.
func (p *stripeProvider) paymentID(kind string, order int64, run string) string {
	if kind == duplicate {
		return fmt.Sprintf("pi_dup_%d", order)
	}
	return fmt.Sprintf("pi_unknown_%d_%s", order, run)
}
