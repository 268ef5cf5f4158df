package verify

import (
	"fmt"
	"strings"

	"gorm.io/gorm"
)

// The checks of events (docs/events.md), made once events are on and
// stamped on_since: every change stamped since then was made by a
// transaction that saw the switch on, and wrote its event in the outbox
// with it. The relay's retention deletes delivered events, oldest first,
// while the stream's row (orders.event_seq, refunds.event_seq) keeps their
// count; what the sequence leaves room for below the events still present
// is what retention took.
const (
	checkEventWritten  = "every change since events were turned on has its event, in the outbox or removed by retention"
	checkEventSequence = "every stream's events in the outbox run without a gap up to its event_seq"
)

// eventsSince is when events were turned on, by MySQL's clock.
const eventsSince = "(SELECT on_since FROM outbox_switch WHERE id = 1)"

// SQL of the event checks.
var (
	// changesSince are the changes stamped since events were turned on, a
	// row each: the stream its event is on, the stream's event_seq and the
	// event's type. Orders by their stamps: placed (created_at), paid
	// (paid_at, or when placed paid: created_at, after its order.reserved),
	// cancelled or expired (returned_at). Refunds by received_at,
	// settled_at and failed_at (a refund failed twice has two events and
	// one stamp: a type's events are counted at least as many as its
	// changes). Payments that conflict by received_at.
	changesSince = `SELECT CONCAT('order:', o.id) stream, o.event_seq seq, 'order.reserved' type
			FROM orders o WHERE o.created_at >= ` + eventsSince + `
		UNION ALL SELECT CONCAT('order:', o.id), o.event_seq, 'order.paid' FROM orders o
			WHERE o.status = 'paid' AND (o.paid_at >= ` + eventsSince + ` OR o.paid_at IS NULL AND o.created_at >= ` + eventsSince + `)
		UNION ALL SELECT CONCAT('order:', o.id), o.event_seq, CONCAT('order.', o.status) FROM orders o
			WHERE o.status IN ` + returnedStatuses + ` AND o.returned_at >= ` + eventsSince + `
		UNION ALL ` + refundChange("refund.owed", "received_at") + `
		UNION ALL ` + refundChange("refund.refunded", "settled_at") + `
		UNION ALL ` + refundChange("refund.failed", "failed_at") + `
		UNION ALL SELECT IF(o.id IS NULL, CONCAT('payment:', p.provider, ':', p.payment_id), CONCAT('order:', o.id)),
				IF(o.id IS NULL, 1, o.event_seq), 'payment.conflict'
			FROM payments p LEFT JOIN orders o ON o.id = p.order_id
			WHERE p.outcome = 'conflict' AND p.received_at >= ` + eventsSince + ` AND (o.id IS NOT NULL OR p.received_at >= ` + sinceSeed + `)`
	// missingEvents are the streams whose changes lack events beyond what
	// retention can have taken: a row each, with the types that lack them.
	// A (stream, type) lacks as many events as its changes outnumber its
	// events in the outbox; the stream's row counts seq events written, and
	// retention can have taken only seq less the events present.
	missingEvents = `SELECT s.stream, CONCAT(s.stream, ' lacks ', s.types, ': event_seq ', s.seq, ', ', s.present, ' in the outbox') line
		FROM (SELECT m.stream, SUM(m.missing) missing, MAX(m.seq) seq,
				GROUP_CONCAT(IF(m.missing > 1, CONCAT(m.missing, ' ', m.type), m.type) ORDER BY m.type SEPARATOR ', ') types,
				(SELECT COUNT(*) FROM outbox x WHERE x.stream = m.stream) present
			FROM (SELECT c.stream, c.type, MAX(c.seq) seq, COUNT(*) - COALESCE(MAX(x.n), 0) missing
				FROM (` + changesSince + `) c
					LEFT JOIN (SELECT stream, type, COUNT(*) n FROM outbox GROUP BY stream, type) x ON x.stream = c.stream AND x.type = c.type
				GROUP BY c.stream, c.type) m
			WHERE m.missing > 0 GROUP BY m.stream) s
		WHERE s.missing > s.seq - s.present`
)

// SQL of the sequence check.
const (
	// streamEvents is each stream's events in the outbox, of the streams
	// counted on a row: orders' and refunds'.
	streamEvents = `(SELECT stream, COUNT(*) n, COUNT(DISTINCT sequence) d, MIN(sequence) lo, MAX(sequence) hi,
			GROUP_CONCAT(sequence ORDER BY sequence) seqs
		FROM outbox WHERE stream LIKE 'order:%' OR stream LIKE 'refund:%' GROUP BY stream)`
	// brokenSequence holds for a stream's events x on its row's event_seq
	// seq that are not a run without a gap or a repeat, from 1 or above,
	// up to seq.
	brokenSequence = "NOT (x.hi = seq AND x.lo >= 1 AND x.hi - x.lo + 1 = x.n AND x.d = x.n)"
	// sequenceLine is the example of a broken sequence.
	sequenceLine = "CONCAT(x.stream, ' event_seq ', seq, ', the outbox has sequences ', x.seqs)"
)

