package stock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"shop/internal/lock"
)

// An order placed with a payment window (Options.PayWindow) is a
// reservation: its unit is the buyer's until pay_by, by MySQL's clock, and
// the sale's again after that unless the buyer paid. Every change of status
// is one conditional UPDATE, decided by MySQL, never a read followed by a
// write:
//
//   - reserved → paid (Pay): WHERE status = 'reserved' AND pay_by >
//     UTC_TIMESTAMP(6). A payment that finds no such row is late, or for a
//     cancelled order: it is recorded as a refund owed, never dropped.
//   - reserved → cancelled (Cancel): the same condition, so that a
//     cancellation and a payment cannot both win;
//   - reserved → expired (the sweep): WHERE status = 'reserved' AND pay_by
//     <= UTC_TIMESTAMP(6), the exact complement of a payment's condition.
//
// A cancellation and the sweep give the unit back (giveBack): under the
// SKU's lock, as an order or a restock writes the stock, in one transaction
// that flips the orders, stamps their returned_at, and adds back exactly as
// many units as rows it flipped, with a fenced write. The transaction
// commits both or neither, so a unit goes back exactly once, whichever
// process is killed when: two replicas that find the same lapsed
// reservations take the lock in turn, and the second finds none left.

const (
	// lapsed selects the reservations whose payment window has ended.
	lapsed = "status = 'reserved' AND pay_by <= UTC_TIMESTAMP(6)"
	// payable selects the reservations that may still be paid or cancelled.
	payable = "status = 'reserved' AND pay_by > UTC_TIMESTAMP(6)"
)

const (
	// sweepRows bounds the reservations of one SKU one sweep transaction
	// returns; a sweep with more returns the rest in its next transaction.
	sweepRows = 1000
	// sweepSKUs bounds the SKUs one sweep looks at.
	sweepSKUs = 100
)

var paymentIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// CheckPaymentID returns an ErrInvalid error unless id is 1–64 characters
// of [A-Za-z0-9_-].
func CheckPaymentID(id string) error {
	if !paymentIDRE.MatchString(id) {
		return invalidf("%s must be 1-64 characters of A-Z a-z 0-9 _ -", FieldPaymentID)
	}
	return nil
}

// found is an order as lookUp read it, with what MySQL's clock says of it.
type found struct {
	Order
	// Lapsed says that the order is reserved and its payment window has
	// ended: it is expired in all but its status, which the sweep sets.
	Lapsed bool `gorm:"column:lapsed"`
}

// lookUp reads user's order id, ErrOrderNotFound when the user has none of
// that id.
func lookUp(db *gorm.DB, user, id int64) (found, error) {
	var f found
	res := db.Raw("SELECT *, ("+lapsed+") AS lapsed FROM orders WHERE id = ? AND user_id = ?", id, user).Scan(&f)
	switch {
	case res.Error != nil:
		return found{}, res.Error
	case res.RowsAffected == 0:
		return found{}, fmt.Errorf("%w: order %d of user %d", ErrOrderNotFound, id, user)
	}
	return f, nil
}

// Order returns user's order id as MySQL has it now. Errors: ErrInvalid,
// ErrOrderNotFound (also for another user's order), ErrBusy.
func (s *Service) Order(ctx context.Context, user, id int64) (Order, error) {
	f, err := s.lookUp(ctx, user, id)
	return f.Order, err
}

// lookUp reads user's order id for a buyer's request, through
// Options.Public. Errors: ErrInvalid, ErrOrderNotFound, ErrBusy.
func (s *Service) lookUp(ctx context.Context, user, id int64) (found, error) {
	return s.opt.Public.lookUp(ctx, user, id)
}

