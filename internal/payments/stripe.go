package payments

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"
)

// The setting that holds the Stripe endpoint's signing secret.
const envStripeSecret = "SHOP_STRIPE_WEBHOOK_SECRET"

// The header Stripe signs its requests with.
const stripeSignatureHeader = "Stripe-Signature"

// Stripe verifies Stripe webhook requests (SHOP_PAYMENTS=stripe).
//
// An event whose api_version is not on stripe-go's release train
// (stripe.APIVersion) is refused as malformed (400), as stripe-go does by
// default: its objects may not decode into stripe-go's types, and a
// payment read wrongly is worse than a payment retried. Stripe retries a
// refused event for days, which leaves operators the time to create the
// endpoint on the right version (docs/payments.md), and the events can be
// resent from then. Ignoring them with a 200 would drop the money silently.
type Stripe struct {
	secret string
}

var _ Verifier = (*Stripe)(nil)

// NewStripe takes the endpoint's signing secret, SHOP_STRIPE_WEBHOOK_SECRET
// (whsec_…, as Stripe shows it). Stripe uses the whole string as the HMAC
// key. An error names the setting, never the value.
func NewStripe(webhookSecret string) (*Stripe, error) {
	switch {
	case webhookSecret == "":
		return nil, fmt.Errorf("%s is empty", envStripeSecret)
	case webhookSecret != strings.TrimSpace(webhookSecret):
		return nil, fmt.Errorf("%s begins or ends with white space: remove it", envStripeSecret)
	case !strings.HasPrefix(webhookSecret, secretPrefix) || len(webhookSecret) == len(secretPrefix):
		return nil, fmt.Errorf("%s must be %s followed by the secret Stripe shows for the endpoint", envStripeSecret, secretPrefix)
	}
	return &Stripe{secret: webhookSecret}, nil
}

// Provider returns ProviderStripe.
func (s *Stripe) Provider() string { return ProviderStripe }

// Verify checks the Stripe-Signature header: its timestamp against now,
// then its v1 signatures (one per secret while Stripe rolls the endpoint's
// secret; one match is enough), and only then parses body.
func (s *Stripe) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	header := h.Get(stripeSignatureHeader)
	if header == "" {
		return Event{}, fmt.Errorf("%w: no %s header", ErrSignature, stripeSignatureHeader)
	}
	// stripe-go checks the timestamp against its own clock, and only that
	// it is not too old; it is checked here against now, both ways, and
	// stripe-go is asked only for the signature.
	ts, err := stripeTimestamp(header)
	if err != nil {
		return Event{}, err
	}
	if err := checkTimestamp(ts, now); err != nil {
		return Event{}, err
	}
	e, err := webhook.ConstructEventWithOptions(body, header, s.secret, webhook.ConstructEventOptions{IgnoreTolerance: true})
	if err != nil {
		// stripe-go returns these when the signature does not hold, before
		// it reads the body; any other error is about the body.
		for _, sigErr := range []error{webhook.ErrNotSigned, webhook.ErrInvalidHeader, webhook.ErrNoValidSignature, webhook.ErrTooOld} {
			if errors.Is(err, sigErr) {
				return Event{}, fmt.Errorf("%w: %w", ErrSignature, err)
			}
		}
		return Event{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := checkEventID(e.ID); err != nil {
		return Event{}, err
	}
	ev, err := parseStripe(e)
	if err != nil {
		return Event{}, err
	}
	ev.ID = e.ID
	return ev, nil
}

// stripeTimestamp returns the t= of a Stripe-Signature header
// ("t=1495999758,v1=…,v1=…"). A header with none, or more than one, is
// refused.
func stripeTimestamp(header string) (string, error) {
	var ts []string
	for pair := range strings.SplitSeq(header, ",") {
		if v, ok := strings.CutPrefix(pair, "t="); ok {
			ts = append(ts, v)
		}
	}
	if len(ts) != 1 {
		return "", fmt.Errorf("%w: %s must carry one timestamp, not %d", ErrSignature, stripeSignatureHeader, len(ts))
	}
	return ts[0], nil
}

// parseStripe reads a verified event.
func parseStripe(e stripe.Event) (Event, error) {
	var object []byte
	if e.Data != nil {
		object = e.Data.Raw
	}
	switch t := string(e.Type); t {
	case TypePaymentIntentSucceeded:
		var pi stripe.PaymentIntent
		if err := decodeData(object, "data.object", &pi); err != nil {
			return Event{}, err
		}
		orderID, ok := positiveInt(pi.Metadata["order_id"])
		if !ok {
			return Event{Type: t, Ignored: IgnoredNotOurs}, nil
		}
		p, err := newPayment(orderID, pi.ID, pi.AmountReceived, string(pi.Currency))
		if err != nil {
			return Event{}, err
		}
		return Event{Type: t, Payment: p}, nil
	case TypeRefundCreated, TypeRefundUpdated, TypeChargeRefundUpdated, TypeRefundFailed:
		var r stripe.Refund
		if err := decodeData(object, "data.object", &r); err != nil {
			return Event{}, err
		}
		status := RefundSucceeded
		if t == TypeRefundFailed {
			status = RefundFailed
		} else if r.Status != stripe.RefundStatusSucceeded {
			return Event{Type: t, Ignored: IgnoredStatus}, nil
		}
		u := stripeRefund(r, status)
		if u.RefundID == "" && u.PaymentID == "" {
			return Event{Type: t, Ignored: IgnoredNotOurs}, nil
		}
		if err := CheckProviderRefundID(u.ProviderRefundID); err != nil {
			return Event{}, err
		}
		return Event{Type: t, Refund: u}, nil
	default:
		return Event{Type: TypeOther, Ignored: IgnoredType}, nil
	}
}

// stripeRefund reads what a Refund says. Its RefundID and PaymentID are
// left empty unless they have the shape our rows hold: a metadata.refund_id
// (set by the refunder) or a PaymentIntent of another shape is not an
// error, it is someone else's, and a refund that names neither of ours is
// not ours.
func stripeRefund(r stripe.Refund, status string) *RefundUpdate {
	u := &RefundUpdate{ProviderRefundID: r.ID, Status: status}
	if id := r.Metadata["refund_id"]; CheckRefundID(id) == nil {
		u.RefundID = id
	}
	if r.PaymentIntent != nil && CheckPaymentID(r.PaymentIntent.ID) == nil {
		u.PaymentID = r.PaymentIntent.ID
	}
	return u
}
