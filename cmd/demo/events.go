package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"shop/internal/eventsink"
)

// The events row: the lifecycle sale with events on (docs/events.md). The
// demo starts a receiver (bin/eventsink) with a record file and a fresh
// secret, and runs the replicas with SHOP_EVENTS_URL and SHOP_EVENTS_SECRET,
// replica 1 on the failpoints build with the shopEventKill failpoint, which
// stops its relay's first delivery answered 2xx before its mark. The sale
// is the lifecycle rows' with a share of the reservations cancelled by
// their buyers: orders reserved, paid by the provider's signed events,
// cancelled, expired by the sweep, and paid late and owed back. Mid-sale
// (once the first wave's orders and payments in time are done) the
// receiver is down for eventsDown; the replica stopped at the failpoint is
// killed there (SIGKILL) and started again, and once its claim's lease runs
// out a relay sends that event again. After the sale the demo waits, up to
// eventsDrain, until the outbox has no pending event, then reads the
// receiver's record: every event the sale's changes wrote must have been
// acknowledged, none out of order on its stream, none acknowledged before
// its predecessor, none sent twice at once, and the killed event delivered
// again under the same webhook-id.

// lifeEvents is the events row's lifecycle variant.
const lifeEvents = "events"

// eventsDown is how long the receiver is down mid-sale.
const eventsDown = 10 * time.Second

// eventsDrain bounds the wait, after the sale, for the outbox to have no
// pending event: the relays' backoff after the receiver's downtime (up to
// 2ⁿ⁻¹ s for the n-th retry) and the killed claim's lease.
const eventsDrain = 90 * time.Second

// eventsCancelFrac is the share of the first wave's reservations its
// buyers cancel at once, so that the sale writes order.cancelled too.
const eventsCancelFrac = 0.1

// eventKillLine is what the shopEventKill failpoint prints on the
// replica's standard error: "… between the POST of event <event_id> and
// its mark".
const eventKillLine = "failpoint shopEventKill"

// eventKillStop is how long the failpoint stops the relay: ample time to
// see its line and kill the replica.
const eventKillStop = 5 * time.Second

// eventsBinary is the receiver (make build, scripts/demo.sh).
const eventsBinary = "bin/eventsink"

// eventsRow is the lifecycle sale with events on.
func eventsRow(o options) row {
	r := lifeRow(o, lifeEvents, "the lifecycle sale with events on (SHOP_EVENTS_URL, a receiver of its own): orders reserved, paid, "+
		"cancelled, expired and paid late (owed back) each write their event in their transaction; mid-sale the receiver is down "+
		fmt.Sprintf("for %s and a replica is killed (SIGKILL) between a POST its receiver answered and its mark ", eventsDown)+
		"(the shopEventKill failpoint): every event is delivered, in order per order, none at once twice, the killed one again "+
		"under the same webhook-id")
	r.Retry = true
	return r
}

// eventsResult is what the events row measured: the outbox as MySQL has
// it, the sale's changes, and the receiver's record as Summarize reads it.
type eventsResult struct {
	Record string // the record file
	// Outbox counts the events the sale's changes wrote (the outbox rows
	// after the row's start), Pending and Dead those not delivered once
	// the wait for the outbox to drain (Drained) ended.
	Outbox, Pending, Dead int
	Drained               time.Duration
	// Changes counts the sale's changes in MySQL: every order (reserved),
	// every order no longer reserved (paid, cancelled, expired), every
	// refund (owed) and every refund settled (refunded, failed).
	Changes int
	// Missing counts the outbox's events the receiver never acknowledged,
	// Foreign the events it acknowledged that are not the row's.
	Missing, Foreign int
	Summary          eventsink.Summary
	// Killed is the event in flight when its replica was killed ("" if
	// none was); KilledAcks and KilledStamps count its acknowledged
	// deliveries and their distinct webhook-timestamps.
	Killed                   string
	KilledAcks, KilledStamps int
	// Down is when the receiver went down, from the sale's start.
	Down time.Duration
	// Verify are verify's checks of the events, if it has any.
	Verify []check
}

