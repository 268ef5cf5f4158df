package payments

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The providers, as SHOP_PAYMENTS names them and as the payments ledger
// records them (payments.provider).
const (
	ProviderWebhook = "webhook"
	ProviderStripe  = "stripe"
)

// MaxBody is the largest body a provider may send, in bytes. The handler
// reads the raw body up to this bound, not through the small JSON limit of
// the buyer routes: it is what bounds the cost of an unsigned request.
const MaxBody = 64 << 10

// Tolerance is how far a signature's timestamp may be from now, either way.
// It is the Standard Webhooks specification's and Stripe's default.
const Tolerance = 5 * time.Minute

var (
	// ErrSignature means the request is not proven to come from the
	// provider: a header is missing or unreadable, no signature matches any
	// secret, or the timestamp is more than Tolerance away. The handler
	// answers 401. Nothing of the body was read.
	ErrSignature = errors.New("payments: bad signature")
	// ErrMalformed means the signature holds but the event breaks a rule:
	// the body is not JSON of the expected shape, or a field is bad. The
	// handler answers 400, with nothing written.
	ErrMalformed = errors.New("payments: malformed event")
)

// The event types, the metric label of every event (Event.Type). The list
// is fixed, so that a provider cannot grow the metric's label set: every
// type not listed here is TypeOther.
const (
	// Standard Webhooks.
	TypePaymentSucceeded = "payment.succeeded"
	TypeRefundSucceeded  = "refund.succeeded"
	// Stripe.
	TypePaymentIntentSucceeded = "payment_intent.succeeded"
	TypeRefundCreated          = "refund.created"
	TypeRefundUpdated          = "refund.updated"
	TypeChargeRefundUpdated    = "charge.refund.updated"
	TypeRefundFailed           = "refund.failed"
	// Any other type, of either provider.
	TypeOther = "other"
)

// Types returns every value Event.Type can take, for a metric to declare
// its labels up front.
func Types() []string {
	return []string{
		TypePaymentSucceeded, TypeRefundSucceeded,
		TypePaymentIntentSucceeded, TypeRefundCreated, TypeRefundUpdated,
		TypeChargeRefundUpdated, TypeRefundFailed,
		TypeOther,
	}
}

// Why an event is ignored (Event.Ignored), for logs and metrics.
const (
	// IgnoredType: the event's type is not one this service acts on. A
	// Stripe charge.refunded is one of them: it says a charge was refunded,
	// not which refund settled, and a refund.* event of the same refund
	// follows.
	IgnoredType = "type"
	// IgnoredNotOurs: a Stripe event about a payment or refund this service
	// did not make (no or an invalid metadata.order_id; a refund that names
	// neither a refund_id nor a PaymentIntent we could have). It is
	// answered 200 so that Stripe does not retry it for days and disable
	// the endpoint.
	IgnoredNotOurs = "not_ours"
	// IgnoredStatus: a Stripe Refund that has not settled (pending,
	// requires_action, canceled), or a refund.created/updated whose refund
	// failed, which its own refund.failed event reports.
	IgnoredStatus = "status"
)

// Refund statuses (RefundUpdate.Status).
const (
	RefundSucceeded = "succeeded"
	RefundFailed    = "failed"
)

// Payment is money the provider says it received for an order.
type Payment struct {
	// OrderID is the order the payment names; it may not exist.
	OrderID int64
	// PaymentID is the provider's id of the payment (Stripe: the
	// PaymentIntent's), 1–64 characters of [A-Za-z0-9_-].
	PaymentID string
	// AmountCents is what was received, in the currency's minor unit; > 0.
	AmountCents int64
	// Currency is the three letters of ISO 4217, upper-case.
	Currency string
}

// RefundUpdate is the provider's word on a refund: it was paid back, or it
// failed.
type RefundUpdate struct {
	// RefundID is ours (refunds.refund_id, a ULID), empty when the
	// provider did not carry a valid one: match by PaymentID then.
	RefundID string
	// PaymentID is the payment the refund returns (Stripe: the
	// PaymentIntent's id), empty when the provider did not say (Standard
	// Webhooks) or it cannot be one of ours.
	PaymentID string
	// ProviderRefundID is the provider's reference (Stripe: re_…), always
	// set: 1–255 printable ASCII characters.
	ProviderRefundID string
	// Status is RefundSucceeded or RefundFailed.
	Status string
}

// Event is a verified provider event. Exactly one of Payment, Refund and
// Ignored is set.
type Event struct {
	// ID is the provider's id of the event: the webhook-id header, or the
	// Stripe event's id. 1–255 printable ASCII characters.
	ID string
	// Type is one of Types().
	Type string
	// Payment is set for a payment received.
	Payment *Payment
	// Refund is set for a refund that settled or failed.
	Refund *RefundUpdate
	// Ignored says why the event is to be answered 200 and otherwise
	// ignored (IgnoredType, IgnoredNotOurs, IgnoredStatus).
	Ignored string
}

