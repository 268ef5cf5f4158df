package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"shop/internal/stripepay"
	"shop/internal/striperec"
)

// The Stripe rows: the lifecycle sale with SHOP_PAYMENTS=stripe, on the
// stack's stripe-mock behind its recording proxy. Each payment is the
// buyer's checkout (a PaymentIntent the replica creates) and then Stripe's
// signed payment_intent.succeeded (bin/loadtest -stripe); the late ones
// are owed back as order_expired, and the replicas' refunders pay them
// back through the Refund API, each call under Idempotency-Key: the
// refund's refund_id. Once the waves are done the row waits, within
// refundsWithin, until MySQL has every refund the row's payments made
// refunded, then reads the proxy's log: every refund must have been called
// for, under exactly one key, its refund_id. In the refund-kill row every
// replica runs the failpoints build with the shopRefundKill failpoint,
// which stops a replica's first refund between its call and its record;
// the demo kills the first replica that stops there and starts it again,
// and the refund it had in flight must be called for again, under the
// same key, once its claim's lease has run out.

// refundStall is how long the shopRefundKill failpoint stops a refund
// between its call and its record: ample time for the demo to see the
// failpoint's line and kill the replica there, and shorter than a claim's
// lease (stripepay.DefaultLease), so that the replicas that are not killed
// (every one runs the failpoint) record their stopped refund within its
// lease and call for it once.
const refundStall = 30 * time.Second

// refundStallFor is the failpoint that stops each replica's first refund
// between its Refund API call and its record for d, and the binary built
// with it.
func refundStallFor(d time.Duration) []string {
	return []string{"SHOP_BINARY=" + failpointBinary, fmt.Sprintf("GOFAIL_FAILPOINTS=shopRefundKill=1*return(%d)", d.Milliseconds())}
}

// refundKillLine is what the shopRefundKill failpoint prints on the
// replica's standard error (its shop.log) when it stops a refund: "… for
// refund <refund_id> and its record".
const refundKillLine = "failpoint shopRefundKill"

// refundsWithin bounds the wait for row r's refunds to be refunded once
// its waves are done: a minute of refunders' intervals and backoff, and in
// the refund-kill row the lease of the killed refunder's claim, which
// holds its refund until it runs out, and a stop at the failpoint of the
// restarted replica, whose first call may be that refund's.
func refundsWithin(r row) time.Duration {
	d := time.Minute
	if r.RefundStall > 0 {
		d += stripepay.DefaultLease + r.RefundStall
	}
	return d
}

// stripeResult is what a Stripe row measured of the money: the refunds
// its payments made, from MySQL, and the calls of Stripe's API the
// replicas made during the row, from the recording proxy's log.
type stripeResult struct {
	From    time.Time     // the row's calls are those logged from then on
	Refunds []refundCalls // the row's refunds, by refund id
	Waited  time.Duration // from the end of the waves until every refund was refunded, or the bound ran out
	Bound   time.Duration // the bound of that wait
	// Created counts the PaymentIntents created (POST /v1/payment_intents)
	// and CreateKeys their distinct Idempotency-Keys; CheckedOut the
	// orders MySQL has with a PaymentIntent.
	Created, CreateKeys, CheckedOut int
	// Cancelled counts the PaymentIntents cancelled (POST
	// /v1/payment_intents/{id}/cancel); Lapsed the orders that ended
	// (expired, cancelled) with a PaymentIntent, whose cancellation is
	// attempted once, and only logged if it fails.
	Cancelled, Lapsed int
	// Unnamed counts the Refund API calls without a metadata.refund_id.
	Unnamed int
	// Killed is the refund in flight when its replica was killed (the
	// refund-kill row; "" if none was).
	Killed string
}

// refundCalls is one refund of a Stripe row: its state in MySQL and the
// Refund API calls made for it.
type refundCalls struct {
	RefundID string
	State    string
	Calls    int
	Keys     []string // the distinct Idempotency-Keys, in the order first sent
}

// oneKey reports whether the refund was called for under exactly one
// Idempotency-Key, its refund_id.
func (c refundCalls) oneKey() bool { return len(c.Keys) == 1 && c.Keys[0] == c.RefundID }

func (c refundCalls) String() string {
	return fmt.Sprintf("%s %s: %d calls, keys %q", c.RefundID, c.State, c.Calls, c.Keys)
}