// refundChange is the changes of type typ of refunds r, stamped by the
// column stamp since events were turned on. A refund's events ride its
// order's stream (a refund for no order, user_id NULL, has its own); when
// the order is gone, a seed deleted it: a change after the last seed was
// made without it, on the refund's own stream, and one before may have
// been on its stream, which is no longer checked.
func refundChange(typ, stamp string) string {
	return `SELECT IF(o.id IS NULL, CONCAT('refund:', r.refund_id), CONCAT('order:', o.id)), IF(o.id IS NULL, r.event_seq, o.event_seq), '` + typ + `'
			FROM refunds r LEFT JOIN orders o ON o.id = r.order_id AND r.user_id IS NOT NULL
			WHERE r.` + stamp + ` >= ` + eventsSince + ` AND (r.user_id IS NULL OR o.id IS NOT NULL OR r.` + stamp + ` >= ` + sinceSeed + `)`
}

// eventChecks are the checks of events, once they are on. An offender is
// counted by one check only: a missing event that the sequence leaves room
// for is the sequence check's, when the gap is not below the events still
// present.
//
//   - every change stamped since events were turned on has its event on
//     its stream, or the stream's event_seq counts more events than the
//     outbox holds, enough for all it lacks: they were delivered and
//     deleted by retention. A stream whose order a seed deleted is not
//     checked;
//   - the events in the outbox of each order's and refund's stream are a
//     run of sequences without a gap, up to its row's event_seq: retention
//     deletes from the oldest, so only the lowest sequences may be gone.
var eventChecks = []offenders{
	{checkEventWritten, missingEvents, "stream"},
	{
		checkEventSequence,
		`SELECT x.stream, ` + sequenceLine + ` line FROM ` + streamEvents + ` x
				JOIN (SELECT id, event_seq seq FROM orders) c ON c.id = CAST(SUBSTRING(x.stream, 7) AS UNSIGNED)
			WHERE x.stream LIKE 'order:%' AND ` + brokenSequence + `
		UNION ALL SELECT x.stream, ` + sequenceLine + ` FROM ` + streamEvents + ` x
				JOIN (SELECT refund_id, event_seq seq FROM refunds) c ON c.refund_id = SUBSTRING(x.stream, 8)
			WHERE x.stream LIKE 'refund:%' AND ` + brokenSequence,
		"stream",
	},
}

// EventFigures is the state of events: whether they are on, since when,
// and the outbox's events by state.
type EventFigures struct {
	On bool `json:"on"`
	// Since is when they were turned on, by MySQL's clock; empty while
	// they are off, or in the instant between the switch and its stamp.
	Since     string `json:"on_since,omitempty"`
	Pending   int64  `json:"pending"`
	Delivered int64  `json:"delivered"`
	Dead      int64  `json:"dead"`
	// OldestPending is how long ago the oldest pending event occurred, in
	// seconds; zero with none pending.
	OldestPending float64 `json:"oldest_pending_seconds"`
}

// String renders the figures as the report's information line.
func (e EventFigures) String() string {
	switch {
	case !e.On:
		return "events off: none is written, none is checked"
	case e.Since == "":
		return "events on, not yet stamped with when (the next start with events, or shop migrate --events, stamps it): not checked"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "events on since %s: pending %d", e.Since, e.Pending)
	if e.Pending > 0 {
		fmt.Fprintf(&b, " (the oldest occurred %.1fs ago)", e.OldestPending)
	}
	fmt.Fprintf(&b, ", delivered %d, dead %d", e.Delivered, e.Dead)
	return b.String()
}

// checkEvents reads the state of events into r and, once they are on and
// stamped, makes the checks of events.
func checkEvents(db *gorm.DB, r *Report) error {
	e := &r.Events
	var since *string
	err := db.Raw(`SELECT s.enabled, DATE_FORMAT(s.on_since, '%Y-%m-%d %H:%i:%s.%f'),
			COALESCE(SUM(o.state = 'pending'), 0), COALESCE(SUM(o.state = 'delivered'), 0), COALESCE(SUM(o.state = 'dead'), 0),
			COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(IF(o.state = 'pending', o.occurred_at, NULL)), UTC_TIMESTAMP(6)), 0) / 1e6
		FROM outbox_switch s LEFT JOIN outbox o ON TRUE WHERE s.id = 1 GROUP BY s.id`).
		Row().Scan(&e.On, &since, &e.Pending, &e.Delivered, &e.Dead, &e.OldestPending)
	if err != nil {
		return fmt.Errorf("stock: verify events: %w", err)
	}
	if since != nil {
		e.Since = *since
	}
	if !e.On || e.Since == "" {
		return nil
	}
	for _, q := range eventChecks {
		c, err := q.check(db)
		if err != nil {
			return err
		}
		r.Checks = append(r.Checks, c)
	}
	return nil
}
