// Package outbox delivers the events that package stock writes to the
// outbox table in the transactions that make the changes (docs/events.md):
// each replica's Relay claims due events by a lease, POSTs them signed by
// Standard Webhooks, and marks them delivered, at least once and in order
// per stream. Store is the table's side: claims, marks, the operators'
// listing and redelivery, retention and the figures metrics show; and the
// switch that turns events on.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"gorm.io/gorm"

	"shop/internal/stock"
)

// The states of an event.
const (
	StatePending   = "pending"
	StateDelivered = "delivered"
	StateDead      = "dead"
)

// Errors of the operators' calls; MySQL's failures are stock.ErrBusy.
var (
	// ErrNotFound means there is no event of that id.
	ErrNotFound = errors.New("outbox: no such event")
	// ErrDelivered means the event was delivered: redelivering it now
	// would send it after its stream's later events.
	ErrDelivered = errors.New("outbox: event delivered")
)

// Event is one row of the outbox.
type Event struct {
	// Position is the event's place in the outbox: within a stream,
	// positions rise with the sequence.
	Position   int64           `gorm:"column:id"`
	EventID    string          `gorm:"column:event_id"`
	Type       string          `gorm:"column:type"`
	Stream     string          `gorm:"column:stream"`
	Sequence   int64           `gorm:"column:sequence"`
	OccurredAt time.Time       `gorm:"column:occurred_at"`
	Data       json.RawMessage `gorm:"column:data"`
	State      string          `gorm:"column:state"`
	// Attempts counts the claims of the event: POSTs begun.
	Attempts    int        `gorm:"column:attempts"`
	NextAt      time.Time  `gorm:"column:next_at"`
	DeliveredAt *time.Time `gorm:"column:delivered_at"`
	LastError   *string    `gorm:"column:last_error"`
}

