package stock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"gorm.io/gorm"

	"shop/internal/lock"
	"shop/internal/mysqldb"
)

// Update selects how PlaceOrder writes the new stock.
type Update int

const (
	// Guarded decrements in one conditional statement,
	// UPDATE … SET stock = stock - 1 … WHERE stock > 0, so the database
	// itself refuses to go below zero whatever the lock does.
	Guarded Update = iota
	// Naive writes back the value it read minus one, as the seeds do. It is
	// correct only while the lock really excludes every other writer; it is
	// kept to show what the lock is for.
	Naive
)

// DefaultBatch is the most orders of one SKU that one lock holder places in
// one transaction when Options.Batch is zero; chosen by measurement with
// make bench-orders (docs/order-path.md, "The batch size").
const DefaultBatch = 64

// DefaultSoldOutTTL is how long a replica trusts, by default, that a
// product it found sold out still is. Restocks and reseeds clear it at once
// (ForgetSoldOut); the lapse only bounds how long a change made behind the
// service's back, by hand in MySQL, goes unseen.
const DefaultSoldOutTTL = time.Minute

// Options configures a Service.
type Options struct {
	// Update is how the stock is written.
	Update Update
	// Fencing makes every stock write carry the lease's fencing token and
	// lets MySQL refuse it unless the token is newer than the row's. It has
	// no effect with a lock that gives no tokens (lock.Local, lock.None).
	Fencing bool
	// Batch is the most orders of one SKU that one lock holder places in
	// one transaction; zero means DefaultBatch. The orders of a SKU that
	// reach this Service while one of its turns waits for or holds the lock
	// queue up, and the next turn places up to Batch of them at once (see
	// queue.go). With 1, every order is placed alone under a lock hold of
	// its own: the seeds' path.
	Batch int
	// Lanes is how many turns of one SKU's queue may run at once on this
	// Service; zero means 1. With a lock that excludes, a second turn would
	// only wait for the first one's lock: keep 1. The lock-free baseline
	// (lock.None) runs one per transaction slot (Concurrency), so that its
	// orders are placed side by side, each in a transaction of its own with
	// Batch 1.
	Lanes int
	// SoldOutTTL is how long a product found sold out is refused from
	// memory, without a query, unless ForgetSoldOut clears it first; zero
	// means DefaultSoldOutTTL, negative turns the memory off.
	SoldOutTTL time.Duration
	// Returning says that MySQL takes INSERT … RETURNING (MariaDB 10.5 and
	// later; see Returning): the orders a batch inserts come back with
	// the INSERT, not from a read after it.
	Returning bool
	// UserLimit is the most orders one user may hold over all products;
	// zero turns the limit off, and with it every statement it costs. An
	// order beyond it is ErrUserLimit (see userlimit.go). The limit holds
	// only while every Service that places orders has it on: one without
	// it neither checks nor counts.
	UserLimit int
	// BeforeWrite, when set, runs inside the lease and the order
	// transaction, before its stock is written (after the product is read,
	// when the transaction reads it); ctx is the transaction's. If it returns a func, that func runs
	// once the transaction has ended (committed or rolled back), still
	// before the lease is released. Tests pause there to make races
	// deterministic; the demo stops a holder between its read and its write
	// and keeps its watchdog frozen until the write has reached MySQL.
	BeforeWrite func(ctx context.Context, sku int64) (after func())
	// Concurrency bounds how many order transactions one Service runs at
	// once. A slot is taken before the SKU lock, so that a lock holder
	// never queues for a connection: keep it at or below the size of the
	// pool the Service writes through, and give reads a pool of their own
	// (Reads). A SKU's turn holds one slot, so a hot SKU leaves the others
	// to the rest. Zero means no bound.
	Concurrency int
	// PayWindow is how long a new order is reserved for its buyer to pay
	// (lifecycle.go) before it expires and its unit returns to the sale;
	// zero places orders paid, with no payment step.
	PayWindow time.Duration
	// Returned, when set, is told after a cancellation or the sweep gave
	// units of sku back (or may have) under the SKU's lock with fencing
	// token fence (0: none): the other replicas must forget that it was
	// sold out, as after a restock (Raised).
	Returned func(ctx context.Context, sku, fence int64)
	// Transitions, when set, counts orders as they reach a status: n orders
	// placed reserved or paid, paid by Pay, cancelled, expired; and
	// "refund_owed" for a payment recorded as owed back.
	Transitions func(status string, n int)
	// BeforeReturn, when set, runs in the transaction that gives units
	// back (lifecycle.go), after its writes and before its COMMIT. The
	// demo stops a sweep there to kill its process with the transaction
	// open.
	BeforeReturn func(ctx context.Context, sku int64)
	// Reads, when set, is the pool for reads outside the order transaction
	// (looking up an idempotent replay after a failure), so that they never
	// take a connection a lock holder needs. Default: the Service's own.
	Reads *gorm.DB
	// Public, when set, reads the orders a buyer's request names (its
	// status, the order a payment or a cancellation is for) before anything
	// else is done for it: a flood of requests for orders that are not
	// there then costs a gated read of a pool of its own (Catalog.Public),
	// not a slot of the order path or a connection of Reads. Default: a
	// Catalog on Reads, ungated.
	Public *Catalog
	// Cache, when set, is told after each committed order that the product's
	// stock changed, and after an order whose COMMIT's outcome is unknown.
	// When it is a SoldOutInvalidator too, the invalidation after the
	// order that sold the last unit also tells every replica that the
	// product sold out.
	Cache Invalidator
	// Logger receives what the caller cannot act on, such as a failed
	// release. Default: discard.
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Service places orders.
type Service struct {
	db      *gorm.DB
	reads   *gorm.DB
	locks   Locker
	opt     Options
	slots   *semaphore.Weighted // nil: unbounded
	soldOut *soldOut

	mu     sync.Mutex
	queues map[int64]*queue // SKUs with orders queued or being placed

	batches, batched atomic.Uint64
}

// NewService returns a Service that writes through db under locks.
func NewService(db *gorm.DB, locks Locker, opt Options) *Service {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Batch <= 0 {
		opt.Batch = DefaultBatch
	}
	if opt.Lanes <= 0 {
		opt.Lanes = 1
	}
	if opt.SoldOutTTL == 0 {
		opt.SoldOutTTL = DefaultSoldOutTTL
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Reads == nil {
		opt.Reads = db
	}
	if opt.Public == nil {
		opt.Public = NewCatalog(opt.Reads)
	}
	s := &Service{db: db, reads: opt.Reads, locks: locks, opt: opt,
		soldOut: newSoldOut(opt.SoldOutTTL, opt.Now), queues: make(map[int64]*queue)}
	if opt.Concurrency > 0 {
		s.slots = semaphore.NewWeighted(int64(opt.Concurrency))
	}
	return s
}

// Stats counts the transactions that placed orders.
type Stats struct {
	// Batches is how many order transactions ran.
	Batches uint64
	// Orders is how many orders they placed or refused.
	Orders uint64
	// Queued is how many orders wait, now, to be taken into a batch.
	Queued int
}

// Stats reports the order transactions run so far and the orders queued.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	queued := 0
	for _, q := range s.queues {
		queued += len(q.waiting)
	}
	s.mu.Unlock()
	return Stats{Batches: s.batches.Load(), Orders: s.batched.Load(), Queued: queued}
}

// ForgetSoldOut makes this Service forget that product sku (every product
// when sku is 0) was sold out: call it on every replica when stock goes up,
// after the change has committed. It is Raised without a fencing token.
func (s *Service) ForgetSoldOut(sku int64) { s.Raised(sku, 0) }

// Raised makes this Service forget that product sku (every product when sku
// is 0) was sold out, as ForgetSoldOut does, for a change made under the
// SKU's lock with fencing token fence: a finding that it sold out made
// under an older token, heard later, is not believed (SoldOutElsewhere).
func (s *Service) Raised(sku, fence int64) { s.soldOut.raise(sku, fence) }

// KnownSoldOut reports whether this Service refuses sku's orders from
// memory, found sold out here or elsewhere (PlaceOrder answers them
// ErrSoldOut without a round trip, but for a key's replay).
func (s *Service) KnownSoldOut(sku int64) bool { return s.soldOut.has(sku) }

// SoldOutElsewhere tells this Service that another replica found product
// sku sold out under the SKU's lock with fencing token fence, so that it
// refuses the product's orders from memory too, without a read of its own.
// A finding older than a raise heard already is dropped (see soldOut).
func (s *Service) SoldOutElsewhere(sku, fence int64) {
	if sku > 0 && fence > 0 {
		s.soldOut.heard(sku, fence)
	}
}

const (
	// releaseTimeout bounds the release of a SKU lock after the transaction.
	releaseTimeout = 2 * time.Second
	// InvalidateTimeout bounds telling the cache about a committed order,
	// which happens before the order is answered.
	InvalidateTimeout = time.Second
	// raiseFenceTimeout bounds telling the lock about a row fenced above
	// its counter.
	raiseFenceTimeout = time.Second
)

// PlaceOrder sells one unit of product sku to user.
//
// A product this Service found sold out is refused at once, from memory
// (see ForgetSoldOut). Otherwise the order joins its SKU's queue (queue.go):
// whoever holds the SKU's lock next places it with the orders queued beside
// it, up to Options.Batch, in one transaction that decrements the stock and
// inserts the orders (place.go), and answers each only after COMMIT and
// after the cache has been told; the lock is released after that. A
// returned Order has been committed. An order still queued when its context
// ends, or when a step of its turn fails, leaves the queue with the error.
//
// With a non-empty idempotencyKey, a repeated call of the same user returns
// the order the first call created (Replayed set) and creates nothing. A key
// belongs to its user: another user's orders under the same key are theirs.
//
// Errors, in the order the rules are applied (place.go): ErrInvalid,
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
	if s.soldOut.has(sku) {
		// A buyer retrying an order that committed must get it back, not
		// "sold out": with a key, look before refusing.
		if idempotencyKey != "" {
			if o, ok, err := replay(s.reads.WithContext(ctx), sku, user, idempotencyKey); err != nil || ok {
				return o, classify(ctx, "place order", err)
			}
		}
		return Order{}, soldOutError(sku)
	}
	// Queued only once the buyer's counter exists: the transaction only
	// locks counters, it never makes them.
	if err := s.ensureCounter(ctx, user); err != nil {
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

// orderTx runs fn as one order transaction on ctx under lease. fn calls
// beforeWrite with after; what the hook returned runs once the transaction
// has ended, whatever its outcome, and before the caller releases the lease.
//
// When fn succeeded and the connection failed under the COMMIT, MySQL may
// have committed or not, and no answer of this connection can tell:
// orderTx returns ErrOutcomeUnknown. A COMMIT that MySQL answered with an
// error, and any failure before it, is a rollback.
func (s *Service) orderTx(ctx context.Context, lease *lock.Lease, fn func(tx *gorm.DB, after *func()) error) error {
	var after func()
	err := s.transaction(ctx, ErrOutcomeUnknown, lease.Key(), func(tx *gorm.DB) error {
		return fn(tx, &after)
	})
	if after != nil {
		after()
	}
	return err
}

// transaction runs fn as one transaction on ctx. When fn succeeded and the
// connection failed under the COMMIT, MySQL may have committed or not, and
// no answer of this connection can tell: transaction returns unknown
// (ErrOutcomeUnknown or an error that wraps it) with what the transaction
// was about. A COMMIT that MySQL answered with an error, and any failure
// before it, is a rollback, returned as it came.
func (s *Service) transaction(ctx context.Context, unknown error, about string, fn func(tx *gorm.DB) error) error {
	committing := false
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := fn(tx); err != nil {
			return err
		}
		committing = true // what fails now is the COMMIT
		return nil
	})
	if err != nil && committing && mysqldb.CommitLost(err) {
		return fmt.Errorf("%w: %s: connection lost at COMMIT: %w", unknown, about, err)
	}
	return err
}

