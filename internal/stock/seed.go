package stock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"shop/internal/mysqldb"
)

// A seed resets the catalog: products 1..n with their stock, and no order,
// refund owed or order counter left from before, in one transaction. Seeds
// of one database run one after the other: the first statement of each
// raises the catalog's epoch (sqlRaiseEpoch), which every seed writes, and
// so holds that row's lock until the transaction ends. The lock is a row's,
// not a user lock (GET_LOCK) of the server the seed talks to: on a Galera
// cluster two seeds sent to two nodes both write the row, and the one
// ordered second fails certification (1213) instead of seeding again.

// seedBatch is how many products one INSERT carries.
const seedBatch = 1000

// unsettledNamed is how many unsettled refunds a refused seed names.
const unsettledNamed = 10

// seedAttempts is how many times a seed runs its transaction while it is
// rolled back for a deadlock or, on Galera, a certification failure: the
// loser of two seeds at once on two nodes runs again, after the winner,
// and sees what the winner committed.
const seedAttempts = 5

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
// another seed of the database still running after the server's row-lock
// wait, innodb_lock_wait_timeout; a seed is a reset, so it may be repeated
// whether or not the failed one committed).
func (c *Catalog) Seed(ctx context.Context, n, stock int) error {
	return c.SeedWindow(ctx, n, stock, Window{})
}

// SeedWindow is Seed with every product on sale within w (see Window).
// Errors: those of Seed, and ErrInvalid for a window Normalize refuses.
func (c *Catalog) SeedWindow(ctx context.Context, n, stock int, w Window) error {
	return c.SeedWith(ctx, n, stock, SeedOptions{Window: w})
}

// SeedOptions are how a seed makes its products, and what it does with
// the refunds of the catalog it replaces.
type SeedOptions struct {
	// Window is when every product is on sale.
	Window Window
	// PriceCents is every product's price, in Currency's minor unit; 0
	// gives each a price of its own between 1.00 and 99.99.
	PriceCents int64
	// Currency is the products' currency, three upper-case letters;
	// empty is USD.
	Currency string
	// IfEmpty seeds only a catalog without products: one that has some
	// is left as it is, orders included, and the error is a
	// *NotEmptyError.
	IfEmpty bool
	// DiscardRefunds lets the seed delete the refunds still unsettled
	// (and their payments in the ledger); without it a seed refuses while
	// there are any, with ErrRefundsUnsettled.
	DiscardRefunds bool
}

func (o SeedOptions) validate() (SeedOptions, error) {
	if o.PriceCents < 0 || o.PriceCents > 1_000_000_000_000 {
		return o, invalidf("%s must be between 0 and 1000000000000", FieldPrice)
	}
	if o.Currency == "" {
		o.Currency = "USD"
	}
	w, err := o.Window.Normalize()
	o.Window = w
	if err != nil {
		return o, err
	}
	return o, CheckCurrency(o.Currency)
}

// SeedWith is Seed with the products and refunds as o says. Errors: those
// of SeedWindow, and ErrRefundsUnsettled (nothing changed).
func (c *Catalog) SeedWith(ctx context.Context, n, stock int, o SeedOptions) error {
	return c.seed(ctx, n, stock, o)
}

// SeedWindowIfEmpty is SeedWindow on a catalog without products only. A
// catalog that has some is left as it is, orders included, and the error is
// a *NotEmptyError. The check is made in the seed's transaction, once it
// holds the epoch's row: of two runs at once on an empty catalog, one seeds
// and the other then finds its products — on a Galera cluster too, through
// two nodes, where the other fails certification and runs again. Errors: those of SeedWindow, and
// *NotEmptyError.
func (c *Catalog) SeedWindowIfEmpty(ctx context.Context, n, stock int, w Window) error {
	return c.SeedWith(ctx, n, stock, SeedOptions{Window: w, IfEmpty: true})
}

