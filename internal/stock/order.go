package stock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"shop/internal/lock"
	"shop/internal/mysqldb"
)

// Every order takes one path, which this file follows top to bottom. It
// joins its SKU's queue on this Service (queue.go), and a goroutine per
// SKU (its drain) places the queue turn by turn: it takes an order slot,
// refuses what this Service remembers the product refuses (sold out, or
// outside its sale window), takes the SKU's lock, takes whoever is queued — up to
// Settings.Batch, never waiting for more — and places them in one
// transaction (batch.go), then answers each. A batch of one is a batch: the
// source articles' one order per lock hold is Batch 1, nothing else. MySQL
// stays the only truth; nothing is decremented anywhere else.
//
// A hot SKU sells one batch per lock hold instead of one order: the hold —
// obtain, BEGIN, UPDATE, INSERT, COMMIT with its fsync, release — is the
// SKU's whole throughput.

const (
	// MinTimeLeft is the least time an order must have left before its
	// context's deadline to be taken into a transaction. An order nearer its
	// end is answered ErrBusy instead: a transaction ends at the earliest
	// deadline of its orders, so one buyer about to give up would cut it
	// short for every other buyer in it.
	MinTimeLeft = time.Second
	// TurnTimeout bounds one turn of a drain — slot, lock wait,
	// transaction — so that a MySQL or Redis that stops answering fails the
	// turn's orders instead of keeping them forever. It is the order budget
	// up to COMMIT that the HTTP API gives a buyer.
	TurnTimeout = 15 * time.Second
	// MaxLockWait is the longest the Locker of a Service may wait for a lock:
	// a turn must keep time for its transaction after the wait.
	MaxLockWait = TurnTimeout - 5*time.Second
	// OrderBudget is the longest PlaceOrder takes to return: its turn, up
	// to the moment its COMMIT is sent (TurnTimeout); the COMMIT's answer,
	// which waits at most the orders' pool's read timeout
	// (mysqldb.OrdersIOTimeout); and what follows the COMMIT before the
	// answer, the announcement (InvalidateTimeout). The lock is released
	// after the answer.
	OrderBudget = TurnTimeout + mysqldb.OrdersIOTimeout + InvalidateTimeout
)

// drainCourtesy is how long a drain that released a lock another process
// was waiting for lets that process take it before trying again itself.
// Without it the releasing replica, whose next try costs no wake-up, would
// win the lock back every time while other replicas' buyers wait.
const drainCourtesy = 3 * time.Millisecond

// PlaceOrder sells one unit of product sku to user.
//
// A product this Service found sold out is refused at once, from memory
// (see ForgetSoldOut), and so is an order that arrived outside the
// product's sale window as this Service last read it (see windows).
// Otherwise the order joins its SKU's queue: whoever
// holds the SKU's lock next places it with the orders queued beside it, up
// to Settings.Batch, in one transaction that decrements the stock and
// inserts the orders (batch.go), and answers each only after COMMIT and
// after the fleet has been told; the lock is released after that. A
// returned Order has been committed. An order still queued when its context
// ends, or when a step of its turn fails, leaves the queue with the error.
//
// With a non-empty idempotencyKey, a repeated call of the same user returns
// the order the first call created (Replayed set) and creates nothing. A key
// belongs to its user: another user's orders under the same key are theirs.
//
// Errors, in the order the rules are applied (batch.go): ErrInvalid,
// ErrIdempotencyMismatch, ErrNotFound, ErrSaleNotStarted, ErrSaleEnded,
// ErrSoldOut, ErrAlreadyOrdered, ErrUserLimit; and ErrBusy whenever the order
// could not be placed now and nothing was written (joined with ErrStaleFence
// when MySQL refused a stale holder's write, with lock.ErrNotObtained when
// the lock was not obtained in time, with lock.ErrNotHeld when the lease was
// lost), ErrOutcomeUnknown (the connection was lost after COMMIT was sent;
// with an idempotency key the order is looked up first, and a committed one
// returned).
func (s *Service) PlaceOrder(ctx context.Context, sku, user int64, idempotencyKey string) (Order, error) {
	if err := CheckOrder(sku, user, idempotencyKey); err != nil {
		return Order{}, err
	}
	arrived := s.arrival()
	if refused := s.remembered(sku, arrived); refused != nil {
		// A buyer retrying an order that committed must get it back, not
		// "sold out": with a key, look before refusing.
		if idempotencyKey != "" {
			if o, ok, err := replay(s.reads.WithContext(ctx), sku, user, idempotencyKey); err != nil || ok {
				return o, classify(ctx, "place order", err)
			}
		}
		return Order{}, refused
	}
	// Queued only once the buyer's counter exists: the transaction only
	// locks counters, it never makes them.
	if err := s.ensureCounter(ctx, user, sku); err != nil {
		return Order{}, err
	}
	o, err := s.enqueue(ctx, sku, user, idempotencyKey, arrived)
	if err != nil && idempotencyKey != "" && !errors.Is(err, ErrIdempotencyMismatch) {
		// A call with the same key may have committed meanwhile: then its
		// order is the answer, whatever this attempt ran into.
		switch o, ok, rerr := replay(s.reads.WithContext(ctx), sku, user, idempotencyKey); {
		case ok:
			return o, nil
		case errors.Is(rerr, ErrIdempotencyMismatch):
			return Order{}, rerr
		}
	}
	return o, err
}