// problems lists what the events row did not do that it must.
func (e *eventsResult) problems() []string {
	var p []string
	s := e.Summary
	if e.Pending > 0 || e.Dead > 0 {
		p = append(p, fmt.Sprintf("%d events pending and %d dead %s after the sale", e.Pending, e.Dead, e.Drained.Round(time.Second)))
	}
	if s.Acknowledged != e.Outbox || e.Missing > 0 || e.Foreign > 0 {
		p = append(p, fmt.Sprintf("%d distinct events acknowledged, %d written (%d never acknowledged, %d not the row's)",
			s.Acknowledged, e.Outbox, e.Missing, e.Foreign))
	}
	if e.Outbox != e.Changes {
		p = append(p, fmt.Sprintf("%d events written for %d changes in MySQL", e.Outbox, e.Changes))
	}
	if s.OutOfOrder+s.Gaps+s.Concurrent > 0 {
		p = append(p, fmt.Sprintf("out of order %d, gaps %d, concurrent %d (first: %s)", s.OutOfOrder, s.Gaps, s.Concurrent,
			strings.Join(s.Examples[:min(1, len(s.Examples))], "")))
	}
	switch {
	case e.Killed == "":
		p = append(p, "no relay stopped at the failpoint")
	case e.KilledAcks < 2:
		p = append(p, fmt.Sprintf("the event in flight when killed, %s, acknowledged %d times, want 2 or more", e.Killed, e.KilledAcks))
	}
	return p
}

// newEventsSecret returns a fresh Standard Webhooks secret: whsec_ and 32
// random bytes in base64.
func newEventsSecret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// receiver is a running bin/eventsink.
type receiver struct {
	cmd     *exec.Cmd
	url     string // its events URL, SHOP_EVENTS_URL
	control string // its control URL, ending in /control/
	exited  chan error
}

// startReceiver starts bin/eventsink verifying secret and appending every
// delivery to record (removed first: the file is appended to), its output
// in log, and returns once it has printed its URLs.
func startReceiver(ctx context.Context, secret, record, log string) (*receiver, error) {
	if err := os.Remove(record); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	logFile, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, eventsBinary, "-record", record)
	// The secret goes by the environment, not the command line.
	cmd.Env = append(os.Environ(), "SHOP_EVENTS_SECRET="+secret)
	cmd.Stderr = logFile
	out, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("%s: %w (make build)", eventsBinary, err)
	}
	rc := &receiver{cmd: cmd, exited: make(chan error, 1)}
	lines := bufio.NewReader(out)
	for range 2 {
		line, err := lines.ReadString('\n')
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			logFile.Close()
			return nil, fmt.Errorf("%s did not print its URLs: %w (see %s)", eventsBinary, err, log)
		}
		fmt.Fprint(logFile, line)
		name, url, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch name {
		case "events":
			rc.url = url
		case "control":
			rc.control = url
		}
	}
	go func() {
		io.Copy(logFile, lines)
		err := cmd.Wait()
		logFile.Close()
		rc.exited <- err
	}()
	if rc.url == "" || rc.control == "" {
		rc.stop()
		return nil, fmt.Errorf("%s printed no events or control URL (see %s)", eventsBinary, log)
	}
	return rc, nil
}

// down tells the receiver to refuse connections for d.
func (rc *receiver) down(ctx context.Context, d time.Duration) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rc.control+"down?for="+d.String(), nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("receiver down: %w", err)
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("receiver down: %s", res.Status)
	}
	return nil
}

// stop ends the receiver (SIGTERM: it closes its record file) and waits
// for it, at most 10 s.
func (rc *receiver) stop() error {
	if rc == nil {
		return nil
	}
	rc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-rc.exited:
		rc.exited <- err
		return err
	case <-time.After(10 * time.Second):
		rc.cmd.Process.Kill()
		return fmt.Errorf("%s did not end on SIGTERM", eventsBinary)
	}
}

