package stripepay

import (
	"context"
	"errors"
	"fmt"

	"github.com/stripe/stripe-go/v82"
)

// RefundRequest is one refund owed: what was received for a payment, to be
// paid back on its PaymentIntent.
type RefundRequest struct {
	// RefundID is the refund's own id: the Idempotency-Key and
	// metadata.refund_id, by which the refund.* events name it.
	RefundID      string
	PaymentIntent string
	AmountCents   int64
}

// Settled is the Refund object Stripe answered with.
type Settled struct {
	ProviderRefundID string
	// Status is the Refund's: succeeded, pending or requires_action (on its
	// way), failed or canceled.
	Status string
	// Listed says that the refund was found among the PaymentIntent's
	// refunds after Stripe answered charge_already_refunded.
	Listed bool
}

// Refund asks Stripe to pay r back: POST /v1/refunds with the
// PaymentIntent, the amount and metadata.refund_id, under
// Idempotency-Key: r.RefundID, so that a call repeated within Stripe's 24
// hours — after a crash between the call and its record, or an answer
// that was lost — returns the first call's Refund rather than making a
// second.
//
// After 24 hours Stripe has forgotten the key, and a repeated call is a
// new refund of a payment that was refunded already: Stripe answers
// charge_already_refunded. Refund then lists the PaymentIntent's refunds
// and returns the one whose metadata.refund_id is r's, unless it failed or
// was cancelled. Failing that it returns one that succeeded: the money is
// back with the buyer, by another refund of the same payment (one made in
// Stripe's Dashboard, say), and a payment has at most one refund owed, so
// recording that one cannot leave money owed. When the refunds are all
// still pending the error is retryable (KindPending); when there is none
// to record it is permanent.
func (c *Client) Refund(ctx context.Context, r RefundRequest) (Settled, error) {
	op := "refund " + r.RefundID
	switch {
	case r.RefundID == "" || len(r.RefundID) > 255:
		return Settled{}, invalid(op, "the refund id must be 1 to 255 bytes")
	case r.PaymentIntent == "":
		return Settled{}, invalid(op, "no payment intent")
	case r.AmountCents <= 0:
		return Settled{}, invalid(op, "amount %d is not positive", r.AmountCents)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	p := &stripe.RefundCreateParams{
		PaymentIntent: stripe.String(r.PaymentIntent),
		Amount:        stripe.Int64(r.AmountCents),
	}
	p.AddMetadata("refund_id", r.RefundID)
	p.SetIdempotencyKey(r.RefundID)
	re, err := c.sc.V1Refunds.Create(ctx, p)
	var se *stripe.Error
	if errors.As(err, &se) && se.Code == stripe.ErrorCodeChargeAlreadyRefunded {
		return c.findRefund(ctx, r)
	}
	if err != nil {
		return Settled{}, classify(op, err)
	}
	return Settled{ProviderRefundID: re.ID, Status: string(re.Status)}, nil
}

// findRefund is Refund's answer to charge_already_refunded.
func (c *Client) findRefund(ctx context.Context, r RefundRequest) (Settled, error) {
	op := fmt.Sprintf("refund %s: list the refunds of %s", r.RefundID, r.PaymentIntent)
	lp := &stripe.RefundListParams{PaymentIntent: stripe.String(r.PaymentIntent)}
	lp.Limit = stripe.Int64(100)
	var succeeded, pending *stripe.Refund
	for re, err := range c.sc.V1Refunds.List(ctx, lp) {
		if err != nil {
			return Settled{}, classify(op, err)
		}
		live := re.Status != stripe.RefundStatusFailed && re.Status != stripe.RefundStatusCanceled
		switch {
		case live && re.Metadata["refund_id"] == r.RefundID:
			return Settled{ProviderRefundID: re.ID, Status: string(re.Status), Listed: true}, nil
		case re.Status == stripe.RefundStatusSucceeded && succeeded == nil:
			succeeded = re
		case live && pending == nil:
			pending = re
		}
	}
	switch {
	case succeeded != nil:
		return Settled{ProviderRefundID: succeeded.ID, Status: string(succeeded.Status), Listed: true}, nil
	case pending != nil:
		return Settled{}, &Error{Op: op, Kind: KindPending, Retryable: true,
			Err: fmt.Errorf("charge_already_refunded, and refund %s is %s", pending.ID, pending.Status)}
	}
	return Settled{}, &Error{Op: op, Kind: KindInvalid,
		Err: errors.New("charge_already_refunded, and no refund of it succeeded or is pending")}
}