// mayHaveCommitted reports whether an order transaction that ended with err
// may have changed the product: it committed, or its outcome is unknown.
func mayHaveCommitted(err error) bool { return err == nil || errors.Is(err, ErrOutcomeUnknown) }

// beforeWrite runs Options.BeforeWrite, keeping what it returns in after.
func (s *Service) beforeWrite(ctx context.Context, sku int64, after *func()) {
	if s.opt.BeforeWrite != nil {
		*after = s.opt.BeforeWrite(ctx, sku)
	}
}

// learn remembers sku as sold out when err says it is.
func (s *Service) learn(sku int64, gen uint64, err error) {
	if errors.Is(err, ErrSoldOut) {
		s.soldOut.mark(sku, gen)
	}
}

func (s *Service) count(orders int) {
	s.batches.Add(1)
	s.batched.Add(uint64(orders))
}

// slot takes one of the Options.Concurrency transaction slots; release
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

// stocked is inStock on db, remembering a product found sold out.
func (s *Service) stocked(db *gorm.DB, sku int64) (Product, error) {
	gen := s.soldOut.generation()
	p, err := inStock(db, sku)
	s.learn(sku, gen, err)
	return p, err
}

// inStock refuses a product that does not exist or has no unit left. It
// returns the stock and the sale window it read.
func inStock(db *gorm.DB, sku int64) (Product, error) {
	var p Product
	if err := db.Select(append([]string{"stock"}, windowColumns...)).Take(&p, sku).Error; err != nil {
		return Product{}, notFound(err, sku)
	}
	if p.Stock <= 0 {
		return Product{}, soldOutError(sku)
	}
	return p, nil
}

