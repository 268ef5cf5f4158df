package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Payments. The payers play the payment provider: a payment is the
// provider's signed event that money arrived (provider.go), never a
// buyer's word. With -pay-frac or -late-frac, a winner whose 201 says its
// order is "reserved" may have it paid: a payment.succeeded event, signed
// with -webhook-secret by Standard Webhooks, POSTed to
// <base>/api/v1/payments/events, naming the order, the payment id
// pay-<order_id>, and the amount_cents and currency of the order's 201.
// Which orders are paid, and how, depends on the order id alone
// (payShare), so a run pays the same orders whoever wins which id.
//
// A payer delivers a payment again after a 429, 502, 503, 504 or a
// transport error, as a provider does, Retry-After honoured, within
// -retries attempts and -retry-for (whether or not the buyers retry).
// Every delivery carries the same body and message id (msg_<payment_id>),
// so that a payment whose answer was lost is the same payment when it
// comes again, never a second one; each is stamped with the time it is
// sent and signed anew, as the service refuses a timestamp more than five
// minutes old.
//
// The service answers 200 once the payment is recorded, and says what it
// did: "applied" (the order is paid) or "owed" (a refund owed, with its
// reason). Payments that must be owed back are sent on purpose: late ones
// (-late-frac), a second payment of an order paid in time (-dup-frac),
// one unit less than the order owes (-mismatch-frac), and payments for
// orders that do not exist (-unknown-orders).
//
// With -stripe the payers play Stripe instead: each payment of an order's
// own is made on its checkout, POST /api/v1/orders/{id}/checkout with the
// buyer's user id and Authorization, at once (a late one too: the buyer
// checked out in time, the money came late), and is a
// payment_intent.succeeded event for the checkout's PaymentIntent, signed
// with the endpoint's secret and POSTed to <base>/api/v1/payments/stripe.
// The payment id is the PaymentIntent's.

// golden is 1/φ. The fractional parts of id×golden for consecutive ids
// spread evenly over [0, 1) (a Weyl sequence), so any run of order ids pays
// a share close to the fraction asked for.
const golden = 0.6180339887498949

// payShare places order id in [0, 1).
func payShare(id int64) float64 {
	_, f := math.Modf(float64(id) * golden)
	return f
}

// The kinds of payment the payers make.
const (
	inTime    = "in_time"   // what the order owes, at once
	late      = "late"      // what the order owes, -late-by after its pay_by: too late, owed back
	duplicate = "duplicate" // a second payment, under another id, of an order paid in time: owed back
	mismatch  = "mismatch"  // one unit less than the order owes, at once: owed back, the order stays reserved
	unknown   = "unknown"   // for an order that does not exist: owed back
	// cancelled is no payment: the buyer cancels its reservation at once.
	cancelled = "cancelled"
)

// kinds lists them, in the order the summary names them.
var kinds = []string{inTime, late, duplicate, mismatch, unknown}

// payPlan says which orders are paid, and how: those whose payShare is
// below frac at once; those in the next lateFrac lateBy after their
// pay_by; those in the next mismatchFrac at once, one unit short; those in
// the next cancelFrac are not paid but cancelled by their buyer. Of those
// paid at once, the ones whose payShare is below dupFrac (at most frac)
// are paid a second time, under another payment id, once the first is
// applied. unknownOrders payments are made for orders that do not exist.
type payPlan struct {
	frac          float64
	lateFrac      float64
	dupFrac       float64
	mismatchFrac  float64
	cancelFrac    float64
	unknownOrders int
	lateBy        time.Duration
}

// pays says whether the plan makes any payment.
func (p payPlan) pays() bool {
	return p.frac > 0 || p.lateFrac > 0 || p.mismatchFrac > 0 || p.unknownOrders > 0
}

// kind says how order id is paid: inTime, late, mismatch, cancelled (not
// paid, but cancelled), or "" (never).
func (p payPlan) kind(id int64) string {
	switch s := payShare(id); {
	case s < p.frac:
		return inTime
	case s < p.frac+p.lateFrac:
		return late
	case s < p.frac+p.lateFrac+p.mismatchFrac:
		return mismatch
	case s < p.frac+p.lateFrac+p.mismatchFrac+p.cancelFrac:
		return cancelled
	}
	return ""
}

// paidTwice says whether order id, paid in time, is paid a second time.
func (p payPlan) paidTwice(id int64) bool { return payShare(id) < p.dupFrac }

// unknownOrder is the first id of the orders that do not exist: far above
// any order a sale places.
const unknownOrder = int64(1) << 62

