package verify

import (
	"fmt"

	"gorm.io/gorm"
)

// The checks of money: refunds, the payments ledger, and the amounts that
// orders owe and payments bring. Rows from before amounts are exempt: an
// order with neither amount_cents nor currency (paid or ended before
// migration 00008), and a refund with no provider (owed before the ledger)
// are not compared with a payment, which they have none of.
const (
	checkRefundOrder    = "every refund owed is of its order, for a reason the order bears out"
	checkRefundNotPaid  = "no payment both paid an order and is owed back"
	checkPaymentAmount  = "every paid order's payment matches its amount and currency"
	checkPaymentOnce    = "no payment id is applied to two orders"
	checkRefundAmount   = "every refund returns the amount and currency its payment received"
	checkRefundSettled  = "every refunded refund has the provider's reference and settled_at"
	checkLedgerAgreesTo = "the payments ledger agrees with orders and refunds"
)

// SQL of the money checks.
const (
	// moneyO, moneyP and moneyR render the amount and currency of an
	// order o, a payment p and a refund r: "1000 USD", or NULL for either
	// one missing.
	moneyO = "CONCAT(COALESCE(o.amount_cents, 'NULL'), ' ', COALESCE(o.currency, 'NULL'))"
	moneyP = "CONCAT(COALESCE(p.amount_cents, 'NULL'), ' ', COALESCE(p.currency, 'NULL'))"
	moneyR = "CONCAT(COALESCE(r.amount_cents, 'NULL'), ' ', COALESCE(r.currency, 'NULL'))"
	// beforeAmounts holds for an order o from before amounts.
	beforeAmounts = "(o.amount_cents IS NULL AND o.currency IS NULL)"
	// gaveUpPayment holds for an order of the table orders whose payment id
	// migration 00008 took away: the id was on an earlier order too, which
	// kept it, and this one owes it back (a refund from before the ledger,
	// duplicate_payment). The order stays paid, with paid_at and no
	// payment id.
	gaveUpPayment = `EXISTS (SELECT 1 FROM refunds d
		WHERE d.order_id = orders.id AND d.provider IS NULL AND d.reason = 'duplicate_payment')`
	// paidOutsideLedger are the paid orders o that carry a payment id the
	// ledger did not apply to them: from before the ledger, when a buyer's
	// word paid an order, or paid by a path that skipped the ledger. The
	// ledger is read by its order (ix_payments_order): by payment id alone
	// it has no index. A WHERE clause follows, to be extended with AND.
	paidOutsideLedger = `orders o LEFT JOIN payments a ON a.order_id = o.id AND a.payment_id = o.payment_id AND a.outcome = 'applied'
		WHERE o.status = 'paid' AND o.payment_id IS NOT NULL AND a.payment_id IS NULL`
	// sinceSeed is when the last seed reset the catalog: the ledger and
	// the settled refunds keep payments of orders it deleted, which are
	// not held to the orders of now.
	sinceSeed = "(SELECT COALESCE(MAX(seeded_at), '1000-01-01') FROM catalog_epoch)"
	// refundAndLedger is every refund r with its payment p in the ledger,
	// when it has a provider and the ledger has the payment.
	refundAndLedger = `refunds r LEFT JOIN payments p ON p.provider = r.provider AND p.payment_id = r.payment_id`
	// refundOrderMismatch holds for a refund r whose order o (LEFT JOINed)
	// does not bear out its reason. Every reason but unknown_order needs
	// the order, of the refund's user and SKU, and:
	//   - order_cancelled: the order is cancelled;
	//   - order_expired: the payment came at or after pay_by (MySQL's
	//     clock both), and the order is expired, or still reserved until
	//     the sweep expires it;
	//   - duplicate_payment: the order is paid (by another payment, or when
	//     placed);
	//   - amount_mismatch: what was received is not what the order owes.
	// An unknown_order refund names no user or SKU, and its order did not
	// exist when the payment came: there is none, or it was placed after
	// (by the clock of the replica that placed it). COALESCE makes a
	// comparison with NULL a mismatch.
	refundOrderMismatch = `NOT COALESCE(IF(r.reason = 'unknown_order',
		(o.id IS NULL OR o.created_at > r.received_at) AND r.user_id IS NULL AND r.sku_id IS NULL,
		o.user_id = r.user_id AND o.sku_id = r.sku_id AND CASE r.reason
			WHEN 'order_cancelled' THEN o.status = 'cancelled'
			WHEN 'order_expired' THEN o.status IN ('expired', 'reserved') AND o.pay_by <= r.received_at
			WHEN 'duplicate_payment' THEN o.status = 'paid'
			WHEN 'amount_mismatch' THEN NOT (o.amount_cents <=> r.amount_cents AND o.currency <=> r.currency)
			ELSE FALSE END), FALSE)`
	// refundOrderFacts are the facts of a refund r and its order o that
	// its reason rests on, for an example.
	refundOrderFacts = `CONCAT('refund ', r.refund_id, ' of order ', r.order_id, ' payment ', r.payment_id,
		' (user ', COALESCE(r.user_id, 'NULL'), ' sku ', COALESCE(r.sku_id, 'NULL'), ' ', r.reason,
		CASE r.reason WHEN 'amount_mismatch' THEN CONCAT(', received ', ` + moneyR + `)
			WHEN 'order_expired' THEN CONCAT(', received ', r.received_at)
			WHEN 'unknown_order' THEN CONCAT(', received ', r.received_at)
			ELSE '' END,
		'): ', IF(o.id IS NULL, 'no such order', CONCAT('the order is user ', o.user_id, ' sku ', o.sku_id, ' ', o.status,
			CASE r.reason WHEN 'amount_mismatch' THEN CONCAT(', owes ', ` + moneyO + `)
				WHEN 'order_expired' THEN CONCAT(', pay_by ', COALESCE(o.pay_by, 'NULL'))
				WHEN 'unknown_order' THEN CONCAT(', placed ', o.created_at)
				ELSE '' END)))`
)

