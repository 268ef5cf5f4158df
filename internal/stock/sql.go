package stock

import (
	"fmt"

	"gorm.io/gorm"
)

// Every statement the domain sends to MySQL is here, as its text, and each
// runs the one way: through gorm's Exec (run) or Raw (read, readRows), on
// the transaction or pool the caller has, so that every statement passes
// gorm's callbacks (its logger, its context) and none is built by gorm.
// What a statement may change, and how its answer is judged, is said where
// it is used.

// Products.
const (
	// sqlStockOf reads what a look at a product before its lock needs:
	// whether it is there, its stock, and its sale window.
	sqlStockOf = "SELECT stock, sale_starts_at, sale_ends_at FROM products WHERE id = ?"
	// sqlSaleOf reads what a batch's careful attempt judges by, as the
	// naive update reads it; sqlSaleOfLocked locks the row for the guarded
	// update.
	sqlSaleOf       = "SELECT id, stock, fence, sale_starts_at, sale_ends_at FROM products WHERE id = ?"
	sqlSaleOfLocked = sqlSaleOf + " FOR UPDATE"
	// sqlStockAndFenceLocked reads the row as committed now, locked.
	sqlStockAndFenceLocked = "SELECT stock, fence FROM products WHERE id = ? FOR UPDATE"
	// sqlFenceLocked locks the row first, as every write of a SKU's stock
	// does, and reads its fence.
	sqlFenceLocked = "SELECT id, fence FROM products WHERE id = ? FOR UPDATE"
	// sqlProduct reads a whole product; sqlProductLocked locks it too.
	sqlProduct       = "SELECT * FROM products WHERE id = ?"
	sqlProductLocked = sqlProduct + " FOR UPDATE"
	// sqlStock reads a product's stock alone.
	sqlStock = "SELECT id, stock FROM products WHERE id = ?"
	// sqlProductIDs reads every product's id, in order.
	sqlProductIDs = "SELECT id FROM products ORDER BY id"
	// sqlCatalogEpoch reads the catalog's epoch, which a seed raises.
	sqlCatalogEpoch = "SELECT epoch FROM catalog_epoch WHERE id = 1"
)

// A batch's stock writes. A fenced write carries the lease's token and is
// refused unless it is newer than the row's fence; every fenced write
// moves the fence.
const (
	// sqlTakeUnits takes up to ? units, as many as the stock has, handing
	// back the stock before through LAST_INSERT_ID(expr) (as stock+1, so
	// that 0 is "no row"); sqlTakeUnitsFenced is the fenced form, which
	// moves the fence only with a unit taken. Both assignments read the row
	// as it was: the fence's comes first, and with SIMULTANEOUS_ASSIGNMENT
	// (MariaDB) every assignment reads the old row. The condition admits
	// orders that arrived between ? and ? within the sale window.
	sqlTakeUnits       = "UPDATE products SET stock = LAST_INSERT_ID(stock + 1) - 1 - LEAST(stock, ?) WHERE id = ?" + sqlOpenWindow
	sqlTakeUnitsFenced = "UPDATE products SET fence = IF(stock > 0, ?, fence), " +
		"stock = LAST_INSERT_ID(stock + 1) - 1 - LEAST(stock, ?) WHERE id = ?" + sqlOpenWindow + " AND fence < ?"
	// sqlOpenWindow admits every order that arrived between its two
	// arguments, the earliest and the latest, within the sale window.
	sqlOpenWindow = " AND (sale_starts_at IS NULL OR sale_starts_at <= ?) AND (sale_ends_at IS NULL OR sale_ends_at > ?)"
	// The careful attempt's writes: guarded, which refuses to go below
	// zero, and naive, the source articles' write of the value read minus
	// the units sold, fenced as a compare-and-set on the fence read.
	sqlTakeGuarded       = "UPDATE products SET stock = stock - ? WHERE id = ? AND stock >= ?"
	sqlTakeGuardedFenced = "UPDATE products SET stock = stock - ?, fence = ? WHERE id = ? AND stock >= ? AND fence < ?"
	sqlWriteNaive        = "UPDATE products SET stock = ? WHERE id = ?"
	sqlWriteNaiveFenced  = "UPDATE products SET stock = ?, fence = ? WHERE id = ? AND fence = ? AND fence < ?"
)