// Pay pays user's reservation id with paymentID, the payment provider's
// reference, and returns the paid order.
//
// The payment wins if and only if one conditional UPDATE finds the order
// reserved and its payment window open, by MySQL's clock. The same payment
// again is answered with the paid order. A payment that comes after the
// window ended, or after the buyer cancelled, is recorded as a refund owed
// (Refunds) before it is refused; a payment delivered again is the same
// refund.
//
// Errors: ErrInvalid, ErrOrderNotFound (also for another user's order),
// ErrOrderExpired and ErrOrderCancelled (a refund is owed),
// ErrPaymentMismatch (another payment paid the order, or it was paid when
// placed), ErrBusy (MySQL did not answer, and the payment may or may not
// have been applied: the same payment again is safe, and tells).
func (s *Service) Pay(ctx context.Context, user, id int64, paymentID string) (Order, error) {
	if err := validateOrderOf(user, id); err != nil {
		return Order{}, err
	}
	if err := CheckPaymentID(paymentID); err != nil {
		return Order{}, err
	}
	// A payment for an order that is not there is answered before it
	// takes a slot of the order path.
	if _, err := s.lookUp(ctx, user, id); err != nil {
		return Order{}, err
	}
	release, err := s.slot(ctx, 0)
	if err != nil {
		return Order{}, err
	}
	defer release()
	o, err := s.pay(s.db.WithContext(ctx), user, id, paymentID)
	return o, classify(ctx, "pay order", err)
}

func (s *Service) pay(db *gorm.DB, user, id int64, paymentID string) (Order, error) {
	res := db.Exec("UPDATE orders SET status = 'paid', payment_id = ?, paid_at = UTC_TIMESTAMP(6) WHERE id = ? AND user_id = ? AND "+payable,
		paymentID, id, user)
	if res.Error != nil {
		return Order{}, res.Error
	}
	paid := res.RowsAffected == 1
	f, err := lookUp(db, user, id)
	if err != nil {
		if paid {
			return Order{}, fmt.Errorf("%w: order %d was paid, then could not be read: %w", ErrBusy, id, err)
		}
		return Order{}, err
	}
	if paid {
		s.transitions(StatusPaid, 1)
	}
	switch {
	case f.Status == StatusPaid && f.PaymentID != nil && *f.PaymentID == paymentID:
		return f.Order, nil
	case f.Status == StatusPaid:
		return Order{}, fmt.Errorf("%w: order %d", ErrPaymentMismatch, id)
	case f.Status == StatusCancelled:
		return Order{}, s.oweRefund(db, f.Order, paymentID, RefundOrderCancelled, ErrOrderCancelled)
	case f.Status == StatusExpired || f.Lapsed:
		return Order{}, s.oweRefund(db, f.Order, paymentID, RefundOrderExpired, ErrOrderExpired)
	}
	// Reserved, its window open, and yet the UPDATE found it otherwise: it
	// can only be a clock that went back. Nothing changed.
	return Order{}, fmt.Errorf("%w: order %d: reserved and payable, but not paid", ErrBusy, id)
}

// oweRefund records paymentID, which came for o after it had ended for
// reason, as a refund owed, and returns refused, the payment's answer. A
// payment recorded before is left as it was.
func (s *Service) oweRefund(db *gorm.DB, o Order, paymentID, reason string, refused error) error {
	res := db.Exec("INSERT IGNORE INTO refunds (order_id, payment_id, user_id, sku_id, reason, received_at) VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))",
		o.ID, paymentID, o.UserID, o.SKUID, reason)
	if res.Error != nil {
		return fmt.Errorf("record a refund owed for order %d: %w", o.ID, res.Error)
	}
	if res.RowsAffected == 1 {
		s.transitions("refund_owed", 1)
	}
	return fmt.Errorf("%w: order %d: the payment is owed back", refused, o.ID)
}

// Cancel cancels user's reservation id and gives its unit back to the sale,
// as the sweep gives back a lapsed one (giveBack). Cancelling a cancelled
// order answers it again.
//
// Errors: ErrInvalid, ErrOrderNotFound (also for another user's order),
// ErrOrderPaid, ErrOrderExpired (its window ended first: the sweep gives
// its unit back), ErrBusy (the lock was not obtained, MySQL did not
// answer; nothing changed) and ErrCancelOutcomeUnknown (the COMMIT's
// answer was lost: cancelling again tells).
func (s *Service) Cancel(ctx context.Context, user, id int64) (Order, error) {
	f, err := s.lookUp(ctx, user, id)
	if err != nil {
		return Order{}, err
	}
	if f.Status != StatusReserved || f.Lapsed {
		return cancelled(f)
	}
	sku := f.SKUID
	flipped, err := s.withSKU(ctx, sku, func(ctx context.Context, lease *lock.Lease) (int, error) {
		return s.giveBack(ctx, lease, sku, StatusCancelled, "id = ? AND user_id = ? AND "+payable, id, user)
	})
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
		return Order{}, fmt.Errorf("%w: order %d: %w", ErrCancelOutcomeUnknown, id, err)
	case err != nil:
		return Order{}, err
	}
	if f, err = lookUp(s.reads.WithContext(ctx), user, id); err != nil {
		if flipped > 0 {
			err = fmt.Errorf("%w: order %d was cancelled, then could not be read: %w", ErrBusy, id, err)
		}
		return Order{}, classify(ctx, "cancel order", err)
	}
	return cancelled(f)
}

