package verify_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"gorm.io/gorm"

	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// soldTwo is a catalog of three products with two units each in which user
// 10 holds order 1 of SKU 1 and user 20 order 2 of SKU 2: a sale that holds.
func soldTwo(t *testing.T) *testenv.DB {
	t.Helper()
	db := testenv.MySQL(t)
	ctx := context.Background()
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 3, 2); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"UPDATE products SET stock = stock - 1 WHERE id IN (1, 2)",
		"INSERT INTO orders (id, sku_id, user_id) VALUES (1, 1, 10), (2, 2, 20)",
	} {
		if err := db.Gorm.WithContext(ctx).Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return db
}

// checkOf returns the report's check called name.
func checkOf(t *testing.T, r verify.Report, name string) verify.Check {
	t.Helper()
	i := slices.IndexFunc(r.Checks, func(c verify.Check) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("no check %q in %+v", name, r.Checks)
	}
	return r.Checks[i]
}

func hasCheck(r verify.Report, name string) bool {
	return slices.ContainsFunc(r.Checks, func(c verify.Check) bool { return c.Name == name })
}

const (
	ackExists  = "every acknowledged order exists"
	ackMatches = "every acknowledged order has its sku and user"
)

func TestVerifyAcks(t *testing.T) {
	db := soldTwo(t)
	tests := []struct {
		name     string
		acks     string
		lost     []string // examples of the exists check
		mismatch []string // examples of the sku-and-user check; nil: the check passes
		idsCheck bool     // whether the sku-and-user check is made
	}{
		{name: "order ids alone", acks: "1\n2\n"},
		{name: "order, sku and user", acks: "1 1 10\n2 2 20\n", idsCheck: true},
		{name: "both formats in one file", acks: "1\n2 2 20\n", idsCheck: true},
		{name: "wrong user", acks: "1 1 10\n2 2 21\n", idsCheck: true,
			mismatch: []string{"acknowledged order 2 is for sku 2 user 20 in MySQL, ack says sku 2 user 21"}},
		{name: "wrong sku", acks: "1 3 10\n", idsCheck: true,
			mismatch: []string{"acknowledged order 1 is for sku 1 user 10 in MySQL, ack says sku 3 user 10"}},
		{name: "one order told to two buyers", acks: "1 1 10\n1 1 11\n", idsCheck: true,
			mismatch: []string{"acknowledged order 1 is for sku 1 user 10 in MySQL, ack says sku 1 user 11"}},
		{name: "lost, order id alone", acks: "1\n99\n", lost: []string{"order 99"}},
		{name: "lost, with sku and user", acks: "99 1 10\n", idsCheck: true, lost: []string{"order 99"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			acks, err := verify.ReadAcks(strings.NewReader(tt.acks))
			if err != nil {
				t.Fatal(err)
			}
			r, err := verify.Sale(context.Background(), db.Gorm, acks)
			if err != nil {
				t.Fatal(err)
			}
			if r.Acks != len(acks) {
				t.Errorf("report counts %d acks, want %d", r.Acks, len(acks))
			}
			if want := tt.lost == nil && tt.mismatch == nil; r.OK() != want {
				t.Errorf("OK = %v, want %v:\n%s", r.OK(), want, r)
			}
			if c := checkOf(t, r, ackExists); c.Violations != int64(len(tt.lost)) || !slices.Equal(c.Examples, tt.lost) {
				t.Errorf("%s: %d %q, want %q", ackExists, c.Violations, c.Examples, tt.lost)
			}
			if got := hasCheck(r, ackMatches); got != tt.idsCheck {
				t.Fatalf("check %q made: %v, want %v", ackMatches, got, tt.idsCheck)
			}
			if !tt.idsCheck {
				return
			}
			if c := checkOf(t, r, ackMatches); c.Violations != int64(len(tt.mismatch)) || !slices.Equal(c.Examples, tt.mismatch) {
				t.Errorf("%s: %d %q, want %q", ackMatches, c.Violations, c.Examples, tt.mismatch)
			}
			if tt.mismatch != nil && !strings.Contains(r.String(), "FAIL  "+ackMatches+": 1 violations, first: "+tt.mismatch[0]) {
				t.Errorf("the text report does not name the mismatch:\n%s", r)
			}
		})
	}
}

