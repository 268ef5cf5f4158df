// Package stripepay is the service's side of Stripe (SHOP_PAYMENTS=stripe):
// a client for the three calls the service makes — create a PaymentIntent
// for a reservation, cancel it when the reservation ends, refund a payment
// that is owed back — and the refunder, which pays owed refunds back through
// the Refund API.
//
// # Capture
//
// A PaymentIntent is created with Stripe's default, automatic capture: a
// payment that succeeds is money received. Authorize-then-capture
// (capture_method=manual, captured only while the order is reserved and
// before pay_by) would turn a payment that arrives too late into an
// authorization that lapses rather than a refund, but it needs a capture
// step the service must get right under the same races as the payment
// itself (a capture racing the sweep at pay_by, a capture whose answer is
// lost), and an uncaptured authorization still holds the buyer's funds for
// up to seven days. It is not built. Instead, when a reservation ends its
// PaymentIntent is cancelled (CancelIntent), so that it can no longer be
// paid; a payment that still arrives (one that was already processing, or
// raced the cancellation) is a payment for an order that is no longer
// reserved: a refund owed, which the refunder pays back.
//
// # Errors
//
// Every error of a call is an *Error naming its Kind and whether trying
// again may succeed, but CancelIntent's ErrIntentFinal. A retry after an
// answer that was lost is safe: a creation and a refund carry an
// Idempotency-Key, and a cancellation repeated is ErrIntentFinal. So
// transport failures, timeouts, 409, 429, 5xx, a rejected key (401, 403:
// the operator's to fix, not the refund's) and answers that are not
// Stripe's are retryable; any other 4xx is permanent.
package stripepay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"
)

// DefaultTimeout bounds a call when Config.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Config is what a Client needs.
type Config struct {
	// SecretKey is SHOP_STRIPE_SECRET_KEY.
	SecretKey string
	// APIBase is SHOP_STRIPE_API_BASE; empty means Stripe's own,
	// https://api.stripe.com.
	APIBase string
	// Timeout bounds one method call as a whole, the list that follows a
	// charge_already_refunded included; zero means DefaultTimeout.
	Timeout time.Duration
}

// Client calls Stripe's API. It keeps no state between calls and is safe
// for concurrent use.
type Client struct {
	sc      *stripe.Client
	timeout time.Duration
}

// New returns a client of cfg.APIBase with cfg.SecretKey. It makes no call.
func New(cfg Config) (*Client, error) {
	if cfg.SecretKey == "" {
		return nil, errors.New("stripe: no secret key")
	}
	base := cfg.APIBase
	if base == "" {
		base = stripe.APIURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("stripe: API base %q is not an http(s) URL", base)
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if timeout < 0 {
		return nil, fmt.Errorf("stripe: negative timeout %s", timeout)
	}
	// stripe-go's own retries sleep without regard to the call's context
	// and would stretch a call past its timeout, which the refunder's lease
	// is measured against: it makes one attempt, and the caller retries
	// with backoff (the refunder) or answers 503 (a checkout).
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		HTTPClient: &http.Client{
			Timeout:   timeout,
			Transport: http.DefaultTransport.(*http.Transport).Clone(),
		},
		URL:               stripe.String(base),
		MaxNetworkRetries: stripe.Int64(0),
		// Every error is returned to the caller, who logs it with what it
		// was doing; the library's own log would say it twice.
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return &Client{sc: stripe.NewClient(cfg.SecretKey, stripe.WithBackends(backends)), timeout: timeout}, nil
}

// Timeout is the longest a method call takes.
func (c *Client) Timeout() time.Duration { return c.timeout }

// Intent is a PaymentIntent as a buyer's checkout needs it.
type Intent struct {
	ID           string
	ClientSecret string
}

// CreateIntent creates a PaymentIntent for the order's amount, in its
// currency (lower-cased, as Stripe wants it), with metadata.order_id, which
// the payment_intent.succeeded event carries back. idempotencyKey is the
// Idempotency-Key: a retry with the same key within Stripe's 24 hours
// returns the same PaymentIntent.
func (c *Client) CreateIntent(ctx context.Context, orderID, amountCents int64, currency, idempotencyKey string) (Intent, error) {
	op := fmt.Sprintf("create payment intent for order %d", orderID)
	switch {
	case orderID <= 0:
		return Intent{}, invalid(op, "the order id is not positive")
	case amountCents <= 0:
		return Intent{}, invalid(op, "amount %d is not positive", amountCents)
	case !isCurrency(currency):
		return Intent{}, invalid(op, "currency %q is not three letters", currency)
	case idempotencyKey == "" || len(idempotencyKey) > 255:
		return Intent{}, invalid(op, "the idempotency key must be 1 to 255 bytes")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	p := &stripe.PaymentIntentCreateParams{
		Amount:   stripe.Int64(amountCents),
		Currency: stripe.String(strings.ToLower(currency)),
	}
	p.AddMetadata("order_id", strconv.FormatInt(orderID, 10))
	p.SetIdempotencyKey(idempotencyKey)
	pi, err := c.sc.V1PaymentIntents.Create(ctx, p)
	if err != nil {
		return Intent{}, classify(op, err)
	}
	return Intent{ID: pi.ID, ClientSecret: pi.ClientSecret}, nil
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') {
			return false
		}
	}
	return true
}

// ErrIntentFinal is what CancelIntent's error is when the PaymentIntent can
// no longer be cancelled: it is cancelled already, it succeeded (its
// payment is on its way to the service as an event), or it is processing
// one. Trying again cannot change that; the caller logs it and moves on.
var ErrIntentFinal = errors.New("stripe: the payment intent can no longer be cancelled")

// IntentFinalError is CancelIntent's ErrIntentFinal, with the
// PaymentIntent's status as Stripe gave it ("" when it gave none).
type IntentFinalError struct {
	ID     string
	Status string
}

func (e *IntentFinalError) Error() string {
	return fmt.Sprintf("stripe: payment intent %s can no longer be cancelled: its status is %q", e.ID, e.Status)
}

// Is makes errors.Is(err, ErrIntentFinal) hold.
func (e *IntentFinalError) Is(target error) bool { return target == ErrIntentFinal }

// CancelIntent cancels the PaymentIntent of a reservation that ended, so
// that it can no longer be paid. nil means it is cancelled now; an
// *IntentFinalError (errors.Is ErrIntentFinal) that it could not be, for
// good; any other error is an *Error.
func (c *Client) CancelIntent(ctx context.Context, id string) error {
	if id == "" {
		return invalid("cancel payment intent", "no id")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	_, err := c.sc.V1PaymentIntents.Cancel(ctx, id, nil)
	var se *stripe.Error
	if errors.As(err, &se) && se.Code == stripe.ErrorCodePaymentIntentUnexpectedState {
		final := &IntentFinalError{ID: id}
		if se.PaymentIntent != nil {
			final.Status = string(se.PaymentIntent.Status)
		}
		return final
	}
	if err != nil {
		return classify("cancel payment intent "+id, err)
	}
	return nil
}
