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
)

// Service places orders, and runs everything else that writes a SKU's
// stock under its lock (cancellations, the sweep, restocks), and the
// payments and refunds that change orders without a lock (payments.go,
// refunds.go).
type Service struct {
	db     *gorm.DB
	reads  *gorm.DB
	public *Catalog
	locks  Locker
	set    Settings
	hooks  Hooks
	log    *slog.Logger
	now    func() time.Time

	lookups      *Catalog                   // Deps.Lookups
	announcer    Announcer                  // Deps.Announcer; nil: none
	checkouts    Checkouts                  // Deps.Checkouts; nil: none
	transitioned func(status string, n int) // Deps.Transitions; nil: none

	slots   *semaphore.Weighted // nil: unbounded
	soldOut *soldOut
	windows *windows

	mu     sync.Mutex
	queues map[int64]*queue // SKUs with orders queued or being placed

	group grouper // the batches waiting to be placed in a group (group.go)

	sweep sweeper // what the sweep keeps between sweeps (sweep.go)

	eventsSeen atomic.Bool // events are on: seen so, and so for good (events.go)

	batches, batched atomic.Uint64
}

// Deps are what a Service works with.
type Deps struct {
	// DB is the pool the order transactions run on, and payments,
	// cancellations, the sweep and restocks: open it with
	// mysqldb.OpenOrders.
	DB *gorm.DB
	// Reads, when set, is the pool for reads outside the order transaction
	// (a SKU's stock before its turn, looking up an idempotent replay after
	// a failure), so that they never take a connection a lock holder needs.
	// Default: DB.
	Reads *gorm.DB
	// Public, when set, reads the orders that anonymous requests name
	// (Order: a status read whose sender nobody vouches for): a flood of
	// requests for orders that are not there then costs a gated read of a
	// pool of its own (Catalog.Public), not a slot of the order path or a
	// connection of Reads. Default: a Catalog on Reads, ungated.
	Public *Catalog
	// Lookups, when set, reads the order a cancellation or a checkout is
	// for before anything else is done for it, and a buyer's own order
	// (BuyerOrder), under a bound of their own (Catalog.Lookups), so that
	// anonymous reads filling Public's gate never refuse them. Default: a
	// Catalog on Reads, ungated.
	Lookups *Catalog
	// Locks gives the lock of each SKU, which every write of its stock
	// holds.
	Locks Locker
	// Announcer, when set, tells the fleet after each change of a
	// product's stock that committed, or may have (announce.go): the
	// product cache drops it, and every replica hears that it sold out or
	// that units came back.
	Announcer Announcer
	// Checkouts, when set, creates the checkouts buyers pay at the
	// payment provider (Checkout), and cancels those of reservations that
	// ended (checkout.go).
	Checkouts Checkouts
	// Transitions, when set, counts orders as they reach a status: n orders
	// placed reserved or paid, paid by a payment, cancelled, expired;
	// "refund_owed" for a payment recorded as owed back, and
	// "refund_refunded" and "refund_failed" for refunds settled or failed.
	Transitions func(status string, n int)
	// Logger receives what the caller cannot act on, such as a failed
	// release. Default: discard.
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Update selects how an order writes the new stock.
type Update int

const (
	// Guarded decrements in one conditional statement,
	// UPDATE … SET stock = stock - 1 … WHERE stock > 0, so the database
	// itself refuses to go below zero whatever the lock does.
	Guarded Update = iota
	// Naive writes back the value it read minus one, as the source
	// articles do. It is correct only while the lock really excludes every
	// other writer; it is kept to show what the lock is for.
	Naive
)

// Settings are how a Service places orders. The zero value is the
// defaults.
type Settings struct {
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
	// its own: the source articles' path.
	Batch int
	// Group is the most SKUs' batches placed in one transaction, each
	// under its own SKU's lock and fenced by its own token, with one COMMIT
	// (group.go); zero means 1, a transaction per batch. The batches that
	// are ready while the groups in flight commit form the next group, never
	// waiting for more: with Concurrency slots, Concurrency/Group groups (at
	// least one) are in flight at once.
	Group int
	// Lanes is how many turns of one SKU's queue may run at once on this
	// Service; zero means 1. With a lock that excludes, a second turn would
	// only wait for the first one's lock: keep 1. The lock-free baseline
	// (lock.None) runs one per transaction slot (Concurrency), so that its
	// orders are placed side by side, each in a transaction of its own with
	// Batch 1.
	Lanes int
	// Concurrency bounds how many order transactions one Service runs at
	// once. A slot is taken before the SKU lock, so that a lock holder
	// never queues for a connection: keep it at or below the size of the
	// pool the Service writes through, and give reads a pool of their own
	// (Deps.Reads). A SKU's turn holds one slot, so a hot SKU leaves the
	// others to the rest. Zero means no bound.
	Concurrency int
	// SoldOutTTL is how long a product found sold out is refused from
	// memory, without a query, unless ForgetSoldOut clears it first; zero
	// means DefaultSoldOutTTL, negative turns the memory off, and with it
	// the memory of sale windows, which is kept for SoldOutHeardTTL at most.
	SoldOutTTL time.Duration
	// WaitRead is how long a drain waits for a lock another holds before it
	// reads the stock, and then between its reads (at the times the lock
	// asks whether to go on waiting): a holder that sold the last unit
	// announces it, but a waiter that missed the announcement, or outlived
	// its memory (SoldOutHeardTTL) while a lost holder's lease runs out,
	// learns the sell-out from MySQL rather than wait until its buyers'
	// deadline. Zero means DefaultWaitRead; negative, never.
	WaitRead time.Duration
	// Returning says that MySQL takes INSERT … RETURNING (MariaDB 10.5 and
	// later; see mysqldb.Returning): the orders a batch inserts come back
	// with the INSERT, not from a read after it.
	Returning bool
	// UserLimit is the most orders one user may hold over all products;
	// zero turns the limit off, and with it every statement it costs. An
	// order beyond it is ErrUserLimit (see userlimit.go). The limit holds
	// only while every Service that places orders has it on: one without
	// it neither checks nor counts.
	UserLimit int
	// PayWindow is how long a new order is reserved for its buyer to pay
	// (lifecycle.go) before it expires and its unit returns to the sale;
	// zero places orders paid, with no payment step.
	PayWindow time.Duration
}

// DefaultBatch is the most orders of one SKU that one lock holder places in
// one transaction when Settings.Batch is zero; chosen by measurement with
// make bench-orders (docs/order-path.md, "The batch size").
const DefaultBatch = 64

// DefaultSoldOutTTL is how long a replica trusts, by default, that a
// product it found sold out still is. Restocks and reseeds clear it at once
// (ForgetSoldOut); the lapse only bounds how long a change made behind the
// service's back, by hand in MySQL, goes unseen.
const DefaultSoldOutTTL = time.Minute

// DefaultWaitRead is Settings.WaitRead's default: far longer than a holder
// keeps a lock to sell a batch, so that a sell-out's waiters, who hear of
// it, never read.
const DefaultWaitRead = time.Second

// Hooks are places where tests and the demo step into a Service's work. A
// Service without them runs as it would without the seam.
type Hooks struct {
	// BeforeWrite, when set, runs inside the lease and the order
	// transaction, before its stock is written (after the product is read,
	// when the transaction reads it); ctx is the transaction's. If it
	// returns a func, that func runs once the transaction has ended
	// (committed or rolled back), still before the lease is released.
	// Tests pause there to make races deterministic; the demo stops a
	// holder between its read and its write and keeps its watchdog frozen
	// until the write has reached MySQL.
	BeforeWrite func(ctx context.Context, sku int64) (after func())
	// BeforeReturn, when set, runs in the transaction that gives units
	// back (lifecycle.go), after its writes and before its COMMIT. The
	// demo stops a sweep there to kill its process with the transaction
	// open.
	BeforeReturn func(ctx context.Context, sku int64)
	// BeforeEnd, when set, runs in the transaction that gives units back,
	// once it has locked the orders it ends and before it ends them. Tests
	// let a reservation's pay_by pass there.
	BeforeEnd func(ctx context.Context, sku int64)
}

// NewService returns a Service on d, placing orders as s says.
func NewService(d Deps, s Settings, h Hooks) *Service {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Reads == nil {
		d.Reads = d.DB
	}
	if d.Public == nil {
		d.Public = NewCatalog(d.Reads)
	}
	if d.Lookups == nil {
		d.Lookups = NewCatalog(d.Reads)
	}
	if s.Batch <= 0 {
		s.Batch = DefaultBatch
	}
	if s.Lanes <= 0 {
		s.Lanes = 1
	}
	if s.SoldOutTTL == 0 {
		s.SoldOutTTL = DefaultSoldOutTTL
	}
	if s.WaitRead == 0 {
		s.WaitRead = DefaultWaitRead
	}
	svc := &Service{db: d.DB, reads: d.Reads, public: d.Public, lookups: d.Lookups, locks: d.Locks, set: s, hooks: h,
		log: d.Logger, now: d.Now, announcer: d.Announcer, checkouts: d.Checkouts, transitioned: d.Transitions, soldOut: newSoldOut(s.SoldOutTTL, d.Now), windows: newWindows(min(s.SoldOutTTL, SoldOutHeardTTL), d.Now), queues: make(map[int64]*queue)}
	if s.Concurrency > 0 {
		svc.slots = semaphore.NewWeighted(int64(s.Concurrency))
	}
	return svc
}

// Locker gives exclusive leases on keys; each of internal/lock's families
// implements it.
type Locker interface {
	// Obtain takes key's lock, waiting as long as the lock's own wait
	// allows and ctx lets it.
	Obtain(ctx context.Context, key string) (*lock.Lease, error)
	// ObtainWhile is Obtain for a caller whose reason to wait may go away:
	// between its tries it calls still, and gives up with still's error
	// when there is one. A lock that never tries again need not call it.
	ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*lock.Lease, error)
	// RaiseFence raises key's fencing counter to at least atLeast, never
	// lowering it; a lock that keeps no counter of its own does nothing.
	// The order path calls it when MySQL refused a write because the row's
	// fence was at or above the holder's token. Usually a newer holder
	// wrote the row, and the counter is past it already; but if the
	// counter fell behind the rows — a Redis restarted empty starts it
	// again from its own clock, which may be behind the one that counted
	// before — every holder of the SKU would be refused until that clock
	// caught up. Raising the counter to the row's fence lets the next
	// holder write.
	RaiseFence(ctx context.Context, key string, atLeast int64) error
}

