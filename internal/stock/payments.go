package stock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"

	"github.com/oklog/ulid/v2"
	"gorm.io/gorm"

	"shop/internal/mysqldb"
)

// Payments come from the payment provider, never from a buyer's word: a
// signed event says that money arrived for an order (see docs/payments.md).
// Receive decides what it does in one transaction of conditional
// statements, by MySQL's clock, and keeps it in the payments ledger, one row
// per (provider, payment_id):
//
//	the order                             the payment               effect
//	reserved, before pay_by               same amount and currency  paid (applied)
//	reserved, before pay_by               another amount/currency   owed: amount_mismatch, order stays reserved
//	expired, cancelled, reserved & lapsed any                       owed: order_expired / order_cancelled
//	paid by this payment                  the same again            nothing (applied)
//	paid by another, or paid when placed  a second payment          owed: duplicate_payment
//	no such order                         any                       owed: unknown_order
//	any                                   payment_id on another order  conflict: nothing done
//
// A payment delivered again finds its ledger row and changes nothing: the
// provider is answered what the first delivery did.

// The outcomes of a payment in the ledger.
const (
	OutcomeApplied  = "applied"
	OutcomeOwed     = "owed"
	OutcomeConflict = "conflict"
)

// The reasons a payment is owed back.
const (
	RefundOrderExpired     = "order_expired"
	RefundOrderCancelled   = "order_cancelled"
	RefundAmountMismatch   = "amount_mismatch"
	RefundDuplicatePayment = "duplicate_payment"
	RefundUnknownOrder     = "unknown_order"
)

// Payment is a payment the provider reports for an order.
type Payment struct {
	// Provider is who reported it ("webhook", "stripe").
	Provider string
	// PaymentID is the provider's reference, unique per provider.
	PaymentID string
	// OrderID is the order the event names; it may not exist.
	OrderID int64
	// AmountCents and Currency are what was received, in the currency's
	// minor unit; Currency is three upper-case letters.
	AmountCents int64
	Currency    string
	// EventID is the provider's event or message id.
	EventID string
}

// Receipt is what a payment did.
type Receipt struct {
	// Outcome is OutcomeApplied, OutcomeOwed or OutcomeConflict.
	Outcome string
	// Reason and RefundID name the refund owed, with OutcomeOwed.
	Reason   string
	RefundID string
	// Again says that the payment had been received before: this delivery
	// changed nothing.
	Again bool
}

var (
	paymentIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	currencyRE  = regexp.MustCompile(`^[A-Z]{3}$`)
	providerRE  = regexp.MustCompile(`^[a-z]{1,16}$`)
	eventIDRE   = regexp.MustCompile(`^[\x20-\x7e]{1,255}$`)
)

// CheckPaymentID returns an ErrInvalid error unless id is 1–64 characters
// of [A-Za-z0-9_-].
func CheckPaymentID(id string) error {
	if !paymentIDRE.MatchString(id) {
		return invalidf("%s must be 1-64 characters of A-Z a-z 0-9 _ -", FieldPaymentID)
	}
	return nil
}

// CheckCurrency returns an ErrInvalid error unless c is three upper-case
// letters.
func CheckCurrency(c string) error {
	if !currencyRE.MatchString(c) {
		return invalidf("%s must be three upper-case letters (ISO 4217)", FieldCurrency)
	}
	return nil
}

func (p Payment) validate() error {
	switch {
	case !providerRE.MatchString(p.Provider):
		return invalidf("%s must be 1-16 lower-case letters", FieldProvider)
	case p.OrderID <= 0:
		return invalidf("%s must be a positive integer", FieldOrder)
	case p.AmountCents <= 0:
		return invalidf("%s must be a positive integer", FieldAmount)
	case !eventIDRE.MatchString(p.EventID):
		return invalidf("%s must be 1-255 printable ASCII characters", FieldEventID)
	}
	if err := CheckPaymentID(p.PaymentID); err != nil {
		return err
	}
	return CheckCurrency(p.Currency)
}