// The amount and currency of a payment for an order that does not exist,
// which owes nothing.
const (
	unknownAmount   = 100
	unknownCurrency = "USD"
)

// paid is what a payment of kind says was received for an order that
// owes owed: owed, but one unit less for a mismatch (one more for an
// order that owes a single unit, as a payment of nothing is malformed).
func paid(kind string, owed int64) int64 {
	switch {
	case kind != mismatch:
		return owed
	case owed > 1:
		return owed - 1
	}
	return owed + 1
}

// payment is one payment a payer makes.
type payment struct {
	base  string // the service URL the order was placed at
	order int64
	user  int64  // the buyer; 0 for an order that does not exist
	id    string // payment_id; with -stripe, set by the checkout for the kinds made on one
	kind  string
	// amount and currency are what the payment says was received: the
	// order's own, from its 201, but for a mismatch.
	amount   int64
	currency string
	payBy    time.Time
	auth     string // the buyer's Authorization header, if it sent one: a checkout is the buyer's
	// rt sends the payment from its buyer's source address.
	rt http.RoundTripper
}

// payer makes the payments, at most payConns requests at a time.
type payer struct {
	plan     payPlan
	provider provider
	run      string // the run's id: the payments for orders that do not exist are its own
	policy   retryPolicy
	// clock stamps each delivery; time.Now but in tests.
	clock func() time.Time
	// life is the run's context: an interrupt ends the payers' waits.
	life  context.Context
	slots chan struct{}

	// inTime counts the payments made at once, late those made after
	// their pay_by.
	inTime, late sync.WaitGroup
	retries      atomic.Int64

	mu        sync.Mutex
	statuses  map[string]int            // every event delivery's answer (answerKey)
	checkouts map[string]int            // every checkout attempt's answer
	tallies   map[string]*PayTally      // kind → its payments' last answers
	lines     []string                  // the payments file
	finals    map[string]map[string]int // kind → last answer → payments
	// events are every event delivery's timing, cancels every cancel
	// attempt's.
	events, cancels timings
	// cancelStatuses counts every cancel attempt's answer, cancelFinals
	// each cancel's last one.
	cancelStatuses, cancelFinals map[string]int
}

// timings are the latencies of requests sent in [first, last].
type timings struct {
	took        []time.Duration
	first, last time.Time
}

// add records one request, sent at start and answered (or not) after
// took.
func (t *timings) add(start time.Time, took time.Duration) {
	t.took = append(t.took, took)
	if t.first.IsZero() || start.Before(t.first) {
		t.first = start
	}
	if end := start.Add(took); end.After(t.last) {
		t.last = end
	}
}

// payConns caps the payers' requests in flight.
const payConns = 64

func newPayer(life context.Context, plan payPlan, pr provider, run string, policy retryPolicy) *payer {
	p := &payer{plan: plan, provider: pr, run: run, policy: policy, clock: time.Now, life: life,
		slots: make(chan struct{}, payConns), statuses: map[string]int{}, checkouts: map[string]int{},
		tallies: map[string]*PayTally{}, finals: map[string]map[string]int{},
		cancelStatuses: map[string]int{}, cancelFinals: map[string]int{}}
	for _, k := range kinds {
		p.tallies[k], p.finals[k] = &PayTally{}, map[string]int{}
	}
	return p
}

// unknownPayment is the i-th (from 0) payment for an order that does not
// exist, sent to base through rt.
func (p *payer) unknownPayment(i int, base string, rt http.RoundTripper) payment {
	order := unknownOrder + int64(i)
	return payment{base: base, order: order, id: p.provider.paymentID(unknown, order, p.run), kind: unknown,
		amount: unknownAmount, currency: unknownCurrency, rt: rt}
}

// schedule makes payment pm in the background: its checkout first, if it
// has one; then the payment at once, or lateBy after its order's pay_by
// (by this machine's clock; pay_by is MySQL's, on the same machine in the
// demo); then, for an order the plan pays twice, the second payment.
func (p *payer) schedule(pm payment) {
	wg := &p.inTime
	if pm.kind == late {
		wg = &p.late
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if pm.kind == cancelled {
			p.cancel(pm)
			return
		}
		if p.provider.checkout(pm.kind) {
			var a answer
			p.withSlot(func() { a = p.checkout(p.life, &pm) })
			if pm.id == "" {
				p.final(pm, a, "checkout ")
				return
			}
		}
		if pm.kind == late {
			at := time.Now()
			if !pm.payBy.IsZero() {
				at = pm.payBy
			}
			select {
			case <-p.life.Done():
			case <-time.After(time.Until(at.Add(p.plan.lateBy))):
			}
		}
		a := p.pay(pm)
		if pm.kind != inTime || !p.plan.paidTwice(pm.order) || outcome(a) != "applied" {
			return
		}
		pm.kind, pm.id = duplicate, p.provider.paymentID(duplicate, pm.order, p.run)
		p.pay(pm)
	}()
}