// The statements of the outbox's side.
const (
	eventColumns = "id, event_id, type, stream, sequence, occurred_at, data, state, attempts, next_at, delivered_at, last_error"
	// sqlDue reads the events a relay may send now: pending, due, not
	// claimed by a live lease, and first of their stream — every earlier
	// event of the stream delivered. A plain read: an event that is first
	// stays first until it is delivered (a delivered event never returns
	// to pending), and the claim checks the rest again under the row's
	// lock.
	sqlDue = "SELECT " + eventColumns + " FROM outbox o WHERE o.state = 'pending' AND o.next_at <= UTC_TIMESTAMP(6) " +
		"AND (o.claimed_until IS NULL OR o.claimed_until <= UTC_TIMESTAMP(6)) " +
		"AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.stream = o.stream AND e.sequence < o.sequence AND e.state <> 'delivered') " +
		"ORDER BY o.id LIMIT ?"
	// sqlClaim leases events for one claim (claim = ?), if they are still
	// unclaimed; sqlClaimed reads back which of them it got.
	sqlClaim = "UPDATE outbox SET claim = ?, claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, attempts = attempts + 1 " +
		"WHERE id IN ? AND state = 'pending' AND (claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6))"
	sqlClaimed = "SELECT id FROM outbox WHERE id IN ? AND claim = ?"
	// sqlDelivered marks claimed events of one claim delivered.
	sqlDelivered = "UPDATE outbox SET state = 'delivered', delivered_at = UTC_TIMESTAMP(6), claimed_until = NULL, last_error = NULL " +
		"WHERE id IN ? AND claim = ? AND state = 'pending'"
	// sqlDie marks a claimed event dead if it has been undelivered for the
	// longest an event may be (? microseconds), by MySQL's clock;
	// sqlRetry otherwise makes it due again after a backoff.
	sqlDie = "UPDATE outbox SET state = 'dead', claimed_until = NULL, last_error = ? " +
		"WHERE id = ? AND claim = ? AND state = 'pending' AND aging_from <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"
	sqlRetry = "UPDATE outbox SET next_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, claimed_until = NULL, last_error = ? " +
		"WHERE id = ? AND claim = ? AND state = 'pending'"
	// sqlWake makes due now the events waiting out a backoff after a
	// failure without an answer (noAnswer).
	sqlWake = "UPDATE outbox SET next_at = UTC_TIMESTAMP(6) WHERE state = 'pending' AND next_at > UTC_TIMESTAMP(6) AND last_error LIKE '" + noAnswer + "%'"
	// sqlPage lists events in a state after a position.
	sqlPage = "SELECT " + eventColumns + " FROM outbox WHERE state = ? AND id > ? ORDER BY id LIMIT ?"
	// sqlLockEvent reads an event by id with a lock; sqlRevive makes a dead
	// or pending one due now, its age counting from now, and sqlRejuvenate
	// gives the pending events after it on its stream, held while it was
	// dead, their age from now too.
	sqlLockEvent  = "SELECT " + eventColumns + " FROM outbox WHERE event_id = ? FOR UPDATE"
	sqlRevive     = "UPDATE outbox SET state = 'pending', next_at = UTC_TIMESTAMP(6), aging_from = UTC_TIMESTAMP(6), attempts = 0 WHERE id = ?"
	sqlRejuvenate = "UPDATE outbox SET aging_from = UTC_TIMESTAMP(6) WHERE stream = ? AND sequence > ? AND state = 'pending'"
	// sqlPrune deletes at most ? delivered events that occurred more than
	// ? microseconds ago.
	sqlPrune = "DELETE FROM outbox WHERE state = 'delivered' AND occurred_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND LIMIT ?"
	// sqlPending counts the pending events and measures the oldest whose
	// age counts: not held behind a dead event of its stream.
	sqlPending = "SELECT COUNT(*) AS pending, TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN NOT EXISTS (" +
		"SELECT 1 FROM outbox d WHERE d.stream = o.stream AND d.sequence < o.sequence AND d.state = 'dead') " +
		"THEN o.aging_from END), UTC_TIMESTAMP(6)) AS oldest FROM outbox o WHERE o.state = 'pending'"
	sqlDeadCount = "SELECT COUNT(*) FROM outbox WHERE state = 'dead'"
	// The switch (see package stock, events.go).
	sqlSwitchOn   = "UPDATE outbox_switch SET enabled = TRUE WHERE id = 1 AND NOT enabled"
	sqlStampOn    = "UPDATE outbox_switch SET on_since = UTC_TIMESTAMP(6) WHERE id = 1 AND enabled AND on_since IS NULL"
	sqlReadSwitch = "SELECT enabled, on_since FROM outbox_switch WHERE id = 1"
)

// Store is the outbox table on a pool of its own.
type Store struct{ db *gorm.DB }

// NewStore returns the outbox on db.
func NewStore(db *gorm.DB) *Store { return &Store{db: db} }

// Switch is whether events are on, and since when by MySQL's clock (nil
// while they are off, or in the instant between the switch and its stamp).
type Switch struct {
	On    bool       `gorm:"column:enabled"`
	Since *time.Time `gorm:"column:on_since"`
}

// Enable turns events on for every replica, if they are not on already,
// and reports whether this call turned them on. The switch commits first
// and is stamped after, so that every change stamped after on_since was
// made by a transaction that saw the switch on (package stock, events.go);
// a stamp lost with a crash between the two is made by the next Enable.
func (s *Store) Enable(ctx context.Context) (bool, error) {
	db := s.db.WithContext(ctx)
	r := db.Exec(sqlSwitchOn)
	if r.Error != nil {
		return false, fmt.Errorf("outbox: turn events on: %w", r.Error)
	}
	if err := db.Exec(sqlStampOn).Error; err != nil {
		return false, fmt.Errorf("outbox: stamp events on: %w", err)
	}
	return r.RowsAffected == 1, nil
}

// Switch reads whether events are on.
func (s *Store) Switch(ctx context.Context) (Switch, error) {
	var sw Switch
	if err := s.db.WithContext(ctx).Raw(sqlReadSwitch).Scan(&sw).Error; err != nil {
		return Switch{}, fmt.Errorf("outbox: read the switch: %w", err)
	}
	return sw, nil
}