// repairFence tells the lock, when err is a write refused for a stale fence,
// how far the row's fence has gone, so that a counter that fell behind the
// rows is raised and the next holder's token is above the fence (see
// FenceRaiser). It runs once the transaction has ended, bounded and
// detached from the buyer; a failure is logged and changes nothing else:
// the order has failed anyway, and the next refusal tries again.
func (s *Service) repairFence(ctx context.Context, err error) {
	var stale *staleFence
	r, ok := s.locks.(FenceRaiser)
	if !ok || !errors.As(err, &stale) {
		return
	}
	key := LockKey(stale.sku)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), raiseFenceTimeout)
	defer cancel()
	if err := r.RaiseFence(ctx, key, stale.row); err != nil {
		s.opt.Logger.WarnContext(ctx, "raise fencing counter", "key", key, "at_least", stale.row, "err", err)
	}
}

// replay finds the order user created earlier under key. ok is false when
// there is none; the error is ErrIdempotencyMismatch when it is of another
// SKU.
func replay(db *gorm.DB, sku, user int64, key string) (o Order, ok bool, err error) {
	res := db.Where("user_id = ? AND idempotency_key = ?", user, key).Limit(1).Find(&o)
	if res.Error != nil || res.RowsAffected == 0 {
		return Order{}, false, res.Error
	}
	o, err = replayOf(o, sku, user, key)
	return o, err == nil, err
}