// seed is SeedWindow, or SeedWindowIfEmpty when ifEmpty is set. Its
// transaction raises the catalog's epoch first, and so waits there for
// any other seed of the database to end; it sees what that one committed,
// as its first read comes after. A transaction rolled back for a deadlock
// or a certification failure committed nothing, and runs again, up to
// seedAttempts times.
func (c *Catalog) seed(ctx context.Context, n, stock int, o SeedOptions) error {
	o, err := o.validate()
	if err != nil {
		return err
	}
	if n < 0 || n > 10_000_000 {
		return invalidf("%s must be between 0 and 10000000", FieldProducts)
	}
	if stock < 0 || stock > 1_000_000_000 {
		return invalidf("%s must be between 0 and 1000000000", FieldStock)
	}
	for attempt := 1; ; attempt++ {
		// At REPEATABLE READ whatever the server's default, so that its
		// DELETEs lock the gaps too: an order counter made meanwhile
		// (ensureCounter) waits for the seed, and then counts what it left.
		err = c.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if _, _, err := run(tx, sqlRaiseEpoch); err != nil {
				return fmt.Errorf("seed: epoch: %w", err)
			}
			if o.IfEmpty {
				var products int64
				if _, err := read(tx, &products, sqlCountProducts); err != nil {
					return err
				}
				if products > 0 {
					return &NotEmptyError{Products: products}
				}
			}
			return resetCatalog(tx, n, stock, o)
		}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if !mysqldb.Deadlock(err) || attempt == seedAttempts || ctx.Err() != nil {
			break
		}
	}
	var notEmpty *NotEmptyError
	if errors.As(err, &notEmpty) {
		return notEmpty
	}
	return classify(ctx, "seed", err)
}

// resetCatalog deletes every order, every refund settled or discarded,
// every user's order counter and every product in tx, and inserts products
// 1..n with stock units each, as o says; tx has raised the catalog's
// epoch.
// Settled refunds and the payments ledger stay: they are money's history,
// not the sale's.
func resetCatalog(tx *gorm.DB, n, stock int, o SeedOptions) error {
	var unsettled int64
	if _, err := read(tx, &unsettled, sqlCountUnsettled); err != nil {
		return err
	}
	deletes := []string{sqlDeleteOrders, sqlDeleteCounters, sqlDeleteProducts}
	if unsettled > 0 {
		if !o.DiscardRefunds {
			var named []string
			if _, err := read(tx, &named, sqlNameUnsettled, unsettledNamed); err != nil {
				return err
			}
			more := ""
			if unsettled > int64(len(named)) {
				more = ", …"
			}
			return fmt.Errorf("%w: %d refunds are not settled (%s%s)", ErrRefundsUnsettled, unsettled, strings.Join(named, ", "), more)
		}
		deletes = append([]string{sqlDiscardPayments, sqlDeleteUnsettled}, deletes...)
	}
	for _, q := range deletes {
		if _, _, err := run(tx, q); err != nil {
			return err
		}
	}
	for first := 1; first <= n; first += seedBatch {
		last := min(first+seedBatch-1, n)
		args := make([]any, 0, (last-first+1)*sqlProductRowCount)
		for id := first; id <= last; id++ {
			price := o.PriceCents
			if price == 0 {
				price = int64(100 + id*37%9900)
			}
			args = append(args, id, fmt.Sprintf("Product %d", id), price, o.Currency, stock, stock, o.Window.StartsAt, o.Window.EndsAt)
		}
		insert := sqlInsertProduct + strings.Repeat(sqlProductRow+", ", last-first) + sqlProductRow
		if _, _, err := run(tx, insert, args...); err != nil {
			return err
		}
	}
	return nil
}

// PriceUnpriced gives currency to every product that has none (shop
// migrate, SHOP_CURRENCY), and returns how many it changed. Errors:
// ErrInvalid, ErrBusy.
func (c *Catalog) PriceUnpriced(ctx context.Context, currency string) (int64, error) {
	if err := CheckCurrency(currency); err != nil {
		return 0, err
	}
	n, _, err := run(c.db.WithContext(ctx), sqlPriceUnpriced, currency)
	return n, classify(ctx, "currency of products", err)
}
