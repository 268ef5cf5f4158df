package stock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"shop/internal/lock"
)

// A hot SKU sells one unit per lock hold if every order takes the lock for
// itself: the hold — obtain, BEGIN, UPDATE, INSERT, COMMIT with its fsync,
// release — is the SKU's whole throughput. Here the orders of a SKU that
// reach a replica while one of them waits for or holds the lock queue up,
// and one goroutine per SKU and replica (the drain) places the queue in
// batches: it takes the lock, takes whoever is queued (up to Batch, never
// waiting for more), places them in one transaction and answers each after
// COMMIT. MySQL stays the only truth; nothing is decremented anywhere else.

// queue holds the orders of one SKU waiting to be placed; Service.mu guards
// it.
type queue struct {
	waiting []*ticket
	next    uint64 // the seq of the last ticket queued; seqs start at 1
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

// drainCourtesy is how long a drain that released a lock another process
// was waiting for lets that process take it before trying again itself.
// Without it the releasing replica, whose next try costs no wake-up, would
// win the lock back every time while other replicas' buyers wait.
const drainCourtesy = 3 * time.Millisecond

// enqueue queues the order and waits for its answer. An order still queued
// when its context ends, or when a try for the lock that began after it was
// queued runs out of time, leaves the queue as ErrBusy; one already taken
// into a batch waits for the batch's answer.
func (s *Service) enqueue(ctx context.Context, sku, user int64, idempotencyKey string, arrived time.Time) (Order, error) {
	// Queued only once the buyer's counter exists: the transaction only
	// locks counters, it never makes them.
	if err := s.ensureCounter(ctx, user); err != nil {
		return Order{}, err
	}
	t := &ticket{ctx: ctx, user: user, key: idempotencyKey, done: make(chan answer, 1), arrived: arrived}
	s.mu.Lock()
	q, running := s.queues[sku]
	if !running {
		q = &queue{}
		s.queues[sku] = q
	}
	q.next++
	t.seq = q.next
	q.waiting = append(q.waiting, t)
	s.mu.Unlock()
	if !running {
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

// take removes up to n orders from the head of q, answering those whose
// buyer has gone instead.
func (s *Service) take(sku int64, q *queue, n int) []*ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	var batch []*ticket
	for len(q.waiting) > 0 && len(batch) < n {
		t := q.waiting[0]
		q.waiting = q.waiting[1:]
		if t.ctx.Err() != nil {
			t.answer(Order{}, fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, context.Cause(t.ctx)))
			continue
		}
		batch = append(batch, t)
	}
	return batch
}

// pending reports whether q still has orders. If not, q is removed, and
// the drain ends: the next order of the SKU starts a new queue.
func (s *Service) pending(sku int64, q *queue) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(q.waiting) > 0 {
		return true
	}
	delete(s.queues, sku)
	return false
}

// refuseQueued answers with err every order queued for sku before the
// arrival numbered before; all of them when before is zero.
func (s *Service) refuseQueued(q *queue, before uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := q.waiting[:0]
	for _, t := range q.waiting {
		if before != 0 && t.seq >= before {
			kept = append(kept, t)
			continue
		}
		t.answer(Order{}, err)
	}
	clear(q.waiting[len(kept):])
	q.waiting = kept
}

// arrivals returns the seq the next order queued for q will get.
func (s *Service) arrivals(q *queue) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return q.next + 1
}