// Receive records payment p and applies it as the table above says, in one
// transaction, and returns what it did. It takes an order slot, as an
// order does, and reaches the order by its primary key. A deadlock (the
// order's row taken by a cancellation or the sweep in another order) is
// retried once.
//
// Errors: ErrInvalid (nothing written), ErrBusy (MySQL did not answer or
// refused work for now, and nothing was recorded; or the COMMIT's answer
// was lost). After ErrBusy the same payment again is safe: it is recorded
// once.
func (s *Service) Receive(ctx context.Context, p Payment) (Receipt, error) {
	if err := p.validate(); err != nil {
		return Receipt{}, err
	}
	release, err := s.slot(ctx, 0)
	if err != nil {
		return Receipt{}, err
	}
	defer release()
	var r Receipt
	for attempt := 0; ; attempt++ {
		r, err = s.receive(ctx, p)
		if attempt > 0 || !mysqldb.Deadlock(err) {
			break
		}
	}
	if err != nil {
		return Receipt{}, classify(ctx, "receive payment", err)
	}
	if !r.Again {
		switch r.Outcome {
		case OutcomeApplied:
			s.transitions(StatusPaid, 1)
		case OutcomeOwed:
			s.transitions("refund_owed", 1)
		}
	}
	return r, nil
}

// receive is Receive's transaction.
func (s *Service) receive(ctx context.Context, p Payment) (Receipt, error) {
	var r Receipt
	// A COMMIT whose answer was lost is answered busy: the provider sends
	// the event again, and the ledger makes that safe.
	err := s.transaction(ctx, ErrBusy, "payment "+p.PaymentID, func(tx *gorm.DB) error {
		// The ledger's row first: a delivery that finds it there already
		// waits for the one that wrote it, then changes nothing.
		n, _, err := run(tx, sqlRecordPayment, p.Provider, p.PaymentID, p.OrderID, p.AmountCents, p.Currency, p.EventID)
		if err != nil {
			return err
		}
		if n == 0 {
			r, err = s.received(tx, p)
			return err
		}
		events, err := s.eventsOn(tx)
		if err != nil {
			return err
		}
		if r, err = s.apply(tx, p, events); err != nil {
			return err
		}
		if r.Outcome != OutcomeApplied {
			_, _, err = run(tx, sqlSetOutcome, r.Outcome, p.Provider, p.PaymentID)
		}
		return err
	})
	return r, err
}

// received is the answer to a payment delivered again: what its first
// delivery did, from the ledger.
func (s *Service) received(tx *gorm.DB, p Payment) (Receipt, error) {
	var led struct {
		OrderID     int64  `gorm:"column:order_id"`
		AmountCents int64  `gorm:"column:amount_cents"`
		Currency    string `gorm:"column:currency"`
		Outcome     string `gorm:"column:outcome"`
	}
	if ok, err := read(tx, &led, sqlPaymentOf, p.Provider, p.PaymentID); err != nil || !ok {
		return Receipt{}, errors.Join(err, fmt.Errorf("%w: payment %s: in the ledger, then not", ErrBusy, p.PaymentID))
	}
	if led.OrderID != p.OrderID || led.AmountCents != p.AmountCents || led.Currency != p.Currency {
		s.log.WarnContext(tx.Statement.Context, "payment delivered again with other details: the first delivery stands",
			"provider", p.Provider, "payment_id", p.PaymentID, "order_id", led.OrderID, "event_order_id", p.OrderID)
	}
	r := Receipt{Outcome: led.Outcome, Again: true}
	if led.Outcome == OutcomeOwed {
		var ref Refund
		if _, err := read(tx, &ref, sqlRefundOfPayment, p.Provider, p.PaymentID); err != nil {
			return Receipt{}, err
		}
		r.Reason, r.RefundID = ref.Reason, ref.RefundID
	}
	return r, nil
}

