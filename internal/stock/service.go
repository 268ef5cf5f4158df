package stock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sync/semaphore"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"shop/internal/lock"
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

// Options configures a Service.
type Options struct {
	// Update is how the stock is written.
	Update Update
	// Fencing makes every stock write carry the lease's fencing token and
	// lets MySQL refuse it unless the token is newer than the row's. It has
	// no effect with a lock that gives no tokens (lock.Local, lock.None).
	Fencing bool
	// BeforeWrite, when set, runs after the product is read and before its
	// stock is written. Tests pause there to make races deterministic.
	BeforeWrite func(ctx context.Context, sku int64)
	// Concurrency bounds how many orders one Service works on at once;
	// the rest wait their turn (within their context). Keep it at or below
	// the database pool size so that a lock holder never queues for a
	// connection while others queue for its lock. Zero means no bound.
	Concurrency int
	// Cache, when set, is told after each committed order that the product's
	// stock changed.
	Cache Invalidator
	// Logger receives what the caller cannot act on, such as a failed
	// release. Default: discard.
	Logger *slog.Logger
}

// Service places orders.
type Service struct {
	db    *gorm.DB
	locks Locker
	opt   Options
	slots *semaphore.Weighted // nil: unbounded
}

// NewService returns a Service that writes through db under locks.
func NewService(db *gorm.DB, locks Locker, opt Options) *Service {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{db: db, locks: locks, opt: opt}
	if opt.Concurrency > 0 {
		s.slots = semaphore.NewWeighted(int64(opt.Concurrency))
	}
	return s
}

const (
	// releaseTimeout bounds the release of a SKU lock after the transaction.
	releaseTimeout = 2 * time.Second
	// invalidateTimeout bounds telling the cache about a committed order.
	invalidateTimeout = time.Second
)

// PlaceOrder sells one unit of product sku to user.
//
// A product that is missing or sold out is refused at once, without the
// lock: stock only goes down during a sale, so a read of zero is final.
// Otherwise PlaceOrder takes the SKU's lock and, in one transaction,
// decrements the stock and inserts the order; the lock is released only
// after COMMIT has returned. A returned Order has been committed.
//
// With a non-empty idempotencyKey, a repeated call returns the order the
// first call created (Replayed set) and creates nothing.
//
// Errors: ErrInvalid, ErrNotFound, ErrSoldOut, ErrAlreadyOrdered,
// ErrIdempotencyMismatch, ErrBusy (joined with ErrStaleFence when MySQL
// refused a stale holder's write).
func (s *Service) PlaceOrder(ctx context.Context, sku, user int64, idempotencyKey string) (Order, error) {
	if err := validateOrder(sku, user, idempotencyKey); err != nil {
		return Order{}, err
	}
	if s.slots != nil {
		if err := s.slots.Acquire(ctx, 1); err != nil {
			return Order{}, fmt.Errorf("%w: waiting for a slot: %w", ErrBusy, err)
		}
		defer s.slots.Release(1)
	}
	db := s.db.WithContext(ctx)
	if idempotencyKey != "" {
		// A replay needs no lock.
		if o, ok, err := s.replay(db, sku, user, idempotencyKey); err != nil || ok {
			return o, classify(ctx, "place order", err)
		}
	}
	o, err := s.place(ctx, db, sku, user, idempotencyKey)
	if err != nil && idempotencyKey != "" {
		// A call with the same key may have committed meanwhile: then its
		// order is the answer, whatever this attempt ran into.
		switch o, ok, rerr := s.replay(db, sku, user, idempotencyKey); {
		case ok:
			return o, nil
		case errors.Is(rerr, ErrIdempotencyMismatch):
			return Order{}, rerr
		}
	}
	return o, err
}

// place checks the stock, takes the lock and runs the transaction.
func (s *Service) place(ctx context.Context, db *gorm.DB, sku, user int64, idempotencyKey string) (Order, error) {
	if err := inStock(db, sku); err != nil {
		return Order{}, classify(ctx, "place order", err)
	}
	lease, err := s.locks.Obtain(ctx, LockKey(sku))
	if err != nil {
		return Order{}, fmt.Errorf("%w: sku %d: %w", ErrBusy, sku, err)
	}
	defer s.release(ctx, lease)

	var o Order
	err = s.db.WithContext(lease.Context()).Transaction(func(tx *gorm.DB) error {
		var err error
		o, err = s.placeOrder(lease.Context(), tx, lease.Fence(), sku, user, idempotencyKey)
		return err
	})
	switch {
	case err == nil:
		s.invalidate(ctx, sku)
		return o, nil
	case duplicate(err) == userSKUIndex:
		return Order{}, fmt.Errorf("%w: user %d, sku %d", ErrAlreadyOrdered, user, sku)
	}
	return Order{}, s.classifyLease(ctx, lease, err)
}

// inStock refuses a product that does not exist or has no unit left.
func inStock(db *gorm.DB, sku int64) error {
	var p Product
	if err := db.Select("stock").Take(&p, sku).Error; err != nil {
		return notFound(err, sku)
	}
	if p.Stock <= 0 {
		return fmt.Errorf("%w: sku %d", ErrSoldOut, sku)
	}
	return nil
}

