package stock

import (
	"strconv"

	"gorm.io/gorm"
)

// Events (docs/events.md). Every change that systems downstream must hear
// of — an order placed, paid or ended, a refund owed or settled, a payment
// that conflicts — writes its event to the outbox table in the transaction
// that makes the change, so that the two commit together or not at all;
// each replica's relay (internal/outbox) delivers them. An event's data is
// built by MySQL from the row as the change left it, and its occurred_at is
// the change's own stamp, so that nothing of the replica's clock or memory
// gets in.
//
// Each event belongs to a stream, whose sequence counts it: an order's
// events and its refunds' ride the order's stream, counted on its row
// (orders.event_seq); a refund with no order counts on its own row, and a
// conflicting payment with no order is a stream of one.
//
// Whether events are on is the database's word (outbox_switch), never the
// replica's configuration. A Service that has not seen them on asks in each
// transaction that makes a change, in a way that cannot miss the switch: the
// switch is turned on, committed, and only then given its on_since stamp
// (internal/outbox, Enable), so a change that saw it off was stamped before
// on_since —
//
//   - an order's INSERT reads the switch in the same statement that stamps
//     created_at (sqlOrderRow);
//   - every other change reads it first, with a shared lock (sqlEventsOn),
//     which the switch's UPDATE waits for.
//
// Once seen on it stays on: there is no switching events off.

// The types of events.
const (
	EventOrderReserved   = "order.reserved"
	EventOrderPaid       = "order.paid"
	EventOrderCancelled  = "order.cancelled"
	EventOrderExpired    = "order.expired"
	EventRefundOwed      = "refund.owed"
	EventRefundRefunded  = "refund.refunded"
	EventRefundFailed    = "refund.failed"
	EventPaymentConflict = "payment.conflict"
)

// rfc3339 is the DATE_FORMAT of an event's times: RFC 3339 in UTC, to the
// microsecond.
const rfc3339 = "'%Y-%m-%dT%H:%i:%s.%fZ'"

// The outbox's statements. Their text holds DATE_FORMAT's % signs, so none
// of them goes through withCondition.
var (
	// sqlEventsOn reads the switch with a shared lock, held until COMMIT.
	sqlEventsOn = "SELECT enabled FROM outbox_switch WHERE id = 1 LOCK IN SHARE MODE"
	// sqlPlacedEvents writes the order.reserved events of orders just
	// placed (id IN ?) whose INSERT saw events on; sqlPlacedPaidEvents adds
	// their order.paid events, for orders placed paid.
	sqlPlacedEvents     = eventInsert + placedEvent(EventOrderReserved, StatusReserved, 1)
	sqlPlacedPaidEvents = sqlPlacedEvents + " UNION ALL " + placedEvent(EventOrderPaid, StatusPaid, 2)
	// sqlOrderEvents writes the event of the change just made to each of
	// orders (id IN ?): paid, cancelled or expired, as its status says.
	sqlOrderEvents = eventInsert + eventSelect("CONCAT('order.', o.status)", "CONCAT('order:', o.id)", "o.event_seq",
		"IF(o.status = 'paid', o.paid_at, o.returned_at)", orderData("o.status", "o.event_seq"), "FROM orders o WHERE o.id IN ?")
	// sqlRefundEvent writes a refund's event of type ? (refund_id = ?) on
	// its order's stream; sqlOrderlessRefundEvent on its own.
	sqlRefundEvent = eventInsert + eventSelect("?", "CONCAT('order:', o.id)", "o.event_seq", refundChange,
		refundData("o.event_seq"), "FROM refunds r JOIN orders o ON o.id = r.order_id WHERE r.refund_id = ?")
	sqlOrderlessRefundEvent = eventInsert + eventSelect("?", "CONCAT('refund:', r.refund_id)", "r.event_seq", refundChange,
		refundData("r.event_seq"), "FROM refunds r WHERE r.refund_id = ?")
	// sqlConflictEvent writes a payment's payment.conflict event (provider
	// = ?, payment_id = ?), naming the order that has the payment (?), on
	// the stream of the order the payment named; sqlOrderlessConflictEvent
	// on its own, when there is no such order.
	sqlConflictEvent = eventInsert + eventSelect("'"+EventPaymentConflict+"'", "CONCAT('order:', o.id)", "o.event_seq", "p.received_at",
		conflictData("o.event_seq"), "FROM payments p JOIN orders o ON o.id = p.order_id WHERE p.provider = ? AND p.payment_id = ?")
	sqlOrderlessConflictEvent = eventInsert + eventSelect("'"+EventPaymentConflict+"'", "CONCAT('payment:', p.provider, ':', p.payment_id)", "1",
		"p.received_at", conflictData("1"), "FROM payments p WHERE p.provider = ? AND p.payment_id = ?")

	// sqlCountOrderEvent and sqlCountRefundEvent count one more event on a
	// stream's row.
	sqlCountOrderEvent  = "UPDATE orders SET event_seq = event_seq + 1 WHERE id = ?"
	sqlCountRefundEvent = "UPDATE refunds SET event_seq = event_seq + 1 WHERE refund_id = ?"
)

// The pieces the statements above are made of.
const (
	eventInsert = "INSERT INTO outbox (event_id, type, stream, sequence, occurred_at, aging_from, next_at, data) "
	// refundChange is when a refund's change was made, by its state.
	refundChange = "CASE r.state WHEN 'refunded' THEN r.settled_at WHEN 'failed' THEN r.failed_at ELSE r.received_at END"
)