// Orders.
const (
	// sqlOrderColumns are the columns of an order just placed.
	sqlOrderColumns = "id, sku_id, user_id, idempotency_key, fence, created_at, status, pay_by, amount_cents, currency, event_seq"
	// sqlInsertOrder is the start of a multi-row INSERT of orders, whose
	// rows insertOrders writes as sqlOrderRow, joined by UNION ALL: each
	// selects its amount and currency from the product's row (the last
	// argument), with the pay_by of its kind and its first event's
	// sequence number (eventSeqOf), the two %s. created_at is MySQL's
	// clock, as pay_by is: within one statement UTC_TIMESTAMP(6) is one
	// instant, so a reservation's pay_by is its created_at plus the window,
	// exactly, whatever the replica's clock says. The form is plain SQL,
	// the same on MariaDB and MySQL.
	sqlInsertOrder  = "INSERT INTO orders (sku_id, user_id, idempotency_key, fence, created_at, status, pay_by, amount_cents, currency, event_seq) "
	sqlOrderRow     = "SELECT ?, ?, ?, ?, UTC_TIMESTAMP(6), ?, %s, price_cents, currency, %s FROM products WHERE id = ?"
	sqlOrderRowArgs = 6
	// sqlOrdersOfUsers reads users' active orders of a SKU through the
	// (user, active SKU) unique index.
	sqlOrdersOfUsers = "SELECT * FROM orders WHERE user_id IN ? AND active_sku = ?"
	// sqlHeldOrders reads users' active orders of a SKU and their orders
	// under keys, of any SKU and status.
	sqlHeldOrders = "SELECT * FROM orders WHERE user_id IN ? AND (active_sku = ? OR idempotency_key IN ?)"
	// sqlOrderByKey reads the order a user placed under a key.
	sqlOrderByKey = "SELECT * FROM orders WHERE user_id = ? AND idempotency_key = ? LIMIT 1"
	// sqlOrderOf reads a user's order, with whether its payment window has
	// ended by MySQL's clock.
	sqlOrderOf = "SELECT *, (" + sqlLapsed + ") AS lapsed FROM orders WHERE id = ? AND user_id = ?"
)

