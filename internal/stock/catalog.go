package stock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Catalog reads and resets products in MySQL.
type Catalog struct {
	db *gorm.DB
	// public, when set, bounds the reads made for public requests (see
	// Public).
	public *gate
}

// NewCatalog returns a Catalog on db.
func NewCatalog(db *gorm.DB) *Catalog { return &Catalog{db: db} }

// Public returns a Catalog on the same pool whose reads for public
// requests — Product, Stock, Order, Replay — run at most width at once:
// one that waits longer than wait for a place is refused with ErrBusy
// (a 503 to retry). Give it a pool of its own of width connections, so
// that a flood of such reads, the cheapest thing anyone can send, never
// takes a connection the order path or the readiness check needs, and
// never queues at all.
func (c *Catalog) Public(width int, wait time.Duration) *Catalog {
	return &Catalog{db: c.db, public: newGate(width, wait)}
}

// Product returns the product with id. Errors: ErrInvalid, ErrNotFound.
func (c *Catalog) Product(ctx context.Context, id int64) (Product, error) {
	if err := validateID(id); err != nil {
		return Product{}, err
	}
	var p Product
	err := c.public.pass(ctx, "product", func() error { return c.db.WithContext(ctx).Take(&p, id).Error })
	if err != nil {
		return Product{}, classify(ctx, "product", notFound(err, id))
	}
	return p, nil
}

// Stock returns the product's stock as MySQL has it now.
// Errors: ErrInvalid, ErrNotFound.
func (c *Catalog) Stock(ctx context.Context, id int64) (int, error) {
	if err := validateID(id); err != nil {
		return 0, err
	}
	var p Product
	err := c.public.pass(ctx, "stock", func() error { return c.db.WithContext(ctx).Select("id", "stock").Take(&p, id).Error })
	if err != nil {
		return 0, classify(ctx, "stock", notFound(err, id))
	}
	return p.Stock, nil
}

// Order returns user's order id as MySQL has it now. Errors: ErrInvalid,
// ErrOrderNotFound (also for another user's order), ErrBusy.
func (c *Catalog) Order(ctx context.Context, user, id int64) (Order, error) {
	f, err := c.lookUp(ctx, user, id)
	return f.Order, err
}

// lookUp is lookUp, through the gate.
func (c *Catalog) lookUp(ctx context.Context, user, id int64) (found, error) {
	if err := validateOrderOf(user, id); err != nil {
		return found{}, err
	}
	var f found
	err := c.public.pass(ctx, "read order", func() (err error) {
		f, err = lookUp(c.db.WithContext(ctx), user, id)
		return err
	})
	return f, classify(ctx, "read order", err)
}

// Replay returns the order user placed earlier under idempotency key,
// Replayed: what a request sent again with the key is answered, whatever
// stops it going further (a rate limit). Errors: ErrOrderNotFound (the key
// placed no order), ErrIdempotencyMismatch (it placed one of another SKU),
// ErrInvalid, ErrBusy.
func (c *Catalog) Replay(ctx context.Context, sku, user int64, key string) (Order, error) {
	if err := CheckOrder(sku, user, key); err != nil {
		return Order{}, err
	}
	var o Order
	var ok bool
	err := c.public.pass(ctx, "replay", func() (err error) {
		o, ok, err = replay(c.db.WithContext(ctx), sku, user, key)
		return err
	})
	switch {
	case err != nil:
		return Order{}, classify(ctx, "replay", err)
	case !ok:
		return Order{}, fmt.Errorf("%w: no order of user %d under key %q", ErrOrderNotFound, user, key)
	}
	return o, nil
}

// ProductIDs returns the id of every product, in ascending order.
func (c *Catalog) ProductIDs(ctx context.Context) ([]int64, error) {
	ids, err := productIDs(c.db.WithContext(ctx))
	if err != nil {
		return nil, classify(ctx, "product ids", err)
	}
	return ids, nil
}