// eventSelect is one SELECT of outbox rows: each of its arguments is SQL.
// The event is due at once, and its age counts from when it occurred.
func eventSelect(typ, stream, sequence, occurred, data, from string) string {
	return "SELECT UUID(), " + typ + ", " + stream + ", " + sequence + ", " + occurred + ", " + occurred +
		", UTC_TIMESTAMP(6), " + data + " " + from
}

// placedEvent is the SELECT of the event of type typ, numbered sequence, of
// the orders just placed (id IN ?) whose INSERT numbered at least that.
func placedEvent(typ, status string, sequence int) string {
	n := strconv.Itoa(sequence)
	return eventSelect("'"+typ+"'", "CONCAT('order:', o.id)", n, "o.created_at", orderData("'"+status+"'", n),
		"FROM orders o WHERE o.id IN ? AND o.event_seq >= "+n)
}

// orderData is an order's event data (orders o): the fields the API shows,
// with status and sequence as SQL.
func orderData(status, sequence string) string {
	return "JSON_OBJECT('order_id', o.id, 'sku_id', o.sku_id, 'user_id', o.user_id, " +
		"'created_at', " + ts("o.created_at") + ", 'status', " + status + ", 'pay_by', " + ts("o.pay_by") + ", " +
		"'paid_at', " + ts("o.paid_at") + ", 'payment_id', o.payment_id, 'returned_at', " + ts("o.returned_at") + ", " +
		"'amount_cents', o.amount_cents, 'currency', o.currency, 'sequence', " + sequence + ")"
}

// refundData is a refund's event data (refunds r).
func refundData(sequence string) string {
	return "JSON_OBJECT('refund_id', r.refund_id, 'provider', r.provider, 'payment_id', r.payment_id, 'order_id', r.order_id, " +
		"'user_id', r.user_id, 'sku_id', r.sku_id, 'amount_cents', r.amount_cents, 'currency', r.currency, " +
		"'received_at', " + ts("r.received_at") + ", 'reason', r.reason, 'state', r.state, " +
		"'provider_refund_id', r.provider_refund_id, 'settled_at', " + ts("r.settled_at") + ", " +
		"'failed_at', " + ts("r.failed_at") + ", 'failure', IF(r.state = 'failed', r.last_error, NULL), 'sequence', " + sequence + ")"
}

// conflictData is a conflicting payment's event data (payments p), with
// the order that has the payment as an argument (?, NULL when unknown).
func conflictData(sequence string) string {
	return "JSON_OBJECT('provider', p.provider, 'payment_id', p.payment_id, 'order_id', p.order_id, " +
		"'amount_cents', p.amount_cents, 'currency', p.currency, 'provider_event_id', p.event_id, " +
		"'received_at', " + ts("p.received_at") + ", 'paid_order_id', ?, 'sequence', " + sequence + ")"
}

// ts formats a DATETIME(6) column as RFC 3339; NULL stays NULL.
func ts(column string) string { return "DATE_FORMAT(" + column + ", " + rfc3339 + ")" }

// eventSeqOf is the SQL of a new order's event_seq: n while events are on.
// A Service that has seen them on writes n; one that has not reads the
// switch in the INSERT itself.
func (s *Service) eventSeqOf(n int) string {
	if s.eventsSeen.Load() {
		return strconv.Itoa(n)
	}
	return "(SELECT IF(enabled, " + strconv.Itoa(n) + ", 0) FROM outbox_switch WHERE id = 1)"
}

// eventsOn reports whether events are on, for a transaction that is about
// to make a change on tx: from memory once seen, and otherwise from the
// switch, read with a shared lock that holds its value until COMMIT.
func (s *Service) eventsOn(tx *gorm.DB) (bool, error) {
	if s.eventsSeen.Load() {
		return true, nil
	}
	var on bool
	if _, err := read(tx, &on, sqlEventsOn); err != nil {
		return false, err
	}
	if on {
		s.eventsSeen.Store(true)
	}
	return on, nil
}

// counted is what a change adds to its stream's count: one event while
// events are on, none while they are off.
func counted(events bool) int {
	if events {
		return 1
	}
	return 0
}

// orderEvents writes the events of orders ids' last change.
func orderEvents(tx *gorm.DB, ids []int64) error {
	_, _, err := run(tx, sqlOrderEvents, ids)
	return err
}

// refundEvent counts a refund's event of type typ on its stream and writes
// it: on its order's stream when it has an order (ordered), on its own
// otherwise.
func refundEvent(tx *gorm.DB, typ string, r Refund) error {
	if r.UserID != nil {
		n, _, err := run(tx, sqlCountOrderEvent, r.OrderID)
		if err != nil {
			return err
		}
		if n == 1 {
			_, _, err = run(tx, sqlRefundEvent, typ, r.RefundID)
			return err
		}
		// Its order is gone (a seed deleted it): the refund's own stream.
	}
	if _, _, err := run(tx, sqlCountRefundEvent, r.RefundID); err != nil {
		return err
	}
	_, _, err := run(tx, sqlOrderlessRefundEvent, typ, r.RefundID)
	return err
}

// conflictEvent writes payment p's payment.conflict event; other is the
// order that has the payment, 0 when not known yet.
func conflictEvent(tx *gorm.DB, p Payment, other int64) error {
	if other == 0 {
		if _, err := read(tx, &other, sqlOrderOfPayment, p.PaymentID); err != nil {
			return err
		}
	}
	var paid *int64
	if other > 0 {
		paid = &other
	}
	n, _, err := run(tx, sqlCountOrderEvent, p.OrderID)
	if err != nil {
		return err
	}
	q := sqlOrderlessConflictEvent
	if n == 1 {
		q = sqlConflictEvent
	}
	_, _, err = run(tx, q, paid, p.Provider, p.PaymentID)
	return err
}
