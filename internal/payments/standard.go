package payments

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The setting that holds the Standard Webhooks secrets, named by the errors
// about them.
const envWebhookSecret = "SHOP_PAYMENT_WEBHOOK_SECRET"

// MinSecret is the fewest bytes a Standard Webhooks secret may decode to.
// The specification asks for 24 to 64; its Go package accepts any length,
// even none, so the service checks.
const MinSecret = 24

const secretPrefix = "whsec_"

// Standard verifies Standard Webhooks requests (SHOP_PAYMENTS=webhook).
type Standard struct {
	// hooks holds one Webhook per secret, in the order of the setting.
	hooks []*standardwebhooks.Webhook
}

var _ Verifier = (*Standard)(nil)

// NewStandard parses secrets, the value of SHOP_PAYMENT_WEBHOOK_SECRET: a
// comma list of whsec_ + base64, each decoding to at least MinSecret
// bytes. A request signed with any of them verifies, so that a secret can
// be rotated: add the new one, move the sender to it, remove the old one.
// An error names the setting and the entry, never a secret's value.
func NewStandard(secrets string) (*Standard, error) {
	if secrets == "" {
		return nil, fmt.Errorf("%s is empty", envWebhookSecret)
	}
	entries := strings.Split(secrets, ",")
	s := &Standard{}
	for i, entry := range entries {
		key, err := DecodeSecret(entry)
		if err != nil {
			return nil, fmt.Errorf("%s: entry %d of %d: %w", envWebhookSecret, i+1, len(entries), err)
		}
		hook, err := standardwebhooks.NewWebhookRaw(key)
		if err != nil {
			return nil, fmt.Errorf("%s: entry %d of %d: %w", envWebhookSecret, i+1, len(entries), err)
		}
		s.hooks = append(s.hooks, hook)
	}
	return s, nil
}

// DecodeSecret returns the key of one whsec_ secret, at least MinSecret
// bytes. The key is decoded here, not by the library, so that the length
// checked is the key's. An error never quotes the secret, so that a caller
// may add the name of its setting and log it.
func DecodeSecret(entry string) ([]byte, error) {
	switch {
	case entry == "":
		return nil, errors.New("empty")
	case entry != strings.TrimSpace(entry):
		return nil, errors.New("begins or ends with white space: remove it")
	case !strings.HasPrefix(entry, secretPrefix):
		return nil, fmt.Errorf("does not begin with %s", secretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(entry, secretPrefix))
	if err != nil {
		// The decoder's error gives an offset, not the data.
		return nil, fmt.Errorf("not base64 after %s: %w", secretPrefix, err)
	}
	if len(key) < MinSecret {
		return nil, fmt.Errorf("decodes to %d bytes, at least %d are needed", len(key), MinSecret)
	}
	return key, nil
}

// Provider returns ProviderWebhook.
func (s *Standard) Provider() string { return ProviderWebhook }

// Verify checks the three headers, the timestamp against now, and the
// signatures against each secret in turn, then parses body. The
// webhook-signature header may carry several space-separated signatures
// (a sender that is rotating its secret sends one per secret); one that
// matches is enough, which the library does.
func (s *Standard) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	for _, name := range []string{standardwebhooks.HeaderWebhookID, standardwebhooks.HeaderWebhookTimestamp, standardwebhooks.HeaderWebhookSignature} {
		if h.Get(name) == "" {
			return Event{}, fmt.Errorf("%w: no %s header", ErrSignature, name)
		}
	}
	// The library checks the timestamp against its own clock; it is checked
	// here against now instead, before any HMAC is computed, and the
	// library is asked only for the signature.
	if err := checkTimestamp(h.Get(standardwebhooks.HeaderWebhookTimestamp), now); err != nil {
		return Event{}, err
	}
	if !s.signed(h, body) {
		return Event{}, fmt.Errorf("%w: no signature matches", ErrSignature)
	}
	id := h.Get(standardwebhooks.HeaderWebhookID)
	if err := checkEventID(id); err != nil {
		return Event{}, err
	}
	e, err := parseStandard(body)
	if err != nil {
		return Event{}, err
	}
	e.ID = id
	return e, nil
}

// signed says whether any secret verifies the request.
func (s *Standard) signed(h http.Header, body []byte) bool {
	for _, hook := range s.hooks {
		if hook.VerifyIgnoringTimestamp(body, h) == nil {
			return true
		}
	}
	return false
}

// standardBody is a Standard Webhooks payload; data is read by type.
type standardBody struct {
	Type *string         `json:"type"`
	Data json.RawMessage `json:"data"`
}

// The data of each type this service acts on. Integers are read raw, so
// that a float, a string or a missing value is told from a number.
type (
	standardPayment struct {
		OrderID     json.RawMessage `json:"order_id"`
		PaymentID   string          `json:"payment_id"`
		AmountCents json.RawMessage `json:"amount_cents"`
		Currency    string          `json:"currency"`
	}
	standardRefund struct {
		RefundID         string `json:"refund_id"`
		ProviderRefundID string `json:"provider_refund_id"`
	}
)

// parseStandard reads a verified body. Unknown fields are ignored.
func parseStandard(body []byte) (Event, error) {
	var b standardBody
	if err := json.Unmarshal(body, &b); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if b.Type == nil || *b.Type == "" {
		return Event{}, fmt.Errorf("%w: no type", ErrMalformed)
	}
	switch *b.Type {
	case TypePaymentSucceeded:
		var d standardPayment
		if err := decodeData(b.Data, "data", &d); err != nil {
			return Event{}, err
		}
		orderID, err := jsonInt(d.OrderID, "order_id")
		if err != nil {
			return Event{}, err
		}
		amount, err := jsonInt(d.AmountCents, "amount_cents")
		if err != nil {
			return Event{}, err
		}
		p, err := newPayment(orderID, d.PaymentID, amount, d.Currency)
		if err != nil {
			return Event{}, err
		}
		return Event{Type: TypePaymentSucceeded, Payment: p}, nil
	case TypeRefundSucceeded:
		var d standardRefund
		if err := decodeData(b.Data, "data", &d); err != nil {
			return Event{}, err
		}
		if err := CheckRefundID(d.RefundID); err != nil {
			return Event{}, err
		}
		if err := CheckProviderRefundID(d.ProviderRefundID); err != nil {
			return Event{}, err
		}
		return Event{Type: TypeRefundSucceeded, Refund: &RefundUpdate{
			RefundID:         d.RefundID,
			ProviderRefundID: d.ProviderRefundID,
			Status:           RefundSucceeded,
		}}, nil
	default:
		return Event{Type: TypeOther, Ignored: IgnoredType}, nil
	}
}

// jsonInt reads a positive JSON integer.
func jsonInt(raw json.RawMessage, field string) (int64, error) {
	n, ok := positiveInt(string(raw))
	if !ok {
		return 0, fmt.Errorf("%w: %s must be a positive integer", ErrMalformed, field)
	}
	return n, nil
}
