// Package admin is the operators' changes of the sale — resetting the
// catalog, changing a product — and what must follow each of them across
// the fleet: the product cache reset or the product dropped from it, and
// every replica told of new stock.
//
// A change that has committed stands: what fails after it is a warning,
// not an error, because doing it again would repeat it (a seed deletes the
// orders placed since; a restock adds its units twice). What follows a
// commit runs on a context of its own, so a caller that gives up then does
// not leave the fleet behind.
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"shop/internal/notify"
	"shop/internal/stock"
)

// Catalog resets the catalog in MySQL; *stock.Catalog is one (SeedWith),
// and so is IfEmpty of one.
type Catalog interface {
	SeedWith(ctx context.Context, n, units int, o stock.SeedOptions) error
}

// Changer changes a product in MySQL; *stock.Service is one.
type Changer interface {
	ChangeProduct(ctx context.Context, sku int64, c stock.Change) (stock.Product, error)
}

// Cache is the product cache; *cache.Products is one. Reset drops every
// entry and rebuilds the Bloom filter from the catalog; Invalidate drops
// one product everywhere.
type Cache interface {
	Reset(ctx context.Context) (dropped int, err error)
	Invalidate(ctx context.Context, sku int64) error
}

// Restocks tells every replica that sku's stock went up (every product's,
// for 0), so that none refuses it from its memory of products sold out;
// *notify.Restocks is one.
type Restocks interface {
	Announce(ctx context.Context, sku int64) error
}

// Admin makes the operators' changes. Its zero value is not usable: build
// it with its fields set.
type Admin struct {
	Catalog  Catalog
	Changer  Changer
	Cache    Cache
	Restocks Restocks
	// Currency is the currency of the products a seed makes without one
	// (SHOP_CURRENCY); empty is USD.
	Currency string
	// Logger receives the warnings, at error level. Default: discard.
	Logger *slog.Logger
}

func (a *Admin) log() *slog.Logger {
	if a.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Logger
}

// IfEmpty is a Catalog whose seed leaves a catalog that has products as it
// is (shop seed --if-empty): its seed's *stock.NotEmptyError says so.
type IfEmpty struct{ Catalog *stock.Catalog }

// SeedWith seeds c's catalog if it has no products.
func (c IfEmpty) SeedWith(ctx context.Context, n, units int, o stock.SeedOptions) error {
	o.IfEmpty = true
	return c.Catalog.SeedWith(ctx, n, units, o)
}

// seedFollowUpTimeout bounds what follows a committed seed: the restock
// announcement and the cache reset, which rebuilds the Bloom filter from
// every product id. It stays well below nginx's proxy_read_timeout (25s), so
// that a committed seed is answered, with its warnings, rather than with
// nginx's 504, which invites a retry that would delete the orders since.
const seedFollowUpTimeout = 15 * time.Second

// Seeded is what a committed seed did beyond the catalog.
type Seeded struct {
	// Dropped is how many cached products were dropped.
	Dropped int
	// Warnings are what did not follow the seed.
	Warnings []Warning
}

// Warning is a step after a committed change that failed: Msg says what it
// means to the operator, Err why it failed (for the log, not the client).
type Warning struct {
	Msg string
	Err error
}

// Messages returns the warnings' messages.
func (s Seeded) Messages() []string { return messages(s.Warnings) }

func messages(warnings []Warning) []string {
	var msgs []string
	for _, w := range warnings {
		msgs = append(msgs, w.Msg)
	}
	return msgs
}

