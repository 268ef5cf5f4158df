package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// tap is an HTTP forward proxy on loopback that hey's requester sends every
// request through. hey keeps only status codes and timings; the tap also
// reads each response body, so that every 201 becomes a line of the acks
// file: the orders the buyers were told they have, with the SKU and user
// each answer named. Each request hey sends is one buyer; with a retry
// policy the tap retries the buyer's failures before it answers hey, so
// that hey's latency is the buyer's whole wait. A winner's payment is made
// beside it, by the tap's payer, and is not in hey's latency. Buyer i (in
// the order the tap is asked) is sent from source address i mod the
// sources' number, its retries, purchases again and payment too. The load
// test's own client (-client direct) hands the tap its buyers without the
// proxy (serve): the same bookkeeping, without the HTTP hop.
type tap struct {
	sources *sources
	server  *http.Server
	addr    string
	policy  retryPolicy

	// serving counts the buyers the tap is answering. Once close has
	// begun (closing), the tap takes no new buyer, and drained is closed
	// when the last one it had has its answer.
	servingMu sync.Mutex
	serving   int
	closing   bool
	drained   chan struct{}

	next     atomic.Int64 // buyers seen
	done     atomic.Int64
	retries  atomic.Int64
	mu       sync.Mutex
	statuses map[int]int    // every attempt's answer
	errors   map[string]int // every attempt's transport error
	finals   map[string]int // each buyer's last answer: its status code, or "error"
	acks     []ack
	acked    map[string]bool // the buyers (Idempotency-Keys) in acks
	reserved int             // acks whose order was reserved, awaiting payment

	// payer pays the winners' reservations (-pay-frac, -late-frac,
	// -mismatch-frac, -dup-frac); nil: nobody pays.
	payer *payer
	// until, when above zero, makes a buyer answered 409 sold_out buy
	// again, after a backoff, until the run has won until orders or
	// untilEnd has passed (-until, -until-for): a wave of buyers waiting
	// for returned units.
	until    int64
	untilEnd time.Time
	won      atomic.Int64 // acks
	rebuys   atomic.Int64 // purchase attempts after a sold_out
}

// ack is one 201: the order, and the SKU and user its body named (zero if
// it named none).
type ack struct{ orderID, skuID, userID int64 }

// String renders the ack as a line of the acks file: "order_id sku_id
// user_id", or the order id alone if the answer lacked the others.
func (a ack) String() string {
	if a.skuID <= 0 || a.userID <= 0 {
		return strconv.FormatInt(a.orderID, 10)
	}
	return fmt.Sprintf("%d %d %d", a.orderID, a.skuID, a.userID)
}

// tapConnsPerHost caps the tap's requests in flight to each service URL,
// over all its source addresses; requests beyond it wait in the tap, as
// they would in a server's accept queue.
const tapConnsPerHost = 256

// newTap makes a tap that sends each buyer's request by policy, through
// srcs. It serves no proxy until listen: the load test's own client
// (direct.go) hands it its buyers without one.
func newTap(policy retryPolicy, srcs *sources) *tap {
	return &tap{
		sources:  srcs,
		policy:   policy,
		statuses: map[int]int{},
		errors:   map[string]int{},
		finals:   map[string]int{},
		acked:    map[string]bool{},
		drained:  make(chan struct{}),
	}
}

// listen starts the tap's proxy on a loopback port (addr), for hey.
func (t *tap) listen() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	t.addr = ln.Addr().String()
	t.server = &http.Server{Handler: t, ReadHeaderTimeout: 10 * time.Second}
	go t.server.Serve(ln)
	return nil
}

