package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"shop/internal/payments"
)

// Refunds the lifecycle rows leave. Every late payment is recorded as a
// refund owed, and `shop seed` refuses while any refund is unsettled, so
// that a reseed never deletes money silently. With SHOP_PAYMENTS=webhook
// only the provider's word settles a refund, so before each seed the demo
// plays the provider: one signed refund.succeeded event per refund MySQL
// has unsettled, sent to a replica, with provider_refund_id
// re_demo_<refund_id>. The Stripe rows' replicas take Stripe's events
// only, and their refunders pay back the Stripe rows' own refunds, so a
// Stripe row's seed plays Stripe for whatever the rows before left: a
// signed refund.updated event whose Refund (re_demo_<refund_id>,
// succeeded) carries the refund id in its metadata, as the refunder's
// calls do.

// envWebhookSecret names the provider's secret, which the stack gives the
// replicas and the demo alike: the lifecycle rows' payers (bin/loadtest
// -webhook-secret) and the refunds' settlements are signed with it.
const envWebhookSecret = "SHOP_PAYMENT_WEBHOOK_SECRET"

// envStripeSecret names the Stripe endpoint's signing secret, the stack's
// STRIPE_WEBHOOK_SECRET: the Stripe rows' payers (bin/loadtest -stripe
// -webhook-secret) and their seeds' settlements are signed with it.
const envStripeSecret = "SHOP_STRIPE_WEBHOOK_SECRET"

// demoRefundRef is the provider's reference the demo settles refund id
// with.
func demoRefundRef(id string) string { return "re_demo_" + id }

// settleAttempts bounds the deliveries of one settlement: a replica just
// started, or a MariaDB just restarted, answers 503 for a moment.
const settleAttempts = 10

// settler is the payment provider the demo plays to settle refunds: the
// replicas' (SHOP_PAYMENTS), whose events are the only ones they take.
type settler interface {
	// path is the replicas' route of the provider's events.
	path() string
	// settlement is the body of refund id's settlement event.
	settlement(id string) ([]byte, error)
	// sign sets the headers of one delivery, signed at now, of the
	// message msgID with body.
	sign(h http.Header, msgID string, body []byte, now time.Time) error
}

// newSettler returns the provider of the replicas' mode, stripe or not,
// with its secret: the first of webhookSecret, a rotation's comma list,
// or stripeSecret.
func newSettler(stripe bool, webhookSecret, stripeSecret string) (settler, error) {
	if stripe {
		if stripeSecret == "" {
			return nil, fmt.Errorf("%s is not set: the demo settles them with signed refund.updated events", envStripeSecret)
		}
		return stripeSettler{stripeSecret}, nil
	}
	if webhookSecret == "" {
		return nil, fmt.Errorf("%s is not set: the demo settles them with signed refund.succeeded events", envWebhookSecret)
	}
	hook, err := standardwebhooks.NewWebhook(strings.Split(webhookSecret, ",")[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envWebhookSecret, err)
	}
	return webhookSettler{hook}, nil
}

// webhookSettler settles as a Standard Webhooks provider:
// refund.succeeded.
type webhookSettler struct{ hook *standardwebhooks.Webhook }

func (webhookSettler) path() string { return "/api/v1/payments/events" }

func (webhookSettler) settlement(id string) ([]byte, error) {
	return json.Marshal(map[string]any{"type": "refund.succeeded",
		"data": map[string]string{"refund_id": id, "provider_refund_id": demoRefundRef(id)}})
}

func (w webhookSettler) sign(h http.Header, msgID string, body []byte, now time.Time) error {
	sig, err := w.hook.Sign(msgID, now, body)
	if err != nil {
		return err
	}
	h.Set(standardwebhooks.HeaderWebhookID, msgID)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, sig)
	return nil
}

// stripeSettler settles as Stripe: refund.updated, on stripe-go's API
// version, signed with stripe-go's test helper.
type stripeSettler struct{ secret string }

func (stripeSettler) path() string { return "/api/v1/payments/stripe" }