// replayOf answers an order of user under idempotency key with o, the
// order the user made under the key before: o itself, Replayed, or
// ErrIdempotencyMismatch when o is of another SKU.
func replayOf(o Order, sku, user int64, key string) (Order, error) {
	if o.SKUID != sku || o.UserID != user {
		return Order{}, fmt.Errorf("%w: key %q", ErrIdempotencyMismatch, key)
	}
	o.Replayed = true
	return o, nil
}

// invalidate tells the cache that sku's stock changed. It runs after COMMIT,
// still under the SKU lock, and even when the caller has gone: the order
// stands, and a cache left holding the old stock would show it until the
// entry expires, which is what the log line reports.
func (s *Service) invalidate(ctx context.Context, sku int64) { s.changed(ctx, sku, 0) }

// changed tells the cache that sku changed; with soldOutAt, the fencing
// token of the hold that found it sold out, it also tells every replica
// that it sold out, when the cache can (SoldOutInvalidator).
func (s *Service) changed(ctx context.Context, sku, soldOutAt int64) {
	if s.opt.Cache == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), InvalidateTimeout)
	defer cancel()
	var err error
	if c, ok := s.opt.Cache.(SoldOutInvalidator); ok && soldOutAt > 0 {
		err = c.InvalidateSoldOut(ctx, sku, soldOutAt)
	} else {
		err = s.opt.Cache.Invalidate(ctx, sku)
	}
	if err != nil {
		s.opt.Logger.WarnContext(ctx, "invalidate cached product", "sku", sku, "err", err)
	}
}

func (s *Service) release(ctx context.Context, lease *lock.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		s.opt.Logger.WarnContext(ctx, "release sku lock", "key", lease.Key(), "err", err)
	}
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