// Epoch returns the catalog's epoch: how many times it was reset. Every
// seed raises it in its own transaction, so that what is built from the
// catalog's ids elsewhere (the product cache's Bloom filter) can record the
// epoch it was built from and be told stale when the catalog has moved on.
func (c *Catalog) Epoch(ctx context.Context) (int64, error) {
	epoch, err := catalogEpoch(c.db.WithContext(ctx))
	if err != nil {
		return 0, classify(ctx, "catalog epoch", err)
	}
	return epoch, nil
}

// ProductIDsWithEpoch returns the id of every product, in ascending order,
// and the catalog's epoch they are of: both are read in one snapshot, so a
// seed that commits meanwhile is in both or in neither.
func (c *Catalog) ProductIDsWithEpoch(ctx context.Context) (ids []int64, epoch int64, err error) {
	err = c.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// The snapshot of a REPEATABLE READ transaction is taken at its
		// first read and serves both.
		if epoch, err = catalogEpoch(tx); err != nil {
			return err
		}
		ids, err = productIDs(tx)
		return err
	}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, 0, classify(ctx, "product ids", err)
	}
	return ids, epoch, nil
}

func productIDs(db *gorm.DB) ([]int64, error) {
	ids := []int64{}
	err := db.Model(&Product{}).Order("id").Pluck("id", &ids).Error
	return ids, err
}

// catalogEpoch reads the one row of catalog_epoch; none is epoch 0.
func catalogEpoch(db *gorm.DB) (int64, error) {
	var epochs []int64
	if err := db.Table("catalog_epoch").Where("id = 1").Pluck("epoch", &epochs).Error; err != nil {
		return 0, err
	}
	if len(epochs) == 0 {
		return 0, nil
	}
	return epochs[0], nil
}

// seedBatch is how many products one INSERT carries.
const seedBatch = 1000

// seedLockWait bounds how long a seed waits for another seed of the same
// database to end.
const seedLockWait = 2 * time.Minute

// seedLock names the seeds' lock: a MySQL user lock (GET_LOCK), which is
// server-wide, so it is named after the database, hashed to stay within
// the 64 characters a lock name may have.
const seedLock = "CONCAT('shop_seed_', MD5(COALESCE(DATABASE(), '')))"

// NotEmptyError is what SeedWindowIfEmpty returns for a catalog that has
// products: it left the catalog, and its orders, as they were.
type NotEmptyError struct {
	// Products is how many products the catalog has.
	Products int64
}

func (e *NotEmptyError) Error() string {
	return fmt.Sprintf("stock: the catalog has %d products: not seeded", e.Products)
}

// Seed replaces the catalog with products 1..n, each with stock units,
// deletes every order, every refund owed and every user's order counter,
// and raises the catalog's epoch (see Epoch), in one transaction.
// Errors: ErrInvalid, ErrBusy (MySQL down or refusing work for now, or
// another seed of the database still running after seedLockWait; a seed is
// a reset, so it may be repeated whether or not the failed one committed).
func (c *Catalog) Seed(ctx context.Context, n, stock int) error {
	return c.SeedWindow(ctx, n, stock, Window{})
}

// SeedWindow is Seed with every product on sale within w (see Window).
// Errors: those of Seed, and ErrInvalid for a window Normalize refuses.
func (c *Catalog) SeedWindow(ctx context.Context, n, stock int, w Window) error {
	return c.seed(ctx, n, stock, w, false)
}

// SeedWindowIfEmpty is SeedWindow on a catalog without products only. A
// catalog that has some is left as it is, orders included, and the error is
// a *NotEmptyError. The check is made in the seed's transaction, under the
// seeds' lock: of two runs at once on an empty catalog, one seeds and the
// other then finds its products. Errors: those of SeedWindow, and
// *NotEmptyError.
func (c *Catalog) SeedWindowIfEmpty(ctx context.Context, n, stock int, w Window) error {
	return c.seed(ctx, n, stock, w, true)
}