// close stops the tap once the buyers it is still serving have their
// answers (at most wait), so that a snapshot taken after it counts them.
// It waits for those buyers, not for the tap's connections to go idle, as
// http.Server's Shutdown would: hey's transport may dial a connection it
// never sends a request on (the request it was dialled for took another
// connection that came free first), and Shutdown waits for such a
// connection until it is five seconds old, which would hold every run
// that leaves one, and the "orders done" line a next wave starts on, for
// five seconds more.
func (t *tap) close(wait time.Duration) {
	t.servingMu.Lock()
	if !t.closing && t.serving == 0 {
		close(t.drained)
	}
	t.closing = true
	t.servingMu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-t.drained:
	case <-timer.C:
	}
	// Close drops every connection, unused or idle, and any buyer still
	// in flight past wait: its request's context ends its attempts.
	if t.server != nil {
		t.server.Close()
	}
	t.sources.closeIdle()
}

// enter counts a buyer in, unless the tap is closing.
func (t *tap) enter() bool {
	t.servingMu.Lock()
	defer t.servingMu.Unlock()
	if t.closing {
		return false
	}
	t.serving++
	return true
}

// leave counts a buyer out, once it has its answer.
func (t *tap) leave() {
	t.servingMu.Lock()
	defer t.servingMu.Unlock()
	t.serving--
	if t.closing && t.serving == 0 {
		close(t.drained)
	}
}

// answer is what one attempt got: a response, read whole, or an error.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// ServeHTTP forwards a proxied request (absolute URL) as one buyer
// (serve) and copies the buyer's last answer back.
func (t *tap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !t.enter() {
		http.Error(w, "the load test is over", http.StatusServiceUnavailable)
		return
	}
	defer t.leave()
	defer t.done.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a := t.serve(r, body)
	if a.err != nil {
		http.Error(w, a.err.Error(), http.StatusBadGateway)
		return
	}
	for k, vs := range a.header {
		w.Header()[k] = vs
	}
	w.WriteHeader(a.status)
	w.Write(a.body)
}

// serve is one buyer: it sends r, with body, retrying it by the tap's
// policy, records every answer and returns the last. A buyer who wins a
// reservation that the payment plan picks has it paid (payer); with until
// set, a buyer answered 409 sold_out buys again. Both clients come here:
// the proxy (ServeHTTP) with the request hey sent it, and the load test's
// own client (direct.go) with the request it built, so that a buyer is
// the same buyer whichever sent it.
func (t *tap) serve(r *http.Request, body []byte) answer {
	key := r.Header.Get("Idempotency-Key")
	rt := t.sources.of(int(t.next.Add(1) - 1))
	var a answer
	for attempt := 1; ; attempt++ {
		// Each purchase attempt is a purchase of its own, under a key of
		// its own: the key of a sold-out attempt is not the next one's.
		k := key
		if key != "" && attempt > 1 {
			k = fmt.Sprintf("%s-%d", key, attempt)
		}
		var won *created
		a, won = t.buy(rt, r, body, k)
		if won != nil {
			t.schedulePayment(rt, r, won)
			break
		}
		wait := soldOutDelay(attempt)
		if !t.buyAgain(a, wait) {
			break
		}
		select {
		case <-r.Context().Done():
		case <-time.After(wait):
		}
		if r.Context().Err() != nil {
			break // the client gave up on this buyer
		}
		t.rebuys.Add(1)
	}
	t.final(a)
	return a
}

// buy makes one purchase attempt under Idempotency-Key key (none if
// empty): it sends the request through rt, retrying it by the tap's policy
// with the same key, and returns the last answer, and the order it won if
// that answer is a 201 that made a new ack.
func (t *tap) buy(rt http.RoundTripper, r *http.Request, body []byte, key string) (answer, *created) {
	start := time.Now()
	for n := 1; ; n++ {
		a := t.send(rt, r, body, key)
		won := t.record(key, a)
		if !retryable(a) || n >= t.policy.attempts {
			return a, won
		}
		wait := t.policy.delay(n, a.header.Get("Retry-After"))
		if time.Since(start)+wait > t.policy.budget {
			return a, won
		}
		select {
		case <-r.Context().Done():
		case <-time.After(wait):
		}
		if r.Context().Err() != nil {
			return a, won // hey gave up on this buyer
		}
		t.retries.Add(1)
	}
}

