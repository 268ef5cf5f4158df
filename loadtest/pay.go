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

// Payments. With -pay-frac or -late-frac, a winner whose 201 says its order
// is "reserved" may pay it: POST /api/v1/orders/{id}/pay with its user id
// and the payment id pay-<order_id>, the buyer's Authorization header sent
// again. Which winners pay, and when, depends on the order id alone
// (payShare), so a run pays the same orders whoever wins which id.
//
// A payer retries 429, 502, 503, 504 and transport errors with the same
// payment_id, as a payment provider delivers a payment again, Retry-After
// honoured, within -retries attempts and -retry-for (whether or not the
// buyers retry): a payment whose answer was lost is the same payment when
// it comes again, never a second one.

// golden is 1/φ. The fractional parts of id×golden for consecutive ids
// spread evenly over [0, 1) (a Weyl sequence), so any run of order ids pays
// a share close to the fraction asked for.
const golden = 0.6180339887498949

// payShare places order id in [0, 1).
func payShare(id int64) float64 {
	_, f := math.Modf(float64(id) * golden)
	return f
}

// payPlan says which winners pay: those whose payShare is below frac pay at
// once; those below frac+lateFrac pay lateBy after their order's pay_by,
// too late on purpose, so that the service must refuse the payment and owe
// it back.
type payPlan struct {
	frac     float64
	lateFrac float64
	lateBy   time.Duration
}

// The times a payment is made.
const (
	inTime = "in_time"
	late   = "late"
)

// when says when the winner of order id pays: inTime, late, or "" (never).
func (p payPlan) when(id int64) string {
	switch s := payShare(id); {
	case s < p.frac:
		return inTime
	case s < p.frac+p.lateFrac:
		return late
	}
	return ""
}

// payment is one payment a payer makes.
type payment struct {
	base  string // the service URL the order was placed at
	order int64
	user  int64
	id    string // payment_id
	when  string // inTime or late
	payBy time.Time
	auth  string // the buyer's Authorization header, if it sent one
	// rt sends the payment from its buyer's source address, as the same
	// customer would pay.
	rt http.RoundTripper
}

// paymentID is the payment id of order id: derived from the order, so that
// every delivery of one payment carries the same id.
func paymentID(order int64) string { return "pay-" + strconv.FormatInt(order, 10) }

// payer makes the payments, at most payConns at a time.
type payer struct {
	plan   payPlan
	policy retryPolicy
	// life is the run's context: an interrupt ends the payers' waits.
	life  context.Context
	slots chan struct{}

	inTime, late sync.WaitGroup
	retries      atomic.Int64

	mu       sync.Mutex
	statuses map[string]int            // every attempt's answer (answerKey)
	tallies  map[string]*PayTally      // inTime, late → their payments' last answers
	lines    []string                  // the payments file
	finals   map[string]map[string]int // inTime, late → last answer → payments
}

// payConns caps the payments in flight.
const payConns = 64

func newPayer(life context.Context, plan payPlan, policy retryPolicy) *payer {
	return &payer{plan: plan, policy: policy, life: life, slots: make(chan struct{}, payConns),
		statuses: map[string]int{}, tallies: map[string]*PayTally{inTime: {}, late: {}},
		finals: map[string]map[string]int{inTime: {}, late: {}}}
}

// schedule makes payment pm in the background: at once, or lateBy after
// its order's pay_by (by this machine's clock; pay_by is MySQL's, on the
// same machine in the demo).
func (p *payer) schedule(pm payment) {
	wg := &p.inTime
	if pm.when == late {
		wg = &p.late
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if pm.when == late {
			at := time.Now()
			if !pm.payBy.IsZero() {
				at = pm.payBy
			}
			select {
			case <-p.life.Done():
			case <-time.After(time.Until(at.Add(p.plan.lateBy))):
			}
		}
		select {
		case <-p.life.Done():
		case p.slots <- struct{}{}:
			defer func() { <-p.slots }()
		}
		p.pay(p.life, pm)
	}()
}