// withSlot runs f once a place among the payers' requests is free (or the
// run is interrupted).
func (p *payer) withSlot(f func()) {
	select {
	case <-p.life.Done():
	case p.slots <- struct{}{}:
		defer func() { <-p.slots }()
	}
	f()
}

// pay delivers pm's event and records its last answer, which it returns.
func (p *payer) pay(pm payment) answer {
	var a answer
	body, err := p.provider.event(pm)
	if err != nil {
		a = answer{err: err}
	} else {
		p.withSlot(func() {
			a = p.deliver(p.life, pm.rt, p.statuses, p.timed, func(ctx context.Context) (*http.Request, error) {
				req, err := http.NewRequestWithContext(ctx, "POST", pm.base+p.provider.path(), bytes.NewReader(body))
				if err != nil {
					return nil, err
				}
				req.Header.Set("Content-Type", "application/json")
				return req, p.provider.sign(req.Header, pm, body, p.clock())
			})
		})
	}
	p.final(pm, a, "")
	return a
}

// checkout asks for the checkout of pm's order, as its buyer, and sets
// pm.id to its PaymentIntent if it is answered 200 with one; it returns
// the last answer.
func (p *payer) checkout(ctx context.Context, pm *payment) answer {
	a := p.deliver(ctx, pm.rt, p.checkouts, nil, pm.post("checkout"))
	if a.err == nil && a.status == http.StatusOK {
		var co struct {
			PaymentIntent string `json:"payment_intent"`
		}
		if json.Unmarshal(a.body, &co) == nil {
			pm.id = co.PaymentIntent
		}
	}
	return a
}

// timed records one event delivery, sent at start and answered (or not)
// after took.
func (p *payer) timed(start time.Time, took time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events.add(start, took)
}

// cancelTimed records one cancel attempt, as timed an event delivery.
func (p *payer) cancelTimed(start time.Time, took time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancels.add(start, took)
}

