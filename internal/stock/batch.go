package stock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"gorm.io/gorm"

	"shop/internal/lock"
)

// A batch — the orders of one SKU a lock holder took from the queue, in
// arrival order, one or many — is placed in one transaction, which first
// tries the common case and falls back to judging each order against what
// MySQL holds:
//
//   - fast: every buyer may buy. One guarded UPDATE takes the batch's units
//     (and refuses unless the stock, the fence and the sale window allow
//     them all), one INSERT records the orders, one UPDATE counts them on
//     the buyers' counters when the user limit is on. That is the source
//     articles' UPDATE, INSERT, COMMIT for a batch of one.
//   - careful: when the UPDATE refuses, the same transaction reads the
//     product (a locking read; the naive update's plain read, which always
//     goes this way), the orders its buyers hold already and their
//     counters, and judges each order. When the INSERT runs into an order
//     the buyers hold (a retry of an order that committed, a second order of
//     the same buyer, the same key on another SKU) or a counter refuses, the
//     transaction rolls back and the careful one runs in its place.
//
// Whichever runs, every order is judged by the same rules, in this order,
// after the HTTP layer's (input, then identity and rate limits):
//
//  1. a key the buyer used before is a replay of that order (or
//     ErrIdempotencyMismatch for another SKU);
//  2. no such product: ErrNotFound;
//  3. outside the sale window, judged at the order's arrival:
//     ErrSaleNotStarted, ErrSaleEnded;
//  4. no unit left: ErrSoldOut;
//  5. the buyer holds an order of the product already: ErrAlreadyOrdered;
//  6. the buyer holds Settings.UserLimit orders: ErrUserLimit.
//
// A replay comes first, so that a retry of an order that committed gets its
// order whatever has happened since. Then the product's rules come before
// the buyer's, so that a product known to be gone, closed or sold out is
// refused without asking who the buyer is: from one stock read, or from
// memory. A buyer whose request has ended is not placed (ErrBusy); one who
// sends its key again in the same batch gets the first one's order, when
// that one bought, and is judged as any other order otherwise.

// maxCareful bounds the careful attempts of one batch. Each one that fails
// on a unique index has read the orders that were in the way of the one
// before, so another runs only if yet another order came in between: a
// buyer sending the same key to several products at once.
const maxCareful = 3

// errCareful is a fast attempt that met what it cannot judge: its
// transaction rolls back and the careful attempt runs.
var errCareful = errors.New("stock: the batch needs a careful attempt")

// errBuyersDeadline ends a batch's transaction when its earliest buyer's
// deadline comes.
var errBuyersDeadline = errors.New("the earliest deadline of the batch's orders came")

// verdict is what a batch decided for one of its orders.
type verdict struct {
	order *Order // sold now, or replayed
	err   error
	// follows is the earlier order of the batch, of the same buyer under
	// the same key, that this one replays; -1 for none.
	follows int
}

// sale is what a batch's transaction decided.
type sale struct {
	verdicts []verdict
	// sold are the orders sold, in arrival order; sellers their places in
	// the batch.
	sold    []Order
	sellers []int
	// soldOut says that the batch left no unit: the product is sold out.
	soldOut bool
}

// facts is what a batch's transaction knows when it judges its orders. A
// nil field is unknown: the fast attempt knows none, and assumes every
// buyer may buy, which its statements then check.
type facts struct {
	product *Product
	// stock is the stock before the batch, when known without the row:
	// what the fast attempt's UPDATE took and left.
	stock *int
	held  *held
	// counts are the buyers' order counters (userlimit.go).
	counts map[int64]int
}

