package payments_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"shop/internal/payments"
)

func newStripe(t *testing.T) *payments.Stripe {
	t.Helper()
	v, err := payments.NewStripe(stripeSecret)
	if err != nil {
		t.Fatalf("NewStripe: %v", err)
	}
	return v
}

// stripeEvent returns a Stripe event of type typ about object, on
// stripe-go's API version.
func stripeEvent(t *testing.T, typ string, object any) []byte {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"id":          eventID,
		"object":      "event",
		"api_version": stripe.APIVersion,
		"created":     now.Unix(),
		"livemode":    false,
		"type":        typ,
		"data":        map[string]any{"object": object},
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// stripeSigned returns the headers of body signed with secret at ts, by
// stripe-go's test helper.
func stripeSigned(secret string, ts time.Time, body []byte) http.Header {
	p := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: ts})
	h := http.Header{}
	h.Set("Stripe-Signature", p.Header)
	return h
}

// intent returns a PaymentIntent with metadata.
func intent(metadata map[string]string) map[string]any {
	return map[string]any{
		"id":              paymentID,
		"object":          "payment_intent",
		"amount":          1099,
		"amount_received": 1099,
		"currency":        "usd",
		"status":          "succeeded",
		"metadata":        metadata,
	}
}

// refund returns a Refund with a status, metadata and PaymentIntent (nil:
// none).
func refund(status string, metadata map[string]string, pi any) map[string]any {
	return map[string]any{
		"id":             stripeRefundID,
		"object":         "refund",
		"amount":         1099,
		"currency":       "usd",
		"status":         status,
		"metadata":       metadata,
		"payment_intent": pi,
	}
}

var (
	ours        = map[string]string{"order_id": "1234"}
	ourRefund   = map[string]string{"refund_id": refundID}
	refundTypes = []string{payments.TypeRefundCreated, payments.TypeRefundUpdated, payments.TypeChargeRefundUpdated}
)

func TestStripeEvents(t *testing.T) {
	v := newStripe(t)
	type test struct {
		name   string
		typ    string
		object any
		want   payments.Event
	}
	tests := []test{
		{"payment", payments.TypePaymentIntentSucceeded, intent(ours), payments.Event{
			Type: payments.TypePaymentIntentSucceeded,
			Payment: &payments.Payment{
				OrderID: 1234, PaymentID: paymentID, AmountCents: 1099, Currency: "USD",
			},
		}},
		{"refund failed", payments.TypeRefundFailed, refund("failed", ourRefund, paymentID), payments.Event{
			Type: payments.TypeRefundFailed,
			Refund: &payments.RefundUpdate{
				RefundID: refundID, PaymentID: paymentID, ProviderRefundID: stripeRefundID, Status: payments.RefundFailed,
			},
		}},
		{"charge refunded is not a settlement", "charge.refunded", map[string]any{"id": "ch_1", "object": "charge", "refunded": true},
			payments.Event{Type: payments.TypeOther, Ignored: payments.IgnoredType}},
		{"another type", "customer.created", map[string]any{"id": "cus_1", "object": "customer"},
			payments.Event{Type: payments.TypeOther, Ignored: payments.IgnoredType}},
	}
	for _, typ := range refundTypes {
		succeeded := &payments.RefundUpdate{ProviderRefundID: stripeRefundID, Status: payments.RefundSucceeded}
		settles := func(refundID, paymentID string) payments.Event {
			u := *succeeded
			u.RefundID, u.PaymentID = refundID, paymentID
			return payments.Event{Type: typ, Refund: &u}
		}
		tests = append(tests,
			test{typ + " succeeded", typ, refund("succeeded", ourRefund, paymentID), settles(refundID, paymentID)},
			test{typ + " expanded PaymentIntent", typ, refund("succeeded", ourRefund, intent(nil)), settles(refundID, paymentID)},
			// Made by hand in the dashboard: matched by PaymentIntent.
			test{typ + " without refund_id", typ, refund("succeeded", nil, paymentID), settles("", paymentID)},
			test{typ + " with someone else's refund_id", typ, refund("succeeded", map[string]string{"refund_id": "R-17"}, paymentID), settles("", paymentID)},
			test{typ + " without PaymentIntent", typ, refund("succeeded", ourRefund, nil), settles(refundID, "")},
			test{typ + " naming nothing of ours", typ, refund("succeeded", map[string]string{"refund_id": "R-17"}, nil),
				payments.Event{Type: typ, Ignored: payments.IgnoredNotOurs}},
			test{typ + " PaymentIntent of another shape", typ, refund("succeeded", nil, "pi.1"),
				payments.Event{Type: typ, Ignored: payments.IgnoredNotOurs}},
		)
		// A refund that has not settled; a failed one is reported by its
		// own refund.failed.
		for _, status := range []string{"pending", "requires_action", "canceled", "failed"} {
			tests = append(tests, test{typ + " " + status, typ, refund(status, ourRefund, paymentID),
				payments.Event{Type: typ, Ignored: payments.IgnoredStatus}})
		}
	}
	// A PaymentIntent that is not ours: no, or an invalid, order_id.
	for _, metadata := range []map[string]string{
		nil, {}, {"order": "1234"}, {"order_id": ""}, {"order_id": "abc"}, {"order_id": "0"}, {"order_id": "-3"},
		{"order_id": "042"}, {"order_id": "+42"}, {"order_id": " 42"}, {"order_id": "42 "}, {"order_id": "4.2"},
		{"order_id": "1e3"}, {"order_id": "9223372036854775808"},
	} {
		tests = append(tests, test{"not ours " + mapString(metadata), payments.TypePaymentIntentSucceeded, intent(metadata),
			payments.Event{Type: payments.TypePaymentIntentSucceeded, Ignored: payments.IgnoredNotOurs}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := stripeEvent(t, tt.typ, tt.object)
			e, err := v.Verify(stripeSigned(stripeSecret, now, body), body, now)
			tt.want.ID = eventID
			wantEvent(t, e, err, tt.want)
		})
	}
}