// CheckOrder returns an ErrInvalid error unless sku and user are positive
// and idempotencyKey is empty or well formed: the rules an order is judged
// by before anything is read or limited for it.
func CheckOrder(sku, user int64, idempotencyKey string) error {
	switch {
	case sku <= 0:
		return invalidf("%s must be a positive integer", FieldSKU)
	case user <= 0:
		return invalidf("%s must be a positive integer", FieldUser)
	case idempotencyKey != "":
		return CheckIdempotencyKey(idempotencyKey)
	}
	return nil
}

// arrival is the time an order that arrives now is judged by, to the
// microsecond, as MySQL compares it with the window (see sqlOpenWindow).
func (s *Service) arrival() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

// enqueue queues the order and waits for its answer. An order still queued
// when its context ends leaves the queue as ErrBusy; one already taken into
// a batch waits for the batch's answer, which its transaction bounds.
func (s *Service) enqueue(ctx context.Context, sku, user int64, idempotencyKey string, arrived time.Time) (Order, error) {
	t := &ticket{ctx: ctx, user: user, key: idempotencyKey, done: make(chan answer, 1), arrived: arrived}
	q, start := s.join(sku, t)
	if start {
		go s.drain(sku, q)
	}
	select {
	case a := <-t.done:
		return a.order, a.err
	case <-ctx.Done():
	}
	if s.leave(q, t) {
		return Order{}, fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, context.Cause(ctx))
	}
	// Taken into a batch already: its transaction decides.
	a := <-t.done
	return a.order, a.err
}

// drain places the orders queued for sku, turn by turn, until none is left.
func (s *Service) drain(sku int64, q *queue) {
	for s.pending(sku, q) {
		if s.refusedFromMemory(sku, q) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), TurnTimeout)
		contended := s.turn(ctx, sku, q)
		cancel()
		if contended {
			time.Sleep(drainCourtesy)
		}
	}
}

// turn takes a slot, takes the SKU's lock and places the next batch. It
// reports whether another process was waiting for the lock when it was
// released. A step that fails answers the queued orders with its error
// (see fail).
//
// The slot is taken before the lock, so that a holder never waits for a
// connection; a SKU's drain holds one slot at most, so a hot SKU's buyers
// do not keep other SKUs' orders from the slots.
//
// The stock is not read before the lock: the transaction's guarded UPDATE
// refuses a product sold out or closed as a read would, and a read would
// cost a statement for every product that has stock, which is every
// product a flash sale's peak sells. What a read would refuse without the
// lock is refused from memory: a sell-out found here or heard from the
// replica that sold the last unit, and the sale window a transaction (or
// a read) last found. Only a product known sold out until lately is read
// first, since it is most likely still gone.
func (s *Service) turn(ctx context.Context, sku int64, q *queue) (contended bool) {
	began := s.nextSeq(q)
	release, err := s.slot(ctx, sku)
	if err != nil {
		s.fail(q, began, err)
		return false
	}
	defer release()
	// A product found sold out while the slot was awaited — here or, by
	// its announcement, elsewhere — is refused without a read.
	if s.refusedFromMemory(sku, q) {
		return false
	}
	if s.soldOut.lapsed(sku) && !s.readFirst(ctx, sku, q) {
		return false
	}
	began = s.nextSeq(q)
	lease, err := s.obtain(ctx, sku)
	if err != nil {
		if !errors.Is(err, ErrSoldOut) && !errors.Is(err, ErrNotFound) {
			err = fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, err)
		}
		s.fail(q, began, err)
		return false
	}
	// The holder that released the lock has most likely announced the
	// sell-out it found before it did; and orders queued meanwhile may
	// have come outside a window learned meanwhile.
	if s.refusedFromMemory(sku, q) {
		s.release(ctx, lease)
		return lease.Contended()
	}
	batch := s.take(sku, q, s.set.Batch)
	// What is logged for a batch of one buyer carries the buyer's request
	// id; a batch of several is logged on the drain's context.
	logCtx := ctx
	if len(batch) == 1 {
		logCtx = context.WithoutCancel(batch[0].ctx)
	}
	if len(batch) > 0 {
		s.place(logCtx, lease, sku, batch)
	}
	s.release(logCtx, lease)
	return lease.Contended()
}

