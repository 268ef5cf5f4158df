package stock

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"shop/internal/lock"
)

// An order placed with a payment window (Settings.PayWindow) is a
// reservation: its unit is the buyer's until pay_by, by MySQL's clock, and
// the sale's again after that unless the buyer paid. Every change of status
// is one conditional UPDATE, decided by MySQL, never a read followed by a
// write:
//
//   - reserved → paid (Receive, a payment from the provider): WHERE status
//     = 'reserved' AND pay_by > UTC_TIMESTAMP(6) and the amount owed. A
//     payment that finds no such row is late, for a cancelled order, or of
//     another amount: it is recorded as a refund owed, never dropped
//     (payments.go).
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
	// sweepRows bounds the reservations of one SKU one sweep transaction
	// returns; a sweep with more returns the rest in its next transaction.
	sweepRows = 1000
)

// errLapsedWhileLocked is a transaction that gives units back finding that
// a reservation it locked as payable lapsed before its UPDATE.
var errLapsedWhileLocked = errors.New("a locked reservation lapsed before it was ended")

// found is an order as readOrder read it, with what MySQL's clock says of
// it.
type found struct {
	Order
	// Lapsed says that the order is reserved and its payment window has
	// ended: it is expired in all but its status, which the sweep sets.
	Lapsed bool `gorm:"column:lapsed"`
}

// readOrder reads user's order id, ErrOrderNotFound when the user has none
// of that id.
func readOrder(db *gorm.DB, user, id int64) (found, error) {
	var f found
	ok, err := read(db, &f, sqlOrderOf, id, user)
	switch {
	case err != nil:
		return found{}, err
	case !ok:
		return found{}, fmt.Errorf("%w: order %d of user %d", ErrOrderNotFound, id, user)
	}
	return f, nil
}

// Order returns user's order id as MySQL has it now, read through
// Deps.Public: for a request that anyone may have sent. Errors:
// ErrInvalid, ErrOrderNotFound (also for another user's order), ErrBusy.
func (s *Service) Order(ctx context.Context, user, id int64) (Order, error) {
	f, err := s.public.order(ctx, user, id)
	return f.Order, err
}

// BuyerOrder is Order read through Deps.Lookups, the lifecycle's own
// bound, for a buyer whose identity the caller has proven and whose reads
// it bounds per buyer. Errors: as Order's.
func (s *Service) BuyerOrder(ctx context.Context, user, id int64) (Order, error) {
	f, err := s.lookups.order(ctx, user, id)
	return f.Order, err
}