func mapString(m map[string]string) string {
	b, _ := json.Marshal(m)
	return string(b)
}

// A timestamp exactly Tolerance away either way is in time.
func TestStripeToleranceEdges(t *testing.T) {
	v := newStripe(t)
	body := stripeEvent(t, payments.TypePaymentIntentSucceeded, intent(ours))
	for _, ts := range []time.Time{now.Add(-payments.Tolerance), now.Add(payments.Tolerance)} {
		e, err := v.Verify(stripeSigned(stripeSecret, ts, body), body, now)
		if err != nil || e.Payment == nil {
			t.Errorf("signed at now%+v: %s, %v", ts.Sub(now), show(e), err)
		}
	}
}

// While Stripe rolls an endpoint's secret it signs with both: one v1
// signature that matches is enough.
func TestStripeSeveralSignatures(t *testing.T) {
	v := newStripe(t)
	body := stripeEvent(t, payments.TypePaymentIntentSucceeded, intent(ours))
	good := stripeSigned(stripeSecret, now, body).Get("Stripe-Signature")
	other := stripeSigned(stripeOtherSecret, now, body).Get("Stripe-Signature")
	_, goodSig, _ := strings.Cut(good, ",")
	_, otherSig, _ := strings.Cut(other, ",")
	for _, header := range []string{
		good + "," + otherSig,
		other + "," + goodSig,
		other + ",v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39," + goodSig,
	} {
		h := http.Header{}
		h.Set("Stripe-Signature", header)
		if e, err := v.Verify(h, body, now); err != nil || e.Payment == nil {
			t.Errorf("%q: %s, %v", header, show(e), err)
		}
	}
}

// Every request not proven to be Stripe's is ErrSignature, and its body is
// not read: the body is not JSON, which would be ErrMalformed had it been
// parsed.
func TestStripeBadSignature(t *testing.T) {
	v := newStripe(t)
	body := []byte(`{"id":"evt_1","type":"payment_intent.succeeded"`)
	valid := stripeSigned(stripeSecret, now, body).Get("Stripe-Signature")
	tests := []struct {
		name   string
		header string
		body   []byte
	}{
		{"tampered body", valid, append([]byte(" "), body...)},
		{"wrong secret", stripeSigned(stripeOtherSecret, now, body).Get("Stripe-Signature"), body},
		{"old timestamp", stripeSigned(stripeSecret, now.Add(-payments.Tolerance-time.Second), body).Get("Stripe-Signature"), body},
		{"a day old", stripeSigned(stripeSecret, now.Add(-24*time.Hour), body).Get("Stripe-Signature"), body},
		{"future timestamp", stripeSigned(stripeSecret, now.Add(payments.Tolerance+time.Second), body).Get("Stripe-Signature"), body},
		{"timestamp changed after signing", strings.Replace(valid, "t=1700000000,", "t=1700000001,", 1), body},
		{"no header", "", body},
		{"no timestamp", strings.Replace(valid, "t=1700000000,", "", 1), body},
		{"two timestamps", "t=1700000000," + valid, body},
		{"timestamp not a number", strings.Replace(valid, "t=1700000000,", "t=now,", 1), body},
		{"no v1 signature", strings.Replace(valid, "v1=", "v0=", 1), body},
		{"signature not hex", "t=1700000000,v1=zz", body},
		{"not a Stripe header", "sha256=abcdef", body},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.header != "" {
				h.Set("Stripe-Signature", tt.header)
			}
			e, err := v.Verify(h, tt.body, now)
			wantErr(t, e, err, payments.ErrSignature, stripeSecret, stripeOtherSecret)
		})
	}
	// The control: signed right, the same body is malformed.
	e, err := v.Verify(stripeSigned(stripeSecret, now, body), body, now)
	wantErr(t, e, err, payments.ErrMalformed)
}

