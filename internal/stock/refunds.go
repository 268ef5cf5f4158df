package stock

import (
	"context"
	"time"
)

// The reasons a payment is owed back.
const (
	RefundOrderExpired   = "order_expired"
	RefundOrderCancelled = "order_cancelled"
)

// Refund is a payment owed back: one that came for an order after it had
// expired or been cancelled. It is recorded, never dropped (the refunds
// table); the same payment delivered again is the same refund.
type Refund struct {
	OrderID   int64  `gorm:"column:order_id"`
	UserID    int64  `gorm:"column:user_id"`
	SKUID     int64  `gorm:"column:sku_id"`
	PaymentID string `gorm:"column:payment_id"`
	// ReceivedAt is when the payment came, by MySQL's clock.
	ReceivedAt time.Time `gorm:"column:received_at"`
	// Reason is RefundOrderExpired or RefundOrderCancelled.
	Reason string `gorm:"column:reason"`
}

// Refunds returns every refund owed, oldest first (by received_at, then
// order_id and payment_id); none is an empty slice. Errors: ErrBusy (MySQL
// down or refusing work for now).
func (c *Catalog) Refunds(ctx context.Context) ([]Refund, error) {
	refunds := []Refund{}
	if _, err := read(c.db.WithContext(ctx), &refunds, sqlRefunds); err != nil {
		return nil, classify(ctx, "refunds", err)
	}
	return refunds, nil
}