func TestVerifyWithoutAcksMakesNoAckCheck(t *testing.T) {
	db := soldTwo(t)
	r, err := verify.Sale(context.Background(), db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || hasCheck(r, ackExists) || hasCheck(r, ackMatches) || r.Acks != 0 {
		t.Errorf("without acks:\n%s", r)
	}
}

func TestVerifyReadAcks(t *testing.T) {
	acks, err := verify.ReadAcks(strings.NewReader("1\n\n  2 3 4 \n5\t6\t7\n"))
	want := []verify.Ack{{OrderID: 1}, {OrderID: 2, SKUID: 3, UserID: 4}, {OrderID: 5, SKUID: 6, UserID: 7}}
	if err != nil || !slices.Equal(acks, want) {
		t.Errorf("ReadAcks = %v, %v; want %v", acks, err, want)
	}
	if acks, err := verify.ReadAcks(strings.NewReader("")); err != nil || acks == nil || len(acks) != 0 {
		t.Errorf("an empty file: %v, %v; want no acks (and not nil: the acks are checked)", acks, err)
	}
	for _, bad := range []struct{ text, want string }{
		{"1\n2 3\n", "line 2: want \"order_id\" or \"order_id sku_id user_id\", have 2 fields"},
		{"1\n2 3 4 5\n", "line 2: want \"order_id\" or \"order_id sku_id user_id\", have 4 fields"},
		{"x\n", "line 1: order_id \"x\" is not a positive integer"},
		{"1\n\n2 0 4\n", "line 3: sku_id \"0\" is not a positive integer"},
		{"2 3 -4\n", "line 1: user_id \"-4\" is not a positive integer"},
	} {
		if _, err := verify.ReadAcks(strings.NewReader(bad.text)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ReadAcks(%q) = %v, want an error with %q", bad.text, err, bad.want)
		}
	}
}

// The times of the lifecycle fixture, as verify's examples print them.
const (
	placedAt   = "2025-01-01 10:00:00"
	paidAt     = "2025-01-01 10:05:00"
	returnedAt = "2025-01-01 10:20:00"
	payBy      = "2025-01-01 10:15:00"
	lateAt     = "2025-01-01 10:40:00" // after every pay_by
)

// lifecycle is a catalog of four products with three units each and orders
// in every status, with the refunds owed that go with them: a sale that
// holds. Counting every order rather than the active ones, SKUs 2 and 3
// would be short of units.
//
//	order 1: sku 1, user 10, reserved
//	order 2: sku 1, user 11, paid by a buyer's word before the ledger (payment pay-2)
//	order 3: sku 2, user 10, paid when placed (no payment id)
//	order 4: sku 2, user 11, cancelled; its late payment pay-4 is owed back
//	order 5: sku 3, user 10, expired; its late payment pay-5 is owed back
//	order 6: sku 3, user 10, reserved again after order 5 expired
func lifecycle(t *testing.T) *testenv.DB {
	t.Helper()
	db := testenv.MySQL(t)
	ctx := context.Background()
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 4, 3); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		// The catalog was seeded before the day of these rows.
		"UPDATE catalog_epoch SET seeded_at = '2025-01-01 09:00:00'",
		"UPDATE products SET stock = stock - 2 WHERE id = 1",
		"UPDATE products SET stock = stock - 1 WHERE id IN (2, 3)",
		`INSERT INTO orders (id, sku_id, user_id, created_at, status, pay_by, paid_at, payment_id, returned_at) VALUES
			(1, 1, 10, '` + placedAt + `', 'reserved', '` + payBy + `', NULL, NULL, NULL),
			(2, 1, 11, '` + placedAt + `', 'paid', '` + payBy + `', '` + paidAt + `', 'pay-2', NULL),
			(3, 2, 10, '` + placedAt + `', 'paid', NULL, NULL, NULL, NULL),
			(4, 2, 11, '` + placedAt + `', 'cancelled', '` + payBy + `', NULL, NULL, '` + returnedAt + `'),
			(5, 3, 10, '` + placedAt + `', 'expired', '` + payBy + `', NULL, NULL, '` + returnedAt + `'),
			(6, 3, 10, '` + returnedAt + `', 'reserved', '2025-01-01 10:35:00', NULL, NULL, NULL)`,
		`INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at) VALUES
			('r4', 4, 'pay-4', 11, 2, 'order_cancelled', '2025-01-01 10:30:00'),
			('r5', 5, 'pay-5', 10, 3, 'order_expired', '2025-01-01 10:25:00')`,
	} {
		if err := db.Gorm.WithContext(ctx).Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return db
}