// offenders is a check written once, as the query of its offenders: a
// row each, its example in the column line, ordered by the columns that
// order names.
type offenders struct{ name, query, order string }

// check counts the offenders and lists the first of them.
func (o offenders) check(db *gorm.DB) (Check, error) {
	return runCheck(db, o.name, "SELECT COUNT(*) FROM ("+o.query+") x",
		"SELECT line FROM ("+o.query+") x ORDER BY "+o.order)
}

// moneyChecks are the checks of refunds, payments and amounts, in the
// order a report lists them. An offender is counted by one check only.
//
//   - every refund owed is for its order, of its user and SKU, and the
//     order bears its reason out (see refundOrderMismatch);
//   - no payment is both applied and owed back: no refund is of a payment
//     id that a paid order carries, or that the ledger applied. The
//     refunds migration 00008 made of a payment id on several orders are
//     of the id the first order kept, by design; and a refund whose
//     payment the ledger lacks, or holds as a conflict, is the ledger
//     check's;
//   - every paid order paid by a payment in the ledger owes what the
//     payment brought, in its currency (orders from before amounts are
//     exempt: a payment from before the ledger delivered again);
//   - no payment id is on two orders (the unique key on
//     orders.payment_id makes it so; checked all the same), or applied by
//     the ledger twice, under two providers;
//   - every refund with a provider returns the amount and currency its
//     payment received;
//   - every refunded refund has the provider's reference and settled_at;
//   - the ledger agrees with orders and refunds (payments and refunds
//     received before the last seed are of orders it deleted, and are not
//     held to the orders of now): a payment applied is
//     carried by its order; one owed has its refund, for the same order;
//     a conflict's payment id is on another order; every refund with a
//     provider is of a payment the ledger holds as owed (or applied, the
//     check above); and every paid order with an amount carries a payment
//     the ledger applied to it: only orders from before amounts were paid
//     before the ledger (counted, not a violation).
var moneyChecks = []offenders{
	{
		checkRefundOrder,
		`SELECT r.order_id, r.payment_id, ` + refundOrderFacts + ` line
			FROM refunds r LEFT JOIN orders o ON o.id = r.order_id WHERE r.received_at >= ` + sinceSeed + ` AND ` + refundOrderMismatch,
		"order_id, payment_id",
	},
	{
		checkRefundNotPaid,
		`SELECT r.order_id, r.payment_id, o.id paid,
				CONCAT('payment ', r.payment_id, IF(o.id IS NULL,
					CONCAT(' (', r.provider, ') was applied by the ledger to order ', p.order_id),
					CONCAT(' paid order ', o.id)), ' and is owed back for order ', r.order_id) line
			FROM ` + refundAndLedger + ` LEFT JOIN orders o ON o.status = 'paid' AND o.payment_id = r.payment_id
			WHERE NOT (r.provider IS NULL AND r.reason = 'duplicate_payment')
				AND (r.provider IS NULL OR COALESCE(p.outcome, '') IN ('applied', 'owed'))
				AND (o.id IS NOT NULL OR COALESCE(p.outcome, '') = 'applied')`,
		"order_id, payment_id, paid",
	},
	{
		checkPaymentAmount,
		`SELECT o.id, p.provider, CONCAT('order ', o.id, ' owes ', ` + moneyO + `, ', payment ', p.payment_id,
				' (', p.provider, ') paid ', ` + moneyP + `) line
			FROM orders o JOIN payments p ON p.order_id = o.id AND p.payment_id = o.payment_id AND p.outcome = 'applied'
			WHERE o.status = 'paid' AND NOT ` + beforeAmounts + `
				AND NOT (p.amount_cents <=> o.amount_cents AND p.currency <=> o.currency)`,
		"id, provider",
	},
	{
		checkPaymentOnce,
		`SELECT x.payment_id, CONCAT('payment ', x.payment_id, ' is on orders ',
				COALESCE((SELECT GROUP_CONCAT(id ORDER BY id) FROM orders WHERE payment_id = x.payment_id), 'none'),
				'; the ledger applied it to ', COALESCE((SELECT GROUP_CONCAT(CONCAT('order ', order_id, ' (', provider, ')')
					ORDER BY provider SEPARATOR ', ') FROM payments WHERE payment_id = x.payment_id AND outcome = 'applied'), 'none')) line
			FROM (SELECT payment_id FROM orders WHERE payment_id IS NOT NULL GROUP BY payment_id HAVING COUNT(*) > 1
				UNION SELECT payment_id FROM payments WHERE outcome = 'applied' GROUP BY payment_id HAVING COUNT(*) > 1) x`,
		"payment_id",
	},
	{
		checkRefundAmount,
		`SELECT r.refund_id, CONCAT('refund ', r.refund_id, ' returns ', ` + moneyR + `, ', its payment ', p.payment_id,
				' (', p.provider, ') received ', ` + moneyP + `) line
			FROM refunds r JOIN payments p ON p.provider = r.provider AND p.payment_id = r.payment_id
			WHERE NOT (r.amount_cents <=> p.amount_cents AND r.currency <=> p.currency)`,
		"refund_id",
	},
	{
		checkRefundSettled,
		`SELECT refund_id, CONCAT('refund ', refund_id, ' refunded, provider_refund_id ', QUOTE(provider_refund_id),
				' settled_at ', COALESCE(settled_at, 'NULL')) line
			FROM refunds WHERE state = 'refunded' AND (COALESCE(provider_refund_id, '') = '' OR settled_at IS NULL)`,
		"refund_id",
	},
	{
		checkLedgerAgreesTo,
		// One branch per kind of disagreement, kind the first column.
		`SELECT 1 kind, p.order_id, p.payment_id k, CONCAT('payment ', p.payment_id, ' (', p.provider, ') applied to order ',
				p.order_id, ', which ', IF(o.id IS NULL, 'does not exist', CONCAT('carries ', COALESCE(o.payment_id, 'no payment id')))) line
			FROM payments p LEFT JOIN orders o ON o.id = p.order_id
			WHERE p.outcome = 'applied' AND NOT (o.payment_id <=> p.payment_id) AND p.received_at >= ` + sinceSeed + `
		UNION ALL SELECT 2, p.order_id, p.payment_id, CONCAT('payment ', p.payment_id, ' (', p.provider, ') owed back for order ',
				p.order_id, IF(r.refund_id IS NULL, ', and no refund returns it', CONCAT(', but its refund ', r.refund_id, ' is for order ', r.order_id)))
			FROM payments p LEFT JOIN refunds r ON r.provider = p.provider AND r.payment_id = p.payment_id
			WHERE p.outcome = 'owed' AND NOT (r.order_id <=> p.order_id)
		UNION ALL SELECT 3, p.order_id, p.payment_id, CONCAT('payment ', p.payment_id, ' (', p.provider, ') for order ',
				p.order_id, ' is a conflict, but no other order carries it')
			FROM payments p WHERE p.outcome = 'conflict' AND p.received_at >= ` + sinceSeed + `
				AND NOT EXISTS (SELECT 1 FROM orders c WHERE c.payment_id = p.payment_id AND c.id <> p.order_id)
		UNION ALL SELECT 4, r.order_id, r.refund_id, CONCAT('refund ', r.refund_id, ' of payment ', r.payment_id, ' (', r.provider, '): ',
				IF(p.outcome IS NULL, 'the ledger does not have the payment', CONCAT('the ledger holds it as ', p.outcome)))
			FROM ` + refundAndLedger + `
			WHERE r.provider IS NOT NULL AND COALESCE(p.outcome, '') NOT IN ('applied', 'owed')
		UNION ALL SELECT 5, o.id, o.payment_id, CONCAT('order ', o.id, ' is paid by payment ', o.payment_id,
				', which the ledger has not applied to it')
			FROM ` + paidOutsideLedger + ` AND NOT ` + beforeAmounts,
		"kind, order_id, k",
	},
}