// refund returns the row's refund id, or nil.
func (s *stripeResult) refund(id string) *refundCalls {
	i := slices.IndexFunc(s.Refunds, func(c refundCalls) bool { return c.RefundID == id })
	if i < 0 {
		return nil
	}
	return &s.Refunds[i]
}

// problems lists what a Stripe row's money did not do that it must.
func (s *stripeResult) problems(refundKill bool) []string {
	var p []string
	var open, keys []refundCalls
	for _, c := range s.Refunds {
		if c.State != "refunded" {
			open = append(open, c)
		}
		if !c.oneKey() {
			keys = append(keys, c)
		}
	}
	if len(open) > 0 {
		p = append(p, fmt.Sprintf("%d of %d refunds not refunded %s after the sale (first: %s)",
			len(open), len(s.Refunds), s.Bound, open[0]))
	}
	if len(keys) > 0 {
		p = append(p, fmt.Sprintf("%d refunds not called for under exactly one Idempotency-Key, their refund_id (first: %s)",
			len(keys), keys[0]))
	}
	if s.Unnamed > 0 {
		p = append(p, fmt.Sprintf("%d Refund API calls without a metadata.refund_id", s.Unnamed))
	}
	if s.CreateKeys != s.CheckedOut {
		p = append(p, fmt.Sprintf("PaymentIntents created under %d Idempotency-Keys for %d orders with one", s.CreateKeys, s.CheckedOut))
	}
	if refundKill && s.Killed != "" {
		switch c := s.refund(s.Killed); {
		case c == nil:
			p = append(p, fmt.Sprintf("the refund in flight when killed, %s, is not one of the row's", s.Killed))
		case c.Calls < 2:
			p = append(p, fmt.Sprintf("the refund in flight when killed, %s, called for %d times, want 2 or more", s.Killed, c.Calls))
		}
	}
	return p
}

// maxCalls is the most Refund API calls made for one refund.
func (s *stripeResult) maxCalls() int {
	n := 0
	for _, c := range s.Refunds {
		n = max(n, c.Calls)
	}
	return n
}

// refunded counts the row's refunds MySQL has refunded.
func (s *stripeResult) refunded() int {
	n := 0
	for _, c := range s.Refunds {
		if c.State == "refunded" {
			n++
		}
	}
	return n
}

// keysPerRefund renders the distinct Idempotency-Keys per refund: the
// count (or its range), and "= refund_id" when every refund's one key is
// its refund_id.
func (s *stripeResult) keysPerRefund() string {
	if len(s.Refunds) == 0 {
		return "-"
	}
	lo, hi, own := len(s.Refunds[0].Keys), 0, true
	for _, c := range s.Refunds {
		lo, hi, own = min(lo, len(c.Keys)), max(hi, len(c.Keys)), own && c.oneKey()
	}
	n := strconv.Itoa(lo)
	if lo != hi {
		n = fmt.Sprintf("%d–%d", lo, hi)
	}
	if own {
		n += ", = refund_id"
	}
	return n
}

// inFlight renders the refund in flight when its replica was killed, with
// its calls and keys.
func (s *stripeResult) inFlight() string {
	if s.Killed == "" {
		return "-"
	}
	c := s.refund(s.Killed)
	if c == nil {
		return s.Killed + ": not the row's"
	}
	return fmt.Sprintf("%s: %d calls, %d key", c.RefundID, c.Calls, len(c.Keys))
}

// killInRefund waits for a replica's refunder to stop at the
// shopRefundKill failpoint (the Refund API called, its answer not yet
// recorded), kills that replica (SIGKILL) and starts it again
// (killAtFailpoint), and says in l which refund was in flight.
func killInRefund(ctx context.Context, o options, l *lifeResult, offsets []int64, start time.Time, stderr io.Writer) error {
	line, err := killAtFailpoint(ctx, o, l, offsets, start, failpointKill{line: refundKillLine, none: "no refund stopped at the failpoint",
		where: func(line string) string {
			return "between the Refund API call for refund " + inFlightRefund(line) + " and its record"
		}}, stderr)
	l.Stripe.Killed = inFlightRefund(line)
	return err
}

// inFlightRefund reads the refund id from the shopRefundKill failpoint's
// line, or "".
func inFlightRefund(line string) string {
	_, rest, ok := strings.Cut(line, " for refund ")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, " ")
	return id
}

