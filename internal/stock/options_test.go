package stock_test

import (
	"log/slog"
	"time"

	"gorm.io/gorm"

	"shop/internal/stock"
)

// options is what a test sets of a Service beyond its pool and its lock:
// its settings, its hooks, and the dependencies a test replaces.
type options struct {
	stock.Settings
	stock.Hooks
	Announcer stock.Announcer
	Checkouts stock.Checkouts
	Reads     *gorm.DB
	Public    *stock.Catalog
	Lookups   *stock.Catalog
	Logger    *slog.Logger
	Now       func() time.Time
}

// newService is a Service on db under locks, as o says.
func newService(db *gorm.DB, locks stock.Locker, o options) *stock.Service {
	return stock.NewService(stock.Deps{DB: db, Locks: locks, Announcer: o.Announcer, Checkouts: o.Checkouts, Reads: o.Reads, Public: o.Public, Lookups: o.Lookups, Logger: o.Logger, Now: o.Now},
		o.Settings, o.Hooks)
}