// Verifier checks a provider's request and reads its event.
type Verifier interface {
	// Provider is ProviderWebhook or ProviderStripe.
	Provider() string
	// Verify checks the request's signature and its timestamp against
	// now, and only then parses body. It returns an error wrapping
	// ErrSignature or ErrMalformed; its message names no secret.
	Verify(h http.Header, body []byte, now time.Time) (Event, error)
}

// checkTimestamp returns an ErrSignature error unless header, the
// request's timestamp in Unix seconds, is at most Tolerance away from now.
func checkTimestamp(header string, now time.Time) error {
	sec, err := strconv.ParseInt(header, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: the timestamp is not a number of seconds", ErrSignature)
	}
	switch d := now.Sub(time.Unix(sec, 0)); {
	case d > Tolerance:
		return fmt.Errorf("%w: timestamp %s old, more than %s", ErrSignature, d.Round(time.Second), Tolerance)
	case d < -Tolerance:
		return fmt.Errorf("%w: timestamp %s ahead, more than %s", ErrSignature, (-d).Round(time.Second), Tolerance)
	}
	return nil
}

// positiveInt reads a positive decimal integer that fits in 64 bits,
// digits only, with no sign or leading zero: a JSON integer (a float,
// 1.0, 1e3, a string or null is not one), or a number written into Stripe
// metadata by strconv.
func positiveInt(s string) (int64, bool) {
	if s == "" || s[0] == '0' || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

var (
	paymentIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	// A ULID in its canonical form: 26 characters of Crockford's base32,
	// upper-case, the first at most 7 (a larger one overflows 128 bits).
	refundIDRE = regexp.MustCompile(`^[0-7][0-9A-HJKMNP-TV-Z]{25}$`)
	currencyRE = regexp.MustCompile(`^[A-Za-z]{3}$`)
)

// CheckPaymentID returns an ErrMalformed error unless id is 1–64 characters
// of [A-Za-z0-9_-], the shape of payments.payment_id.
func CheckPaymentID(id string) error {
	if !paymentIDRE.MatchString(id) {
		return fmt.Errorf("%w: payment_id must be 1-64 characters of A-Z a-z 0-9 _ -", ErrMalformed)
	}
	return nil
}

// CheckRefundID returns an ErrMalformed error unless id is a ULID in its
// canonical, upper-case form, the shape of refunds.refund_id.
func CheckRefundID(id string) error {
	if !refundIDRE.MatchString(id) {
		return fmt.Errorf("%w: refund_id must be a ULID (26 characters of upper-case Crockford base32)", ErrMalformed)
	}
	return nil
}

// CheckProviderRefundID returns an ErrMalformed error unless ref is 1–255
// printable ASCII characters, the shape of refunds.provider_refund_id.
func CheckProviderRefundID(ref string) error {
	if !printable(ref) {
		return fmt.Errorf("%w: provider_refund_id must be 1-255 printable ASCII characters", ErrMalformed)
	}
	return nil
}

// checkEventID returns an ErrMalformed error unless id is 1–255 printable
// ASCII characters, the shape of payments.event_id.
func checkEventID(id string) error {
	if !printable(id) {
		return fmt.Errorf("%w: event id must be 1-255 printable ASCII characters", ErrMalformed)
	}
	return nil
}

// printable says whether s is 1–255 characters of printable ASCII (space
// to tilde).
func printable(s string) bool {
	if len(s) < 1 || len(s) > 255 {
		return false
	}
	for i := range len(s) {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// CheckCurrency returns c upper-cased, or an ErrMalformed error unless it
// is exactly three ASCII letters. Whether they name an ISO 4217 currency is
// not checked: a payment in a currency that is not the order's is a refund
// owed, which needs no list.
func CheckCurrency(c string) (string, error) {
	if !currencyRE.MatchString(c) {
		return "", fmt.Errorf("%w: currency must be three ASCII letters", ErrMalformed)
	}
	return strings.ToUpper(c), nil
}

// decodeData reads the object an event is about, named what, into v.
func decodeData(data []byte, what string, v any) error {
	if len(data) == 0 || string(data) == "null" {
		return fmt.Errorf("%w: no %s", ErrMalformed, what)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrMalformed, what, err)
	}
	return nil
}

// newPayment checks a payment's fields, each provider's by the same rules.
// orderID is positive: both providers read it with positiveInt.
func newPayment(orderID int64, paymentID string, amountCents int64, currency string) (*Payment, error) {
	if err := CheckPaymentID(paymentID); err != nil {
		return nil, err
	}
	if amountCents <= 0 {
		return nil, fmt.Errorf("%w: amount_cents must be a positive integer", ErrMalformed)
	}
	currency, err := CheckCurrency(currency)
	if err != nil {
		return nil, err
	}
	return &Payment{OrderID: orderID, PaymentID: paymentID, AmountCents: amountCents, Currency: currency}, nil
}