// stripeFigures waits, within bound, until MySQL has every refund
// received since (the row's) refunded, then reads into s the refunds'
// states, the calls the recording proxy logged from s.From, and the
// orders' PaymentIntents.
func stripeFigures(ctx context.Context, o options, db *sql.DB, since time.Time, bound time.Duration, s *stripeResult, stderr io.Writer) error {
	s.Bound = bound
	began := time.Now()
	for {
		refunds, err := refundStates(ctx, db, since)
		if err != nil {
			return err
		}
		s.Refunds, s.Waited = refunds, time.Since(began)
		if !slices.ContainsFunc(refunds, func(c refundCalls) bool { return c.State != "refunded" }) || s.Waited >= bound {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	fmt.Fprintf(stderr, "demo: %d of %d refunds refunded %s after the sale\n", s.refunded(), len(s.Refunds), s.Waited.Round(100*time.Millisecond))
	path := filepath.Join(o.state, "stripe", "calls.jsonl")
	calls, err := striperec.Read(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s.count(calls)
	err = db.QueryRowContext(ctx, `SELECT COUNT(payment_intent), COALESCE(SUM(status IN ('expired', 'cancelled') AND payment_intent IS NOT NULL), 0)
		FROM orders WHERE sku_id = 1`).Scan(&s.CheckedOut, &s.Lapsed)
	if err != nil {
		return fmt.Errorf("orders' PaymentIntents: %w", err)
	}
	return nil
}

// count reads into s the calls of Stripe's API logged from s.From: the
// Refund API calls for each of s.Refunds and those naming none, and the
// PaymentIntents created and cancelled.
func (s *stripeResult) count(calls []striperec.Call) {
	calls = slices.DeleteFunc(slices.Clone(calls), func(c striperec.Call) bool { return c.Time.Before(s.From) })
	byRefund := striperec.Refunds(calls)
	for i := range s.Refunds {
		if rc := byRefund[s.Refunds[i].RefundID]; rc != nil {
			s.Refunds[i].Calls, s.Refunds[i].Keys = rc.Calls, rc.Keys
		}
	}
	if rc := byRefund[""]; rc != nil {
		s.Unnamed = rc.Calls
	}
	s.Created, s.Cancelled = 0, 0
	var keys []string
	for _, c := range calls {
		switch {
		case c.Method != http.MethodPost:
		case c.Path == "/v1/payment_intents":
			s.Created++
			if !slices.Contains(keys, c.IdempotencyKey) {
				keys = append(keys, c.IdempotencyKey)
			}
		case strings.HasPrefix(c.Path, "/v1/payment_intents/") && strings.HasSuffix(c.Path, "/cancel"):
			s.Cancelled++
		}
	}
	s.CreateKeys = len(keys)
}

// writeRefunds writes the row's refunds to path, a line each: "refund_id
// state calls key…", the Refund API calls made for it and their distinct
// Idempotency-Keys.
func (s *stripeResult) writeRefunds(path string) error {
	var b strings.Builder
	for _, c := range s.Refunds {
		fmt.Fprintf(&b, "%s %s %d %s\n", c.RefundID, c.State, c.Calls, strings.Join(c.Keys, " "))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// refundStates returns the refunds received since, by refund id, with
// their states.
func refundStates(ctx context.Context, db *sql.DB, since time.Time) ([]refundCalls, error) {
	refunds, err := queryRefunds(ctx, db, "received_at >= ?", since)
	if err != nil {
		return nil, fmt.Errorf("the row's refunds: %w", err)
	}
	return refunds, nil
}

// queryRefunds returns the refunds where holds (with args), by refund id,
// with their states.
func queryRefunds(ctx context.Context, db *sql.DB, where string, args ...any) ([]refundCalls, error) {
	rows, err := db.QueryContext(ctx, "SELECT refund_id, state FROM refunds WHERE "+where+" ORDER BY refund_id", args...)
	if err != nil {
		return nil, err
	}
	var refunds []refundCalls
	for rows.Next() {
		var c refundCalls
		if err := rows.Scan(&c.RefundID, &c.State); err != nil {
			rows.Close()
			return nil, err
		}
		refunds = append(refunds, c)
	}
	return refunds, closeRows(rows)
}