// failing returns the checks of r that found violations.
func failing(r verify.Report) []verify.Check {
	var out []verify.Check
	for _, c := range r.Checks {
		if c.Violations > 0 {
			out = append(out, c)
		}
	}
	return out
}

// The lifecycle checks that Verify makes.
const (
	checkUnits         = "initial_stock == stock + active orders"
	checkOneActive     = "one active order per (user, sku)"
	checkStatus        = "every order is reserved, paid, cancelled or expired"
	checkPaidAndGone   = "no order both paid and cancelled or expired"
	checkReturned      = "returned_at set exactly on cancelled and expired orders"
	checkPaymentID     = "every order paid by a payment has its payment id"
	checkRefundOrder   = "every refund owed is of its order, for a reason the order bears out"
	checkRefundNotPaid = "no payment both paid an order and is owed back"
)

func TestVerifyLifecycleHolds(t *testing.T) {
	db := lifecycle(t)
	acks, err := verify.ReadAcks(strings.NewReader("1 1 10\n2 1 11\n3 2 10\n4 2 11\n5 3 10\n6 3 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := verify.Sale(context.Background(), db.Gorm, acks)
	if err != nil {
		t.Fatal(err)
	}
	if f := failing(r); len(f) > 0 {
		t.Errorf("a sale that holds, with orders in every status: %+v\n%s", f, r)
	}
	want := verify.StatusCounts{Reserved: 2, Paid: 2, Cancelled: 1, Expired: 1}
	if r.Orders != 6 || r.ByStatus != want || r.ByStatus.Active() != 4 || r.Refunds != 2 || r.PaidWithoutPayment != 1 ||
		r.Stock != 8 || r.InitialStock != 12 || r.Oversold != 0 || r.Acks != 6 {
		t.Errorf("report %+v; want 6 orders %+v, 2 refunds, 1 paid without payment id, stock 8 of 12", r, want)
	}
	if r.Payments != (verify.PaymentCounts{}) || r.RefundsByState != (verify.RefundCounts{Owed: 2}) || r.PaidBeforeLedger != 1 {
		t.Errorf("report %+v; want an empty ledger, 2 refunds owed and 1 order paid before the ledger", r)
	}
	for _, name := range []string{checkUnits, checkOneActive, checkStatus, checkPaidAndGone, checkReturned, checkPaymentID,
		checkRefundOrder, checkRefundNotPaid, ackExists, ackMatches} {
		checkOf(t, r, name)
	}
	expectLines(t, r,
		"products 4, initial stock 12, stock 8, orders 6, oversold units 0\n",
		"orders by status: reserved 2, paid 2, cancelled 1, expired 1; refunds owed 2\n",
		"payments by outcome: applied 0, owed 0, conflict 0; refunds by state: owed 2, requested 0, refunded 0, failed 0\n",
		"info  1 paid orders carry no payment id (paid when placed, or by the migration)\n",
		"info  1 paid orders carry a payment id from before the payments ledger, and no amount to check it by\n",
		"ok    "+checkRefundNotPaid+"\n",
		"verdict: all invariants hold\n",
	)
}

// expectLines expects the text report of r to have every line of lines.
func expectLines(t *testing.T, r verify.Report, lines ...string) {
	t.Helper()
	text := r.String()
	for _, line := range lines {
		if !strings.Contains(text, line) {
			t.Errorf("the text report lacks %q:\n%s", line, text)
		}
	}
}

// TestVerifyLifecycleViolations breaks the lifecycle fixture in each way
// verify checks, with direct SQL, and expects that check to fail with
// exactly those offenders, and no other check to fail.
// violation is a case of a broken sale: the SQL that breaks it, and the
// check that finds it, with its examples.
type violation struct {
	name     string
	sql      []string // run on one connection, in order
	check    string
	examples []string
}

func TestVerifyLifecycleViolations(t *testing.T) {
	t.Parallel()
	tests := []violation{
		{"negative stock", []string{"UPDATE products SET stock = -1, initial_stock = -1 WHERE id = 4"},
			"stock >= 0", []string{"sku 4 stock -1"}},
		{"a reservation that took no unit", []string{
			"INSERT INTO orders (id, sku_id, user_id, status, pay_by) VALUES (7, 4, 12, 'reserved', '" + payBy + "')",
		}, checkUnits, []string{"sku 4 initial 3 stock 3 active orders 1"}},
		{"a unit returned twice", []string{"UPDATE products SET stock = stock + 1 WHERE id = 3"},
			checkUnits, []string{"sku 3 initial 3 stock 3 active orders 1"}},
		{"an expiry that returned no unit", []string{"UPDATE products SET stock = stock - 1 WHERE id = 2"},
			checkUnits, []string{"sku 2 initial 3 stock 1 active orders 1"}},
		{"two active orders of one user and sku", []string{
			"ALTER TABLE orders DROP INDEX uq_orders_user_active_sku",
			"UPDATE products SET stock = stock - 1 WHERE id = 1",
			"INSERT INTO orders (id, sku_id, user_id) VALUES (7, 1, 10)",
		}, checkOneActive, []string{"user 10 sku 1 active orders 2 (1,7)"}},
		{"an order of no product", []string{
			"INSERT INTO orders (id, sku_id, user_id, status, returned_at) VALUES (7, 999, 10, 'cancelled', '" + returnedAt + "')",
		}, "every order names a product", []string{"order 7 sku 999"}},
		{"an order of no status", []string{
			"SET SESSION sql_mode = ''",
			"INSERT INTO orders (id, sku_id, user_id, status) VALUES (7, 4, 12, 'refunded')",
			"SET SESSION sql_mode = DEFAULT",
		}, checkStatus, []string{"order 7 status ''"}},
		{"cancelled, then paid", []string{"UPDATE orders SET paid_at = '" + paidAt + "' WHERE id = 4"},
			checkPaidAndGone, []string{"order 4 cancelled paid_at " + paidAt + ".000000 payment_id NULL"}},
		{"expired, with a payment applied", []string{"UPDATE orders SET payment_id = 'pay-x' WHERE id = 5"},
			checkPaidAndGone, []string{"order 5 expired paid_at NULL payment_id pay-x"}},
		{"paid, its unit returned", []string{"UPDATE orders SET returned_at = '" + returnedAt + "' WHERE id = 2"},
			checkPaidAndGone, []string{"order 2 paid returned_at " + returnedAt + ".000000"}},
		{"expired, its unit not returned", []string{"UPDATE orders SET returned_at = NULL WHERE id = 5"},
			checkReturned, []string{"order 5 expired returned_at NULL"}},
		{"cancelled and reserved, their units not returned and returned", []string{
			"UPDATE orders SET returned_at = NULL WHERE id = 4",
			"UPDATE orders SET returned_at = '" + returnedAt + "' WHERE id = 1",
		}, checkReturned, []string{"order 1 reserved returned_at " + returnedAt + ".000000", "order 4 cancelled returned_at NULL"}},
		{"paid by a payment without its payment id", []string{"UPDATE orders SET payment_id = NULL WHERE id = 2"},
			checkPaymentID, []string{"order 2 paid paid_at " + paidAt + ".000000 payment_id NULL"}},
		{"a payment id without paid_at", []string{"UPDATE orders SET payment_id = 'pay-3' WHERE id = 3"},
			checkPaymentID, []string{"order 3 paid paid_at NULL payment_id pay-3"}},
		{"a reservation with a payment", []string{"UPDATE orders SET payment_id = 'pay-1' WHERE id = 1"},
			checkPaymentID, []string{"order 1 reserved paid_at NULL payment_id pay-1"}},
		{"a refund of no order", []string{
			"INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at) VALUES ('rx', 99, 'pay-99', 10, 1, 'order_expired', '" + lateAt + "')",
		}, checkRefundOrder, []string{"refund rx of order 99 payment pay-99 (user 10 sku 1 order_expired, received " + lateAt + ".000000): no such order"}},
		{"a refund of a paid order", []string{
			"INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at) VALUES ('rx', 2, 'pay-late', 11, 1, 'order_expired', '" + lateAt + "')",
		}, checkRefundOrder, []string{"refund rx of order 2 payment pay-late (user 11 sku 1 order_expired, received " + lateAt + ".000000): " +
			"the order is user 11 sku 1 paid, pay_by " + payBy + ".000000"}},
		{"a refund of a reservation before its pay_by", []string{
			"INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at) VALUES ('rx', 6, 'pay-6', 10, 3, 'order_expired', '2025-01-01 10:34:59')",
		}, checkRefundOrder, []string{"refund rx of order 6 payment pay-6 (user 10 sku 3 order_expired, received 2025-01-01 10:34:59.000000): " +
			"the order is user 10 sku 3 reserved, pay_by 2025-01-01 10:35:00.000000"}},
		{"a late payment refunded before its order's pay_by", []string{"UPDATE refunds SET received_at = '2025-01-01 10:14:00' WHERE refund_id = 'r5'"},
			checkRefundOrder, []string{"refund r5 of order 5 payment pay-5 (user 10 sku 3 order_expired, received 2025-01-01 10:14:00.000000): " +
				"the order is user 10 sku 3 expired, pay_by " + payBy + ".000000"}},
		{"a refund of another reason", []string{"UPDATE refunds SET reason = 'order_cancelled' WHERE order_id = 5"},
			checkRefundOrder, []string{"refund r5 of order 5 payment pay-5 (user 10 sku 3 order_cancelled): the order is user 10 sku 3 expired"}},
		{"a refund to another user and sku", []string{"UPDATE refunds SET user_id = 12, sku_id = 1 WHERE order_id = 4"},
			checkRefundOrder, []string{"refund r4 of order 4 payment pay-4 (user 12 sku 1 order_cancelled): the order is user 11 sku 2 cancelled"}},
		{"a refund to no user", []string{"UPDATE refunds SET user_id = NULL WHERE order_id = 4"},
			checkRefundOrder, []string{"refund r4 of order 4 payment pay-4 (user NULL sku 2 order_cancelled): the order is user 11 sku 2 cancelled"}},
		{"a payment applied and owed back", []string{
			"INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at) VALUES ('rx', 4, 'pay-2', 11, 2, 'order_cancelled', '" + lateAt + "')",
		}, checkRefundNotPaid, []string{"payment pay-2 paid order 2 and is owed back for order 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := saleAfter(t, lifecycle(t), tt.sql)
			expectFailing(t, r, []verify.Check{{Name: tt.check, Violations: int64(len(tt.examples)), Examples: tt.examples}})
		})
	}
}

// saleAfter runs sql on one connection of db, in order, and returns what
// Sale then finds.
func saleAfter(t *testing.T, db *testenv.DB, sql []string) verify.Report {
	t.Helper()
	ctx := context.Background()
	err := db.Gorm.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		for _, q := range sql {
			if err := conn.Exec(q).Error; err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := verify.Sale(ctx, db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// expectFailing expects the checks of r that fail to be want, no more, in
// the text report and in its JSON; with want nil, the sale holds.
func expectFailing(t *testing.T, r verify.Report, want []verify.Check) {
	t.Helper()
	if got := failing(r); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("failing checks %+v, want only %+v\n%s", got, want, r)
	}
	if r.OK() != (want == nil) {
		t.Errorf("OK() = %v with %d checks failing", r.OK(), len(want))
	}
	checks := jsonChecks(t, r)
	for _, c := range want {
		expectLines(t, r, fmt.Sprintf("FAIL  %s: %d violations, first: %s\n", c.Name, c.Violations, strings.Join(c.Examples, "; ")))
		if got := checks[c.Name]; fmt.Sprint(got) != fmt.Sprint(c) {
			t.Errorf("JSON check %+v, want %+v", got, c)
		}
	}
}

// Orders that expired or were cancelled still exist for --acks: nothing
// filters acknowledged orders on their status.
func TestVerifyAcksInAnyStatus(t *testing.T) {
	db := lifecycle(t)
	acks, err := verify.ReadAcks(strings.NewReader("4 2 11\n5\n99\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := verify.Sale(context.Background(), db.Gorm, acks)
	if err != nil {
		t.Fatal(err)
	}
	want := []verify.Check{{Name: ackExists, Violations: 1, Examples: []string{"order 99"}}}
	if got := failing(r); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("failing checks %+v, want only %+v", got, want)
	}
}

// The user limit counts active orders: user 10 holds three (orders 1, 3
// and 6) and an expired one (5).
func TestUserLimitCountsActiveOrders(t *testing.T) {
	db := lifecycle(t)
	ctx := context.Background()
	for limit, want := range map[int]verify.Check{
		3: {Name: "orders per user <= 3"},
		2: {Name: "orders per user <= 2", Violations: 1, Examples: []string{"user 10 orders 3"}},
		1: {Name: "orders per user <= 1", Violations: 1, Examples: []string{"user 10 orders 3"}},
	} {
		c, err := verify.UserLimit(ctx, db.Gorm, limit)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(c) != fmt.Sprint(want) {
			t.Errorf("limit %d: %+v, want %+v", limit, c, want)
		}
	}
}

// UserLimit names the users holding more orders than the limit.
func TestUserLimit(t *testing.T) {
	ctx := context.Background()
	db := soldTwo(t) // users 10 and 20, one order each
	if err := db.Gorm.Exec("INSERT INTO orders (sku_id, user_id) VALUES (3, 10)").Error; err != nil {
		t.Fatal(err)
	}
	c, err := verify.UserLimit(ctx, db.Gorm, 1)
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "orders per user <= 1" || c.Violations != 1 || len(c.Examples) != 1 || c.Examples[0] != "user 10 orders 2" {
		t.Errorf("limit 1: %+v, want user 10 with 2 orders", c)
	}
	if c, err := verify.UserLimit(ctx, db.Gorm, 2); err != nil || c.Violations != 0 {
		t.Errorf("limit 2: %+v, %v; want no violation", c, err)
	}
}

// A reservation lapsed far past pay_by still holding its unit is warned
// about, with the order named; one that lapsed a moment ago, which the
// next sweep returns, is not. Neither breaks an invariant.
func TestVerifyWarnsOfLapsedReservations(t *testing.T) {
	db := soldTwo(t)
	ctx := context.Background()
	for _, q := range []string{
		"UPDATE orders SET status = 'reserved', pay_by = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE id = 1",
		"UPDATE orders SET status = 'reserved', pay_by = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = 2",
	} {
		if err := db.Gorm.WithContext(ctx).Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	r, err := verify.Sale(ctx, db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := r.String()
	var warn string
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "WARN") {
			warn += line
		}
	}
	if !r.OK() || !strings.Contains(warn, "order 1 sku 1") || strings.Contains(warn, "order 2 ") {
		t.Errorf("verify = OK %v, warnings %q; want OK, and a warning naming order 1 alone:\n%s", r.OK(), warn, out)
	}
}
