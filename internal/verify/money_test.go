package verify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"shop/internal/testenv"
	"shop/internal/verify"
)

// The money checks that Verify makes.
const (
	checkPaymentAmount = "every paid order's payment matches its amount and currency"
	checkPaymentOnce   = "no payment id is applied to two orders"
	checkRefundAmount  = "every refund returns the amount and currency its payment received"
	checkRefundSettled = "every refunded refund has the provider's reference and settled_at"
	checkLedger        = "the payments ledger agrees with orders and refunds"
)

// ledger is the lifecycle fixture, from before amounts and the payments
// ledger, to which a sale with amounts and a ledger has been added, with a
// payment of every outcome and a refund of every reason and state: a sale
// that holds. SKU 4 costs 1000 USD; every time is 2025-01-01.
//
//	order 7:  sku 4, user 20, paid by pay-7 (applied); pay-7b came again
//	          for it (owed back, duplicate_payment, r7 requested)
//	order 8:  sku 4, user 21, reserved; pay-8 brought 900 USD (owed back,
//	          amount_mismatch, r8 owed); pay-2, which order 2 carries from
//	          before the ledger, came for it too (a conflict)
//	order 9:  sku 4, user 22, expired; pay-9 came at 10:25, after its
//	          pay_by (owed back, order_expired, r9 refunded as re_9)
//	order 10: sku 4, user 23, cancelled; pi_10, from Stripe, came after
//	          (owed back, order_cancelled, r10 owed)
//	order 11: sku 2, user 12, paid at 10:06 by pay-2 before the ledger:
//	          migration 00008 left pay-2 to order 2, paid at 10:05, and owes
//	          it back (r11, no provider, no amount, duplicate_payment)
//	pay-99:   for order 99, which does not exist (owed back, unknown_order,
//	          r99 failed)
func ledger(t *testing.T) *testenv.DB {
	t.Helper()
	db := lifecycle(t)
	ctx := context.Background()
	for _, q := range []string{
		"UPDATE products SET currency = 'USD'",
		"UPDATE products SET price_cents = 1000, stock = stock - 2 WHERE id = 4",
		"UPDATE products SET stock = stock - 1 WHERE id = 2",
		`INSERT INTO orders (id, sku_id, user_id, created_at, status, pay_by, paid_at, payment_id, returned_at, amount_cents, currency) VALUES
			(7, 4, 20, '` + placedAt + `', 'paid', '` + payBy + `', '` + paidAt + `', 'pay-7', NULL, 1000, 'USD'),
			(8, 4, 21, '` + placedAt + `', 'reserved', '` + payBy + `', NULL, NULL, NULL, 1000, 'USD'),
			(9, 4, 22, '` + placedAt + `', 'expired', '` + payBy + `', NULL, NULL, '` + returnedAt + `', 1000, 'USD'),
			(10, 4, 23, '` + placedAt + `', 'cancelled', '` + payBy + `', NULL, NULL, '` + returnedAt + `', 1000, 'USD'),
			(11, 2, 12, '` + placedAt + `', 'paid', '` + payBy + `', '2025-01-01 10:06:00', NULL, NULL, NULL, NULL)`,
		`INSERT INTO payments (provider, payment_id, order_id, amount_cents, currency, event_id, received_at, outcome) VALUES
			('webhook', 'pay-7', 7, 1000, 'USD', 'evt-7', '` + paidAt + `', 'applied'),
			('webhook', 'pay-7b', 7, 1000, 'USD', 'evt-7b', '2025-01-01 10:06:00', 'owed'),
			('webhook', 'pay-8', 8, 900, 'USD', 'evt-8', '2025-01-01 10:07:00', 'owed'),
			('webhook', 'pay-2', 8, 500, 'USD', 'evt-2', '2025-01-01 10:09:00', 'conflict'),
			('webhook', 'pay-9', 9, 1000, 'USD', 'evt-9', '2025-01-01 10:25:00', 'owed'),
			('stripe', 'pi_10', 10, 1000, 'USD', 'evt_10', '2025-01-01 10:30:00', 'owed'),
			('webhook', 'pay-99', 99, 1000, 'USD', 'evt-99', '2025-01-01 10:08:00', 'owed')`,
		`INSERT INTO refunds (refund_id, provider, payment_id, order_id, user_id, sku_id, amount_cents, currency, reason, state,
				provider_refund_id, settled_at, received_at) VALUES
			('r7', 'webhook', 'pay-7b', 7, 20, 4, 1000, 'USD', 'duplicate_payment', 'requested', NULL, NULL, '2025-01-01 10:06:00'),
			('r8', 'webhook', 'pay-8', 8, 21, 4, 900, 'USD', 'amount_mismatch', 'owed', NULL, NULL, '2025-01-01 10:07:00'),
			('r9', 'webhook', 'pay-9', 9, 22, 4, 1000, 'USD', 'order_expired', 'refunded', 're_9', '2025-01-01 11:00:00', '2025-01-01 10:25:00'),
			('r10', 'stripe', 'pi_10', 10, 23, 4, 1000, 'USD', 'order_cancelled', 'owed', NULL, NULL, '2025-01-01 10:30:00'),
			('r11', NULL, 'pay-2', 11, 12, 2, NULL, NULL, 'duplicate_payment', 'owed', NULL, NULL, '2025-01-01 10:06:00'),
			('r99', 'webhook', 'pay-99', 99, NULL, NULL, 1000, 'USD', 'unknown_order', 'failed', NULL, NULL, '2025-01-01 10:08:00')`,
	} {
		if err := db.Gorm.WithContext(ctx).Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return db
}

// jsonChecks are the checks of r as `shop verify --json` prints them, by
// name.
func jsonChecks(t *testing.T, r verify.Report) map[string]verify.Check {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Checks []struct {
			Name       string   `json:"name"`
			Violations int64    `json:"violations"`
			Examples   []string `json:"examples"`
		} `json:"checks"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	checks := map[string]verify.Check{}
	for _, c := range out.Checks {
		checks[c.Name] = verify.Check{Name: c.Name, Violations: c.Violations, Examples: c.Examples}
	}
	return checks
}

// moneyCheckNames are the checks of refunds, payments and amounts.
var moneyCheckNames = []string{checkRefundOrder, checkRefundNotPaid, checkPaymentAmount, checkPaymentOnce,
	checkRefundAmount, checkRefundSettled, checkLedger}

func TestVerifyLedgerHolds(t *testing.T) {
	// A sale that holds, with payments of every outcome and refunds of
	// every reason and state.
	r := saleAfter(t, ledger(t), nil)
	expectFailing(t, r, nil)
	want := verify.StatusCounts{Reserved: 3, Paid: 4, Cancelled: 2, Expired: 2}
	if r.Orders != 11 || r.ByStatus != want || r.Refunds != 8 || r.Stock != 5 || r.InitialStock != 12 {
		t.Errorf("report %+v; want 11 orders %+v, 8 refunds, stock 5 of 12", r, want)
	}
	lines := []string{
		"payments by outcome: applied 1, owed 5, conflict 1; refunds by state: owed 5, requested 1, refunded 1, failed 1\n",
		"info  2 paid orders carry no payment id (paid when placed, or by the migration)\n",
		"info  1 paid orders carry a payment id from before the payments ledger, and no amount to check it by\n",
		"verdict: all invariants hold\n",
	}
	for _, name := range moneyCheckNames {
		lines = append(lines, "ok    "+name+"\n")
	}
	expectLines(t, r, lines...)

	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var j struct {
		Refunds          int64            `json:"refunds_owed"`
		PaidWithout      int64            `json:"paid_without_payment_id"`
		PaidBeforeLedger int64            `json:"paid_before_ledger"`
		Payments         map[string]int64 `json:"payments_by_outcome"`
		RefundsByState   map[string]int64 `json:"refunds_by_state"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(j), "{8 2 1 map[applied:1 conflict:1 owed:5] map[failed:1 owed:5 refunded:1 requested:1]}"; got != want {
		t.Errorf("JSON %s, want %s:\n%s", got, want, b)
	}
	checks := jsonChecks(t, r)
	for _, name := range moneyCheckNames {
		if c, ok := checks[name]; !ok || c.Violations != 0 || c.Examples != nil {
			t.Errorf("JSON check %q: %+v, %v; want it, with no violations", name, c, ok)
		}
	}
}

// TestVerifyLedgerViolations breaks the ledger fixture in each way the
// money checks look for, with direct SQL, and expects those checks to fail
// with exactly those offenders, in the text and in the JSON, and no other
// check to fail. The cases that want no failing check are what the checks
// must let pass.
func TestVerifyLedgerViolations(t *testing.T) {
	t.Parallel()
	one := func(name string, examples ...string) []verify.Check {
		return []verify.Check{{Name: name, Violations: int64(len(examples)), Examples: examples}}
	}
	const (
		r2 = `INSERT INTO refunds (refund_id, provider, payment_id, order_id, user_id, sku_id, amount_cents, currency, reason, received_at)
			VALUES ('r2', 'webhook', 'pay-2', 8, 21, 4, 500, 'USD', 'amount_mismatch', '2025-01-01 10:09:00')`
	)
	tests := []struct {
		name string
		sql  []string // run on one connection, in order
		want []verify.Check
	}{
		{"a payment of another amount", []string{"UPDATE payments SET amount_cents = 900 WHERE payment_id = 'pay-7'"},
			one(checkPaymentAmount, "order 7 owes 1000 USD, payment pay-7 (webhook) paid 900 USD")},
		{"an order that owes another currency", []string{"UPDATE orders SET currency = 'EUR' WHERE id = 7"},
			one(checkPaymentAmount, "order 7 owes 1000 EUR, payment pay-7 (webhook) paid 1000 USD")},
		{"an order with an amount and no currency", []string{"UPDATE orders SET currency = NULL WHERE id = 7"},
			one(checkPaymentAmount, "order 7 owes 1000 NULL, payment pay-7 (webhook) paid 1000 USD")},
		{"a payment from before the ledger delivered again", []string{
			"INSERT INTO payments VALUES ('stripe', 'pay-2', 2, 1000, 'USD', 'evt_2', '" + lateAt + "', 'applied')",
		}, nil},

		{"one payment id on two orders", []string{
			"ALTER TABLE orders DROP INDEX uq_orders_payment",
			"UPDATE products SET stock = stock - 1 WHERE id = 1",
			`INSERT INTO orders (id, sku_id, user_id, created_at, status, pay_by, paid_at, payment_id, amount_cents, currency)
				VALUES (12, 1, 12, '` + placedAt + `', 'paid', '` + payBy + `', '` + paidAt + `', 'pay-7', 1000, 'USD')`,
		}, []verify.Check{
			{Name: checkPaymentOnce, Violations: 1, Examples: []string{"payment pay-7 is on orders 7,12; the ledger applied it to order 7 (webhook)"}},
			{Name: checkLedger, Violations: 1, Examples: []string{"order 12 is paid by payment pay-7, which the ledger has not applied to it"}},
		}},
		{"one payment id applied twice", []string{
			"INSERT INTO payments VALUES ('stripe', 'pay-7', 7, 1000, 'USD', 'evt_7', '" + paidAt + "', 'applied')",
		}, one(checkPaymentOnce, "payment pay-7 is on orders 7; the ledger applied it to order 7 (stripe), order 7 (webhook)")},

		{"a refund of another amount", []string{"UPDATE refunds SET amount_cents = 800 WHERE refund_id = 'r8'"},
			one(checkRefundAmount, "refund r8 returns 800 USD, its payment pay-8 (webhook) received 900 USD")},
		{"a refund in another currency", []string{"UPDATE refunds SET currency = 'EUR' WHERE refund_id = 'r10'"},
			one(checkRefundAmount, "refund r10 returns 1000 EUR, its payment pi_10 (stripe) received 1000 USD")},
		{"a refund with a provider and no amount", []string{"UPDATE refunds SET amount_cents = NULL, currency = NULL WHERE refund_id = 'r9'"},
			one(checkRefundAmount, "refund r9 returns NULL NULL, its payment pay-9 (webhook) received 1000 USD")},

		{"refunded without the provider's reference", []string{"UPDATE refunds SET provider_refund_id = NULL WHERE refund_id = 'r9'"},
			one(checkRefundSettled, "refund r9 refunded, provider_refund_id NULL settled_at 2025-01-01 11:00:00.000000")},
		{"refunded without settled_at", []string{"UPDATE refunds SET settled_at = NULL WHERE refund_id = 'r9'"},
			one(checkRefundSettled, "refund r9 refunded, provider_refund_id 're_9' settled_at NULL")},
		{"a refund from before the ledger refunded with an empty reference", []string{
			"UPDATE refunds SET state = 'refunded', provider_refund_id = '', settled_at = '" + lateAt + "' WHERE refund_id = 'r4'",
		}, one(checkRefundSettled, "refund r4 refunded, provider_refund_id '' settled_at "+lateAt+".000000")},

		{"a payment applied to an order that does not carry it", []string{
			"INSERT INTO payments VALUES ('webhook', 'pay-13', 8, 1000, 'USD', 'evt-13', '" + lateAt + "', 'applied')",
		}, one(checkLedger, "payment pay-13 (webhook) applied to order 8, which carries no payment id")},
		{"a payment applied to no order, which paid another", []string{"UPDATE payments SET order_id = 98 WHERE payment_id = 'pay-7'"},
			one(checkLedger, "payment pay-7 (webhook) applied to order 98, which does not exist",
				"order 7 is paid by payment pay-7, which the ledger has not applied to it")},
		{"a payment owed back with no refund", []string{"DELETE FROM refunds WHERE refund_id = 'r8'"},
			one(checkLedger, "payment pay-8 (webhook) owed back for order 8, and no refund returns it")},
		{"a payment owed back by a refund of another order", []string{"UPDATE payments SET order_id = 7 WHERE payment_id = 'pay-8'"},
			one(checkLedger, "payment pay-8 (webhook) owed back for order 7, but its refund r8 is for order 8")},
		{"a conflict whose payment id no other order carries", []string{"UPDATE payments SET order_id = 2 WHERE payment_id = 'pay-2'"},
			one(checkLedger, "payment pay-2 (webhook) for order 2 is a conflict, but no other order carries it")},
		{"a refund of a payment the ledger does not have", []string{"DELETE FROM payments WHERE payment_id = 'pi_10'"},
			one(checkLedger, "refund r10 of payment pi_10 (stripe): the ledger does not have the payment")},
		{"a refund of a conflict", []string{r2},
			one(checkLedger, "refund r2 of payment pay-2 (webhook): the ledger holds it as conflict")},
		{"a refund under another provider", []string{"UPDATE refunds SET provider = 'stripe' WHERE refund_id = 'r8'"},
			one(checkLedger, "payment pay-8 (webhook) owed back for order 8, and no refund returns it",
				"refund r8 of payment pay-8 (stripe): the ledger does not have the payment")},
		{"an order with an amount paid outside the ledger", []string{"DELETE FROM payments WHERE payment_id = 'pay-7'"},
			one(checkLedger, "order 7 is paid by payment pay-7, which the ledger has not applied to it")},

		{"a payment applied and owed back, in the ledger", []string{
			`INSERT INTO refunds (refund_id, provider, payment_id, order_id, user_id, sku_id, amount_cents, currency, reason, received_at)
				VALUES ('r7x', 'webhook', 'pay-7', 7, 20, 4, 1000, 'USD', 'duplicate_payment', '` + paidAt + `')`,
		}, one(checkRefundNotPaid, "payment pay-7 paid order 7 and is owed back for order 7")},
		{"a payment owed back whose id pays another order", []string{
			"UPDATE payments SET outcome = 'owed' WHERE payment_id = 'pay-2'", r2,
		}, one(checkRefundNotPaid, "payment pay-2 paid order 2 and is owed back for order 8")},
		{"a payment the ledger applied to an order that does not carry it, owed back", []string{
			"INSERT INTO payments VALUES ('webhook', 'pay-12', 7, 1000, 'USD', 'evt-12', '" + lateAt + "', 'applied')",
			`INSERT INTO refunds (refund_id, provider, payment_id, order_id, user_id, sku_id, amount_cents, currency, reason, received_at)
				VALUES ('r12', 'webhook', 'pay-12', 7, 20, 4, 1000, 'USD', 'duplicate_payment', '` + lateAt + `')`,
		}, []verify.Check{
			{Name: checkRefundNotPaid, Violations: 1, Examples: []string{"payment pay-12 (webhook) was applied by the ledger to order 7 and is owed back for order 7"}},
			{Name: checkLedger, Violations: 1, Examples: []string{"payment pay-12 (webhook) applied to order 7, which carries pay-7"}},
		}},

		{"an amount_mismatch refund of the amount owed", []string{
			"UPDATE payments SET amount_cents = 1000 WHERE payment_id = 'pay-8'",
			"UPDATE refunds SET amount_cents = 1000 WHERE refund_id = 'r8'",
		}, one(checkRefundOrder, "refund r8 of order 8 payment pay-8 (user 21 sku 4 amount_mismatch, received 1000 USD): "+
			"the order is user 21 sku 4 reserved, owes 1000 USD")},
		{"a duplicate_payment refund of an order not paid", []string{"UPDATE refunds SET reason = 'duplicate_payment' WHERE refund_id = 'r10'"},
			one(checkRefundOrder, "refund r10 of order 10 payment pi_10 (user 23 sku 4 duplicate_payment): the order is user 23 sku 4 cancelled")},
		{"an unknown_order refund of an order that exists", []string{"UPDATE refunds SET reason = 'unknown_order' WHERE refund_id = 'r10'"},
			one(checkRefundOrder, "refund r10 of order 10 payment pi_10 (user 23 sku 4 unknown_order, received 2025-01-01 10:30:00.000000): "+
				"the order is user 23 sku 4 cancelled, placed "+placedAt+".000000")},
		{"an unknown_order refund that names a user", []string{"UPDATE refunds SET user_id = 20 WHERE refund_id = 'r99'"},
			one(checkRefundOrder, "refund r99 of order 99 payment pay-99 (user 20 sku NULL unknown_order, received 2025-01-01 10:08:00.000000): no such order")},
		{"a late payment for a reservation the sweep has not expired yet", []string{
			"INSERT INTO payments VALUES ('webhook', 'pay-6', 6, 1000, 'USD', 'evt-6', '" + lateAt + "', 'owed')",
			`INSERT INTO refunds (refund_id, provider, payment_id, order_id, user_id, sku_id, amount_cents, currency, reason, received_at)
				VALUES ('r6', 'webhook', 'pay-6', 6, 10, 3, 1000, 'USD', 'order_expired', '` + lateAt + `')`,
		}, nil},
		{"a payment for an order placed after it, under the id it named", []string{
			`INSERT INTO orders (id, sku_id, user_id, created_at, status, pay_by, returned_at, amount_cents, currency)
				VALUES (12, 4, 24, '` + placedAt + `', 'cancelled', '` + payBy + `', '` + returnedAt + `', 1000, 'USD')`,
			"INSERT INTO payments VALUES ('webhook', 'pay-12', 12, 1000, 'USD', 'evt-12', '2025-01-01 09:59:00', 'owed')",
			`INSERT INTO refunds (refund_id, provider, payment_id, order_id, amount_cents, currency, reason, received_at)
				VALUES ('r12', 'webhook', 'pay-12', 12, 1000, 'USD', 'unknown_order', '2025-01-01 09:59:00')`,
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			expectFailing(t, saleAfter(t, ledger(t), tt.sql), tt.want)
		})
	}
}