// Every signed event that breaks a rule is ErrMalformed.
func TestStripeMalformed(t *testing.T) {
	v := newStripe(t)
	with := func(object map[string]any, key string, value any) map[string]any {
		o := make(map[string]any, len(object))
		for k, v := range object {
			o[k] = v
		}
		o[key] = value
		return o
	}
	event := func(typ string, object any) []byte { return stripeEvent(t, typ, object) }
	pi := intent(ours)
	re := refund("succeeded", ourRefund, paymentID)
	tests := []struct {
		name string
		body []byte
	}{
		{"not JSON", []byte(`{"id":`)},
		{"no data", []byte(`{"id":"` + eventID + `","api_version":"` + stripe.APIVersion + `","type":"payment_intent.succeeded"}`)},
		{"data without object", []byte(`{"id":"` + eventID + `","api_version":"` + stripe.APIVersion + `","type":"refund.updated","data":{}}`)},
		// Its objects may not decode into stripe-go's: it is refused until
		// the endpoint is on stripe-go's version, as stripe-mock's is not.
		{"stripe-mock's API version", []byte(strings.Replace(string(event(payments.TypePaymentIntentSucceeded, pi)), stripe.APIVersion, "2026-08-26.dahlia", 1))},
		{"API version before release trains", []byte(strings.Replace(string(event(payments.TypePaymentIntentSucceeded, pi)), stripe.APIVersion, "2020-08-27", 1))},
		{"no event id", []byte(strings.Replace(string(event(payments.TypePaymentIntentSucceeded, pi)), eventID, "", 1))},
		{"event id too long", []byte(strings.Replace(string(event(payments.TypePaymentIntentSucceeded, pi)), eventID, strings.Repeat("e", 256), 1))},
		{"PaymentIntent not an object", event(payments.TypePaymentIntentSucceeded, []int{1})},
		{"amount_received not a number", event(payments.TypePaymentIntentSucceeded, with(pi, "amount_received", "1099"))},
		{"amount_received zero", event(payments.TypePaymentIntentSucceeded, with(pi, "amount_received", 0))},
		{"amount_received negative", event(payments.TypePaymentIntentSucceeded, with(pi, "amount_received", -1))},
		{"currency of two letters", event(payments.TypePaymentIntentSucceeded, with(pi, "currency", "us"))},
		{"no currency", event(payments.TypePaymentIntentSucceeded, with(pi, "currency", nil))},
		{"PaymentIntent id of another shape", event(payments.TypePaymentIntentSucceeded, with(pi, "id", "pi.1"))},
		{"no PaymentIntent id", event(payments.TypePaymentIntentSucceeded, with(pi, "id", ""))},
		{"Refund not an object", event(payments.TypeRefundUpdated, "re_1")},
		{"Refund status not a string", event(payments.TypeRefundUpdated, with(re, "status", 1))},
		{"no Refund id", event(payments.TypeRefundUpdated, with(re, "id", ""))},
		{"Refund id too long", event(payments.TypeRefundFailed, with(re, "id", strings.Repeat("r", 256)))},
		{"Refund id not printable", event(payments.TypeChargeRefundUpdated, with(re, "id", "re_\n1"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := v.Verify(stripeSigned(stripeSecret, now, tt.body), tt.body, now)
			wantErr(t, e, err, payments.ErrMalformed)
		})
	}
}

func TestNewStripe(t *testing.T) {
	for _, bad := range []string{"", "whsec_", "sk_test_123", "0123456789abcdef", " " + stripeSecret, stripeSecret + "\n"} {
		v, err := payments.NewStripe(bad)
		if err == nil {
			t.Errorf("NewStripe(%q) = %v, want an error", bad, v)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "SHOP_STRIPE_WEBHOOK_SECRET") || (len(bad) > 6 && strings.Contains(msg, strings.TrimSpace(bad))) {
			t.Errorf("NewStripe(%q): %q, want it to name SHOP_STRIPE_WEBHOOK_SECRET and not its value", bad, msg)
		}
	}
	if v := newStripe(t); v.Provider() != payments.ProviderStripe {
		t.Errorf("Provider() = %q", v.Provider())
	}
}
