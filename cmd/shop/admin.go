package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"shop/internal/cache"
	"shop/internal/handler"
	"shop/internal/notify"
	"shop/internal/stock"

	"github.com/go-sql-driver/mysql"
)

// catalogSeeder resets the catalog in MySQL; *stock.Catalog is one.
type catalogSeeder interface {
	SeedWindow(ctx context.Context, n, units int, sale stock.Window) error
}

// seedFollowUpTimeout bounds what follows a committed seed: the restock
// announcement and the cache reset, which rebuilds the Bloom filter from
// every product id. It stays well below nginx's proxy_read_timeout (25s), so
// that a committed seed is answered, with its warnings, rather than with
// nginx's 504, which invites a retry that would delete the orders since.
const seedFollowUpTimeout = 15 * time.Second

// seeded is what a committed seed did beyond the catalog.
type seeded struct {
	// dropped is how many cached products were dropped.
	dropped int
	// warnings are what did not follow the seed.
	warnings []seedWarning
}

// seedWarning is a step after a committed seed that failed: msg says what
// it means to the user, err why it failed (for the log, not the client).
type seedWarning struct {
	msg string
	err error
}

// messages returns the warnings' messages.
func (s seeded) messages() []string {
	var msgs []string
	for _, w := range s.warnings {
		msgs = append(msgs, w.msg)
	}
	return msgs
}

// seedCatalog resets the catalog, then the product cache and its Bloom
// filter, and tells every replica to forget what it found sold out.
//
// An error means the catalog was not reset. Once it was, the seed stands:
// what fails after it is a warning, logged at error level, and not an
// error, because retrying a seed deletes the orders placed since. What
// follows the commit runs on a context of its own, so a caller that gives up
// then does not leave the old Bloom filter (which refuses the new products)
// and the old cached pages in place.
func seedCatalog(ctx context.Context, catalog catalogSeeder, products *cache.Products, restocks *notify.Restocks, log *slog.Logger, n, units int, sale stock.Window) (seeded, error) {
	if err := catalog.SeedWindow(ctx, n, units, sale); err != nil {
		return seeded{}, busyIfUnreachable(err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), seedFollowUpTimeout)
	defer cancel()
	var s seeded
	warn := func(msg string, err error) {
		log.ErrorContext(ctx, "seed: the catalog was reset, but "+msg, "err", err)
		s.warnings = append(s.warnings, seedWarning{msg, err})
	}
	// Announced first: a replica refusing from memory is a wrong answer,
	// a stale cached product only a stale page.
	if err := restocks.Announce(ctx, notify.All); err != nil {
		warn(fmt.Sprintf("the replicas were not told of the new stock: a replica may refuse a product it found sold out before the seed for up to %s", stock.DefaultSoldOutTTL), err)
	}
	dropped, err := products.Reset(ctx)
	if err != nil {
		warn("the product cache was not reset: product pages may show old stock until their cache entries expire (SHOP_CACHE_TTL), "+
			"and ids read as absent before the seed may answer 404 until theirs do (SHOP_CACHE_NULL_TTL); "+
			"the replicas rebuild the Bloom filter for the new catalog within seconds", err)
	}
	s.dropped = dropped
	if err == nil {
		// Now that the filter of the new catalog is built: every replica
		// drops its copy of the old one (see cache.Products.Hear).
		if err := restocks.Announce(ctx, notify.All); err != nil {
			log.WarnContext(ctx, "seed: the replicas were not told the Bloom filter was rebuilt: each reads it again once its copy is found of an older catalog (within a second)", "err", err)
		}
	}
	log.InfoContext(ctx, "seed: catalog reset", "products", n, "stock", units, "cache_entries_dropped", dropped, "warnings", len(s.warnings))
	return s, nil
}

// newSeeder is the admin API's seed: seedCatalog, its warnings in words for
// the client.
func newSeeder(catalog catalogSeeder, products *cache.Products, restocks *notify.Restocks, log *slog.Logger) handler.Seeder {
	return handler.SeedFunc(func(ctx context.Context, n, units int, sale stock.Window) ([]string, error) {
		s, err := seedCatalog(ctx, catalog, products, restocks, log, n, units, sale)
		return s.messages(), err
	})
}