// Claim is a relay's lease on events: until it runs out no other claim
// takes them, and only it marks them.
type Claim struct {
	token int64
	// Events are the events claimed, each first of its stream.
	Events []Event
}

// Claim leases up to n due events, each the first undelivered of its
// stream, for lease.
func (s *Store) Claim(ctx context.Context, lease time.Duration, n int) (Claim, error) {
	db := s.db.WithContext(ctx)
	var due []Event
	if err := db.Raw(sqlDue, n).Scan(&due).Error; err != nil {
		return Claim{}, fmt.Errorf("outbox: due events: %w", err)
	}
	if len(due) == 0 {
		return Claim{}, nil
	}
	c := Claim{token: rand.Int64N(1<<62) + 1}
	ids := make([]int64, len(due))
	for i, e := range due {
		ids[i] = e.Position
	}
	r := db.Exec(sqlClaim, c.token, lease.Microseconds(), ids)
	if r.Error != nil {
		return Claim{}, fmt.Errorf("outbox: claim: %w", r.Error)
	}
	if r.RowsAffected == int64(len(due)) {
		c.Events = due
		return c, nil
	}
	// Another relay claimed some of them in between.
	var got []int64
	if err := db.Raw(sqlClaimed, ids, c.token).Scan(&got).Error; err != nil {
		return Claim{}, fmt.Errorf("outbox: read a claim back: %w", err)
	}
	mine := make(map[int64]bool, len(got))
	for _, id := range got {
		mine[id] = true
	}
	for _, e := range due {
		if mine[e.Position] {
			c.Events = append(c.Events, e)
		}
	}
	return c, nil
}

// Delivered marks events of claim c delivered, in one statement, and
// returns how many it marked: not one whose lease ran out and another claim
// took.
func (s *Store) Delivered(ctx context.Context, c Claim, events ...Event) (int64, error) {
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.Position
	}
	r := s.db.WithContext(ctx).Exec(sqlDelivered, ids, c.token)
	if r.Error != nil {
		return 0, fmt.Errorf("outbox: mark %d events delivered: %w", len(events), r.Error)
	}
	return r.RowsAffected, nil
}

// Failed records a failed attempt at e of claim c: the event is dead if it
// has been undelivered for maxAge (by MySQL's clock), and otherwise due
// again after backoff. It reports whether the event died.
func (s *Store) Failed(ctx context.Context, c Claim, e Event, problem string, backoff, maxAge time.Duration) (dead bool, err error) {
	db := s.db.WithContext(ctx)
	problem = truncate(problem, 255)
	r := db.Exec(sqlDie, problem, e.Position, c.token, maxAge.Microseconds())
	if r.Error != nil {
		return false, fmt.Errorf("outbox: event %s: %w", e.EventID, r.Error)
	}
	if r.RowsAffected == 1 {
		return true, nil
	}
	if err := db.Exec(sqlRetry, backoff.Microseconds(), problem, e.Position, c.token).Error; err != nil {
		return false, fmt.Errorf("outbox: event %s: %w", e.EventID, err)
	}
	return false, nil
}

// noAnswer begins the problem recorded of an attempt that got no answer:
// the receiver refused the connection, closed it, or let it time out.
const noAnswer = "no answer: "

// Wake makes due now every event waiting out a backoff after an attempt
// that got no answer, and returns how many: the receiver answers again.
func (s *Store) Wake(ctx context.Context) (int64, error) {
	r := s.db.WithContext(ctx).Exec(sqlWake)
	if r.Error != nil {
		return 0, fmt.Errorf("outbox: wake the events that got no answer: %w", r.Error)
	}
	return r.RowsAffected, nil
}

// Page is the operators' listing: events in State after position After,
// at most Limit of them.
type Page struct {
	State string
	After int64
	Limit int
}