// SeedCatalog resets the catalog to products 1..n with units each, as o
// says (a currency of "" is Admin.Currency), then the product cache and its Bloom filter, and tells every
// replica to forget what it found sold out.
//
// An error means the catalog was not reset (stock.Catalog.SeedWith's,
// among them *stock.NotEmptyError from IfEmpty and
// stock.ErrRefundsUnsettled). Once it was, the seed
// stands: what fails after it is a warning, logged at error level.
func (a *Admin) SeedCatalog(ctx context.Context, n, units int, o stock.SeedOptions) (Seeded, error) {
	if o.Currency == "" {
		o.Currency = a.Currency
	}
	if err := a.Catalog.SeedWith(ctx, n, units, o); err != nil {
		return Seeded{}, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), seedFollowUpTimeout)
	defer cancel()
	var s Seeded
	warn := func(msg string, err error) {
		a.log().ErrorContext(ctx, "seed: the catalog was reset, but "+msg, "err", err)
		s.Warnings = append(s.Warnings, Warning{msg, err})
	}
	// Announced first: a replica refusing from memory is a wrong answer,
	// a stale cached product only a stale page.
	if err := a.Restocks.Announce(ctx, notify.All); err != nil {
		warn(fmt.Sprintf("the replicas were not told of the new stock: a replica may refuse a product it found sold out before the seed for up to %s", stock.DefaultSoldOutTTL), err)
	}
	dropped, err := a.Cache.Reset(ctx)
	if err != nil {
		warn("the product cache was not reset: product pages may show old stock until their cache entries expire (SHOP_CACHE_TTL), "+
			"and ids read as absent before the seed may answer 404 until theirs do (SHOP_CACHE_NULL_TTL); "+
			"the replicas rebuild the Bloom filter for the new catalog within seconds", err)
	}
	s.Dropped = dropped
	if err == nil {
		// Now that the filter of the new catalog is built: every replica
		// drops its copy of the old one (see cache.Products.Hear).
		if err := a.Restocks.Announce(ctx, notify.All); err != nil {
			a.log().WarnContext(ctx, "seed: the replicas were not told the Bloom filter was rebuilt: each reads it again once its copy is found of an older catalog (within a second)", "err", err)
		}
	}
	a.log().InfoContext(ctx, "seed: catalog reset", "products", n, "stock", units, "cache_entries_dropped", dropped, "warnings", len(s.Warnings))
	return s, nil
}

// Seed is SeedCatalog as the admin API answers it: its warnings in words
// for the client (handler.Seeder).
func (a *Admin) Seed(ctx context.Context, n, units int, o stock.SeedOptions) ([]string, error) {
	s, err := a.SeedCatalog(ctx, n, units, o)
	return s.Messages(), err
}

// changeFollowUpTimeout bounds what follows a committed change of a
// product: the restock announcement and the cache invalidation.
const changeFollowUpTimeout = 5 * time.Second

// ChangeProduct changes a product (see stock.Service.ChangeProduct), which
// has forgotten on this replica that the product was sold out if it was
// restocked; then it tells every other replica of a restock and drops the
// cached product, so that its page shows the change at once. It returns
// the product as MySQL has it after the change, and what did not follow it
// as warnings in words for the client (handler.ProductAdmin).
//
// An error means nothing changed, but for an unknown outcome
// (stock.ErrChangeOutcomeUnknown), which is followed up as a change that
// committed, since it may have: an announcement and a dropped cache entry
// are harmless if nothing changed, where leaving them out would keep the
// new units, if they are there, from the other replicas and the product
// page. Its error is returned all the same, and what fails in the
// follow-up is only logged.
func (a *Admin) ChangeProduct(ctx context.Context, sku int64, c stock.Change) (stock.Product, []string, error) {
	p, err := a.Changer.ChangeProduct(ctx, sku, c)
	switch {
	case errors.Is(err, stock.ErrOutcomeUnknown):
		a.follow(ctx, sku, c, "may have been changed")
		return stock.Product{}, nil, err
	case err != nil:
		return stock.Product{}, nil, err
	}
	return p, messages(a.follow(ctx, sku, c, "was changed")), nil
}

// follow is what follows a change c of product sku that changed, or may
// have: the restock announced, the cached product dropped. It runs on a
// context of its own, whether the client stays or not. What fails is
// logged at error level, changed saying whether the product was changed or
// may have been, and returned as warnings.
func (a *Admin) follow(ctx context.Context, sku int64, c stock.Change, changed string) []Warning {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), changeFollowUpTimeout)
	defer cancel()
	var warnings []Warning
	warn := func(msg string, err error) {
		a.log().ErrorContext(ctx, "change product: the product "+changed+", but "+msg, "sku", sku, "err", err)
		warnings = append(warnings, Warning{msg, err})
	}
	if c.AddStock != nil {
		if err := a.Restocks.Announce(ctx, sku); err != nil {
			warn(fmt.Sprintf("the other replicas were not told of the new stock: one that found the product sold out may refuse it for up to %s", stock.DefaultSoldOutTTL), err)
		}
	}
	if err := a.Cache.Invalidate(ctx, sku); err != nil {
		warn("the product cache was not updated: the product page may show the old stock and sale window until its cache entry expires (SHOP_CACHE_TTL)", err)
	}
	return warnings
}