// TryLocker is a Locker that can also take a lock only if it is free,
// without waiting for it: every family of internal/lock but Local and
// None. The sweep claims its shards so when its Locker is one.
type TryLocker interface {
	Locker
	// TryObtain takes key's lock if it is free, and otherwise returns
	// lock.ErrNotObtained at once.
	TryObtain(ctx context.Context, key string) (*lock.Lease, error)
}

// Stats counts the transactions that placed orders.
type Stats struct {
	// Batches is how many order transactions ran: a group's is one, with
	// the careful attempts it took.
	Batches uint64
	// Orders is how many orders they placed or refused.
	Orders uint64
	// Queued is how many orders wait, now, to be taken into a batch.
	Queued int
	// Grouping is how many batches wait, now, for a group's transaction.
	Grouping int
}

// Stats reports the order transactions run so far and the orders queued.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	queued := 0
	for _, q := range s.queues {
		queued += len(q.waiting)
	}
	s.mu.Unlock()
	s.group.mu.Lock()
	grouping := len(s.group.waiting)
	s.group.mu.Unlock()
	return Stats{Batches: s.batches.Load(), Orders: s.batched.Load(), Queued: queued, Grouping: grouping}
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

// withLease runs fn, which writes sku's stock, with a transaction slot and
// under the SKU's lock, as the work of a SKU other than its orders does (a
// restock, a cancellation, the sweep). fn runs on the lease's context, so
// that it ends when the lease is lost. An error of fn that is a stale
// write repairs the lock's counter (repairFence) and is classified on the
// lease's context (classifyTx).
//
// The wait for the slot and the lock is the lock's own, or what
// withLockWait put on ctx: a wait that ends first is ErrBusy wrapping
// errWaitEnded.
func (s *Service) withLease(ctx context.Context, sku int64, fn func(ctx context.Context, lease *lock.Lease) error) error {
	ctx, kept, end := leaseWait(ctx)
	defer end()
	release, err := s.slot(ctx, sku)
	if err != nil {
		if context.Cause(ctx) == errWaitEnded {
			err = fmt.Errorf("%w: %w", err, errWaitEnded)
		}
		return err
	}
	defer release()
	lease, err := s.locks.Obtain(ctx, LockKey(sku))
	if err != nil {
		if context.Cause(ctx) == errWaitEnded && !errors.Is(err, errWaitEnded) {
			err = errors.Join(err, errWaitEnded)
		}
		return fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, err)
	}
	defer s.release(ctx, lease)
	if !kept() {
		return fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, errWaitEnded)
	}
	if err := fn(lease.Context(), lease); err != nil {
		s.repairFence(ctx, err)
		return classifyTx(lease.Context(), err)
	}
	return nil
}