// place places batch, orders of sku in arrival order, under lease, and
// answers each once the transaction has ended and the fleet has been told.
// The batch is a part of a group (group.go): its transaction may place the
// batches of other SKUs too, each under its own lease, with one COMMIT. The
// batch's part ends, at the latest, at the earliest deadline of its orders:
// no statement of it runs for a buyer who has been answered, and the COMMIT
// is bounded by the pool's read timeout (mysqldb.OpenOrders). ctx is for
// what is logged.
func (s *Service) place(ctx context.Context, lease *lock.Lease, sku int64, batch []*ticket) {
	txCtx, cancel := earliest(lease.Context(), batch)
	defer cancel()
	gen := s.soldOut.generation()
	p := &part{lease: lease, sku: sku, batch: batch, ctx: txCtx, done: make(chan struct{})}
	s.commit(p)
	sale, err := p.sale, p.err
	if err != nil {
		s.repairFence(ctx, err)
		s.learn(sku, gen, err)
		err = classifyTx(txCtx, err)
		if mayHaveCommitted(err) {
			s.changed(ctx, sku, 0)
		}
		for _, t := range batch {
			t.answer(Order{}, err)
		}
		return
	}
	// The other replicas learn of a sell-out with the announcement, before
	// the lock is released: a return of units, which takes the lock after
	// it, is announced after it too. Only a batch that took the last unit
	// announces it: its write moved the row's fence to its token, so every
	// later raise carries a later one. A batch that found none wrote
	// nothing, and a holder with an older token whose lease ran out may
	// still return units after it (see soldOut).
	var soldOutAt int64
	if sale.soldOut {
		s.soldOut.mark(sku, gen)
		if len(sale.sold) > 0 {
			soldOutAt = s.fence(lease)
		}
	}
	if len(sale.sold) > 0 || soldOutAt > 0 {
		s.changed(ctx, sku, soldOutAt)
	}
	if len(sale.sold) > 0 {
		s.transitions(sale.sold[0].Status, len(sale.sold))
	}
	for i, t := range batch {
		v := sale.verdicts[i]
		if v.follows >= 0 {
			o := *sale.verdicts[v.follows].order
			o.Replayed = true
			v.order = &o
		}
		if v.order != nil {
			t.answer(*v.order, nil)
		} else {
			t.answer(Order{}, v.err)
		}
	}
}

// earliest returns a context of parent that ends at the earliest deadline of
// batch's orders, with errBuyersDeadline as its cause.
func earliest(parent context.Context, batch []*ticket) (context.Context, context.CancelFunc) {
	var first time.Time
	for _, t := range batch {
		if d, ok := t.ctx.Deadline(); ok && (first.IsZero() || d.Before(first)) {
			first = d
		}
	}
	if first.IsZero() {
		return context.WithCancel(parent)
	}
	return context.WithDeadlineCause(parent, first, errBuyersDeadline)
}

// sellIn is one attempt at batch's transaction, on tx.
func (s *Service) sellIn(ctx context.Context, tx *gorm.DB, after *func(), fence, sku int64, batch []*ticket, careful bool) (sale, error) {
	fenced := s.set.Fencing && fence > 0
	hooked := false
	if !careful {
		sl := s.judge(sku, fence, batch, facts{})
		if len(sl.sold) == 0 {
			return sl, nil
		}
		s.beforeWrite(ctx, sku, after)
		hooked = true
		first, last := arrivalSpan(batch)
		had, ok, err := takeUnits(tx, sku, fenced, fence, len(sl.sold), first, last)
		if err != nil {
			return sale{}, err
		}
		if ok {
			taken := min(had, len(sl.sold))
			if taken == 0 && hasKeys(batch) {
				// Sold out, but a key may replay an order: only the careful
				// attempt reads them.
				return sale{}, errCareful
			}
			if left := had - taken; left == 0 && len(sl.sold) < len(batch) || taken < len(sl.sold) {
				// The batch took the last units: an order after them is
				// sold out, whatever else would refuse it.
				sl = s.judge(sku, fence, batch, facts{stock: &taken})
			}
			if len(sl.sold) != taken {
				// A buyer left between the two judgements: the units
				// taken are not the orders sold. Judge again under the
				// row's lock.
				return sale{}, errCareful
			}
			sl.soldOut = had == taken
			if taken == 0 {
				return sl, nil
			}
			return sl, s.record(tx, sku, &sl, errCareful)
		}
		// Refused, and nothing written: judge each order.
	}

	read, err := s.readSale(tx, sku)
	if err != nil {
		return sale{}, err
	}
	f := facts{product: &read}
	if read.Stock > 0 || hasKeys(batch) {
		h, err := heldOrders(tx, sku, batch)
		if err != nil {
			return sale{}, err
		}
		f.held = &h
	}
	if s.set.UserLimit > 0 && read.Stock > 0 {
		if users := limitCandidates(batch, f.held); len(users) > 0 {
			if f.counts, err = lockCounters(tx, users); err != nil {
				return sale{}, err
			}
		}
	}
	sl := s.judge(sku, fence, batch, f)
	sl.soldOut = read.Stock-len(sl.sold) <= 0
	if len(sl.sold) == 0 {
		return sl, nil
	}
	if !hooked {
		s.beforeWrite(ctx, sku, after)
	}
	if err := s.writeStock(tx, sku, read, fenced, fence, len(sl.sold)); err != nil {
		return sale{}, err
	}
	return sl, s.record(tx, sku, &sl, nil)
}