// cancelled is a cancellation's answer for f as it is now.
func cancelled(f found) (Order, error) {
	switch {
	case f.Status == StatusCancelled:
		return f.Order, nil
	case f.Status == StatusPaid:
		return Order{}, fmt.Errorf("%w: order %d", ErrOrderPaid, f.ID)
	case f.Status == StatusExpired || f.Lapsed:
		return Order{}, fmt.Errorf("%w: order %d", ErrOrderExpired, f.ID)
	}
	return Order{}, fmt.Errorf("%w: order %d is still reserved", ErrBusy, f.ID)
}

// Sweep gives back the units of every lapsed reservation, SKU by SKU,
// each in a transaction of its own under the SKU's lock (giveBack), and
// returns how many it gave back. Every replica sweeps: two that find the
// same reservations take the SKU's lock in turn, and the second finds none.
// A SKU that fails is left to the next sweep, and its error returned with
// the others'.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	var skus []int64
	err := s.reads.WithContext(ctx).Raw("SELECT DISTINCT sku_id FROM orders WHERE "+lapsed+" LIMIT ?", sweepSKUs).Scan(&skus).Error
	if err != nil {
		return 0, classify(ctx, "sweep", err)
	}
	total := 0
	var errs []error
	for _, sku := range skus {
		n, err := s.withSKU(ctx, sku, func(ctx context.Context, lease *lock.Lease) (int, error) {
			return s.giveBack(ctx, lease, sku, StatusExpired, lapsed)
		})
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("sku %d: %w", sku, err))
		}
	}
	return total, errors.Join(errs...)
}

