package main

import (
	"encoding/json"
	"strings"
	"testing"

	"shop/internal/testenv"
)

// shop serve lists the refunds that MySQL has to the admin API, and
// settles one by hand; a seed refuses while one is unsettled.
func TestServeRefunds(t *testing.T) {
	t.Parallel()
	const token = "refunds-admin-token-0123456789"
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_ADMIN_TOKEN": token})
	if code, out := shopWith(vars(), "seed", "--products", "1", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	r := startReplica(t, vars())
	if e := r.public.paid(1<<40, "pay-9", 250, "EUR"); e.expect(200) != nil || e.body.Result != "owed" || e.body.Reason != "unknown_order" {
		t.Fatalf("a payment for no order: %v; want 200 owed unknown_order", e)
	}
	a := r.admin.refunds()
	var page struct {
		Refunds []map[string]any `json:"refunds"`
		Next    *string          `json:"next"`
	}
	if a.expect(200) != nil || json.Unmarshal(a.raw, &page) != nil || len(page.Refunds) != 1 || page.Next != nil {
		t.Fatalf("GET /api/v1/admin/refunds: %v", a)
	}
	got := page.Refunds[0]
	if got["payment_id"] != "pay-9" || got["amount_cents"] != 250.0 || got["currency"] != "EUR" || got["state"] != "owed" || got["reason"] != "unknown_order" {
		t.Errorf("the refund: %v", got)
	}
	if code, out := shopWith(vars(), "seed", "--products", "1", "--stock", "1"); code != 1 || !strings.Contains(out, "1 refunds are not settled") {
		t.Errorf("seed with a refund owed: exit %d\n%s\nwant 1, saying so", code, out)
	}
	if s := r.admin.settle(got["refund_id"].(string), "re_9"); s.expect(200) != nil {
		t.Fatalf("settle: %v", s)
	}
	if code, out := shopWith(vars(), "seed", "--products", "1", "--stock", "1", "--price-cents", "500", "--currency", "GBP"); code != 0 {
		t.Errorf("seed once settled: exit %d\n%s", code, out)
	}
	var n int64
	if err := db.Gorm.Raw("SELECT COUNT(*) FROM products WHERE price_cents = 500 AND currency = 'GBP'").Scan(&n).Error; err != nil || n != 1 {
		t.Errorf("seeded products at 500 GBP: %d, %v", n, err)
	}
}
