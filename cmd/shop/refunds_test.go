package main

import (
	"testing"

	"shop/internal/testenv"
)

// shop serve lists the refunds owed that MySQL has to the admin API.
func TestServeRefunds(t *testing.T) {
	t.Parallel()
	const token = "refunds-admin-token-0123456789"
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_ADMIN_TOKEN": token})
	if code, out := shopWith(vars(), "seed", "--products", "1", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	for _, q := range []string{
		"INSERT INTO orders (id, sku_id, user_id, status, pay_by, returned_at) VALUES (9, 1, 7, 'expired', '2030-01-02 03:00:00', '2030-01-02 03:00:01')",
		"INSERT INTO refunds (order_id, payment_id, user_id, sku_id, reason, received_at) VALUES (9, 'pay-9', 7, 1, 'order_expired', '2030-01-02 03:04:05.5')",
	} {
		if err := db.Gorm.Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	r := startReplica(t, vars())
	a := r.admin.refunds()
	want := `{"refunds":[{"order_id":9,"user_id":7,"sku_id":1,"payment_id":"pay-9","received_at":"2030-01-02T03:04:05.5Z","reason":"order_expired"}]}`
	if a.expect(200) != nil || string(a.raw) != want {
		t.Errorf("GET /api/v1/admin/refunds: %v\nwant 200 %s", a, want)
	}
}
