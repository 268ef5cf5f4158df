package stock_test

import (
	"context"
	"testing"
	"time"

	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// withRefunds is a database with the refunds owed that TestRefunds lists,
// recorded out of order.
func withRefunds(t *testing.T) *testenv.DB {
	t.Helper()
	db := testenv.MySQL(t)
	if err := db.Gorm.Exec(`INSERT INTO refunds (order_id, payment_id, user_id, sku_id, reason, received_at) VALUES
		(4, 'pay-4', 11, 2, 'order_cancelled', '2025-01-01 10:30:00'),
		(5, 'pay-5', 10, 3, 'order_expired', '2025-01-01 10:25:00'),
		(4, 'pay-4b', 11, 2, 'order_cancelled', '2025-01-01 10:25:00.123456')`).Error; err != nil {
		t.Fatal(err)
	}
	return db
}

// Refunds lists every refund owed, oldest first, then by order.
func TestRefunds(t *testing.T) {
	db := withRefunds(t)
	got, err := stock.NewCatalog(db.Gorm).Refunds(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	at := func(min, micro int) time.Time { return time.Date(2025, 1, 1, 10, min, 0, micro*1000, time.UTC) }
	want := []stock.Refund{
		{OrderID: 5, UserID: 10, SKUID: 3, PaymentID: "pay-5", ReceivedAt: at(25, 0), Reason: stock.RefundOrderExpired},
		{OrderID: 4, UserID: 11, SKUID: 2, PaymentID: "pay-4b", ReceivedAt: at(25, 123456), Reason: stock.RefundOrderCancelled},
		{OrderID: 4, UserID: 11, SKUID: 2, PaymentID: "pay-4", ReceivedAt: at(30, 0), Reason: stock.RefundOrderCancelled},
	}
	if len(got) != len(want) {
		t.Fatalf("Refunds = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].ReceivedAt.Location() != time.UTC || !got[i].ReceivedAt.Equal(want[i].ReceivedAt) {
			t.Errorf("refund %d received at %v, want %v (UTC)", i, got[i].ReceivedAt, want[i].ReceivedAt)
		}
		got[i].ReceivedAt = want[i].ReceivedAt
		if got[i] != want[i] {
			t.Errorf("refund %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A seed deletes the refunds owed with the orders they are of.
func TestSeedDeletesRefunds(t *testing.T) {
	db := withRefunds(t)
	ctx := context.Background()
	catalog := stock.NewCatalog(db.Gorm)
	if err := catalog.Seed(ctx, 2, 1); err != nil {
		t.Fatal(err)
	}
	refunds, err := catalog.Refunds(ctx)
	if err != nil || refunds == nil || len(refunds) != 0 {
		t.Errorf("refunds after a seed: %v, %v; want none (an empty slice)", refunds, err)
	}
	r, err := verify.Sale(ctx, db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || r.Orders != 0 || r.Refunds != 0 || r.ByStatus != (verify.StatusCounts{}) {
		t.Errorf("after a seed:\n%s", r)
	}
}