// PaymentCounts counts the payments ledger by outcome.
type PaymentCounts struct {
	Applied  int64 `json:"applied"`
	Owed     int64 `json:"owed"`
	Conflict int64 `json:"conflict"`
}

// RefundCounts counts refunds by state.
type RefundCounts struct {
	Owed      int64 `json:"owed"`
	Requested int64 `json:"requested"`
	Refunded  int64 `json:"refunded"`
	Failed    int64 `json:"failed"`
}

// countMoney fills r's counts of the ledger, of refunds by state and of the
// orders paid before the ledger.
func countMoney(db *gorm.DB, r *Report) error {
	p, f := &r.Payments, &r.RefundsByState
	err := db.Raw(`SELECT
		(SELECT COUNT(*) FROM payments WHERE outcome = 'applied'),
		(SELECT COUNT(*) FROM payments WHERE outcome = 'owed'),
		(SELECT COUNT(*) FROM payments WHERE outcome = 'conflict'),
		(SELECT COUNT(*) FROM refunds WHERE state = 'owed'),
		(SELECT COUNT(*) FROM refunds WHERE state = 'requested'),
		(SELECT COUNT(*) FROM refunds WHERE state = 'refunded'),
		(SELECT COUNT(*) FROM refunds WHERE state = 'failed'),
		(SELECT COUNT(*) FROM `+paidOutsideLedger+` AND `+beforeAmounts+`)`).
		Row().Scan(&p.Applied, &p.Owed, &p.Conflict, &f.Owed, &f.Requested, &f.Refunded, &f.Failed, &r.PaidBeforeLedger)
	if err != nil {
		return fmt.Errorf("stock: verify: %w", err)
	}
	return nil
}