// eventsSettings are the replicas' settings of the events row: the
// receiver's URL and secret, and replica 1 on the failpoints build with
// the shopEventKill failpoint (scripts/stack.sh's I:VAR=VALUE).
func eventsSettings(url, secret string) []string {
	return []string{"SHOP_EVENTS_URL=" + url, "SHOP_EVENTS_SECRET=" + secret, "1:SHOP_BINARY=" + failpointBinary,
		fmt.Sprintf("1:GOFAIL_FAILPOINTS=shopEventKill=1*return(%d)", eventKillStop.Milliseconds())}
}

// startEvents starts the events row's receiver, records where the outbox
// ends, and restarts the replicas with events on (the seed before ran
// without them, so that its settlements of the rows before write no event).
// It returns the receiver and the outbox's last id before the row.
func startEvents(ctx context.Context, o options, r row, db *sql.DB, base string, stderr io.Writer) (*receiver, int64, error) {
	secret := newEventsSecret()
	rc, err := startReceiver(ctx, secret, base+".events", base+".eventsink.log")
	if err != nil {
		return nil, 0, err
	}
	var last int64
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(MAX(id), 0) FROM outbox").Scan(&last); err != nil {
		rc.stop()
		return nil, 0, fmt.Errorf("the outbox's last id: %w", err)
	}
	args := append(replicaArgs(o, r), eventsSettings(rc.url, secret)...)
	if _, err := commandEnv(ctx, topologyEnv(r), stderr, o.stack, args...); err != nil {
		rc.stop()
		return nil, 0, err
	}
	fmt.Fprintf(stderr, "demo: events on, delivered to %s; replica 1 runs the shopEventKill failpoint\n", rc.url)
	return rc, last, nil
}

// killInEvent waits for a replica's relay to stop at the shopEventKill
// failpoint (its POST answered 2xx, its mark not yet written), kills that
// replica (SIGKILL) and starts it again (killAtFailpoint), and says in e
// which event was in flight.
func killInEvent(ctx context.Context, o options, l *lifeResult, offsets []int64, start time.Time, stderr io.Writer) error {
	line, err := killAtFailpoint(ctx, o, l, offsets, start, failpointKill{line: eventKillLine, none: "no relay stopped at the failpoint",
		where: func(line string) string {
			return "between the POST of event " + inFlightEvent(line) + " and its mark"
		}}, stderr)
	l.Events.Killed = inFlightEvent(line)
	return err
}

// inFlightEvent reads the event id from the shopEventKill failpoint's
// line, or "".
func inFlightEvent(line string) string {
	_, rest, ok := strings.Cut(line, " of event ")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, " ")
	return id
}