// judge decides each order of batch from what is known (see facts), by the
// rules at the top of this file, selling in arrival order to a holder whose
// fencing token is fence.
func (s *Service) judge(sku, fence int64, batch []*ticket, f facts) sale {
	sl := sale{verdicts: make([]verdict, len(batch))}
	left := math.MaxInt
	switch {
	case f.product != nil:
		left = f.product.Stock
	case f.stock != nil:
		left = *f.stock
	}
	buying := map[int64]bool{}    // users this batch sells to
	underKey := map[heldKey]int{} // (user, key) → the order of this batch that buys under it
	for i, t := range batch {
		v := &sl.verdicts[i]
		v.follows = -1
		k := heldKey{t.user, t.key}
		if t.key != "" {
			if o, ok := f.held.byKey(k); ok {
				if o, v.err = replayOf(o, sku, t.user, t.key); v.err == nil {
					v.order = &o
				}
				continue
			}
			if j, ok := underKey[k]; ok {
				v.follows = j
				continue
			}
		}
		switch {
		case t.ctx.Err() != nil:
			v.err = fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, context.Cause(t.ctx))
		case f.product != nil && f.product.window().admits(sku, t.arrived) != nil:
			v.err = f.product.window().admits(sku, t.arrived)
		case left <= 0:
			v.err = soldOutError(sku)
		case f.held.byUser(t.user) || buying[t.user]:
			v.err = fmt.Errorf("%w: user %d, sku %d", ErrAlreadyOrdered, t.user, sku)
		case f.counts != nil && s.limitReached(f.counts, t.user) != nil:
			v.err = s.limitReached(f.counts, t.user)
		default:
			left--
			buying[t.user] = true
			if t.key != "" {
				underKey[k] = i
			}
			o := Order{SKUID: sku, UserID: t.user, Fence: fence}
			if t.key != "" {
				o.IdempotencyKey = &t.key
			}
			sl.sold = append(sl.sold, o)
			sl.sellers = append(sl.sellers, i)
		}
	}
	return sl
}

// hasKeys reports whether any order of batch carries an idempotency key.
func hasKeys(batch []*ticket) bool {
	for _, t := range batch {
		if t.key != "" {
			return true
		}
	}
	return false
}

// readSale reads sku's row for the careful attempt: with a lock for the
// guarded update, so that nothing changes it until COMMIT; as the source
// articles read it for the naive one. Its sale window is remembered
// (windows), so that the next orders outside it are refused without MySQL.
func (s *Service) readSale(tx *gorm.DB, sku int64) (Product, error) {
	q := sqlSaleOf
	if s.set.Update == Guarded {
		q = sqlSaleOfLocked
	}
	seen := s.windows.seen()
	var p Product
	err := readProduct(tx, &p, q, sku)
	if err == nil {
		s.windows.learn(sku, p.window(), seen)
	}
	return p, err
}