// The lifecycle: every change of an order's status is one conditional
// UPDATE, decided by MySQL's clock (lifecycle.go).
const (
	// sqlLapsed selects the reservations whose payment window has ended.
	sqlLapsed = "status = 'reserved' AND pay_by <= UTC_TIMESTAMP(6)"
	// sqlPayable selects the reservations that may still be paid or
	// cancelled: the exact complement of sqlLapsed among reservations.
	sqlPayable = "status = 'reserved' AND pay_by > UTC_TIMESTAMP(6)"
	// sqlLapsedShards lists the shards (sku_id mod ?) that have lapsed
	// reservations, the one of the oldest first; sqlLapsedSKUs lists the
	// SKUs of one (mod ? = ?) that have, the one of the oldest first, at
	// most ? of them. Both read the lapsed rows alone, on the index
	// (status, pay_by): as many as the sweep has left. sqlOldestLapsed is
	// the age of the oldest lapsed reservation in microseconds, NULL for
	// none, one look at the same index.
	sqlLapsedShards = "SELECT MOD(sku_id, ?) AS shard FROM orders WHERE " + sqlLapsed + " GROUP BY shard ORDER BY MIN(pay_by), shard"
	sqlLapsedSKUs   = "SELECT sku_id FROM orders WHERE " + sqlLapsed + " AND MOD(sku_id, ?) = ? GROUP BY sku_id ORDER BY MIN(pay_by), sku_id LIMIT ?"
	sqlOldestLapsed = "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(pay_by), UTC_TIMESTAMP(6)) FROM orders WHERE " + sqlLapsed
	// sqlCancellable and sqlExpirable are what a cancellation and the sweep
	// end: a user's payable reservation, and lapsed reservations.
	sqlCancellable = "id = ? AND user_id = ? AND " + sqlPayable
	sqlExpirable   = sqlLapsed
	// sqlFindEnding finds, without a lock and before the transaction, at
	// most ? orders of a SKU that a condition (sqlCancellable,
	// sqlExpirable) selects; sqlLockEnding then locks them through the
	// primary key, in id order, with the condition again. A payment locks
	// its order through the primary key too, so the two take an order's
	// locks in one order: a locking read through the (sku, status) index
	// would hold its entry while waiting for the row that a payment holds
	// while it waits for the entry, a deadlock. sqlEnd ends them, with the
	// condition again, stamping returned_at.
	sqlFindEnding = "SELECT id FROM orders WHERE sku_id = ? AND %s ORDER BY id LIMIT ?"
	sqlLockEnding = "SELECT id, user_id, payment_intent FROM orders FORCE INDEX (PRIMARY) WHERE id IN ? AND sku_id = ? AND %s ORDER BY id FOR UPDATE"
	sqlEnd        = "UPDATE orders FORCE INDEX (PRIMARY) SET status = ?, returned_at = UTC_TIMESTAMP(6), event_seq = event_seq + ? WHERE id IN ? AND sku_id = ? AND %s"
	// sqlReturnUnits adds units back; sqlReturnUnitsFenced is its fenced
	// form.
	sqlReturnUnits       = "UPDATE products SET stock = stock + ? WHERE id = ?"
	sqlReturnUnitsFenced = "UPDATE products SET stock = stock + ?, fence = ? WHERE id = ? AND fence < ?"
)