// drain places the orders queued for sku, batch by batch, until none is
// left.
func (s *Service) drain(sku int64, q *queue) {
	for s.pending(sku, q) {
		if s.soldOut.has(sku) {
			s.refuseQueued(q, 0, fmt.Errorf("%w: sku %d", ErrSoldOut, sku))
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		contended, err := s.placeNext(ctx, sku, q)
		cancel()
		if err != nil {
			continue
		}
		if contended {
			time.Sleep(drainCourtesy)
		}
	}
}

// batchTimeout bounds one turn of a drain — slot, stock read, lock wait,
// transaction — so that a MySQL or Redis that stops answering fails the
// batch's buyers instead of keeping them forever.
const batchTimeout = 10 * time.Second

// placeNext takes a slot and the SKU's lock, then places the next batch. It
// reports whether another process was waiting for the lock when it was
// released. When it returns an error, it has answered the queued orders
// with it: the product is sold out or gone, or the lock was not obtained
// (then only the orders that waited for the whole try).
//
// The slot is taken before the lock, so that a holder never waits for a
// connection; a SKU's queue holds one slot at most, so a hot SKU's buyers
// do not keep other SKUs' orders from the slots.
func (s *Service) placeNext(ctx context.Context, sku int64, q *queue) (contended bool, err error) {
	release, err := s.slot(ctx, sku)
	if err != nil {
		s.refuseQueued(q, 0, err)
		return false, err
	}
	defer release()
	// A product another replica sold out is refused without the lock.
	p, err := s.stocked(s.reads.WithContext(ctx), sku)
	if err != nil {
		err = classify(ctx, "place order", err)
		s.refuseQueued(q, 0, err)
		return false, err
	}
	// So is each order that came outside the product's sale window.
	if !s.refuseOutside(sku, q, p.window()) {
		return false, nil
	}
	tried := s.arrivals(q)
	lease, err := s.obtain(ctx, sku)
	if err != nil {
		switch {
		case errors.Is(err, ErrSoldOut), errors.Is(err, ErrNotFound):
			s.refuseQueued(q, 0, err)
		case errors.Is(err, lock.ErrNotObtained):
			// Those who came during the try wait for the next one.
			s.refuseQueued(q, tried, fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, err))
		default:
			s.refuseQueued(q, 0, fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, err))
		}
		return false, err
	}
	// ctx is the drain's, for every buyer of the batch: what is logged
	// with it (the lock's release, a batch's invalidation) carries no
	// request id. What is done for one buyer is logged with the buyer's
	// context, which carries the buyer's.
	defer func() {
		s.release(ctx, lease)
		contended = lease.Contended()
	}()
	batch := s.take(sku, q, s.opt.Batch)
	switch {
	case len(batch) == 0:
	case len(batch) == 1:
		t := batch[0]
		o, err := s.placeOne(t.ctx, lease, sku, t.user, t.key, t.arrived)
		if mayHaveCommitted(err) {
			s.invalidate(t.ctx, sku)
		}
		t.answer(o, err)
	default:
		s.placeBatch(ctx, lease, sku, batch)
	}
	return false, nil
}

// stillWanted is what a Locker can do beyond Obtain: give up waiting when
// the reason to wait has gone (lock.Redis, lock.Redlock).
type stillWanted interface {
	ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*lock.Lease, error)
}

// obtain takes sku's lock for a drain. While another process holds it —
// most likely selling the SKU's last units — the stock is read again before
// each retry, so that a SKU sold out meanwhile is refused without the lock:
// in a sell-out, three buyers in four never take it.
func (s *Service) obtain(ctx context.Context, sku int64) (*lock.Lease, error) {
	l, ok := s.locks.(stillWanted)
	if !ok {
		return s.locks.Obtain(ctx, LockKey(sku))
	}
	return l.ObtainWhile(ctx, LockKey(sku), func(ctx context.Context) error {
		_, err := s.stocked(s.reads.WithContext(ctx), sku)
		if errors.Is(err, ErrSoldOut) || errors.Is(err, ErrNotFound) {
			return err
		}
		return nil // a failed read is no reason to stop waiting
	})
}

// verdict is what a batch decided for one of its orders.
type verdict struct {
	sell  bool   // gets a unit
	order *Order // the order it is answered with, once known
	err   error
	// leader is the earlier order of this batch with the same idempotency
	// key: this one is answered with its result, as a replay.
	leader int
}