const (
	// soldOutBase is the first wait of a buyer who buys again after a
	// sold_out (-until); each further attempt doubles it.
	soldOutBase = 100 * time.Millisecond
	// soldOutCap is the most such a buyer waits between two attempts: a
	// unit returned to the sale is bought within about this long.
	soldOutCap = time.Second
)

// soldOutDelay is how long a buyer waits after its purchase attempt n
// (from 1) was sold out: full jitter over an exponential window from
// soldOutBase up to soldOutCap.
func soldOutDelay(n int) time.Duration {
	window := min(soldOutBase<<min(n-1, 16), soldOutCap)
	return retryFloor + rand.N(window-retryFloor+1)
}

// buyAgain tells whether a buyer whose purchase attempt was answered a
// buys again after wait: with until set, after a 409 sold_out, while the
// run has won fewer than until orders and wait ends before untilEnd.
func (t *tap) buyAgain(a answer, wait time.Duration) bool {
	return t.until > 0 && a.err == nil && a.status == http.StatusConflict && errorCode(a.body) == "sold_out" &&
		t.won.Load() < t.until && time.Now().Add(wait).Before(t.untilEnd)
}

// schedulePayment has the payer pay the reservation won, if the payment
// plan picks it, at the service the order went to, through the buyer's
// transport rt (from its source address), with the amount and currency
// its 201 gave, and with its Authorization for a checkout.
func (t *tap) schedulePayment(rt http.RoundTripper, r *http.Request, won *created) {
	if t.payer == nil || won.Status != "reserved" {
		return
	}
	kind := t.payer.plan.kind(won.OrderID)
	if kind == "" {
		return
	}
	payBy, _ := time.Parse(time.RFC3339Nano, won.PayBy)
	pm := payment{base: r.URL.Scheme + "://" + r.URL.Host, order: won.OrderID, user: won.UserID, kind: kind,
		amount: paid(kind, won.AmountCents), currency: won.Currency, payBy: payBy, auth: r.Header.Get("Authorization"), rt: rt}
	if kind != cancelled && !t.payer.provider.checkout(kind) {
		pm.id = t.payer.provider.paymentID(kind, won.OrderID, t.payer.run)
	}
	t.payer.schedule(pm)
}

// send makes one attempt at the request with body through rt, under
// Idempotency-Key key (none if empty), within the policy's timeout. The
// body is given without GetBody, so the transport never sends an order
// again by itself: every attempt is the tap's, and counted.
func (t *tap) send(rt http.RoundTripper, r *http.Request, body []byte, key string) answer {
	ctx, cancel := context.WithTimeout(r.Context(), t.policy.timeout)
	defer cancel()
	out := r.Clone(ctx)
	out.RequestURI = ""
	out.Header.Del("Proxy-Connection")
	if key != "" {
		out.Header.Set("Idempotency-Key", key)
	}
	out.Body, out.GetBody, out.ContentLength = nil, nil, int64(len(body))
	if len(body) > 0 {
		out.Body = io.NopCloser(bytes.NewReader(body))
	}
	return roundTrip(rt, out)
}

// roundTrip sends req once through rt and reads the whole answer.
func roundTrip(rt http.RoundTripper, req *http.Request) answer {
	res, err := rt.RoundTrip(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return answer{err: err}
	}
	return answer{status: res.StatusCode, header: res.Header, body: data}
}

// retryable tells whether an attempt's answer asks for another: a
// transport error, 502, 503 or 504 leave the order's fate open, and 429
// (a rate limit, at nginx or in the service) says that nothing was done
// and when to come back.
func retryable(a answer) bool {
	return a.err != nil || retryableStatus(a.status)
}

