package stock

import (
	"context"
	"fmt"
	"time"
)

// Checkouts is the payment provider's side of a checkout: a payment the
// buyer can make for an order (Stripe's PaymentIntent), and its
// cancellation once the order can no longer be paid.
type Checkouts interface {
	// Create creates a payment of o's amount, in its currency, that names
	// o, sending key as the provider's idempotency key.
	Create(ctx context.Context, o Order, key string) (Checkout, error)
	// Cancel cancels the payment intent so that it can no longer be paid.
	Cancel(ctx context.Context, intent string) error
}

// Checkout is a payment the buyer can make for an order.
type Checkout struct {
	OrderID       int64
	PaymentIntent string
	ClientSecret  string
	AmountCents   int64
	Currency      string
}

// cancelTimeout bounds the cancellation of one order's checkout.
const cancelTimeout = 10 * time.Second

// Checkout returns the checkout of user's reservation id, creating it at
// the provider on the first call. An order has at most one: it is stored
// with a conditional UPDATE (payment_intent IS NULL), and a later or
// concurrent call answers the stored one. The provider's idempotency key
// is a random value stored on the order before the first call.
//
// Errors: ErrInvalid, ErrOrderNotFound (also another user's order),
// ErrOrderNotPayable (not reserved, or past pay_by), ErrBusy (the provider
// or MySQL failed; nothing the buyer can pay was kept).
func (s *Service) Checkout(ctx context.Context, user, id int64) (Checkout, error) {
	if s.checkouts == nil {
		return Checkout{}, fmt.Errorf("%w: no checkout provider", ErrBusy)
	}
	f, err := s.lookups.order(ctx, user, id)
	if err != nil {
		return Checkout{}, err
	}
	if c, ok := storedCheckout(f.Order); ok {
		return c, nil
	}
	if f.Status != StatusReserved || f.Lapsed || f.AmountCents == nil || f.Currency == nil {
		return Checkout{}, fmt.Errorf("%w: order %d is %s", ErrOrderNotPayable, id, f.Status)
	}
	key, err := s.checkoutKey(ctx, f.Order)
	if err != nil {
		return Checkout{}, classify(ctx, "checkout", err)
	}
	c, err := s.checkouts.Create(ctx, f.Order, key)
	if err != nil {
		return Checkout{}, fmt.Errorf("%w: order %d: create the payment: %w", ErrBusy, id, err)
	}
	n, _, err := run(s.db.WithContext(ctx), sqlStoreCheckout, c.PaymentIntent, c.ClientSecret, id, user)
	if err != nil {
		return Checkout{}, classify(ctx, "checkout", err)
	}
	if n == 1 {
		return c, nil
	}
	// Another checkout stored its payment first, or the order stopped
	// being payable meanwhile.
	f, err = readOrder(s.reads.WithContext(ctx), user, id)
	if err != nil {
		return Checkout{}, classify(ctx, "checkout", err)
	}
	if stored, ok := storedCheckout(f.Order); ok {
		if stored.PaymentIntent != c.PaymentIntent {
			s.cancelCheckouts(ctx, []Order{{ID: id, PaymentIntent: &c.PaymentIntent}})
		}
		return stored, nil
	}
	s.cancelCheckouts(ctx, []Order{{ID: id, PaymentIntent: &c.PaymentIntent}})
	return Checkout{}, fmt.Errorf("%w: order %d is %s", ErrOrderNotPayable, id, f.Status)
}

// storedCheckout is o's checkout, if it has one.
func storedCheckout(o Order) (Checkout, bool) {
	if o.PaymentIntent == nil || o.ClientSecret == nil || o.AmountCents == nil || o.Currency == nil {
		return Checkout{}, false
	}
	return Checkout{OrderID: o.ID, PaymentIntent: *o.PaymentIntent, ClientSecret: *o.ClientSecret,
		AmountCents: *o.AmountCents, Currency: *o.Currency}, true
}

// checkoutKey returns o's idempotency key towards the provider, storing a
// new one first if it has none: a ULID, random as a refund id is, made by
// NewRefundID.
func (s *Service) checkoutKey(ctx context.Context, o Order) (string, error) {
	if o.CheckoutKey != nil {
		return *o.CheckoutKey, nil
	}
	db := s.db.WithContext(ctx)
	if _, _, err := run(db, sqlSetCheckoutKey, NewRefundID(), o.ID); err != nil {
		return "", err
	}
	var key string
	if _, err := read(db, &key, sqlCheckoutKey, o.ID); err != nil {
		return "", err
	}
	return key, nil
}

// cancelCheckouts cancels the checkouts of orders that ended, once their
// end committed, so that a lapsed reservation can no longer be paid. A
// failure is logged: a payment that still comes is owed back.
func (s *Service) cancelCheckouts(ctx context.Context, ended []Order) {
	if s.checkouts == nil {
		return
	}
	for _, o := range ended {
		if o.PaymentIntent == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		if err := s.checkouts.Cancel(cctx, *o.PaymentIntent); err != nil {
			s.log.WarnContext(ctx, "cancel the checkout of an ended order", "order_id", o.ID,
				"payment_intent", *o.PaymentIntent, "err", err)
		}
		cancel()
	}
}