func (stripeSettler) settlement(id string) ([]byte, error) {
	refund, err := json.Marshal(stripe.Refund{ID: demoRefundRef(id), Object: "refund", Status: stripe.RefundStatusSucceeded,
		Metadata: map[string]string{"refund_id": id}})
	if err != nil {
		return nil, err
	}
	return json.Marshal(stripe.Event{ID: "evt_settle_" + id, Object: "event", APIVersion: stripe.APIVersion,
		Created: time.Now().Unix(), Type: payments.TypeRefundUpdated, Data: &stripe.EventData{Raw: refund}})
}

func (s stripeSettler) sign(h http.Header, _ string, body []byte, now time.Time) error {
	h.Set("Stripe-Signature", webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: s.secret, Timestamp: now}).Header)
	return nil
}

// settleRefunds settles every refund MySQL (db) has unsettled with a
// signed settlement event of the replicas' provider (newSettler's
// arguments), sent to the replica at base, and returns how many it
// settled. It checks that none is left unsettled.
func settleRefunds(ctx context.Context, db *sql.DB, base string, stripe bool, webhookSecret, stripeSecret string) (int, error) {
	ids, err := unsettledRefunds(ctx, db)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	p, err := newSettler(stripe, webhookSecret, stripeSecret)
	if err != nil {
		return 0, fmt.Errorf("%d refunds are unsettled and %w", len(ids), err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for i, id := range ids {
		if err := settleRefund(ctx, client, p, base, id); err != nil {
			return i, err
		}
	}
	left, err := unsettledRefunds(ctx, db)
	if err != nil {
		return len(ids), err
	}
	if len(left) > 0 {
		return len(ids), fmt.Errorf("%d refunds settled, and %d still unsettled (first: %s)", len(ids), len(left), left[0])
	}
	return len(ids), nil
}

// unsettledRefunds returns the ids of the refunds a seed would refuse to
// delete: those not refunded.
func unsettledRefunds(ctx context.Context, db *sql.DB) ([]string, error) {
	refunds, err := queryRefunds(ctx, db, "state <> 'refunded'")
	if err != nil {
		return nil, fmt.Errorf("unsettled refunds: %w", err)
	}
	ids := make([]string, len(refunds))
	for i, r := range refunds {
		ids[i] = r.RefundID
	}
	return ids, nil
}

// settleRefund delivers refund id's settlement event to base until it is
// answered, within settleAttempts, and checks that the answer says it is
// refunded. Every delivery carries the same message id and body, and a
// signature of its own time.
func settleRefund(ctx context.Context, client *http.Client, p settler, base, id string) error {
	body, err := p.settlement(id)
	if err != nil {
		return err
	}
	var last error
	for attempt := 1; attempt <= settleAttempts; attempt++ {
		if attempt > 1 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(attempt-1) * 200 * time.Millisecond):
			}
		}
		status, answer, err := postEvent(ctx, client, p, base, "msg_settle_"+id, body)
		switch {
		case err != nil:
			last = err
			continue
		case status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout:
			last = fmt.Errorf("%d %s", status, answer)
			continue
		case status != http.StatusOK:
			return fmt.Errorf("settle refund %s: %d %s", id, status, answer)
		}
		var res struct {
			Result string `json:"result"`
		}
		if json.Unmarshal(answer, &res) != nil || res.Result != "refunded" {
			return fmt.Errorf("settle refund %s: answered %s, want refunded", id, answer)
		}
		return nil
	}
	return fmt.Errorf("settle refund %s: %d attempts: %w", id, settleAttempts, last)
}

// postEvent sends one delivery of the provider's message msgID, signed
// now, to base's route of its events, and returns the answer.
func postEvent(ctx context.Context, client *http.Client, p settler, base, msgID string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+p.path(), bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if err := p.sign(req.Header, msgID, body, time.Now()); err != nil {
		return 0, nil, err
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("the answer to %s: %w", msgID, err)
	}
	return res.StatusCode, answer, nil
}
