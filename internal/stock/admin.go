package stock

import (
	"context"
	"fmt"
	"math"
	"time"

	"gorm.io/gorm"

	"shop/internal/lock"
)

// MaxAddStock is the most units one change may add to a product.
const MaxAddStock = 1_000_000_000

// Bound is a change to one side of a sale window.
type Bound struct {
	// Set says that the side changes; unset, At is ignored.
	Set bool
	// At is the side's new value; nil opens that side.
	At *time.Time
}

// Change is what ChangeProduct changes of a product: what it leaves unset
// stays as it is.
type Change struct {
	SaleStartsAt Bound
	SaleEndsAt   Bound
	// AddStock, when set, raises both initial_stock and stock by that many
	// units, 1 to MaxAddStock.
	AddStock *int
	// PriceCents, when set, is the product's new price, 1 to MaxPrice, in
	// its currency's minor unit. Reservations placed before keep what
	// they owe.
	PriceCents *int64
}

// MaxPrice is the highest price a product may have.
const MaxPrice = 1_000_000_000_000

// validate refuses a change that changes nothing or adds a number of units
// out of range.
func (c Change) validate() error {
	switch {
	case !c.SaleStartsAt.Set && !c.SaleEndsAt.Set && c.AddStock == nil && c.PriceCents == nil:
		return invalidf("give at least one of %s, %s, %s, %s", FieldSaleStartsAt, FieldSaleEndsAt, FieldAddStock, FieldPrice)
	case c.PriceCents != nil && (*c.PriceCents < 1 || *c.PriceCents > MaxPrice):
		return invalidf("%s must be an integer between 1 and %d", FieldPrice, MaxPrice)
	case c.AddStock != nil && (*c.AddStock < 1 || *c.AddStock > MaxAddStock):
		return invalidf("%s must be an integer between 1 and %d", FieldAddStock, MaxAddStock)
	}
	return nil
}

// apply returns p's window with c's bounds put in, normalised (see
// Window.Normalize).
func (c Change) apply(p Product) (Window, error) {
	w := p.window()
	if c.SaleStartsAt.Set {
		w.StartsAt = c.SaleStartsAt.At
	}
	if c.SaleEndsAt.Set {
		w.EndsAt = c.SaleEndsAt.At
	}
	return w.Normalize()
}

// ChangeProduct changes product sku's sale window and restocks it, and
// returns the product as MySQL has it after the change.
//
// A restock (AddStock) is a write to the stock like an order's: it takes the
// SKU's lock through the Locker the orders use, and in one transaction reads
// the row with a lock, then raises initial_stock and stock by the same n in
// one UPDATE — fenced with the lease's token as an order's write is, so a
// holder whose lease ran out can write neither before nor after it — which
// keeps initial_stock == stock + orders true at every commit. Once
// committed, this Service forgets that the product was sold out and, still
// under the lease, announces the restock with the lease's fencing token
// (Deps.Announcer), as a return of units is: a finding that the product
// sold out made under an older token, heard after it, is not believed. A
// failure to tell the fleet does not undo the change; it is logged. A
// restock whose outcome is unknown is announced all the same: forgetting
// only makes a replica ask MySQL, which is harmless if nothing changed,
// where remembering would refuse the new units, if they are there, until
// the memory lapses.
//
// A change of the window alone takes no lock: orders re-check the window in
// their own transaction, against the row as MySQL has it then. It is a
// locking read and an UPDATE, so it waits for order transactions under way
// on the row, and orders that arrive once it committed are judged by it.
//
// Errors: ErrInvalid (nothing to change, add_stock out of range, a bound
// outside MySQL's range, a window whose start is not before its end after
// the change, a stock that would not fit), ErrNotFound, ErrBusy (the lock
// not obtained or lost, MySQL not answering; joined with ErrStaleFence when
// MySQL refused this holder's write), ErrChangeOutcomeUnknown (the
// connection was lost after COMMIT was sent: the change may or may not
// have been made). Nothing is written on any other error.
func (s *Service) ChangeProduct(ctx context.Context, sku int64, c Change) (Product, error) {
	if err := validateID(sku); err != nil {
		return Product{}, err
	}
	if err := c.validate(); err != nil {
		return Product{}, err
	}
	if c.AddStock == nil {
		// A slot, as an order transaction takes, so that a change holding
		// the row never waits for a connection of the pool it shares with
		// the orders.
		release, err := s.slot(ctx, sku)
		if err != nil {
			return Product{}, err
		}
		defer release()
		p, err := s.changeProduct(ctx, nil, sku, c)
		// Once the change has committed (or may have), this Service no
		// longer refuses orders by the window it knew; the others forget
		// it when they hear the change (Hear).
		s.windows.forget(sku)
		return p, classify(ctx, "change product", err)
	}
	var p Product
	err := s.withLease(ctx, sku, func(ctx context.Context, lease *lock.Lease) error {
		var err error
		p, err = s.changeProduct(ctx, lease, sku, c)
		s.windows.forget(sku)
		if mayHaveCommitted(err) {
			s.returned(ctx, sku, s.fence(lease))
		}
		return err
	})
	if err != nil {
		return Product{}, err
	}
	return p, nil
}

// changeProduct is ChangeProduct's transaction, on ctx, under lease when it
// restocks (nil otherwise). A lost COMMIT is ErrChangeOutcomeUnknown, as an
// order's is ErrOutcomeUnknown (see transaction).
func (s *Service) changeProduct(ctx context.Context, lease *lock.Lease, sku int64, c Change) (Product, error) {
	var p Product
	fence := s.fence(lease)
	err := s.transaction(ctx, ErrChangeOutcomeUnknown, fmt.Sprintf("sku %d", sku), func(tx *gorm.DB) error {
		if err := readProduct(tx, &p, sqlProductLocked, sku); err != nil {
			return err
		}
		w, err := c.apply(p)
		if err != nil {
			return err
		}
		n, price := 0, p.PriceCents
		if c.AddStock != nil {
			n = *c.AddStock
		}
		if c.PriceCents != nil {
			price = *c.PriceCents
		}
		if int64(p.InitialStock)+int64(n) > math.MaxInt32 {
			return invalidf("sku %d: %s %d + %s %d exceeds %d", sku, FieldInitialStock, p.InitialStock, FieldAddStock, n, math.MaxInt32)
		}
		if fence == 0 {
			// Without fencing an UPDATE that changes nothing (the same
			// window again) counts no row: its count says nothing.
			_, _, err := run(tx, sqlChangeProduct, n, n, price, w.StartsAt, w.EndsAt, sku)
			if err != nil {
				return err
			}
		} else {
			if p.Fence >= fence {
				return &staleFence{sku: sku, token: fence, row: p.Fence}
			}
			// A fenced UPDATE always moves the fence, so it counts its row.
			// The row is locked, so the count is 1 unless the fence check
			// above was wrong.
			changed, _, err := run(tx, sqlChangeProductFenced, n, n, price, w.StartsAt, w.EndsAt, fence, sku, fence)
			if err != nil {
				return err
			}
			if changed != 1 {
				return &staleFence{sku: sku, token: fence, row: p.Fence}
			}
			p.Fence = fence
		}
		p.InitialStock += n
		p.Stock += n
		p.SaleStartsAt, p.SaleEndsAt = w.StartsAt, w.EndsAt
		p.PriceCents = price
		return nil
	})
	return p, err
}
