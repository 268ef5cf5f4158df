package stock

import (
	"fmt"
	"time"
)

// Window is a product's sale window: an order that arrives at or after
// StartsAt and before EndsAt may buy; a nil bound leaves that side open.
//
// An order is judged by the time it arrived (Deps.Now when PlaceOrder
// was called), not by when its transaction runs: a buyer who came while the
// sale was on is not refused because the queue ahead of it took a while.
type Window struct {
	StartsAt *time.Time
	EndsAt   *time.Time
}

// The range of a MySQL DATETIME.
var (
	earliestTime = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)
	latestTime   = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
)

// Normalize returns w in UTC, truncated to the microsecond MySQL keeps, so
// that what is written is what is compared and shown. Errors: ErrInvalid
// when a bound is outside MySQL's DATETIME range or the window is empty
// (StartsAt at or after EndsAt).
func (w Window) Normalize() (Window, error) {
	var out Window
	for _, b := range []struct {
		name Field
		in   *time.Time
		out  **time.Time
	}{{FieldSaleStartsAt, w.StartsAt, &out.StartsAt}, {FieldSaleEndsAt, w.EndsAt, &out.EndsAt}} {
		if b.in == nil {
			continue
		}
		t := b.in.UTC().Truncate(time.Microsecond)
		if t.Before(earliestTime) || t.After(latestTime) {
			return Window{}, invalidf("%s must be between years 1000 and 9999", b.name)
		}
		*b.out = &t
	}
	if out.StartsAt != nil && out.EndsAt != nil && !out.StartsAt.Before(*out.EndsAt) {
		return Window{}, invalidf("%s must be before %s", FieldSaleStartsAt, FieldSaleEndsAt)
	}
	return out, nil
}

// window is p's sale window.
func (p Product) window() Window { return Window{StartsAt: p.SaleStartsAt, EndsAt: p.SaleEndsAt} }

// admits refuses an order of sku that arrived at at outside w:
// ErrSaleNotStarted or ErrSaleEnded.
func (w Window) admits(sku int64, at time.Time) error {
	switch {
	case w.StartsAt != nil && at.Before(*w.StartsAt):
		return fmt.Errorf("%w: sku %d: the sale starts at %s", ErrSaleNotStarted, sku, w.StartsAt.Format(time.RFC3339Nano))
	case w.EndsAt != nil && !at.Before(*w.EndsAt):
		return fmt.Errorf("%w: sku %d: the sale ended at %s", ErrSaleEnded, sku, w.EndsAt.Format(time.RFC3339Nano))
	}
	return nil
}