// Cancel cancels user's reservation id and gives its unit back to the sale,
// as the sweep gives back a lapsed one (giveBack). Cancelling a cancelled
// order answers it again.
//
// Errors: ErrInvalid, ErrOrderNotFound (also for another user's order),
// ErrOrderPaid, ErrOrderExpired (its window ended first, also between the
// cancellation's locking read and its UPDATE: the sweep gives its unit
// back), ErrBusy (the lock was not obtained, MySQL did not answer; nothing
// changed) and ErrCancelOutcomeUnknown (the COMMIT's answer was lost, or
// the order was cancelled and then could not be read: cancelling again
// tells).
func (s *Service) Cancel(ctx context.Context, user, id int64) (Order, error) {
	f, err := s.lookups.order(ctx, user, id)
	if err != nil {
		return Order{}, err
	}
	if f.Status != StatusReserved || f.Lapsed {
		return cancelled(f)
	}
	flipped, err := s.giveBack(ctx, f.SKUID, StatusCancelled, sqlCancellable, id, user)
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
		return Order{}, fmt.Errorf("%w: order %d: %w", ErrCancelOutcomeUnknown, id, err)
	case errors.Is(err, errLapsedWhileLocked):
		// Rolled back: the order is as it was, lapsed, and the read
		// below answers so.
	case err != nil:
		return Order{}, err
	}
	if f, err = readOrder(s.reads.WithContext(ctx), user, id); err != nil {
		if flipped > 0 {
			// The cancellation committed: busy would say that nothing
			// changed. Cancelling again answers the cancelled order.
			err = fmt.Errorf("%w: order %d was cancelled, then could not be read: %w", ErrCancelOutcomeUnknown, id, err)
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

// giveBack ends reservations of sku and gives their units back to the
// sale: it sets the orders that where selects (with args) to status, at
// most sweepRows of them, and returns how many it set. It runs with an order
// slot and under the SKU's lock, as a restock does (withLease), and tells
// everyone who remembers the stock once units may have come back. In one
// transaction, it
//
//  1. locks the product's row, first, as every order transaction does, and
//     checks the lease's fencing token against it;
//  2. locks the orders to return, found just before, through the primary
//     key with the condition again (a payment of one of them waits, then finds
//     it no longer reserved; one that came first has made it paid, and it
//     is not locked);
//  3. flips them, with the same condition again, stamping returned_at;
//  4. adds back exactly as many units as rows the flip changed, with a
//     fenced write, and takes the orders off their buyers' counters;
//  5. writes each order's event, when events are on (events.go).
//
// Once it committed, the checkouts of the orders it ended are cancelled at
// the provider (Deps.Checkouts), so that they can no longer be paid.
func (s *Service) giveBack(ctx context.Context, sku int64, status, where string, args ...any) (int, error) {
	var ended []Order
	err := s.withLease(ctx, sku, func(ctx context.Context, lease *lock.Lease) error {
		// Found before the transaction, so that it has no snapshot for
		// innodb_snapshot_isolation to hold its locking reads to.
		var candidates []int64
		if _, err := read(s.db.WithContext(ctx), &candidates, withCondition(sqlFindEnding, where), append(append([]any{sku}, args...), sweepRows)...); err != nil || len(candidates) == 0 {
			return err
		}
		err := s.transaction(ctx, ErrOutcomeUnknown, lease.Key(), func(tx *gorm.DB) error {
			var err error
			ended, err = s.returnUnits(ctx, tx, s.fence(lease), sku, candidates, status, where, args)
			return err
		})
		if !mayHaveCommitted(err) {
			ended = nil // rolled back
			return err
		}
		if len(ended) > 0 {
			s.transitions(status, len(ended))
		}
		if len(ended) > 0 || err != nil {
			s.returned(ctx, sku, s.fence(lease))
		}
		return err
	})
	if err == nil {
		s.cancelCheckouts(ctx, ended)
	}
	return len(ended), err
}

// returnUnits is giveBack's transaction, on tx, under a lease whose fencing
// token is fence (0: not fenced), ending those of candidates that where
// still selects. It returns the orders it ended.
func (s *Service) returnUnits(ctx context.Context, tx *gorm.DB, fence, sku int64, candidates []int64, status, where string, args []any) ([]Order, error) {
	var p Product
	if err := readProduct(tx, &p, sqlFenceLocked, sku); err != nil {
		return nil, err
	}
	if fence > 0 && p.Fence >= fence {
		return nil, &staleFence{sku: sku, token: fence, row: p.Fence}
	}
	events, err := s.eventsOn(tx)
	if err != nil {
		return nil, err
	}
	var ends []Order
	if _, err := read(tx, &ends, withCondition(sqlLockEnding, where), append([]any{candidates, sku}, args...)...); err != nil {
		return nil, err
	}
	if len(ends) == 0 {
		return nil, nil
	}
	ids, users := make([]int64, len(ends)), make([]int64, len(ends))
	for i, o := range ends {
		ids[i], users[i] = o.ID, o.UserID
	}
	if s.hooks.BeforeEnd != nil {
		s.hooks.BeforeEnd(ctx, sku)
	}
	n, _, err := run(tx, withCondition(sqlEnd, where), append([]any{status, counted(events), ids, sku}, args...)...)
	if err != nil {
		return nil, err
	}
	if n != int64(len(ends)) {
		// The orders are locked: only MySQL's clock can have changed what
		// the condition selects, a reservation's pay_by passing between
		// the locking read and the flip. Nothing is ended: the
		// transaction rolls back, a cancellation answers what the order
		// is now (lapsed: ErrOrderExpired), and the sweep returns it.
		return nil, fmt.Errorf("%w: sku %d: %d of %d locked orders changed: %w", ErrBusy, sku, n, len(ends), errLapsedWhileLocked)
	}
	q, qargs := sqlReturnUnits, []any{len(ends), sku}
	if fence > 0 {
		q, qargs = sqlReturnUnitsFenced, []any{len(ends), fence, sku, fence}
	}
	if n, _, err := run(tx, q, qargs...); err != nil || n != 1 {
		return nil, cmp.Or(err, error(&staleFence{sku: sku, token: fence, row: p.Fence}))
	}
	if s.set.UserLimit > 0 {
		// A user holds one active order of a SKU: users has no repeats.
		if _, _, err := run(tx, sqlUncountOrders, users); err != nil {
			return nil, err
		}
	}
	if events {
		if err := orderEvents(tx, ids); err != nil {
			return nil, err
		}
	}
	if s.hooks.BeforeReturn != nil {
		s.hooks.BeforeReturn(ctx, sku)
	}
	return ends, nil
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