// apply decides what a payment received for the first time does to its
// order, and does it, writing its event when events are on.
func (s *Service) apply(tx *gorm.DB, p Payment, events bool) (Receipt, error) {
	n, _, err := run(tx, sqlApplyPayment, p.PaymentID, counted(events), p.OrderID, p.AmountCents, p.Currency)
	switch {
	case mysqldb.Duplicate(err):
		// The payment id pays another order: from before the ledger.
		return s.conflict(tx, p, 0, events)
	case err != nil:
		return Receipt{}, err
	case n == 1 && events:
		return Receipt{Outcome: OutcomeApplied}, orderEvents(tx, []int64{p.OrderID})
	case n == 1:
		return Receipt{Outcome: OutcomeApplied}, nil
	}
	// The order was not payable with this payment: why, as MySQL has it
	// now, with the row locked until COMMIT.
	var f found
	ok, err := read(tx, &f, sqlLockOrder, p.OrderID)
	if err != nil {
		return Receipt{}, err
	}
	if !ok {
		s.log.WarnContext(tx.Statement.Context, "payment for an order that does not exist: owed back",
			"provider", p.Provider, "payment_id", p.PaymentID, "order_id", p.OrderID)
		return s.owe(tx, p, nil, RefundUnknownOrder, events)
	}
	if f.PaymentID != nil && *f.PaymentID == p.PaymentID {
		// Paid by this payment before the ledger kept payments.
		return Receipt{Outcome: OutcomeApplied}, nil
	}
	var other int64
	if ok, err := read(tx, &other, sqlOrderOfPayment, p.PaymentID); err != nil {
		return Receipt{}, err
	} else if ok {
		return s.conflict(tx, p, other, events)
	}
	switch {
	case f.Status == StatusPaid:
		return s.owe(tx, p, &f.Order, RefundDuplicatePayment, events)
	case f.Status == StatusCancelled:
		return s.owe(tx, p, &f.Order, RefundOrderCancelled, events)
	case f.Status == StatusExpired || f.Lapsed:
		return s.owe(tx, p, &f.Order, RefundOrderExpired, events)
	case f.AmountCents == nil || *f.AmountCents != p.AmountCents || f.Currency == nil || *f.Currency != p.Currency:
		return s.owe(tx, p, &f.Order, RefundAmountMismatch, events)
	}
	// Reserved, payable, the right amount, and yet the UPDATE found it
	// otherwise: only a clock that went back does that. Nothing is kept.
	return Receipt{}, fmt.Errorf("%w: order %d: reserved and payable, but not paid", ErrBusy, p.OrderID)
}

// conflict is the answer to a payment whose id already pays another order
// (other, when known): nothing is done but the ledger's row, and its event
// for finance when events are on.
func (s *Service) conflict(tx *gorm.DB, p Payment, other int64, events bool) (Receipt, error) {
	s.log.ErrorContext(tx.Statement.Context, "payment id already applied to another order: recorded as a conflict, nothing done",
		"provider", p.Provider, "payment_id", p.PaymentID, "order_id", p.OrderID, "other_order_id", other)
	if events {
		if err := conflictEvent(tx, p, other); err != nil {
			return Receipt{}, err
		}
	}
	return Receipt{Outcome: OutcomeConflict}, nil
}

// owe records p as a refund owed for reason, with its event when events
// are on; o is its order, nil when there is none.
func (s *Service) owe(tx *gorm.DB, p Payment, o *Order, reason string, events bool) (Receipt, error) {
	id := NewRefundID()
	var user, sku *int64
	if o != nil {
		user, sku = &o.UserID, &o.SKUID
	}
	if _, _, err := run(tx, sqlOweRefund, id, p.Provider, p.PaymentID, p.OrderID, user, sku, reason,
		p.AmountCents, p.Currency, 0); err != nil {
		return Receipt{}, fmt.Errorf("record a refund owed for order %d: %w", p.OrderID, err)
	}
	if events {
		if err := refundEvent(tx, EventRefundOwed, Refund{RefundID: id, OrderID: p.OrderID, UserID: user}); err != nil {
			return Receipt{}, err
		}
	}
	return Receipt{Outcome: OutcomeOwed, Reason: reason, RefundID: id}, nil
}

// NewRefundID returns a new refund id: a ULID, which sorts by time.
func NewRefundID() string { return ulid.MustNew(ulid.Now(), rand.Reader).String() }