// RunSweeper sweeps (Sweep) every interval, give or take a fifth, at
// random, so that replicas started together do not sweep in step, until
// ctx ends. Failures are logged: the next sweep tries again.
func (s *Service) RunSweeper(ctx context.Context, interval time.Duration) {
	for {
		d := time.Duration(float64(interval) * (0.8 + 0.4*rand.Float64()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		sctx, cancel := context.WithTimeout(ctx, TurnTimeout)
		n, err := s.Sweep(sctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.opt.Logger.WarnContext(ctx, "sweep lapsed reservations", "returned", n, "err", err)
		} else if n > 0 {
			s.opt.Logger.InfoContext(ctx, "swept lapsed reservations", "returned", n)
		}
	}
}

// withSKU runs fn, which writes sku's stock, with an order slot and under
// the SKU's lock, as a restock does, and tells everyone who remembers the
// stock once fn may have given units back. It returns what fn returned.
func (s *Service) withSKU(ctx context.Context, sku int64, fn func(ctx context.Context, lease *lock.Lease) (int, error)) (int, error) {
	release, err := s.slot(ctx, sku)
	if err != nil {
		return 0, err
	}
	defer release()
	lease, err := s.locks.Obtain(ctx, LockKey(sku))
	if err != nil {
		return 0, fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, err)
	}
	defer s.release(ctx, lease)
	n, err := fn(lease.Context(), lease)
	if n > 0 || errors.Is(err, ErrOutcomeUnknown) {
		var fence int64
		if s.opt.Fencing {
			fence = lease.Fence()
		}
		s.returned(ctx, sku, fence)
	}
	if err != nil {
		s.repairFence(ctx, err)
		return n, classifyTx(lease.Context(), err)
	}
	return n, nil
}

// returned tells this Service, the other replicas (Options.Returned) and
// the cache that sku's stock went up under the hold with fencing token
// fence (0: none).
func (s *Service) returned(ctx context.Context, sku, fence int64) {
	s.Raised(sku, fence)
	if s.opt.Returned != nil {
		s.opt.Returned(ctx, sku, fence)
	}
	s.invalidate(ctx, sku)
}

// giveBack is the transaction that ends reservations of sku and gives their
// units back to the sale, under lease: it sets the orders that where
// selects (with args) to status, at most sweepRows of them, and returns how
// many it set. In one transaction, it
//
//  1. locks the product's row, first, as every order transaction does, and
//     checks the lease's fencing token against it;
//  2. locks the orders to return (a locking read: a payment of one of them
//     waits, then finds it no longer reserved; one that came first has
//     made it paid, and it is not selected);
//  3. flips them, with the same condition again, stamping returned_at;
//  4. adds back exactly as many units as rows the flip changed, with a
//     fenced write, and takes the orders off their buyers' counters.
func (s *Service) giveBack(ctx context.Context, lease *lock.Lease, sku int64, status, where string, args ...any) (int, error) {
	fence := lease.Fence()
	fenced := s.opt.Fencing && fence > 0
	flipped := 0
	err := s.transaction(ctx, ErrOutcomeUnknown, lease.Key(), func(tx *gorm.DB) error {
		flipped = 0
		var p Product
		if err := tx.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).Select("id", "fence").Take(&p, sku).Error; err != nil {
			return notFound(err, sku)
		}
		if fenced && p.Fence >= fence {
			return &staleFence{sku: sku, token: fence, row: p.Fence}
		}
		var ends []Order
		sel := "SELECT id, user_id FROM orders WHERE sku_id = ? AND " + where + " ORDER BY id LIMIT ? FOR UPDATE"
		if err := tx.Raw(sel, append(append([]any{sku}, args...), sweepRows)...).Scan(&ends).Error; err != nil {
			return err
		}
		if len(ends) == 0 {
			return nil
		}
		ids, users := make([]int64, len(ends)), make([]int64, len(ends))
		for i, o := range ends {
			ids[i], users[i] = o.ID, o.UserID
		}
		res := tx.Exec("UPDATE orders SET status = ?, returned_at = UTC_TIMESTAMP(6) WHERE id IN ? AND sku_id = ? AND "+where,
			append([]any{status, ids, sku}, args...)...)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != int64(len(ends)) {
			return fmt.Errorf("%w: sku %d: %d of %d locked orders changed", ErrBusy, sku, res.RowsAffected, len(ends))
		}
		n := len(ends)
		set, setArgs := "stock = stock + ?", []any{n}
		cond, condArgs := " WHERE id = ?", []any{sku}
		if fenced {
			set, setArgs = set+", fence = ?", append(setArgs, fence)
			cond, condArgs = cond+" AND fence < ?", append(condArgs, fence)
		}
		res = tx.Exec("UPDATE products SET "+set+cond, append(setArgs, condArgs...)...)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != 1 {
			return &staleFence{sku: sku, token: fence, row: p.Fence}
		}
		if s.opt.UserLimit > 0 {
			// A user holds one active order of a SKU: users has no repeats.
			err := tx.Exec("UPDATE user_orders FORCE INDEX (PRIMARY) SET orders = orders - 1 WHERE user_id IN ? AND orders > 0", users).Error
			if err != nil {
				return err
			}
		}
		if s.opt.BeforeReturn != nil {
			s.opt.BeforeReturn(ctx, sku)
		}
		flipped = n
		return nil
	})
	if err != nil && !errors.Is(err, ErrOutcomeUnknown) {
		return 0, err
	}
	if flipped > 0 {
		s.transitions(status, flipped)
	}
	return flipped, err
}

// transitions counts n orders that went to status (or refunds owed).
func (s *Service) transitions(status string, n int) {
	if s.opt.Transitions != nil {
		s.opt.Transitions(status, n)
	}
}

func validateOrderOf(user, id int64) error {
	switch {
	case id <= 0:
		return invalidf("%s must be a positive integer", FieldOrder)
	case user <= 0:
		return invalidf("%s must be a positive integer", FieldUser)
	}
	return nil
}
