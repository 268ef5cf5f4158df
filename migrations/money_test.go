package migrations_test

import (
	"context"
	"testing"

	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/migrations"
)

// The money migrations (00008–00010) on a database of the lifecycle before
// them, with the rows a buyer's word could make: products get USD, a
// reservation owes its product's price while paid and ended orders keep
// NULL ("before amounts"), the later orders that shared a payment id owe
// it back as duplicate_payment and let it go, every refund is named by a
// ULID of its time, and only then are the unique keys on.
func TestMoneyMigration(t *testing.T) {
	ctx := context.Background()
	db := testenv.EmptyMySQL(t)
	sqlDB, err := db.Gorm.DB()
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.UpTo(ctx, sqlDB, 7); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO products (id, name, price_cents, initial_stock, stock) VALUES (1, 'a', 250, 5, 1), (2, 'b', 990, 5, 5)`,
		`INSERT INTO orders (id, sku_id, user_id, created_at, status, pay_by, paid_at, payment_id, returned_at) VALUES
			(1, 1, 10, '2026-01-01 10:00:00', 'paid', '2026-01-01 10:15:00', '2026-01-01 10:01:00', 'same', NULL),
			(2, 1, 11, '2026-01-01 10:00:00', 'paid', '2026-01-01 10:15:00', '2026-01-01 10:02:00', 'same', NULL),
			(3, 1, 12, '2026-01-01 10:00:00', 'paid', '2026-01-01 10:15:00', '2026-01-01 10:03:00', 'same', NULL),
			(4, 1, 13, '2026-01-01 10:00:00', 'reserved', '2030-01-01 10:15:00', NULL, NULL, NULL),
			(5, 2, 14, '2026-01-01 10:00:00', 'expired', '2026-01-01 10:15:00', NULL, NULL, '2026-01-01 10:16:00'),
			(6, 1, 15, '2026-01-01 10:00:00', 'paid', NULL, NULL, NULL, NULL)`,
		`INSERT INTO refunds (order_id, payment_id, user_id, sku_id, reason, received_at) VALUES
			(5, 'late', 14, 2, 'order_expired', '2026-01-01 10:20:00.5')`,
	} {
		if err := db.Gorm.Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := migrations.Up(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}

	var currencies []string
	if err := db.Gorm.Raw("SELECT DISTINCT currency FROM products").Scan(&currencies).Error; err != nil || len(currencies) != 1 || currencies[0] != "USD" {
		t.Errorf("product currencies %v, %v; want USD", currencies, err)
	}
	var orders []stock.Order
	if err := db.Gorm.Raw("SELECT * FROM orders ORDER BY id").Scan(&orders).Error; err != nil {
		t.Fatal(err)
	}
	for _, o := range orders {
		wantAmount := o.ID == 4
		if (o.AmountCents != nil) != wantAmount || (wantAmount && (*o.AmountCents != 250 || *o.Currency != "USD")) {
			t.Errorf("order %d (%s): amount %v %v; want 250 USD only on the reservation", o.ID, o.Status, o.AmountCents, o.Currency)
		}
		keeps := o.ID == 1
		if (o.PaymentID != nil) != keeps && o.ID <= 3 {
			t.Errorf("order %d: payment id %v; want only the first paid to keep 'same'", o.ID, o.PaymentID)
		}
		if o.Status != map[int64]string{1: "paid", 2: "paid", 3: "paid", 4: "reserved", 5: "expired", 6: "paid"}[o.ID] {
			t.Errorf("order %d: status %s changed", o.ID, o.Status)
		}
	}
	var refunds []stock.Refund
	if err := db.Gorm.Raw("SELECT * FROM refunds ORDER BY order_id").Scan(&refunds).Error; err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{2: "duplicate_payment", 3: "duplicate_payment", 5: "order_expired"}
	if len(refunds) != len(want) {
		t.Fatalf("refunds %+v; want %v", refunds, want)
	}
	for _, r := range refunds {
		if want[r.OrderID] != r.Reason || r.State != stock.RefundOwed || r.AmountCents != nil || r.Provider != nil ||
			stock.CheckRefundID(r.RefundID) != nil {
			t.Errorf("refund %+v; want %s, owed, no amount, no provider, a ULID", r, want[r.OrderID])
		}
	}
	// The keys hold from now on: a payment id on one order only, a refund
	// id once.
	if err := db.Gorm.Exec("UPDATE orders SET payment_id = 'same' WHERE id = 2").Error; err == nil {
		t.Error("a second order took payment id 'same': no unique key")
	}
	if err := db.Gorm.Exec("INSERT INTO refunds (refund_id, order_id, payment_id, reason, received_at) VALUES (?, 1, 'x', 'unknown_order', NOW())",
		refunds[0].RefundID).Error; err == nil {
		t.Error("a refund id twice: no primary key")
	}
}