// readFirst reads the stock and the sale window of sku, a product known
// sold out until lately, before its lock, and refuses what the read
// finds: each queued order that came outside the window, then — the window's
// rule comes first — every order queued before the read began when no unit
// is left. It reports whether orders are left for the lock. Orders that
// arrive during the read get a turn of their own: stock also rises during a
// sale, and the zero read is remembered (unless a raise came after it
// began), so that turn refuses them from memory when nothing came back.
func (s *Service) readFirst(ctx context.Context, sku int64, q *queue) bool {
	began := s.nextSeq(q)
	p, err := s.stocked(ctx, sku)
	if err != nil && !errors.Is(err, ErrSoldOut) {
		s.fail(q, began, classify(ctx, "place order", err))
		return false
	}
	if !s.refuse(q, func(t *ticket) error { return p.window().admits(sku, t.arrived) }) {
		return false
	}
	if err != nil {
		s.fail(q, began, err)
		return false
	}
	return true
}

// obtain takes sku's lock for a drain. While another process holds it —
// most likely selling the SKU's last units — it stops waiting as soon as
// the product is known sold out: the holder that sold the last unit
// announced it before releasing the lock, so in a sell-out the losing
// buyers never take it, and none reads the stock. With nothing heard for
// Settings.WaitRead it reads the stock, and again after each WaitRead: a
// holder lost before it released (its lease runs out by itself), or an
// announcement missed, would otherwise keep the waiter until its buyers'
// deadline for a product long gone.
func (s *Service) obtain(ctx context.Context, sku int64) (*lock.Lease, error) {
	next := s.now().Add(s.set.WaitRead)
	return s.locks.ObtainWhile(ctx, LockKey(sku), func(ctx context.Context) error {
		if s.soldOut.has(sku) {
			return soldOutError(sku)
		}
		if s.set.WaitRead < 0 || s.now().Before(next) {
			return nil
		}
		next = s.now().Add(s.set.WaitRead)
		if _, err := s.stocked(ctx, sku); errors.Is(err, ErrSoldOut) || errors.Is(err, ErrNotFound) {
			return err
		}
		return nil // a failed read is no reason to stop waiting
	})
}

// LockKey is the lock key that guards a SKU.
func LockKey(sku int64) string { return "sku:" + strconv.FormatInt(sku, 10) }

// slot takes one of the Settings.Concurrency transaction slots; release
// gives it back.
func (s *Service) slot(ctx context.Context, sku int64) (release func(), err error) {
	if s.slots == nil {
		return func() {}, nil
	}
	if err := s.slots.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("%w: sku %d: waiting for a slot: %w", ErrBusy, sku, err)
	}
	return func() { s.slots.Release(1) }, nil
}

// release gives sku's lock back once the work under it has ended, even
// when ctx has: a lease left held blocks the SKU until it expires.
func (s *Service) release(ctx context.Context, lease *lock.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		s.log.WarnContext(ctx, "release sku lock", "key", lease.Key(), "err", err)
	}
}

// queue holds the orders of one SKU waiting to be placed; Service.mu guards
// it.
type queue struct {
	waiting []*ticket
	next    uint64 // the seq of the last ticket queued; seqs start at 1
	drains  int    // the drains running on it (Settings.Lanes at most)
}

// ticket is one queued order and where its answer goes.
type ticket struct {
	ctx  context.Context
	user int64
	key  string
	seq  uint64      // its place in the queue's arrivals
	done chan answer // buffered: the drain never blocks on a buyer
	// arrived is when the order came: its sale window judges that time.
	arrived time.Time
}