// Payments and refunds (payments.go, refunds.go).
const (
	// sqlRecordPayment keeps a payment in the ledger, as applied until
	// its transaction says otherwise (sqlSetOutcome). On a payment there
	// already it changes nothing, and MySQL answers 0 rows, having locked
	// the row: a delivery racing the first waits for its COMMIT.
	sqlRecordPayment = "INSERT INTO payments (provider, payment_id, order_id, amount_cents, currency, event_id, received_at, outcome) " +
		"VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), 'applied') ON DUPLICATE KEY UPDATE provider = provider"
	sqlSetOutcome = "UPDATE payments SET outcome = ? WHERE provider = ? AND payment_id = ?"
	sqlPaymentOf  = "SELECT order_id, amount_cents, currency, outcome FROM payments WHERE provider = ? AND payment_id = ?"
	// sqlApplyPayment pays a payable reservation with a payment of its
	// amount, by its primary key: the event names no buyer. FORCE INDEX:
	// on few rows the optimizer may go through (status, pay_by) instead,
	// and lock that index's entry before the row, the other way round from
	// a cancellation or the sweep (sqlLockEnding): a deadlock.
	sqlApplyPayment = "UPDATE orders FORCE INDEX (PRIMARY) SET status = 'paid', payment_id = ?, paid_at = UTC_TIMESTAMP(6), event_seq = event_seq + ? " +
		"WHERE id = ? AND " + sqlPayable + " AND amount_cents = ? AND currency = ?"
	// sqlLockOrder reads an order by its primary key with a lock, with
	// whether its payment window has ended by MySQL's clock.
	sqlLockOrder      = "SELECT *, (" + sqlLapsed + ") AS lapsed FROM orders WHERE id = ? FOR UPDATE"
	sqlOrderOfPayment = "SELECT id FROM orders WHERE payment_id = ?"
	// sqlOweRefund records a payment owed back.
	sqlOweRefund = "INSERT INTO refunds (refund_id, provider, payment_id, order_id, user_id, sku_id, reason, amount_cents, currency, received_at, state, event_seq) " +
		"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), 'owed', ?)"
	sqlRefundColumns   = "refund_id, provider, payment_id, order_id, user_id, sku_id, amount_cents, currency, received_at, reason, state, provider_refund_id, settled_at, attempts, last_error"
	sqlRefundOfPayment = "SELECT " + sqlRefundColumns + " FROM refunds WHERE provider = ? AND payment_id = ?"
	// sqlRefundPage is a page of refunds in some states, by refund id.
	sqlRefundPage          = "SELECT " + sqlRefundColumns + " FROM refunds WHERE state IN ? AND refund_id > ? ORDER BY refund_id LIMIT ?"
	sqlLockRefund          = "SELECT " + sqlRefundColumns + " FROM refunds WHERE refund_id = ? FOR UPDATE"
	sqlLockRefundOfPayment = sqlRefundOfPayment + " FOR UPDATE"
	sqlSettleRefund        = "UPDATE refunds SET state = 'refunded', provider_refund_id = ?, settled_at = UTC_TIMESTAMP(6), claimed_until = NULL, last_error = NULL WHERE refund_id = ?"
	sqlFailRefund          = "UPDATE refunds SET state = 'failed', last_error = ?, failed_at = UTC_TIMESTAMP(6), claimed_until = NULL WHERE refund_id = ?"
	// sqlClaimableRefunds locks refunds a refunder may take, skipping
	// those another refunder is claiming now; sqlClaimRefunds claims them.
	sqlClaimableRefunds = "SELECT " + sqlRefundColumns + " FROM refunds WHERE state IN ('owed', 'requested') AND provider = ? " +
		"AND amount_cents IS NOT NULL AND (claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6)) ORDER BY refund_id LIMIT ? FOR UPDATE SKIP LOCKED"
	sqlClaimRefunds = "UPDATE refunds SET state = 'requested', attempts = attempts + 1, " +
		"claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE refund_id IN ?"
	sqlRetryRefund = "UPDATE refunds SET claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, last_error = ? " +
		"WHERE refund_id = ? AND state = 'requested'"
	// sqlStoreCheckout stores an order's checkout, once, while it is
	// payable.
	sqlStoreCheckout  = "UPDATE orders SET payment_intent = ?, client_secret = ? WHERE id = ? AND user_id = ? AND payment_intent IS NULL AND " + sqlPayable
	sqlSetCheckoutKey = "UPDATE orders SET checkout_key = ? WHERE id = ? AND checkout_key IS NULL"
	sqlCheckoutKey    = "SELECT checkout_key FROM orders WHERE id = ?"
	// sqlCountUnsettled counts the refunds a seed must not delete.
	sqlCountUnsettled = "SELECT COUNT(*) FROM refunds WHERE state <> 'refunded'"
	sqlNameUnsettled  = "SELECT CONCAT(refund_id, ' ', state, ' ', reason, ' order ', order_id) FROM refunds WHERE state <> 'refunded' ORDER BY refund_id LIMIT ?"
)