// seed is SeedWindow, or SeedWindowIfEmpty when ifEmpty is set. Every seed
// of a database holds the seeds' lock, on a connection of its own, from
// before its transaction begins until after it ends, so that seeds of one
// database run one after the other and each sees what the one before
// committed.
func (c *Catalog) seed(ctx context.Context, n, stock int, w Window, ifEmpty bool) error {
	w, err := w.Normalize()
	if err != nil {
		return err
	}
	if n < 0 || n > 10_000_000 {
		return invalidf("%s must be between 0 and 10000000", FieldProducts)
	}
	if stock < 0 || stock > 1_000_000_000 {
		return invalidf("%s must be between 0 and 1000000000", FieldStock)
	}
	err = c.db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		if err := lockSeeds(conn); err != nil {
			return err
		}
		defer unlockSeeds(ctx, conn)
		// At REPEATABLE READ whatever the server's default, so that its
		// DELETEs lock the gaps too: an order counter made meanwhile
		// (ensureCounter) waits for the seed, and then counts what it left.
		return conn.Transaction(func(tx *gorm.DB) error {
			if ifEmpty {
				var products int64
				if err := tx.Model(&Product{}).Count(&products).Error; err != nil {
					return err
				}
				if products > 0 {
					return &NotEmptyError{Products: products}
				}
			}
			return resetCatalog(tx, n, stock, w)
		}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	})
	var notEmpty *NotEmptyError
	if errors.As(err, &notEmpty) {
		return notEmpty
	}
	return classify(ctx, "seed", err)
}

// lockSeeds takes the seeds' lock on conn, waiting up to seedLockWait.
func lockSeeds(conn *gorm.DB) error {
	var got sql.NullInt64
	if err := conn.Raw("SELECT GET_LOCK("+seedLock+", ?)", int(seedLockWait.Seconds())).Row().Scan(&got); err != nil {
		return fmt.Errorf("seed lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("%w: another seed of this database has been running for over %s", ErrBusy, seedLockWait)
	}
	return nil
}

// unlockSeeds gives the seeds' lock back once the transaction has ended,
// even when ctx has. If that fails, the connection has broken, which ends
// its session and with it the lock.
func unlockSeeds(ctx context.Context, conn *gorm.DB) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	conn.WithContext(ctx).Exec("DO RELEASE_LOCK(" + seedLock + ")")
}

// resetCatalog deletes every order, every refund owed, every user's order
// counter and every product in tx, inserts products 1..n with stock units
// each, on sale within w, and raises the catalog's epoch.
func resetCatalog(tx *gorm.DB, n, stock int, w Window) error {
	if err := tx.Exec("DELETE FROM orders").Error; err != nil {
		return err
	}
	// The refunds owed are of those orders.
	if err := tx.Exec("DELETE FROM refunds").Error; err != nil {
		return err
	}
	// The per-user order counters go with the orders they count.
	if err := tx.Exec("DELETE FROM user_orders").Error; err != nil {
		return err
	}
	if err := tx.Exec("DELETE FROM products").Error; err != nil {
		return err
	}
	if err := tx.Exec("INSERT INTO catalog_epoch (id, epoch) VALUES (1, 1) ON DUPLICATE KEY UPDATE epoch = epoch + 1").Error; err != nil {
		return err
	}
	batch := make([]Product, 0, min(n, seedBatch))
	for id := 1; id <= n; id++ {
		batch = append(batch, Product{
			ID:           int64(id),
			Name:         fmt.Sprintf("Product %d", id),
			PriceCents:   int64(100 + id*37%9900),
			InitialStock: stock,
			Stock:        stock,
			SaleStartsAt: w.StartsAt,
			SaleEndsAt:   w.EndsAt,
		})
		if len(batch) == cap(batch) || id == n {
			if err := tx.Omit("updated_at").Create(&batch).Error; err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return nil
}

func validateID(id int64) error {
	if id <= 0 {
		return invalidf("%s must be a positive integer", FieldProduct)
	}
	return nil
}