// pay delivers pm until it is answered (not 429, 502, 503, 504 or a transport
// error) or the policy's bound is reached, with the same payment id each
// time, and records its last answer.
func (p *payer) pay(ctx context.Context, pm payment) {
	body := fmt.Sprintf(`{"user_id":%d,"payment_id":%q}`, pm.user, pm.id)
	start := time.Now()
	var a answer
	for n := 1; ; n++ {
		a = p.send(ctx, pm, body)
		p.mu.Lock()
		p.statuses[answerKey(a)]++
		p.mu.Unlock()
		if !retryable(a) || n >= p.policy.attempts || ctx.Err() != nil {
			break
		}
		wait := p.policy.delay(n, a.header.Get("Retry-After"))
		if time.Since(start)+wait > p.policy.budget {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if ctx.Err() != nil {
			break
		}
		p.retries.Add(1)
	}
	p.final(pm, a)
}

// send makes one delivery of pm, within the policy's timeout.
func (p *payer) send(ctx context.Context, pm payment, body string) answer {
	ctx, cancel := context.WithTimeout(ctx, p.policy.timeout)
	defer cancel()
	url := fmt.Sprintf("%s/api/v1/orders/%d/pay", pm.base, pm.order)
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.GetBody = nil // every delivery is the payer's, and counted
	req.Header.Set("Content-Type", "application/json")
	if pm.auth != "" {
		req.Header.Set("Authorization", pm.auth)
	}
	return roundTrip(pm.rt, req)
}

// final records a payment's last answer.
func (p *payer) final(pm payment, a answer) {
	key := answerKey(a)
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tallies[pm.when]
	t.Sent++
	switch {
	case a.err == nil && a.status == http.StatusOK:
		t.Paid++
	case refused(a):
		t.Refused++
	case retryable(a):
		t.Unanswered++
	}
	p.finals[pm.when][key]++
	p.lines = append(p.lines, fmt.Sprintf("%d %d %s %s %s", pm.order, pm.user, pm.id, pm.when, key))
}

// refused tells whether a payment's answer says it came too late, so that
// the service owes it back: 409 order_expired or order_cancelled.
func refused(a answer) bool {
	if a.err != nil || a.status != http.StatusConflict {
		return false
	}
	code := errorCode(a.body)
	return code == "order_expired" || code == "order_cancelled"
}

// answerKey names an answer for the counts: its status, with the error
// code of a 4xx ("409 order_expired"), or "error" for a transport error.
func answerKey(a answer) string {
	if a.err != nil {
		return "error"
	}
	if a.status >= 400 && a.status < 500 {
		if code := errorCode(a.body); code != "" {
			return fmt.Sprintf("%d %s", a.status, code)
		}
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

// PayTally counts the payments made at one time (in time, or late) by
// their last answer.
type PayTally struct {
	Sent       int            `json:"sent"`
	Paid       int            `json:"paid"`       // 200
	Refused    int            `json:"refused"`    // 409 order_expired or order_cancelled: owed back
	Unanswered int            `json:"unanswered"` // still 5xx or a transport error at the end
	Final      map[string]int `json:"final"`      // last answer → payments
}

// PayResult is what -json says of the payments.
type PayResult struct {
	Frac     float64        `json:"pay_frac"`
	LateFrac float64        `json:"late_frac"`
	InTime   PayTally       `json:"in_time"`
	Late     PayTally       `json:"late"`
	Retries  int            `json:"retries"`  // deliveries after a payment's first
	Statuses map[string]int `json:"statuses"` // every delivery's answer
}

// result returns the payments' counts, and the payments file's lines in
// the order the payments ended.
func (p *payer) result() (PayResult, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := PayResult{Frac: p.plan.frac, LateFrac: p.plan.lateFrac, InTime: *p.tallies[inTime], Late: *p.tallies[late],
		Retries: int(p.retries.Load()), Statuses: maps.Clone(p.statuses)}
	r.InTime.Final, r.Late.Final = maps.Clone(p.finals[inTime]), maps.Clone(p.finals[late])
	return r, slices.Clone(p.lines)
}
