package stock

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"gorm.io/gorm"
)

// A refund is a payment owed back (payments.go says when). It is recorded
// in the payment's transaction, and then paid back: by the refunder
// through the provider's Refund API (Stripe), or by the provider or an
// operator settling it (webhook). Its refund_id, a ULID, is its name
// everywhere and the Idempotency-Key towards the provider.
//
//	owed → requested (a refunder claimed it and asks the provider)
//	     → refunded (settled: the provider's reference is kept)
//	     → failed (the provider refused; operators see it listed and alerted)

// The states of a refund.
const (
	RefundOwed      = "owed"
	RefundRequested = "requested"
	RefundRefunded  = "refunded"
	RefundFailed    = "failed"
)

// Refund is a payment owed back.
type Refund struct {
	RefundID string `gorm:"column:refund_id"`
	// Provider is nil on refunds from before the payments ledger.
	Provider  *string `gorm:"column:provider"`
	PaymentID string  `gorm:"column:payment_id"`
	OrderID   int64   `gorm:"column:order_id"`
	// UserID and SKUID are the order's; nil when there is no such order.
	UserID *int64 `gorm:"column:user_id"`
	SKUID  *int64 `gorm:"column:sku_id"`
	// AmountCents and Currency are what was received; nil on refunds from
	// before amounts.
	AmountCents *int64  `gorm:"column:amount_cents"`
	Currency    *string `gorm:"column:currency"`
	// ReceivedAt is when the payment came, by MySQL's clock.
	ReceivedAt time.Time `gorm:"column:received_at"`
	Reason     string    `gorm:"column:reason"`
	State      string    `gorm:"column:state"`
	// ProviderRefundID and SettledAt are set once refunded.
	ProviderRefundID *string    `gorm:"column:provider_refund_id"`
	SettledAt        *time.Time `gorm:"column:settled_at"`
	Attempts         int        `gorm:"column:attempts"`
	LastError        *string    `gorm:"column:last_error"`
}

// RefundQuery is a page of the refunds: those in State (every state when
// empty) whose id comes after After, at most Limit (1–1000) of them.
type RefundQuery struct {
	State string
	After string
	Limit int
}

// MaxRefundPage is the most refunds one page lists.
const MaxRefundPage = 1000

var (
	refundIDRE         = regexp.MustCompile(`^[0-9A-HJKMNP-TV-Z]{26}$`)
	providerRefundIDRE = regexp.MustCompile(`^[\x20-\x7e]{1,255}$`)
)

// CheckRefundID returns an ErrInvalid error unless id is a refund id (a
// ULID: 26 characters of Crockford's base 32).
func CheckRefundID(id string) error {
	if !refundIDRE.MatchString(id) {
		return invalidf("%s must be 26 characters of Crockford's base 32 (a ULID)", FieldRefund)
	}
	return nil
}

func (q RefundQuery) validate() error {
	switch q.State {
	case "", RefundOwed, RefundRequested, RefundRefunded, RefundFailed:
	default:
		return invalidf("%s must be one of owed, requested, refunded, failed", FieldRefundState)
	}
	if q.Limit < 1 || q.Limit > MaxRefundPage {
		return invalidf("%s must be between 1 and %d", FieldLimit, MaxRefundPage)
	}
	if q.After != "" {
		return CheckRefundID(q.After)
	}
	return nil
}

// Refunds returns a page of refunds, by refund id (which is by time), and
// whether there are more after it; none is an empty slice. Errors:
// ErrInvalid, ErrBusy (MySQL down or refusing work for now).
func (c *Catalog) Refunds(ctx context.Context, q RefundQuery) (page []Refund, more bool, err error) {
	if err := q.validate(); err != nil {
		return nil, false, err
	}
	page = []Refund{}
	states := []string{RefundOwed, RefundRequested, RefundRefunded, RefundFailed}
	if q.State != "" {
		states = []string{q.State}
	}
	if _, err := read(c.db.WithContext(ctx), &page, sqlRefundPage, states, q.After, q.Limit+1); err != nil {
		return nil, false, classify(ctx, "refunds", err)
	}
	if len(page) > q.Limit {
		return page[:q.Limit], true, nil
	}
	return page, false, nil
}

