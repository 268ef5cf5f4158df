package stock

import (
	"fmt"
	"sync"
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

// windows is what one replica remembers of its products' sale windows, so
// that a crowd that comes before a sale opens, or after it ends, is refused
// without a round trip to MySQL or Redis. A drain takes the SKU's lock
// without reading the product first; the transaction's guarded UPDATE
// refuses an order outside the window, and its careful read, which
// judges it, tells the window (Service.readSale), as does a read before the
// lock (Service.stocked). Only a window with a bound is kept: a product
// without one has nothing to refuse.
//
// A window changes only by an operator's change of the product (or a
// reseed), which every replica hears (a Changed, or a Raised of every
// product; Service.Hear), and then the memory forgets it at once. A window
// learned by a read that began before a change was heard is dropped: each
// forget moves a sequence on, and a read carries the sequence seen before
// it began. An entry also lapses after ttl, as a sell-out heard from another
// replica does (SoldOutHeardTTL): a change whose announcement was lost
// costs no more than that of refusals.
type windows struct {
	ttl time.Duration
	now func() time.Time

	mu     sync.Mutex
	seq    uint64                // moves on with each forget
	known  map[int64]knownWindow // the windows learned, by SKU
	forgot map[int64]forgotten   // the last forget of each SKU, while a read may predate it
	allSeq uint64                // the seq of the last forget of every product
	added  int                   // entries added (learned or forgotten) since the last sweep
}

// knownWindow is a window learned, and when it lapses.
type knownWindow struct {
	w     Window
	until time.Time
}

// forgotten is a forget of one SKU: its seq, and when it happened.
type forgotten struct {
	seq uint64
	at  time.Time
}

func newWindows(ttl time.Duration, now func() time.Time) *windows {
	return &windows{ttl: ttl, now: now, known: make(map[int64]knownWindow), forgot: make(map[int64]forgotten)}
}

// seen returns what to pass to learn for a read that starts now.
func (m *windows) seen() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seq
}

// learn records w as sku's window, read by a read that started when seen
// returned seq; nothing is recorded if sku's window (or every product's)
// was forgotten since. A window without bounds drops what was known.
func (m *windows) learn(sku int64, w Window, seq uint64) {
	if m.ttl <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.allSeq > seq || m.forgot[sku].seq > seq {
		return
	}
	if w.StartsAt == nil && w.EndsAt == nil {
		delete(m.known, sku)
		return
	}
	m.known[sku] = knownWindow{w: w, until: m.now().Add(m.ttl)}
	m.sweep()
}

// sweep drops, every so many entries added, those that lapsed and the
// forgets no read under way can predate, so that SKUs never asked for
// again do not pile up (an entry is dropped when looked up after it
// lapses, too). m.mu is held.
func (m *windows) sweep() {
	if m.added++; m.added < 1024 {
		return
	}
	m.added = 0
	now := m.now()
	for k, e := range m.known {
		if !now.Before(e.until) {
			delete(m.known, k)
		}
	}
	for k, f := range m.forgot {
		if !now.Before(f.at.Add(OrderBudget)) {
			delete(m.forgot, k)
		}
	}
}

// refuses returns the error sku's remembered window refuses an order that
// arrived at at with (see Window.admits), or nil when it admits it or no
// window is known.
func (m *windows) refuses(sku int64, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.known[sku]
	if !ok {
		return nil
	}
	if !m.now().Before(e.until) {
		delete(m.known, sku)
		return nil
	}
	return e.w.admits(sku, at)
}

// forget drops what is known of sku's window, or of every product's when
// sku is 0, and keeps reads that began before from recording it again.
// A read that began before it ends within OrderBudget, so its mark is kept
// that long: every order's commit is heard as a change, so marks of
// products sold pile up without a sweep.
func (m *windows) forget(sku int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	if sku == 0 {
		clear(m.known)
		clear(m.forgot)
		m.allSeq = m.seq
		return
	}
	delete(m.known, sku)
	m.forgot[sku] = forgotten{seq: m.seq, at: m.now()}
	m.sweep()
}
