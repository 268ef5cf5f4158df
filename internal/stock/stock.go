// Package stock is the domain of shop: products with a stock count, orders
// that take one unit each, and the rules that keep the two consistent under
// any number of concurrent buyers and replicas.
//
// It knows nothing of HTTP. It declares what it needs from the outside — a
// Locker and an Announcer — and uses MySQL through gorm, every statement
// of it in sql.go. Following one order through the code, the files read in
// this order: order.go (an order's path: placed, queued, its turn),
// soldout.go (what this replica knows without asking), batch.go (the
// batch's transaction), tx.go, idempotency.go, userlimit.go, errors.go and
// announce.go (what the fleet is told). lifecycle.go pays, cancels and
// expires orders; admin.go and seed.go change products and reset the
// catalog; catalog.go reads for the public. service.go is what a Service is
// built from.
package stock

import (
	"time"
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
	ID         int64  `gorm:"column:id;primaryKey;autoIncrement:false"`
	Name       string `gorm:"column:name"`
	PriceCents int64  `gorm:"column:price_cents"`
	// Currency is the price's currency, three letters, upper-case (ISO
	// 4217); the price is in its minor unit.
	Currency     string    `gorm:"column:currency"`
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
	// PaidAt and PaymentID say when and by which payment the provider
	// reported the order was paid; nil for an order paid when placed.
	PaidAt    *time.Time `gorm:"column:paid_at"`
	PaymentID *string    `gorm:"column:payment_id"`
	// ReturnedAt is when the order's unit went back to the sale: set on
	// cancelled and expired orders, and only on them.
	ReturnedAt *time.Time `gorm:"column:returned_at"`
	// AmountCents and Currency are what the order owes: its product's
	// price and currency when it was placed. Nil on orders from before
	// amounts.
	AmountCents *int64  `gorm:"column:amount_cents"`
	Currency    *string `gorm:"column:currency"`
	// PaymentIntent and ClientSecret are its Stripe checkout's, and
	// CheckoutKey the Idempotency-Key that checkout was created with; nil
	// before a checkout.
	PaymentIntent *string `gorm:"column:payment_intent"`
	ClientSecret  *string `gorm:"column:client_secret"`
	CheckoutKey   *string `gorm:"column:checkout_key"`
	// EventSeq is the sequence number of the order's last event (events.go),
	// 0 while it has had none.
	EventSeq int64 `gorm:"column:event_seq"`

	// Replayed is true when the order was placed earlier under the same
	// idempotency key and this call created nothing.
	Replayed bool `gorm:"-"`
}

// active reports whether o holds its unit: reserved or paid.
func (o Order) active() bool { return o.Status == StatusReserved || o.Status == StatusPaid }