// The buyers' order counters of the user limit (userlimit.go). FORCE
// INDEX: on a small table the optimizer may scan it whole, and a locking
// scan waits for, and locks, the counters of other users too — other
// transactions' buyers, whose own scans then wait for these: a deadlock.
// Through the primary key only the buyers' rows are locked, in key order.
const (
	sqlCounterExists = "SELECT COUNT(*) FROM user_orders WHERE user_id = ?"
	sqlNewCounter    = "INSERT IGNORE INTO user_orders (user_id, orders) VALUES (?, ?)"
	// sqlLockActiveOrdersOf counts a user's active orders with a locking
	// read (ensureCounter), through the index (user_id, active_sku) and no
	// other: every such read then locks the user's orders in one order, and
	// none waits for another user's (through (status, pay_by), which the
	// optimizer may otherwise take, it would wait for every reservation and
	// lock them in pay_by order).
	sqlLockActiveOrdersOf = "SELECT COUNT(*) FROM orders FORCE INDEX (uq_orders_user_active_sku) WHERE user_id = ? AND status IN ('" + StatusReserved + "', '" + StatusPaid + "') FOR UPDATE"
	sqlLockCounters       = "SELECT user_id, orders FROM user_orders FORCE INDEX (PRIMARY) WHERE user_id IN ? FOR UPDATE"
	// sqlCountOrders raises only the counters under the limit (?).
	sqlCountOrders = "UPDATE user_orders FORCE INDEX (PRIMARY) SET orders = orders + 1 WHERE user_id IN ? AND orders < ?"
	// sqlUncountOrders takes returned orders off their buyers' counters.
	sqlUncountOrders = "UPDATE user_orders FORCE INDEX (PRIMARY) SET orders = orders - 1 WHERE user_id IN ? AND orders > 0"
)

// A product change (admin.go).
const (
	sqlChangeProduct = "UPDATE products SET initial_stock = initial_stock + ?, stock = stock + ?, price_cents = ?, " +
		"sale_starts_at = ?, sale_ends_at = ? WHERE id = ?"
	sqlChangeProductFenced = "UPDATE products SET initial_stock = initial_stock + ?, stock = stock + ?, price_cents = ?, " +
		"sale_starts_at = ?, sale_ends_at = ?, fence = ? WHERE id = ? AND fence < ?"
)

// A seed (seed.go). sqlRaiseEpoch is its first statement, and its lock.
const (
	sqlCountProducts   = "SELECT COUNT(*) FROM products"
	sqlPriceUnpriced   = "UPDATE products SET currency = ? WHERE currency IS NULL"
	sqlDeleteOrders    = "DELETE FROM orders"
	sqlDeleteUnsettled = "DELETE FROM refunds WHERE state <> 'refunded'"
	sqlDiscardPayments = "DELETE p FROM payments p JOIN refunds r ON r.provider = p.provider AND r.payment_id = p.payment_id WHERE r.state <> 'refunded'"
	sqlDeleteCounters  = "DELETE FROM user_orders"
	sqlDeleteProducts  = "DELETE FROM products"
	sqlRaiseEpoch      = "INSERT INTO catalog_epoch (id, epoch, seeded_at) VALUES (1, 1, UTC_TIMESTAMP(6)) " +
		"ON DUPLICATE KEY UPDATE epoch = epoch + 1, seeded_at = UTC_TIMESTAMP(6)"
	sqlInsertProduct   = "INSERT INTO products (id, name, price_cents, currency, initial_stock, stock, fence, sale_starts_at, sale_ends_at) VALUES "
	sqlProductRow      = "(?, ?, ?, ?, ?, ?, 0, ?, ?)"
	sqlProductRowCount = 8 // the arguments of sqlProductRow
)

// withCondition puts condition into a statement that has %s for it.
func withCondition(statement, condition string) string { return fmt.Sprintf(statement, condition) }

// run runs statement q with args on db and returns MySQL's answer: how many
// rows it changed, and the id it handed back (LAST_INSERT_ID; 0 for none).
func run(db *gorm.DB, q string, args ...any) (changed, id int64, err error) {
	r := gorm.WithResult()
	if err := db.Clauses(r).Exec(q, args...).Error; err != nil {
		return 0, 0, err
	}
	// MySQL's driver knows both from the statement's answer: neither
	// fails.
	changed, _ = r.Result.RowsAffected()
	id, _ = r.Result.LastInsertId()
	return changed, id, nil
}

// read runs query q with args on db into dst, a struct or a slice of them
// (by their gorm column names) or a value, and reports whether it read a
// row.
func read(db *gorm.DB, dst any, q string, args ...any) (bool, error) {
	res := db.Raw(q, args...).Scan(dst)
	return res.RowsAffected > 0, res.Error
}
