package stock

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Catalog reads and resets products in MySQL.
type Catalog struct {
	db *gorm.DB
	// public, when set, bounds the reads made for public requests (see
	// Public), or the lifecycle's look-ups (see Lookups).
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
	return &Catalog{db: c.db, public: newGate(width, wait, "public reads")}
}

// Lookups returns a Catalog on the same pool for the lifecycle's look-ups
// (Deps.Lookups): the order a buyer's cancellation or checkout is for, and
// a buyer's own order read with its identity proven. They run at most
// width at once, each waiting up to wait for a place, under a gate of
// their own: a flood of anonymous reads, which fills the public gate, then
// never refuses a buyer who cancels or pays near pay_by.
func (c *Catalog) Lookups(width int, wait time.Duration) *Catalog {
	return &Catalog{db: c.db, public: newGate(width, wait, "order look-ups")}
}

// Product returns the product with id. Errors: ErrInvalid, ErrNotFound.
func (c *Catalog) Product(ctx context.Context, id int64) (Product, error) {
	if err := validateID(id); err != nil {
		return Product{}, err
	}
	var p Product
	err := c.public.pass(ctx, "product", func() error { return readProduct(c.db.WithContext(ctx), &p, sqlProduct, id) })
	if err != nil {
		return Product{}, classify(ctx, "product", err)
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
	err := c.public.pass(ctx, "stock", func() error { return readProduct(c.db.WithContext(ctx), &p, sqlStock, id) })
	if err != nil {
		return 0, classify(ctx, "stock", err)
	}
	return p.Stock, nil
}

// Order returns user's order id as MySQL has it now. Errors: ErrInvalid,
// ErrOrderNotFound (also for another user's order), ErrBusy.
func (c *Catalog) Order(ctx context.Context, user, id int64) (Order, error) {
	f, err := c.order(ctx, user, id)
	return f.Order, err
}

// order is readOrder through the gate.
func (c *Catalog) order(ctx context.Context, user, id int64) (found, error) {
	if err := validateOrderOf(user, id); err != nil {
		return found{}, err
	}
	var f found
	err := c.public.pass(ctx, "read order", func() (err error) {
		f, err = readOrder(c.db.WithContext(ctx), user, id)
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
	_, err := read(db, &ids, sqlProductIDs)
	return ids, err
}

// catalogEpoch reads the one row of catalog_epoch; none is epoch 0.
func catalogEpoch(db *gorm.DB) (int64, error) {
	var epoch int64
	_, err := read(db, &epoch, sqlCatalogEpoch)
	return epoch, err
}

// readProduct reads product id with q into p: ErrNotFound when there is
// none.
func readProduct(db *gorm.DB, p *Product, q string, id int64) error {
	found, err := read(db, p, q, id)
	if err == nil && !found {
		err = fmt.Errorf("%w: product %d", ErrNotFound, id)
	}
	return err
}

// validateID refuses a product id that is not positive.
func validateID(id int64) error {
	if id <= 0 {
		return invalidf("%s must be a positive integer", FieldProduct)
	}
	return nil
}