// takeUnits is the fast attempt's stock write: one guarded UPDATE that
// takes up to n units of sku — as many as the stock has — if the fence is
// older than the holder's token (when fenced) and the sale window admits
// every order of the batch, which arrived between first and last. ok is
// false when the row refused, and then nothing changed. had is the stock
// before, which the UPDATE hands back through LAST_INSERT_ID(expr): MySQL's
// and MariaDB's way for a statement to return a value of the row it wrote,
// in the same round trip. With no stock left, nothing is written: the fence
// moves only with a unit taken, and the COMMIT has nothing to flush.
func takeUnits(tx *gorm.DB, sku int64, fenced bool, fence int64, n int, first, last time.Time) (had int, ok bool, err error) {
	q, args := sqlTakeUnits, []any{n, sku, first, last}
	if fenced {
		q, args = sqlTakeUnitsFenced, []any{fence, n, sku, first, last, fence}
	}
	_, id, err := run(tx, q, args...)
	if err != nil || id == 0 {
		return 0, false, err
	}
	return int(id - 1), true, nil
}

// arrivalSpan returns the earliest and the latest arrival of the orders of
// batch: sqlOpenWindow's arguments, so that the window admits every order
// between them — those the fast attempt refuses by another rule too, which
// the window's comes before.
func arrivalSpan(batch []*ticket) (first, last time.Time) {
	first, last = batch[0].arrived, batch[0].arrived
	for _, t := range batch[1:] {
		if t.arrived.Before(first) {
			first = t.arrived
		} else if t.arrived.After(last) {
			last = t.arrived
		}
	}
	return first, last
}

// record inserts the orders sl sold and, with the limit on, counts them on
// their buyers' counters. A counter that refuses (the user is at the limit,
// or has no counter) is short: record returns it, errCareful for the fast
// attempt, whose judgement assumed it would not.
func (s *Service) record(tx *gorm.DB, sku int64, sl *sale, short error) error {
	events := 1 // order.reserved
	if s.set.PayWindow <= 0 {
		events = 2 // and order.paid
	}
	placed, err := insertOrders(tx, sku, sl.sold, s.set.PayWindow, s.eventSeqOf(events), s.set.Returning)
	if err != nil {
		return err
	}
	if err := s.placedEvents(tx, placed, events); err != nil {
		return err
	}
	for i, o := range sl.sold {
		o, ok := placed[o.UserID]
		if !ok {
			return fmt.Errorf("stock: order of user %d for sku %d not found after insert", o.UserID, sku)
		}
		sl.sold[i] = o
		sl.verdicts[sl.sellers[i]].order = &sl.sold[i]
	}
	if s.set.UserLimit > 0 {
		return s.countOrders(tx, sellersOf(sl.sold), short)
	}
	return nil
}

// writeStock takes n units off product sku in the careful attempt. was is
// the row the transaction read.
//
// A fenced naive write is a compare-and-set on the fence it read, not only a
// check that its token is the newest: a holder whose lease ran out while its
// write sat uncommitted in MySQL can still commit after the next holder has
// read the old stock, and that next holder's token is newer than the row's,
// yet the stock it read is stale. Any fenced write moves the fence, so an
// unchanged fence means an unchanged row.
func (s *Service) writeStock(tx *gorm.DB, sku int64, was Product, fenced bool, fence int64, n int) error {
	var q string
	var args []any
	switch {
	case s.set.Update == Guarded && fenced:
		q, args = sqlTakeGuardedFenced, []any{n, fence, sku, n, fence}
	case s.set.Update == Guarded:
		q, args = sqlTakeGuarded, []any{n, sku, n}
	case fenced:
		q, args = sqlWriteNaiveFenced, []any{was.Stock - n, fence, sku, was.Fence, fence}
	default:
		// The source articles' read-modify-write. Its row count proves
		// nothing (a row already at the written value counts as
		// unchanged), so it is not checked: this write never refuses.
		_, _, err := run(tx, sqlWriteNaive, was.Stock-n, sku)
		return err
	}
	if n, _, err := run(tx, q, args...); err != nil || n == 1 {
		return err
	}
	// Refused: a newer holder wrote the row, or (naive) an older one wrote
	// it after it was read. A locking read sees the row as committed now.
	var now Product
	if err := readProduct(tx, &now, sqlStockAndFenceLocked, sku); err != nil {
		return err
	}
	switch {
	case fenced && now.Fence >= fence:
		return &staleFence{sku: sku, token: fence, row: now.Fence}
	case now.Stock <= 0:
		// Sold out means no unit left, nothing else: a stock above zero
		// but below n is a batch to place again, not a sold-out product.
		return soldOutError(sku)
	}
	return fmt.Errorf("%w: sku %d changed after it was read (fence %d, now %d; stock %d, now %d)",
		ErrBusy, sku, was.Fence, now.Fence, was.Stock, now.Stock)
}