// placeOrder is PlaceOrder's transaction. One order per user and SKU, and
// one per idempotency key, are left to the unique indexes: a second INSERT
// fails and the transaction, stock write included, rolls back.
func (s *Service) placeOrder(ctx context.Context, tx *gorm.DB, fence, sku, user int64, idempotencyKey string) (Order, error) {
	var read Product
	if s.opt.Update == Naive {
		// The seeds' read-modify-write needs the value it will write back.
		if err := tx.Select("id", "stock", "fence").Take(&read, sku).Error; err != nil {
			return Order{}, notFound(err, sku)
		}
		if read.Stock <= 0 {
			return Order{}, fmt.Errorf("%w: sku %d", ErrSoldOut, sku)
		}
	}
	if s.opt.BeforeWrite != nil {
		s.opt.BeforeWrite(ctx, sku)
	}
	fenced := s.opt.Fencing && fence > 0
	if err := s.writeStock(tx, sku, read, fenced, fence); err != nil {
		return Order{}, err
	}
	o := Order{SKUID: sku, UserID: user, Fence: fence, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if idempotencyKey != "" {
		o.IdempotencyKey = &idempotencyKey
	}
	if err := tx.Create(&o).Error; err != nil {
		return Order{}, err
	}
	return o, nil
}

// writeStock takes one unit off product sku. read is the row a naive write
// read earlier in the transaction.
//
// A fenced naive write is a compare-and-set on the fence it read, not only a
// check that its token is the newest: a holder whose lease ran out while its
// write sat uncommitted in MySQL can still commit after the next holder has
// read the old stock, and that next holder's token is newer than the row's,
// yet the stock it read is stale. Any fenced write moves the fence, so an
// unchanged fence means an unchanged row.
func (s *Service) writeStock(tx *gorm.DB, sku int64, read Product, fenced bool, fence int64) error {
	var res *gorm.DB
	switch {
	case s.opt.Update == Guarded && fenced:
		res = tx.Exec("UPDATE products SET stock = stock - 1, fence = ? WHERE id = ? AND stock > 0 AND fence < ?", fence, sku, fence)
	case s.opt.Update == Guarded:
		res = tx.Exec("UPDATE products SET stock = stock - 1 WHERE id = ? AND stock > 0", sku)
	case fenced:
		res = tx.Exec("UPDATE products SET stock = ?, fence = ? WHERE id = ? AND fence = ? AND fence < ?",
			read.Stock-1, fence, sku, read.Fence, fence)
	default:
		// The seeds' read-modify-write. Its row count proves nothing (a row
		// already at the written value counts as unchanged), so it is not
		// checked: this write never refuses.
		return tx.Exec("UPDATE products SET stock = ? WHERE id = ?", read.Stock-1, sku).Error
	}
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected == 1 {
		return nil
	}
	// Refused: the product is gone, its stock ran out, a newer holder wrote
	// the row, or (naive) an older one wrote it after it was read. A locking
	// read sees the row as committed now, not as the transaction's snapshot
	// had it.
	var now Product
	if err := tx.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).Select("stock", "fence").Take(&now, sku).Error; err != nil {
		return notFound(err, sku)
	}
	if fenced && now.Fence >= fence {
		return fmt.Errorf("%w: %w: sku %d: token %d, row has %d", ErrBusy, ErrStaleFence, sku, fence, now.Fence)
	}
	if now.Stock > 0 {
		return fmt.Errorf("%w: sku %d changed after it was read (fence %d, now %d)", ErrBusy, sku, read.Fence, now.Fence)
	}
	return fmt.Errorf("%w: sku %d", ErrSoldOut, sku)
}

// replay finds the order created earlier under key. ok is false when there is
// none.
func (s *Service) replay(db *gorm.DB, sku, user int64, key string) (o Order, ok bool, err error) {
	res := db.Where("idempotency_key = ?", key).Limit(1).Find(&o)
	if res.Error != nil || res.RowsAffected == 0 {
		return Order{}, false, res.Error
	}
	if o.SKUID != sku || o.UserID != user {
		return Order{}, false, fmt.Errorf("%w: key %q", ErrIdempotencyMismatch, key)
	}
	o.Replayed = true
	return o, true, nil
}

// invalidate tells the cache that sku's stock changed. It runs after COMMIT,
// still under the SKU lock, and even when the caller has gone: the order
// stands, and a cache left holding the old stock would show it until the
// entry expires, which is what the log line reports.
func (s *Service) invalidate(ctx context.Context, sku int64) {
	if s.opt.Cache == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), invalidateTimeout)
	defer cancel()
	if err := s.opt.Cache.Invalidate(ctx, sku); err != nil {
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

// classifyLease is classify for errors met under a lease: work cut short
// because the lease was lost is ErrBusy.
func (s *Service) classifyLease(ctx context.Context, lease *lock.Lease, err error) error {
	if cause := context.Cause(lease.Context()); errors.Is(cause, lock.ErrNotHeld) && ctx.Err() == nil {
		return fmt.Errorf("%w: %w", ErrBusy, cause)
	}
	return classify(ctx, "place order", err)
}

// classify wraps database failures that may pass with ErrBusy and leaves
// domain errors as they are.
func classify(ctx context.Context, op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrBusy), errors.Is(err, ErrInvalid), errors.Is(err, ErrNotFound),
		errors.Is(err, ErrSoldOut), errors.Is(err, ErrAlreadyOrdered), errors.Is(err, ErrIdempotencyMismatch):
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrBusy, context.Cause(ctx))
	case transient(err):
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return fmt.Errorf("stock: %s: %w", op, err)
}

func validateOrder(sku, user int64, idempotencyKey string) error {
	switch {
	case sku <= 0:
		return fmt.Errorf("%w: sku_id must be a positive integer", ErrInvalid)
	case user <= 0:
		return fmt.Errorf("%w: user_id must be a positive integer", ErrInvalid)
	case idempotencyKey != "":
		return CheckIdempotencyKey(idempotencyKey)
	}
	return nil
}

func notFound(err error, id int64) error {
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return fmt.Errorf("%w: product %d", ErrNotFound, id)
	}
	return err
}
