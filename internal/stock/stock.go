// Package stock is the domain of shop: products with a stock count, orders
// that take one unit each, and the rules that keep the two consistent under
// any number of concurrent buyers and replicas.
//
// It knows nothing of HTTP. It declares what it needs from the outside — a
// Locker and an Invalidator — and uses MySQL through gorm.
package stock

import (
	"context"
	"regexp"
	"strconv"
	"time"

	"shop/internal/lock"
)

// The statuses of an order. An order is active while it is reserved or
// paid; a cancelled or expired one has given its unit back to the sale.
const (
	StatusReserved  = "reserved"
	StatusPaid      = "paid"
	StatusCancelled = "cancelled"
	StatusExpired   = "expired"
)

// Product is an item on sale.
type Product struct {
	ID           int64     `gorm:"column:id;primaryKey;autoIncrement:false"`
	Name         string    `gorm:"column:name"`
	PriceCents   int64     `gorm:"column:price_cents"`
	InitialStock int       `gorm:"column:initial_stock"`
	Stock        int       `gorm:"column:stock"`
	Fence        int64     `gorm:"column:fence"`
	UpdatedAt    time.Time `gorm:"column:updated_at;autoUpdateTime:false"`
	// SaleStartsAt and SaleEndsAt bound the sale (see Window); nil leaves
	// that side open. UTC, to the microsecond, as MySQL keeps them.
	SaleStartsAt *time.Time `gorm:"column:sale_starts_at"`
	SaleEndsAt   *time.Time `gorm:"column:sale_ends_at"`
}

// Order is one unit of one product sold to one user.
type Order struct {
	ID             int64     `gorm:"column:id;primaryKey"`
	SKUID          int64     `gorm:"column:sku_id"`
	UserID         int64     `gorm:"column:user_id"`
	IdempotencyKey *string   `gorm:"column:idempotency_key"`
	Fence          int64     `gorm:"column:fence"`
	CreatedAt      time.Time `gorm:"column:created_at;autoCreateTime:false"`
	// Status is one of the Status constants.
	Status string `gorm:"column:status;default:paid"`
	// PayBy is when a reservation expires unless paid, by MySQL's clock;
	// nil for an order paid when placed.
	PayBy *time.Time `gorm:"column:pay_by"`
	// PaidAt and PaymentID say when and by which payment /pay paid the
	// order; nil for an order paid when placed.
	PaidAt    *time.Time `gorm:"column:paid_at"`
	PaymentID *string    `gorm:"column:payment_id"`
	// ReturnedAt is when the order's unit went back to the sale: set on
	// cancelled and expired orders, and only on them.
	ReturnedAt *time.Time `gorm:"column:returned_at"`

	// Replayed is true when the order was placed earlier under the same
	// idempotency key and this call created nothing.
	Replayed bool `gorm:"-"`
}

// active reports whether o holds its unit: reserved or paid.
func (o Order) active() bool { return o.Status == StatusReserved || o.Status == StatusPaid }

// Locker gives exclusive leases on keys; internal/lock implements it.
type Locker interface {
	Obtain(ctx context.Context, key string) (*lock.Lease, error)
}

// FenceRaiser is what a Locker may do beyond Obtain (lock.Redis and
// lock.Redlock do): raise key's fencing counter to at least atLeast, never
// lower it. The order path calls it when MySQL refused a write because the
// row's fence was at or above the holder's token. Usually a newer holder
// wrote the row, and the counter is past it already; but if the counter
// fell behind the rows — a Redis restarted empty starts it again from its
// own clock, which may be behind the one that counted before — every holder
// of the SKU would be refused until that clock caught up. Raising the
// counter to the row's fence lets the next holder write.
type FenceRaiser interface {
	RaiseFence(ctx context.Context, key string, atLeast int64) error
}

// Invalidator is told when a product changed, so that a cache of products
// drops what it holds; internal/cache implements it.
type Invalidator interface {
	Invalidate(ctx context.Context, sku int64) error
}

// SoldOutInvalidator is an Invalidator that can also tell every replica,
// with the same invalidation, that the product sold out under the SKU's
// lock with fencing token fence (Service.SoldOutElsewhere on each).
type SoldOutInvalidator interface {
	InvalidateSoldOut(ctx context.Context, sku, fence int64) error
}

// LockKey is the lock key that guards a SKU.
func LockKey(sku int64) string { return "sku:" + strconv.FormatInt(sku, 10) }

var idempotencyKeyRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// CheckIdempotencyKey returns an ErrInvalid error unless k is 1–64
// characters of [A-Za-z0-9_-].
func CheckIdempotencyKey(k string) error {
	if !idempotencyKeyRE.MatchString(k) {
		return invalidf("%s must be 1-64 characters of A-Z a-z 0-9 _ -", FieldIdempotencyKey)
	}
	return nil
}