type answer struct {
	order Order
	err   error
}

func (t *ticket) answer(o Order, err error) { t.done <- answer{o, err} }

// errTooLate is why an order with less than MinTimeLeft is not placed.
var errTooLate = errors.New("too little time left before the order's deadline to place it")

// join queues t for sku and reports whether the caller must start a drain
// of the queue: its lanes (Settings.Lanes) are not all running.
func (s *Service) join(sku int64, t *ticket) (q *queue, start bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q = s.queues[sku]
	if q == nil {
		q = &queue{}
		s.queues[sku] = q
	}
	q.next++
	t.seq = q.next
	q.waiting = append(q.waiting, t)
	start = q.drains < s.set.Lanes
	if start {
		q.drains++
	}
	return q, start
}

// leave takes t out of q if no batch has taken it yet.
func (s *Service) leave(q *queue, t *ticket) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(q.waiting, t)
	if i < 0 {
		return false
	}
	q.waiting = slices.Delete(q.waiting, i, i+1)
	return true
}

// nextSeq returns the seq the next order queued for q will get.
func (s *Service) nextSeq(q *queue) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return q.next + 1
}

// take removes up to n orders from the head of q. An order whose buyer has
// gone, or whose deadline is less than MinTimeLeft away, is answered
// ErrBusy instead.
func (s *Service) take(sku int64, q *queue, n int) []*ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	var batch []*ticket
	for len(q.waiting) > 0 && len(batch) < n {
		t := q.waiting[0]
		q.waiting = q.waiting[1:]
		if err := t.ctx.Err(); err != nil {
			t.answer(Order{}, fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, context.Cause(t.ctx)))
			continue
		}
		if d, ok := t.ctx.Deadline(); ok && time.Until(d) < MinTimeLeft {
			t.answer(Order{}, fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, errTooLate))
			continue
		}
		batch = append(batch, t)
	}
	return batch
}

// pending reports whether q still has orders. If not, the calling drain
// ends, and the last one to end removes q: the next order of the SKU starts
// a new queue.
func (s *Service) pending(sku int64, q *queue) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(q.waiting) > 0 {
		return true
	}
	if q.drains--; q.drains == 0 {
		delete(s.queues, sku)
	}
	return false
}

// remembered returns the error this Service refuses an order of sku that
// arrived at arrived with from memory, without a round trip, by the rules'
// order: outside the sale window it last found (windows), then sold out
// (soldOut). It is nil when memory refuses nothing.
func (s *Service) remembered(sku int64, arrived time.Time) error {
	if err := s.windows.refuses(sku, arrived); err != nil {
		return err
	}
	if s.soldOut.has(sku) {
		return soldOutError(sku)
	}
	return nil
}

// refusedFromMemory answers each order queued for sku that this Service
// refuses from memory (remembered) with its refusal, and reports whether
// none is left.
func (s *Service) refusedFromMemory(sku int64, q *queue) bool {
	return !s.refuse(q, func(t *ticket) error { return s.remembered(sku, t.arrived) })
}

// fail answers orders queued for sku with err. When err is final for the
// product — there is no such product — that is every order queued;
// otherwise only those that were queued before the arrival numbered began,
// when the step that failed began: the orders that came during it get a
// turn of their own. Sold out is not final: a cancellation, the sweep or a
// restock may give a unit back while the read that found none is under
// way, and an order that arrived after it must be able to take that unit.
// The orders queued before the read began are refused: the stock was zero
// at some moment after they arrived. (The next turn reads no more for the
// others than it would have: the read that found none is remembered, and
// refuses them from memory unless units came back meanwhile.)
func (s *Service) fail(q *queue, began uint64, err error) {
	if errors.Is(err, ErrNotFound) {
		began = 0
	}
	s.refuse(q, func(t *ticket) error {
		if began != 0 && t.seq >= began {
			return nil
		}
		return err
	})
}

// refuse answers each order queued in q for which refusal returns an
// error with that error, and reports whether any order is left.
func (s *Service) refuse(q *queue, refusal func(*ticket) error) (left bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := q.waiting[:0]
	for _, t := range q.waiting {
		if err := refusal(t); err != nil {
			t.answer(Order{}, err)
			continue
		}
		kept = append(kept, t)
	}
	clear(q.waiting[len(kept):])
	q.waiting = kept
	return len(kept) > 0
}