// retryableStatus tells whether an answer with status asks for another
// attempt (retryable).
func retryableStatus(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// created is what a 201 says of the order.
type created struct {
	OrderID int64  `json:"order_id"`
	SKUID   int64  `json:"sku_id"`
	UserID  int64  `json:"user_id"`
	Status  string `json:"status"` // reserved, or paid when the service has no payment step
	PayBy   string `json:"pay_by"` // RFC 3339, MySQL's clock; empty without a payment step
	// AmountCents and Currency are what the order owes.
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// record counts one attempt's answer; a 201 becomes an ack, once per buyer
// (a buyer is its Idempotency-Key; without one, every request is a buyer of
// its own). It returns the order of a 201 that made a new ack, else nil.
func (t *tap) record(buyer string, a answer) *created {
	var o created
	if a.err == nil && a.status == http.StatusCreated {
		if json.NewDecoder(bytes.NewReader(a.body)).Decode(&o) != nil {
			o = created{}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if a.err != nil {
		t.errors[a.err.Error()]++
		return nil
	}
	t.statuses[a.status]++
	if o.OrderID <= 0 || (buyer != "" && t.acked[buyer]) {
		return nil
	}
	if buyer != "" {
		t.acked[buyer] = true
	}
	t.acks = append(t.acks, ack{o.OrderID, o.SKUID, o.UserID})
	if o.Status == "reserved" {
		t.reserved++
	}
	t.won.Add(1)
	return &o
}

// final counts a buyer's last answer.
func (t *tap) final(a answer) {
	key := "error"
	if a.err == nil {
		key = strconv.Itoa(a.status)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.finals[key]++
}

// tally is a copy of what the tap has seen.
type tally struct {
	statuses map[int]int
	errors   map[string]int
	finals   map[string]int
	acks     []ack
	retries  int
	reserved int
	rebuys   int
}

// snapshot returns a copy of what the tap has seen.
func (t *tap) snapshot() tally {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tally{
		statuses: maps.Clone(t.statuses),
		errors:   maps.Clone(t.errors),
		finals:   maps.Clone(t.finals),
		acks:     slices.Clone(t.acks),
		retries:  int(t.retries.Load()),
		reserved: t.reserved,
		rebuys:   int(t.rebuys.Load()),
	}
}

// retryPolicy is how the tap sends a buyer's request: at most attempts
// times, starting no attempt later than budget after the first, each
// within timeout.
type retryPolicy struct {
	attempts int
	budget   time.Duration
	timeout  time.Duration
}

// wait is the longest the tap may take to answer one buyer: the last
// attempt starts at most budget after the first and takes at most timeout.
func (p retryPolicy) wait() time.Duration {
	if p.attempts <= 1 {
		return p.timeout
	}
	return p.budget + p.timeout
}

const (
	// retryFloor is the least a buyer waits before it tries again.
	retryFloor = 50 * time.Millisecond
	// retryBase is the first wait's scale when the answer names none (a
	// transport error); each further attempt doubles it.
	retryBase = 100 * time.Millisecond
	// retryCap is the most a buyer waits between two attempts, whatever
	// Retry-After says.
	retryCap = 5 * time.Second
)

// delay is how long a buyer waits after its attempt n (from 1) was
// answered with retryAfter (the header, maybe empty): a uniformly random
// time (full jitter) between retryFloor and a window, which is the
// exponential backoff (retryBase, doubling with each attempt) or the
// Retry-After seconds if longer, and at most retryCap. Retry-After is
// honoured as the window rather than as a minimum on purpose: it counts
// whole seconds, and thousands of buyers told "1" who all came back one
// second later would be the same stampede one second later; drawn from
// the window, they come back spread over it, and a server that keeps
// failing sees them less and less often as the backoff grows.
func (p retryPolicy) delay(n int, retryAfter string) time.Duration {
	window := retryBase << min(n-1, 16)
	if s, err := strconv.Atoi(strings.TrimSpace(retryAfter)); err == nil && s > 0 {
		window = max(window, time.Duration(s)*time.Second)
	}
	window = min(max(window, retryFloor), retryCap)
	return retryFloor + rand.N(window-retryFloor+1)
}