// Settlement is the provider's word on a refund: it was paid back (Status
// RefundRefunded, with the provider's reference) or it failed. The refund
// is named by RefundID or, when the provider did not carry it, by the
// payment it returns.
type Settlement struct {
	Provider         string
	RefundID         string
	PaymentID        string
	ProviderRefundID string
	// Failed says the provider refused the refund; Reason says why.
	Failed bool
	Reason string
}

// Settle applies the provider's word on a refund, and returns the refund
// as it is now. Settling a refunded refund with the same reference again
// changes nothing.
//
// Errors: ErrInvalid, ErrRefundNotFound, ErrRefundSettled (it was settled
// with another reference; or it failed after it was refunded), ErrBusy.
func (s *Service) Settle(ctx context.Context, st Settlement) (Refund, error) {
	if st.RefundID != "" {
		if err := CheckRefundID(st.RefundID); err != nil {
			return Refund{}, err
		}
	} else if err := CheckPaymentID(st.PaymentID); err != nil {
		return Refund{}, err
	}
	if !st.Failed && !providerRefundIDRE.MatchString(st.ProviderRefundID) {
		return Refund{}, invalidf("%s must be 1-255 printable ASCII characters", FieldProviderRefund)
	}
	var r Refund
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		events, err := s.eventsOn(tx)
		if err != nil {
			return err
		}
		var ok bool
		if st.RefundID != "" {
			ok, err = read(tx, &r, sqlLockRefund, st.RefundID)
		} else {
			ok, err = read(tx, &r, sqlLockRefundOfPayment, st.Provider, st.PaymentID)
		}
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("%w: %s%s", ErrRefundNotFound, st.RefundID, st.PaymentID)
		}
		return s.settle(tx, &r, st, events)
	})
	return r, classify(ctx, "settle refund", err)
}

// settle is Settle's decision on r, locked in tx, with its event when
// events are on.
func (s *Service) settle(tx *gorm.DB, r *Refund, st Settlement, events bool) error {
	typ := EventRefundRefunded
	switch {
	case r.State == RefundRefunded && !st.Failed && r.ProviderRefundID != nil && *r.ProviderRefundID == st.ProviderRefundID:
		return nil
	case r.State == RefundRefunded:
		return fmt.Errorf("%w: refund %s is refunded by %s", ErrRefundSettled, r.RefundID, deref(r.ProviderRefundID))
	case st.Failed:
		if _, _, err := run(tx, sqlFailRefund, truncate(st.Reason, 255), r.RefundID); err != nil {
			return err
		}
		s.transitions("refund_"+RefundFailed, 1)
		typ = EventRefundFailed
	default:
		if _, _, err := run(tx, sqlSettleRefund, st.ProviderRefundID, r.RefundID); err != nil {
			return err
		}
		s.transitions("refund_"+RefundRefunded, 1)
	}
	if events {
		if err := refundEvent(tx, typ, *r); err != nil {
			return err
		}
	}
	_, err := read(tx, r, sqlLockRefund, r.RefundID)
	return err
}

// ClaimRefunds claims up to n refunds of provider that are owed, or
// requested by a refunder whose claim ran out, for lease: they become
// requested, claimed until then, and no other refunder takes them
// meanwhile. Refunds from before amounts are left to operators.
func (s *Service) ClaimRefunds(ctx context.Context, provider string, lease time.Duration, n int) ([]Refund, error) {
	var claimed []Refund
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if _, err := read(tx, &claimed, sqlClaimableRefunds, provider, n); err != nil {
			return err
		}
		if len(claimed) == 0 {
			return nil
		}
		ids := make([]string, len(claimed))
		for i, r := range claimed {
			ids[i] = r.RefundID
		}
		_, _, err := run(tx, sqlClaimRefunds, lease.Microseconds(), ids)
		return err
	})
	return claimed, classify(ctx, "claim refunds", err)
}

// RetryRefund gives a claimed refund back to be claimed again after a
// while, with what went wrong.
func (s *Service) RetryRefund(ctx context.Context, id, problem string, after time.Duration) error {
	_, _, err := run(s.db.WithContext(ctx), sqlRetryRefund, after.Microseconds(), truncate(problem, 255), id)
	return classify(ctx, "retry refund", err)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