// productChanger changes a product in MySQL; *stock.Service is one.
type productChanger interface {
	ChangeProduct(ctx context.Context, sku int64, c stock.Change) (stock.Product, error)
}

// productInvalidator drops a cached product; *cache.Products is one.
type productInvalidator interface {
	Invalidate(ctx context.Context, sku int64) error
}

// changeFollowUpTimeout bounds what follows a committed change of a
// product: the restock announcement and the cache invalidation.
const changeFollowUpTimeout = 5 * time.Second

// changeProduct changes a product (see stock.Service.ChangeProduct), which
// has forgotten on this replica that the product was sold out if it was
// restocked; then it tells every other replica of a restock and drops the
// cached product, so that its page shows the change at once.
//
// An error means nothing changed, but for an unknown outcome (below). Once
// the change committed it stands, as a seed does (see seedCatalog): what
// fails after it is a warning, logged at error level — a retry would add the
// units a second time — and what follows runs on a context of its own (see
// followChange).
//
// A change whose outcome is unknown (stock.ErrChangeOutcomeUnknown) is
// followed up as one that committed, since it may have: an announcement and
// a dropped cache entry are harmless if nothing changed, where leaving them
// out would keep the new units, if they are there, from the other replicas
// and the product page. Its error is returned all the same, and what fails
// in the follow-up is only logged.
func changeProduct(ctx context.Context, changer productChanger, products productInvalidator, restocks *notify.Restocks, log *slog.Logger,
	sku int64, c stock.Change) (stock.Product, []string, error) {
	p, err := changer.ChangeProduct(ctx, sku, c)
	switch {
	case errors.Is(err, stock.ErrOutcomeUnknown):
		followChange(ctx, products, restocks, log, sku, c, "may have been changed")
		return stock.Product{}, nil, err
	case err != nil:
		return stock.Product{}, nil, err
	}
	return p, followChange(ctx, products, restocks, log, sku, c, "was changed"), nil
}

// followChange is what follows a change c of product sku that changed, or
// may have: the restock announced, the cached product dropped. It runs on a
// context of its own, whether the client stays or not. What fails is logged
// at error level, changed saying whether the product was changed or may
// have been, and returned as warnings in words for the client.
func followChange(ctx context.Context, products productInvalidator, restocks *notify.Restocks, log *slog.Logger,
	sku int64, c stock.Change, changed string) []string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), changeFollowUpTimeout)
	defer cancel()
	var warnings []string
	warn := func(msg string, err error) {
		log.ErrorContext(ctx, "change product: the product "+changed+", but "+msg, "sku", sku, "err", err)
		warnings = append(warnings, msg)
	}
	if c.AddStock != nil {
		if err := restocks.Announce(ctx, sku); err != nil {
			warn(fmt.Sprintf("the other replicas were not told of the new stock: one that found the product sold out may refuse it for up to %s", stock.DefaultSoldOutTTL), err)
		}
	}
	if err := products.Invalidate(ctx, sku); err != nil {
		warn("the product cache was not updated: the product page may show the old stock and sale window until its cache entry expires (SHOP_CACHE_TTL)", err)
	}
	return warnings
}

// newProductAdmin is the admin API's change of a product: changeProduct.
func newProductAdmin(changer productChanger, products productInvalidator, restocks *notify.Restocks, log *slog.Logger) handler.ProductAdmin {
	return handler.ChangeProductFunc(func(ctx context.Context, sku int64, c stock.Change) (stock.Product, []string, error) {
		return changeProduct(ctx, changer, products, restocks, log, sku, c)
	})
}

// busyIfUnreachable marks a seed that failed because MySQL could not be
// reached (down, or the connection lost) as stock.ErrBusy, a 503 to retry
// rather than a 500. Nothing was written: the seed is one transaction.
func busyIfUnreachable(err error) error {
	var netErr net.Error
	switch {
	case errors.Is(err, stock.ErrBusy), errors.Is(err, stock.ErrInvalid):
		return err
	case errors.As(err, &netErr), errors.Is(err, driver.ErrBadConn), errors.Is(err, mysql.ErrInvalidConn):
		return fmt.Errorf("%w: seed: %w", stock.ErrBusy, err)
	}
	return err
}