// cancel cancels pm's order as its buyer, POST
// /api/v1/orders/{id}/cancel with its user id and Authorization, sent
// again after a 429, 502, 503, 504 or a transport error as a payment is,
// and records its last answer.
func (p *payer) cancel(pm payment) {
	var a answer
	p.withSlot(func() {
		a = p.deliver(p.life, pm.rt, p.cancelStatuses, p.cancelTimed, pm.post("cancel"))
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancelFinals[answerKey(a)]++
}

// deliver sends the request that build makes, built anew for each
// delivery, until it is answered (not 429, 502, 503, 504 or a transport
// error) or the policy's bound is reached, counts every answer in counts,
// times each delivery with observe (when set), and returns the last.
func (p *payer) deliver(ctx context.Context, rt http.RoundTripper, counts map[string]int,
	observe func(start time.Time, took time.Duration), build func(context.Context) (*http.Request, error)) answer {
	start := time.Now()
	for n := 1; ; n++ {
		sent := time.Now()
		a := p.send(ctx, rt, build)
		if observe != nil {
			observe(sent, time.Since(sent))
		}
		p.mu.Lock()
		counts[answerKey(a)]++
		p.mu.Unlock()
		if !retryable(a) || n >= p.policy.attempts || ctx.Err() != nil {
			return a
		}
		wait := p.policy.delay(n, a.header.Get("Retry-After"))
		if time.Since(start)+wait > p.policy.budget {
			return a
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if ctx.Err() != nil {
			return a
		}
		p.retries.Add(1)
	}
}

// send makes one delivery, within the policy's timeout.
func (p *payer) send(ctx context.Context, rt http.RoundTripper, build func(context.Context) (*http.Request, error)) answer {
	ctx, cancel := context.WithTimeout(ctx, p.policy.timeout)
	defer cancel()
	req, err := build(ctx)
	if err != nil {
		return answer{err: err}
	}
	req.GetBody = nil // every delivery is the payer's, and counted
	return roundTrip(rt, req)
}

// final records a payment's last answer, its key prefixed with prefix
// ("checkout " for a payment that ended at its checkout).
func (p *payer) final(pm payment, a answer, prefix string) {
	key := prefix + answerKey(a)
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tallies[pm.kind]
	t.Sent++
	switch {
	case retryable(a):
		t.Unanswered++
	case prefix != "":
	case outcome(a) == "applied":
		t.Paid++
	case outcome(a) == "owed":
		t.Refused++
	}
	p.finals[pm.kind][key]++
	id := pm.id
	if id == "" {
		id = "-"
	}
	p.lines = append(p.lines, fmt.Sprintf("%d %d %s %s %s", pm.order, pm.user, id, pm.kind, key))
}

// eventAnswer is what the service answers a provider's event with.
type eventAnswer struct {
	Result string `json:"result"` // applied, owed or conflict for a payment
	Reason string `json:"reason"` // why a payment is owed back
}

// readEvent reads a 200's answer to an event; the zero value if it is not
// one.
func readEvent(a answer) eventAnswer {
	var e eventAnswer
	if a.err != nil || a.status != http.StatusOK || json.Unmarshal(a.body, &e) != nil {
		return eventAnswer{}
	}
	return e
}

// outcome is the result a 200 says of a payment: "applied", "owed",
// "conflict"; "" for any other answer.
func outcome(a answer) string { return readEvent(a).Result }

// answerKey names an answer for the counts: its status, with the error
// code of a 4xx ("409 order_expired"), the result and reason of a 200 to
// an event ("200 applied", "200 owed order_expired"), or "error" for a
// transport error.
func answerKey(a answer) string {
	if a.err != nil {
		return "error"
	}
	if a.status >= 400 && a.status < 500 {
		if code := errorCode(a.body); code != "" {
			return fmt.Sprintf("%d %s", a.status, code)
		}
	}
	if e := readEvent(a); e.Result != "" {
		return strings.TrimSpace(fmt.Sprintf("%d %s %s", a.status, e.Result, e.Reason))
	}
	return strconv.Itoa(a.status)
}

// errorCode is the code of an error body, {"error":{"code":"sold_out"}},
// or "".
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.NewDecoder(bytes.NewReader(body)).Decode(&e) != nil {
		return ""
	}
	return e.Error.Code
}

// PayTally counts the payments of one kind by their last answer.
type PayTally struct {
	Sent       int            `json:"sent"`       // made, or ended at their checkout
	Paid       int            `json:"paid"`       // 200 applied: the order is paid
	Refused    int            `json:"refused"`    // 200 owed: recorded as a refund owed, to be paid back
	Unanswered int            `json:"unanswered"` // still 429, 5xx or a transport error at the end (the checkout's, with -stripe)
	Final      map[string]int `json:"final"`      // last answer → payments
}

func (t PayTally) String() string {
	return fmt.Sprintf("%d sent, %d paid, %d owed back, %d unanswered", t.Sent, t.Paid, t.Refused, t.Unanswered)
}

// PayResult is what -json says of the payments.
type PayResult struct {
	Provider      string         `json:"provider"` // webhook or stripe
	Frac          float64        `json:"pay_frac"`
	LateFrac      float64        `json:"late_frac"`
	DupFrac       float64        `json:"dup_frac"`
	MismatchFrac  float64        `json:"mismatch_frac"`
	UnknownOrders int            `json:"unknown_orders"`
	InTime        PayTally       `json:"in_time"`
	Late          PayTally       `json:"late"`
	Duplicate     PayTally       `json:"duplicate"`
	Mismatch      PayTally       `json:"mismatch"`
	Unknown       PayTally       `json:"unknown"`
	Retries       int            `json:"retries"`             // deliveries after a payment's or a checkout's first
	Statuses      map[string]int `json:"statuses"`            // every event delivery's answer
	Checkouts     map[string]int `json:"checkouts,omitempty"` // every checkout attempt's answer (-stripe)
	// Events is the event deliveries' timing: their rate over the time
	// they were sent in, and their latency.
	Events EventTiming `json:"events"`
}

// CancelResult is what -json says of the buyers' cancels (-cancel-frac).
type CancelResult struct {
	Frac       float64        `json:"cancel_frac"`
	Sent       int            `json:"sent"`
	Cancelled  int            `json:"cancelled"`  // last answer 200: the order is cancelled, its unit back on sale
	Refused    int            `json:"refused"`    // last answer another 4xx but 429 (409 order_paid, order_expired; 404)
	Unanswered int            `json:"unanswered"` // still 429, 5xx or a transport error at the end
	Statuses   map[string]int `json:"statuses"`   // every attempt's answer
	Final      map[string]int `json:"final"`      // last answer → cancels
	// Attempts is the attempts' timing, as Events is the payments'.
	Attempts EventTiming `json:"attempts"`
}

func (r CancelResult) String() string {
	return fmt.Sprintf("cancels: %d sent, %d cancelled, %d refused, %d unanswered; attempts %d at %.0f/s, p50 %.1f ms, p99 %.1f ms",
		r.Sent, r.Cancelled, r.Refused, r.Unanswered, r.Attempts.Deliveries, r.Attempts.PerSecond, r.Attempts.P50Ms, r.Attempts.P99Ms)
}

// cancelResult returns the cancels' counts.
func (p *payer) cancelResult() CancelResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := CancelResult{Frac: p.plan.cancelFrac, Statuses: maps.Clone(p.cancelStatuses), Final: maps.Clone(p.cancelFinals),
		Attempts: p.cancels.timing()}
	for key, n := range p.cancelFinals {
		r.Sent += n
		code, _ := strconv.Atoi(strings.Fields(key + " 0")[0]) // "error" is 0
		switch {
		case code == http.StatusOK:
			r.Cancelled += n
		case code == 0 || retryableStatus(code):
			r.Unanswered += n
		default:
			r.Refused += n
		}
	}
	return r
}

// EventTiming is how fast the service took the provider's events (or the
// buyers' cancels).
type EventTiming struct {
	Deliveries int     `json:"deliveries"`
	Seconds    float64 `json:"seconds"`    // from the first sent to the last answer
	PerSecond  float64 `json:"per_second"` // deliveries / seconds
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
}

// timing is the timing of the requests.
func (t timings) timing() EventTiming {
	if len(t.took) == 0 {
		return EventTiming{}
	}
	d := slices.Clone(t.took)
	slices.Sort(d)
	ms := func(q float64) float64 {
		return float64(d[min(len(d)-1, int(q*float64(len(d))))].Microseconds()) / 1000
	}
	e := EventTiming{Deliveries: len(d), P50Ms: ms(0.5), P99Ms: ms(0.99), MaxMs: float64(d[len(d)-1].Microseconds()) / 1000}
	if span := t.last.Sub(t.first); span > 0 {
		e.Seconds = span.Seconds()
		e.PerSecond = float64(len(d)) / e.Seconds
	}
	return e
}

// tally returns the tally of kind.
func (r *PayResult) tally(kind string) *PayTally {
	return map[string]*PayTally{inTime: &r.InTime, late: &r.Late, duplicate: &r.Duplicate, mismatch: &r.Mismatch,
		unknown: &r.Unknown}[kind]
}

// summary is the payments' line of the load test's summary: in time and
// late, and the kinds sent on purpose when their flags asked for them.
func (r PayResult) summary() string {
	parts := []string{"payments in time: " + r.InTime.String(), "late: " + r.Late.String()}
	for _, k := range []struct {
		name string
		on   bool
		t    PayTally
	}{{"second payments", r.DupFrac > 0, r.Duplicate}, {"wrong amounts", r.MismatchFrac > 0, r.Mismatch},
		{"unknown orders", r.UnknownOrders > 0, r.Unknown}} {
		if k.on {
			parts = append(parts, k.name+": "+k.t.String())
		}
	}
	return strings.Join(parts, "; ") + fmt.Sprintf("; redeliveries %d; events %d at %.0f/s, p50 %.1f ms, p99 %.1f ms",
		r.Retries, r.Events.Deliveries, r.Events.PerSecond, r.Events.P50Ms, r.Events.P99Ms)
}

// result returns the payments' counts, and the payments file's lines in
// the order the payments ended.
func (p *payer) result() (PayResult, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := PayResult{Provider: p.provider.name(), Frac: p.plan.frac, LateFrac: p.plan.lateFrac, DupFrac: p.plan.dupFrac,
		MismatchFrac: p.plan.mismatchFrac, UnknownOrders: p.plan.unknownOrders, Retries: int(p.retries.Load()),
		Statuses: maps.Clone(p.statuses), Events: p.events.timing()}
	if len(p.checkouts) > 0 {
		r.Checkouts = maps.Clone(p.checkouts)
	}
	for _, k := range kinds {
		t := r.tally(k)
		*t = *p.tallies[k]
		t.Final = maps.Clone(p.finals[k])
	}
	return r, slices.Clone(p.lines)
}

// post makes the buyer's POST /api/v1/orders/{id}/{action} of pm's order,
// with its user id and bearer token.
func (pm *payment) post(action string) func(ctx context.Context) (*http.Request, error) {
	body := fmt.Sprintf(`{"user_id":%d}`, pm.user)
	return func(ctx context.Context) (*http.Request, error) {
		url := fmt.Sprintf("%s/api/v1/orders/%d/%s", pm.base, pm.order, action)
		req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		if pm.auth != "" {
			req.Header.Set("Authorization", pm.auth)
		}
		return req, nil
	}
}