// placeBatch places batch, orders of sku in arrival order, in one
// transaction under lease, and answers each.
func (s *Service) placeBatch(ctx context.Context, lease *lock.Lease, sku int64, batch []*ticket) {
	gen := s.soldOut.generation()
	var (
		verdicts []verdict
		left     int
	)
	err := s.orderTx(lease, func(tx *gorm.DB, after *func()) error {
		var err error
		verdicts, left, err = s.placeMany(lease.Context(), tx, after, lease.Fence(), sku, batch)
		return err
	})
	switch {
	case err == nil:
		s.count(len(batch))
	case duplicate(err):
		// Another writer inserted one of these orders meanwhile: only
		// possible where the lock does not exclude (none, local across
		// replicas). Each order then goes on its own.
		for _, t := range batch {
			o, err := s.placeOne(t.ctx, lease, sku, t.user, t.key, t.arrived)
			t.answer(o, err)
		}
		s.invalidate(ctx, sku)
		return
	default:
		// Every order of the batch gets its failure; under an unknown
		// outcome each buyer with a key gets its order back instead if
		// it committed (PlaceOrder looks).
		s.count(len(batch))
		s.repairFence(ctx, err)
		s.learn(sku, gen, err)
		err = s.classifyLease(ctx, lease, err)
		if mayHaveCommitted(err) {
			s.invalidate(ctx, sku)
		}
		for _, t := range batch {
			t.answer(Order{}, err)
		}
		return
	}
	if left <= 0 {
		s.soldOut.mark(sku, gen)
	}
	sold := false
	for i, t := range batch {
		v := verdicts[i]
		if v.leader >= 0 {
			v = verdicts[v.leader]
			if v.order != nil {
				o := *v.order
				o.Replayed = true
				v.order = &o
			}
		}
		if v.order != nil {
			t.answer(*v.order, nil)
		} else {
			t.answer(Order{}, v.err)
		}
		sold = sold || verdicts[i].sell
	}
	if sold {
		s.invalidate(ctx, sku)
	}
}

// placeMany is placeBatch's transaction. It reads the product (a locking
// read, but for the naive update, which reads as the seeds do), looks up
// the orders its buyers already hold, sells n = min(stock, buyers left) in
// arrival order with one UPDATE and one INSERT, and reads back the ids the
// INSERT gave: a multi-row INSERT's ids need not be consecutive
// (innodb_autoinc_lock_mode=2).
// It also returns the stock left. Each order is judged by the time it
// arrived against the window the read found.
func (s *Service) placeMany(ctx context.Context, tx *gorm.DB, after *func(), fence, sku int64, batch []*ticket) ([]verdict, int, error) {
	var read Product
	q := tx.Select(append([]string{"id", "stock", "fence"}, windowColumns...))
	if s.opt.Update == Guarded {
		q = q.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate})
	}
	if err := q.Take(&read, sku).Error; err != nil {
		return nil, 0, notFound(err, sku)
	}
	held, err := heldOrders(tx, sku, batch)
	if err != nil {
		return nil, 0, err
	}
	// With the limit on, the buyers' counters are locked after the
	// product, in one statement (see userlimit.go).
	var counts map[int64]int
	if users := limitCandidates(batch, held); s.opt.UserLimit > 0 && read.Stock > 0 && len(users) > 0 {
		if counts, err = lockCounters(tx, users); err != nil {
			return nil, 0, err
		}
	}

	verdicts := make([]verdict, len(batch))
	buyers := map[int64]int{}   // user → the order of this batch that buys
	leaders := map[string]int{} // key → the first order of this batch with it
	left := read.Stock
	var sell []Order
	for i, t := range batch {
		v := &verdicts[i]
		v.leader = -1
		if t.key != "" {
			if o, ok := held.byKey[t.key]; ok {
				if o, v.err = replayOf(o, sku, t.user, t.key); v.err == nil {
					v.order = &o
				}
				continue
			}
			if j, ok := leaders[t.key]; ok {
				if batch[j].user != t.user {
					v.err = fmt.Errorf("%w: key %q", ErrIdempotencyMismatch, t.key)
				} else {
					v.leader = j
				}
				continue
			}
			leaders[t.key] = i
		}
		_, before := held.byUser[t.user]
		_, inBatch := buyers[t.user]
		limited := s.limitReached(counts, t.user)
		outside := read.window().admits(sku, t.arrived)
		switch {
		case t.ctx.Err() != nil:
			v.err = fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, context.Cause(t.ctx))
		case outside != nil:
			v.err = outside
		case before || inBatch:
			v.err = fmt.Errorf("%w: user %d, sku %d", ErrAlreadyOrdered, t.user, sku)
		case left <= 0:
			v.err = fmt.Errorf("%w: sku %d", ErrSoldOut, sku)
		case limited != nil:
			v.err = limited
		default:
			left--
			v.sell = true
			buyers[t.user] = i
			o := Order{SKUID: sku, UserID: t.user, Fence: fence, CreatedAt: s.opt.Now().UTC().Truncate(time.Microsecond)}
			if t.key != "" {
				o.IdempotencyKey = &t.key
			}
			sell = append(sell, o)
		}
	}
	if len(sell) == 0 {
		return verdicts, left, nil
	}

	s.beforeWrite(ctx, sku, after)
	if err := s.writeStock(tx, sku, read, s.opt.Fencing && fence > 0, fence, len(sell), time.Time{}); err != nil {
		return nil, 0, err
	}
	ids, err := insertOrders(tx, sku, sell)
	if err != nil {
		return nil, 0, err
	}
	if s.opt.UserLimit > 0 {
		if err := countOrders(tx, sellers(sell)); err != nil {
			return nil, 0, err
		}
	}
	for i := range verdicts {
		if v := &verdicts[i]; v.sell {
			o := sell[0]
			sell = sell[1:]
			if o.ID = ids[o.UserID]; o.ID == 0 {
				return nil, 0, fmt.Errorf("stock: order of user %d for sku %d not found after insert", o.UserID, sku)
			}
			v.order = &o
		}
	}
	return verdicts, left, nil
}