// placedEvents writes the events of orders just placed whose INSERT saw
// events on, events (1 or 2) of each, in one statement.
func (s *Service) placedEvents(tx *gorm.DB, placed map[int64]Order, events int) error {
	var ids []int64
	for _, o := range placed {
		if o.EventSeq > 0 {
			ids = append(ids, o.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	s.eventsSeen.Store(true)
	q, args := sqlPlacedEvents, []any{ids}
	if events == 2 {
		q, args = sqlPlacedPaidEvents, []any{ids, ids}
	}
	_, _, err := run(tx, q, args...)
	return err
}

// insertOrders inserts orders of sku, reserved until now plus payWindow by
// MySQL's clock (paid when payWindow is 0), with eventSeq (SQL) as their
// event_seq, and returns them as MySQL has them, by user. The orders are
// one INSERT, whose rows are selected from the product's row, which the
// transaction has locked: each order owes the product's price, in its
// currency, as they are at that moment. With returning (MariaDB 10.5 and
// later) the orders come back with it;
// otherwise they are read back through the (user, active SKU) unique index:
// a multi-row INSERT's ids need not be consecutive
// (innodb_autoinc_lock_mode=2, auto_increment_increment), and pay_by,
// amount_cents and currency are MySQL's to set.
func insertOrders(tx *gorm.DB, sku int64, orders []Order, payWindow time.Duration, eventSeq string, returning bool) (map[int64]Order, error) {
	status, payBy := StatusPaid, "NULL"
	if payWindow > 0 {
		status, payBy = StatusReserved, fmt.Sprintf("UTC_TIMESTAMP(6) + INTERVAL %d MICROSECOND", payWindow.Microseconds())
	}
	row := fmt.Sprintf(sqlOrderRow, payBy, eventSeq)
	insert := sqlInsertOrder + strings.Repeat(row+" UNION ALL ", len(orders)-1) + row
	args := make([]any, 0, sqlOrderRowArgs*len(orders))
	users := make([]int64, 0, len(orders))
	for _, o := range orders {
		args = append(args, o.SKUID, o.UserID, o.IdempotencyKey, o.Fence, status, sku)
		users = append(users, o.UserID)
	}
	var placed []Order
	if returning {
		// MariaDB hands the orders back as it wrote them — their ids,
		// pay_by by MySQL's clock, their amounts — in the INSERT's own
		// round trip.
		if _, err := read(tx, &placed, insert+" RETURNING "+sqlOrderColumns, args...); err != nil {
			return nil, err
		}
	} else {
		if _, _, err := run(tx, insert, args...); err != nil {
			return nil, err
		}
		if _, err := read(tx, &placed, sqlOrdersOfUsers, users, sku); err != nil {
			return nil, err
		}
	}
	byUser := make(map[int64]Order, len(placed))
	for _, o := range placed {
		byUser[o.UserID] = o
	}
	return byUser, nil
}

// beforeWrite runs Hooks.BeforeWrite, keeping what it returns in after.
func (s *Service) beforeWrite(ctx context.Context, sku int64, after *func()) {
	if s.hooks.BeforeWrite != nil {
		*after = s.hooks.BeforeWrite(ctx, sku)
	}
}

// count counts a transaction that decided orders orders (Stats).
func (s *Service) count(orders int) {
	s.batches.Add(1)
	s.batched.Add(uint64(orders))
}