// MaxPage is the most events one page lists.
const MaxPage = 1000

// List returns a page of events and whether there are more after it.
// Errors: stock.ErrInvalid, stock.ErrBusy.
func (s *Store) List(ctx context.Context, p Page) (events []Event, more bool, err error) {
	switch {
	case p.State != StatePending && p.State != StateDead:
		return nil, false, fmt.Errorf("%w: state must be pending or dead", stock.ErrInvalid)
	case p.Limit < 1 || p.Limit > MaxPage:
		return nil, false, fmt.Errorf("%w: limit must be between 1 and %d", stock.ErrInvalid, MaxPage)
	case p.After < 0:
		return nil, false, fmt.Errorf("%w: after must be a position, 0 or more", stock.ErrInvalid)
	}
	events = []Event{}
	if err := s.db.WithContext(ctx).Raw(sqlPage, p.State, p.After, p.Limit+1).Scan(&events).Error; err != nil {
		return nil, false, fmt.Errorf("%w: list events: %w", stock.ErrBusy, err)
	}
	if len(events) > p.Limit {
		return events[:p.Limit], true, nil
	}
	return events, false, nil
}

// Redeliver makes event id due now: a dead event becomes pending again,
// and its age, and that of the events its death held, counts from now; a
// pending one is tried at once. It returns the event as it is then.
// Errors: ErrNotFound, ErrDelivered, stock.ErrBusy.
func (s *Store) Redeliver(ctx context.Context, id string) (Event, error) {
	var e Event
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		r := tx.Raw(sqlLockEvent, id).Scan(&e)
		switch {
		case r.Error != nil:
			return fmt.Errorf("%w: redeliver %s: %w", stock.ErrBusy, id, r.Error)
		case r.RowsAffected == 0:
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		case e.State == StateDelivered:
			return fmt.Errorf("%w: %s", ErrDelivered, id)
		}
		if err := tx.Exec(sqlRevive, e.Position).Error; err != nil {
			return fmt.Errorf("%w: redeliver %s: %w", stock.ErrBusy, id, err)
		}
		if err := tx.Exec(sqlRejuvenate, e.Stream, e.Sequence).Error; err != nil {
			return fmt.Errorf("%w: redeliver %s: %w", stock.ErrBusy, id, err)
		}
		return tx.Raw(sqlLockEvent, id).Scan(&e).Error
	})
	return e, err
}

// Prune deletes delivered events that occurred more than retain ago, in
// batches of at most batch, and returns how many it deleted.
func (s *Store) Prune(ctx context.Context, retain time.Duration, batch int) (int64, error) {
	var total int64
	for {
		r := s.db.WithContext(ctx).Exec(sqlPrune, retain.Microseconds(), batch)
		if r.Error != nil {
			return total, fmt.Errorf("outbox: prune: %w", r.Error)
		}
		total += r.RowsAffected
		if r.RowsAffected < int64(batch) {
			return total, nil
		}
	}
}

// Figures are what the metrics show of the outbox.
type Figures struct {
	Pending int64
	// Oldest is the age of the oldest pending event whose age counts (not
	// held behind a dead one); zero with none.
	Oldest time.Duration
	Dead   int64
}

// Figures measures the outbox.
func (s *Store) Figures(ctx context.Context) (Figures, error) {
	var row struct {
		Pending int64  `gorm:"column:pending"`
		Oldest  *int64 `gorm:"column:oldest"`
	}
	db := s.db.WithContext(ctx)
	if err := db.Raw(sqlPending).Scan(&row).Error; err != nil {
		return Figures{}, fmt.Errorf("outbox: pending events: %w", err)
	}
	f := Figures{Pending: row.Pending}
	if row.Oldest != nil {
		f.Oldest = time.Duration(*row.Oldest) * time.Microsecond
	}
	if err := db.Raw(sqlDeadCount).Scan(&f.Dead).Error; err != nil {
		return Figures{}, fmt.Errorf("outbox: dead events: %w", err)
	}
	return f, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