// held is what a batch's buyers already hold.
type held struct {
	byUser map[int64]Order  // orders of this SKU, by user
	byKey  map[string]Order // orders under the batch's idempotency keys
}

// heldOrders looks up, in one query, the batch's buyers' orders of sku and
// the orders under the batch's idempotency keys (of any SKU).
func heldOrders(tx *gorm.DB, sku int64, batch []*ticket) (held, error) {
	users := make([]int64, 0, len(batch))
	var keys []string
	for _, t := range batch {
		users = append(users, t.user)
		if t.key != "" {
			keys = append(keys, t.key)
		}
	}
	q := tx.Where("sku_id = ? AND user_id IN ?", sku, users)
	if len(keys) > 0 {
		q = tx.Where(q).Or("idempotency_key IN ?", keys)
	}
	var found []Order
	if err := q.Find(&found).Error; err != nil {
		return held{}, err
	}
	h := held{byUser: map[int64]Order{}, byKey: map[string]Order{}}
	for _, o := range found {
		if o.SKUID == sku {
			h.byUser[o.UserID] = o
		}
		if o.IdempotencyKey != nil {
			h.byKey[*o.IdempotencyKey] = o
		}
	}
	return h, nil
}

// insertOrders inserts orders of sku in one statement and returns their ids
// by user, read back through the (user, sku) unique index.
func insertOrders(tx *gorm.DB, sku int64, orders []Order) (map[int64]int64, error) {
	var b strings.Builder
	b.WriteString("INSERT INTO orders (sku_id, user_id, idempotency_key, fence, created_at) VALUES ")
	args := make([]any, 0, 5*len(orders))
	users := make([]int64, 0, len(orders))
	for i, o := range orders {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?)")
		args = append(args, o.SKUID, o.UserID, o.IdempotencyKey, o.Fence, o.CreatedAt)
		users = append(users, o.UserID)
	}
	if err := tx.Exec(b.String(), args...).Error; err != nil {
		return nil, err
	}
	var rows []Order
	if err := tx.Select("id", "user_id").Where("sku_id = ? AND user_id IN ?", sku, users).Find(&rows).Error; err != nil {
		return nil, err
	}
	ids := make(map[int64]int64, len(rows))
	for _, o := range rows {
		ids[o.UserID] = o.ID
	}
	return ids, nil
}