// eventsFigures waits, up to eventsDrain, until the outbox has no pending
// event after last (the row's), stops the receiver, and reads into e the
// outbox, the sale's changes since (MySQL's clock, the row's refunds) and
// the receiver's record.
func eventsFigures(ctx context.Context, db *sql.DB, rc *receiver, last int64, since time.Time, e *eventsResult, stderr io.Writer) error {
	began := time.Now()
	for {
		err := db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(state = 'pending'), 0), COALESCE(SUM(state = 'dead'), 0)
			FROM outbox WHERE id > ?`, last).Scan(&e.Outbox, &e.Pending, &e.Dead)
		if err != nil {
			return fmt.Errorf("the outbox: %w", err)
		}
		e.Drained = time.Since(began)
		if e.Pending == 0 || e.Drained >= eventsDrain {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	fmt.Fprintf(stderr, "demo: %d events written, %d pending and %d dead %s after the sale\n",
		e.Outbox, e.Pending, e.Dead, e.Drained.Round(100*time.Millisecond))
	if err := rc.stop(); err != nil {
		return err
	}
	var orders, ended, refunds, settled int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(status <> 'reserved'), 0) FROM orders").Scan(&orders, &ended)
	if err != nil {
		return fmt.Errorf("the sale's orders: %w", err)
	}
	err = db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(state IN ('refunded', 'failed')), 0) FROM refunds WHERE received_at >= ?",
		since).Scan(&refunds, &settled)
	if err != nil {
		return fmt.Errorf("the sale's refunds: %w", err)
	}
	e.Changes = orders + ended + refunds + settled

	record, err := eventsink.ReadRecordFile(e.Record)
	if err != nil {
		return err
	}
	e.Summary = eventsink.Summarize(record)
	acked := map[string]bool{}
	stamps := map[int64]bool{}
	for _, d := range record {
		if d.Acknowledged() {
			acked[d.WebhookID] = true
			if d.WebhookID == e.Killed {
				e.KilledAcks++
				stamps[d.WebhookTimestamp] = true
			}
		}
	}
	e.KilledStamps = len(stamps)
	rows, err := db.QueryContext(ctx, "SELECT event_id FROM outbox WHERE id > ?", last)
	if err != nil {
		return fmt.Errorf("the outbox's events: %w", err)
	}
	written := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		written[id] = true
		if !acked[id] {
			e.Missing++
		}
	}
	if err := closeRows(rows); err != nil {
		return fmt.Errorf("the outbox's events: %w", err)
	}
	for id := range acked {
		if !written[id] {
			e.Foreign++
		}
	}
	return nil
}

// eventChecks are verify's checks of the events: those whose name speaks
// of them.
func eventChecks(v verifyReport) []check {
	return slices.DeleteFunc(slices.Clone(v.Checks), func(c check) bool {
		name := strings.ToLower(c.Name)
		return !strings.Contains(name, "event") && !strings.Contains(name, "outbox")
	})
}

// verifyEvents renders verify's checks of the events: "ok", the broken
// ones, or "no events check" when verify has none.
func (e *eventsResult) verifyEvents() string {
	if len(e.Verify) == 0 {
		return "no events check"
	}
	var broken []string
	for _, c := range e.Verify {
		if c.Violations > 0 {
			broken = append(broken, fmt.Sprintf("%s ×%d", c.Name, c.Violations))
		}
	}
	if len(broken) == 0 {
		return fmt.Sprintf("ok (%d checks)", len(e.Verify))
	}
	return strings.Join(broken, ", ")
}

// eventsColumns are the events table's headings; eventsCells gives a
// row's values.
var eventsColumns = []string{"#", "row", "changes in MySQL", "events written (outbox)", "distinct acknowledged",
	"delivered more than once", "out of order", "gaps", "concurrent", "killed event: acks, timestamps",
	"receiver down", "pending / dead after", "lag p50 / max", "verify (events)", "outcome"}

func (r result) eventsCells(n int) []string {
	e := &eventsResult{}
	if r.Life != nil && r.Life.Events != nil {
		e = r.Life.Events
	}
	s := e.Summary
	killed := "-"
	if e.Killed != "" {
		killed = fmt.Sprintf("%s: %d, %d", e.Killed, e.KilledAcks, e.KilledStamps)
	}
	return []string{strconv.Itoa(n), r.Row.lifeName(), strconv.Itoa(e.Changes), strconv.Itoa(e.Outbox), strconv.Itoa(s.Acknowledged),
		strconv.Itoa(s.Duplicates), strconv.Itoa(s.OutOfOrder), strconv.Itoa(s.Gaps), strconv.Itoa(s.Concurrent), killed,
		fmt.Sprintf("%s at %s", eventsDown, e.Down.Round(100*time.Millisecond)),
		fmt.Sprintf("%d / %d after %s", e.Pending, e.Dead, e.Drained.Round(100*time.Millisecond)),
		fmt.Sprintf("%s / %s", msDuration(s.LagP50Ms), msDuration(s.LagMaxMs)), e.verifyEvents(), r.outcome()}
}

// isEvents says whether a result is the events row's.
func isEvents(r result) bool { return r.Row.Life == lifeEvents }

// eventsTable renders the events row's figures for a terminal, or "" when
// it did not run.
func eventsTable(results []result) string {
	return terminalTable(results, isEvents, eventsColumns, result.eventsCells)
}

// msDuration renders milliseconds as a duration, to 10 ms.
func msDuration(ms float64) string {
	return (time.Duration(ms * float64(time.Millisecond))).Round(10 * time.Millisecond).String()
}
