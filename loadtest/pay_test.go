package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"shop/internal/payments"
)

// The payment provider's secrets of the tests: a Standard Webhooks secret
// (32 bytes, base64) and a Stripe endpoint's.
const (
	testWebhookSecret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	testStripeSecret  = "whsec_loadtest_stripe_endpoint"
)

// lifeShop sells the units of one SKU as reservations that must be paid
// within window (none: paid when placed), as the service does: a lapsed
// reservation expires and its unit returns to the sale at the next request;
// one active order per user; Idempotency-Keys replay the order with its
// current status. Order id i owes 1000+i cents in EUR. Payments are the
// provider's events, checked with the service's own verifier (Standard
// Webhooks, or Stripe with stripeFlow) and decided as the service decides
// them, once per payment id (a ledger): applied to a reserved order in time
// with its amount; otherwise owed back, with the reason. With stripeFlow,
// POST /api/v1/orders/{id}/checkout gives the order's PaymentIntent,
// pi_test_<id>, to its buyer (the Authorization its order was placed with)
// while it is reserved. With failPay, each payment's first delivery (and
// each checkout's first attempt) is a 503 (Retry-After: 0, nothing done)
// and its second is done but its answer lost (the connection closed). With
// lapseAfter set (lapseWhenSoldOutTo), the reservations lapse when a number
// of buyers have been told sold_out, not by the clock.
type lifeShop struct {
	window     time.Duration
	failPay    bool
	stripeFlow bool
	verifier   payments.Verifier
	// lateWindow, when above zero, is the window of the orders that
	// latePlan pays late: the others keep window, long enough that nothing
	// paid at once lapses on a loaded machine.
	lateWindow time.Duration
	latePlan   payPlan

	mu         sync.Mutex
	stock      int
	next       int64
	orders     map[int64]*lifeOrder
	keys       map[string]int64 // user and key → order
	active     map[int64]int64  // user → active order
	keysSent   map[string]int   // Idempotency-Key → orders sent with it
	auths      map[int64]string // user → the Authorization its order came with
	deliveries map[string][]delivery
	ledger     map[string]*eventReply    // payment id → what it did
	received   map[string]payments.Event // payment id → its event
	checkouts  map[int64][]time.Time     // order → its checkouts' times
	cancels    map[int64]int             // order → its cancels' attempts
	bad        []string                  // requests the service would refuse, and should not have had
	lapseAfter int                       // above zero: the sold_out users that make the reservations lapse
	soldOutTo  map[int64]bool            // users told sold_out since lapseWhenSoldOutTo
}

type lifeOrder struct {
	id, user  int64
	status    string
	payBy     time.Time
	paymentID string
}

// delivery is one delivery of a payment's event: its event id (the
// message id, or Stripe's), signature timestamp, and raw body.
type delivery struct {
	eventID string
	at      string
	body    string
}

// eventReply is the service's answer to an event.
type eventReply struct {
	Result   string `json:"result"`
	Reason   string `json:"reason,omitempty"`
	RefundID string `json:"refund_id,omitempty"`
	Again    bool   `json:"again,omitempty"`
}

func newLifeShop(units int, window time.Duration) *lifeShop {
	v, err := payments.NewStandard(testWebhookSecret)
	if err != nil {
		panic(err)
	}
	return &lifeShop{window: window, verifier: v, stock: units, orders: map[int64]*lifeOrder{}, keys: map[string]int64{},
		active: map[int64]int64{}, keysSent: map[string]int{}, auths: map[int64]string{}, deliveries: map[string][]delivery{},
		ledger: map[string]*eventReply{}, received: map[string]payments.Event{}, checkouts: map[int64][]time.Time{},
		cancels: map[int64]int{}}
}

// newStripeShop is newLifeShop with Stripe's checkout and events.
func newStripeShop(units int, window time.Duration) *lifeShop {
	s := newLifeShop(units, window)
	v, err := payments.NewStripe(testStripeSecret)
	if err != nil {
		panic(err)
	}
	s.verifier, s.stripeFlow = v, true
	return s
}

// owes is what order id owes, in cents of EUR.
func owes(id int64) int64 { return 1000 + id }

// lapseWhenSoldOutTo makes the reservations placed so far lapse at once
// when n different users have been told sold_out from now on.
func (s *lifeShop) lapseWhenSoldOutTo(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lapseAfter, s.soldOutTo = n, map[int64]bool{}
}

// soldOut notes that user was told sold_out, and lapses the reservations
// if that makes the number lapseWhenSoldOutTo waits for.
func (s *lifeShop) soldOut(user int64) {
	if s.lapseAfter == 0 {
		return
	}
	s.soldOutTo[user] = true
	if len(s.soldOutTo) < s.lapseAfter {
		return
	}
	s.lapseAfter = 0
	now := time.Now()
	for _, o := range s.orders {
		if o.status == "reserved" {
			o.payBy = now
		}
	}
	s.expire()
}

// expire gives back the units of lapsed reservations.
func (s *lifeShop) expire() {
	for _, o := range s.orders {
		if o.status == "reserved" && !time.Now().Before(o.payBy) {
			o.status = "expired"
			delete(s.active, o.user)
			s.stock++
		}
	}
}

func (s *lifeShop) reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func (s *lifeShop) fail(w http.ResponseWriter, code int, reason string) {
	s.reply(w, code, map[string]any{"error": map[string]string{"code": reason, "message": reason}})
}

func (s *lifeShop) order(w http.ResponseWriter, code int, o *lifeOrder) {
	payBy := any(nil)
	if !o.payBy.IsZero() {
		payBy = o.payBy.Format(time.RFC3339Nano)
	}
	s.reply(w, code, map[string]any{"order_id": o.id, "sku_id": 1, "user_id": o.user, "created_at": "x",
		"status": o.status, "pay_by": payBy, "amount_cents": owes(o.id), "currency": "EUR"})
}

func (s *lifeShop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	switch path := r.URL.Path; {
	case path == "/api/v1/orders":
		s.place(w, r, body)
	case path == "/api/v1/payments/events" && !s.stripeFlow, path == "/api/v1/payments/stripe" && s.stripeFlow:
		s.event(w, r, body)
	case strings.HasSuffix(path, "/checkout") && s.stripeFlow:
		s.checkout(w, r, body)
	case strings.HasSuffix(path, "/cancel") && r.Method == "POST":
		s.cancel(w, r, body)
	default:
		s.bad = append(s.bad, r.Method+" "+path)
		s.fail(w, http.StatusNotFound, "not_found")
	}
}

// place is POST /api/v1/orders.
func (s *lifeShop) place(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		User int64 `json:"user_id"`
	}
	json.Unmarshal(body, &req)
	key := r.Header.Get("Idempotency-Key")
	s.keysSent[key]++
	if id, ok := s.keys[fmt.Sprint(req.User, key)]; ok && key != "" {
		s.order(w, http.StatusCreated, s.orders[id])
		return
	}
	if _, ok := s.active[req.User]; ok {
		s.fail(w, http.StatusConflict, "already_ordered")
		return
	}
	if s.stock == 0 {
		s.fail(w, http.StatusConflict, "sold_out")
		s.soldOut(req.User)
		return
	}
	s.stock--
	s.next++
	o := &lifeOrder{id: s.next, user: req.User, status: "paid"}
	if window := s.window; window > 0 {
		if s.lateWindow > 0 && s.latePlan.kind(o.id) == late {
			window = s.lateWindow
		}
		o.status, o.payBy = "reserved", time.Now().Add(window)
	}
	s.orders[o.id], s.active[o.user], s.auths[o.user] = o, o.id, r.Header.Get("Authorization")
	if key != "" {
		s.keys[fmt.Sprint(req.User, key)] = o.id
	}
	s.order(w, http.StatusCreated, o)
}

// paymentIntent is the PaymentIntent of order id's checkout.
func paymentIntent(id int64) string { return fmt.Sprintf("pi_test_%d", id) }

// checkout is POST /api/v1/orders/{id}/checkout: the order's PaymentIntent,
// to its buyer, while it is reserved.
func (s *lifeShop) checkout(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		User int64 `json:"user_id"`
	}
	json.Unmarshal(body, &req)
	id, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/orders/"), "/checkout"), 10, 64)
	o := s.orders[id]
	switch {
	case o == nil || o.user != req.User || r.Header.Get("Authorization") != s.auths[o.user]:
		s.bad = append(s.bad, fmt.Sprintf("checkout of order %d by user %d", id, req.User))
		s.fail(w, http.StatusNotFound, "not_found")
		return
	case o.status != "reserved":
		s.fail(w, http.StatusConflict, "order_"+o.status)
		return
	}
	s.checkouts[id] = append(s.checkouts[id], time.Now())
	if s.failPay && len(s.checkouts[id]) == 1 {
		w.Header().Set("Retry-After", "0")
		s.fail(w, http.StatusServiceUnavailable, "busy")
		return
	}
	s.reply(w, http.StatusOK, map[string]any{"order_id": id, "payment_intent": paymentIntent(id), "client_secret": "x",
		"amount_cents": owes(id), "currency": "EUR"})
}

// cancel is POST /api/v1/orders/{id}/cancel, by the order's buyer (the
// Authorization its order was placed with): a reserved order is cancelled
// and its unit returns to the sale; a cancelled one is answered again; a
// paid one is 409 order_paid. With failPay, each cancel's first attempt is
// a 503 (Retry-After: 0, nothing done).
func (s *lifeShop) cancel(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		User int64 `json:"user_id"`
	}
	json.Unmarshal(body, &req)
	id, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/orders/"), "/cancel"), 10, 64)
	o := s.orders[id]
	if o == nil || o.user != req.User || r.Header.Get("Authorization") != s.auths[o.user] {
		s.bad = append(s.bad, fmt.Sprintf("cancel of order %d by user %d", id, req.User))
		s.fail(w, http.StatusNotFound, "not_found")
		return
	}
	s.cancels[id]++
	switch {
	case s.failPay && s.cancels[id] == 1:
		w.Header().Set("Retry-After", "0")
		s.fail(w, http.StatusServiceUnavailable, "busy")
		return
	case o.status == "reserved":
		o.status = "cancelled"
		delete(s.active, o.user)
		s.stock++
	case o.status != "cancelled":
		s.fail(w, http.StatusConflict, "order_"+o.status)
		return
	}
	s.order(w, http.StatusOK, o)
}

// event is the provider's route: the signature first, as the service
// checks it; then the payment, decided once.
func (s *lifeShop) event(w http.ResponseWriter, r *http.Request, body []byte) {
	ev, err := s.verifier.Verify(r.Header, body, time.Now())
	if err != nil || ev.Payment == nil {
		s.bad = append(s.bad, fmt.Sprintf("event %s: %v", body, err))
		s.fail(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	p := ev.Payment
	at := r.Header.Get(standardwebhooks.HeaderWebhookTimestamp)
	if s.stripeFlow {
		at = r.Header.Get("Stripe-Signature")
	}
	s.deliveries[p.PaymentID] = append(s.deliveries[p.PaymentID], delivery{eventID: ev.ID, at: at, body: string(body)})
	n := len(s.deliveries[p.PaymentID])
	if s.failPay && n == 1 {
		w.Header().Set("Retry-After", "0")
		s.fail(w, http.StatusServiceUnavailable, "busy")
		return
	}
	res := s.receive(ev)
	if s.failPay && n == 2 {
		// Done, and the answer lost.
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	s.reply(w, http.StatusOK, res)
}

// receive decides a payment as the service does, once: a payment id seen
// before is answered what it did, again.
func (s *lifeShop) receive(ev payments.Event) eventReply {
	p := ev.Payment
	if res, ok := s.ledger[p.PaymentID]; ok {
		again := *res
		again.Again = true
		return again
	}
	s.received[p.PaymentID] = ev
	o := s.orders[p.OrderID]
	res := &eventReply{Result: "owed", RefundID: "R" + p.PaymentID}
	switch {
	case o == nil:
		res.Reason = "unknown_order"
	case o.status == "paid":
		res.Reason = "duplicate_payment"
	case o.status == "expired":
		res.Reason = "order_expired"
	case p.AmountCents != owes(o.id) || p.Currency != "EUR":
		res.Reason = "amount_mismatch"
	default:
		o.status, o.paymentID = "paid", p.PaymentID
		res = &eventReply{Result: "applied"}
	}
	s.ledger[p.PaymentID] = res
	return *res
}

// refunds returns the payments the shop owes back: payment id → reason.
func (s *lifeShop) refunds() map[string]string {
	owed := map[string]string{}
	for id, res := range s.ledger {
		if res.Result == "owed" {
			owed[id] = res.Reason
		}
	}
	return owed
}

// checkDeliveries reports a payment delivered other than n times, or
// whose deliveries differ in event id (want: eventID(payment id)) or body,
// and any request the shop refused that the payers should not have sent.
func (s *lifeShop) checkDeliveries(t *testing.T, n int, eventID func(string) string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.bad {
		t.Errorf("the shop refused: %s", b)
	}
	for id, ds := range s.deliveries {
		if len(ds) != n {
			t.Errorf("payment %s delivered %d times, want %d", id, len(ds), n)
		}
		for _, d := range ds {
			if d.eventID != eventID(id) || d.body != ds[0].body {
				t.Errorf("payment %s delivered as event %s with %s; first as %s with %s; want event %s every time",
					id, d.eventID, d.body, ds[0].eventID, ds[0].body, eventID(id))
			}
		}
	}
}

// runPay runs the load test and also returns its payments file.
func runPay(t *testing.T, url string, args ...string) (Result, []string, []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "payments")
	r, acks := runLoad(t, url, append(args, "-payments", path)...)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	if s := strings.TrimSpace(string(data)); s != "" {
		lines = strings.Split(s, "\n")
	}
	return r, acks, lines
}

// wantPayments returns the payments file's lines the plan makes of the
// acks, "order user payment_id kind" → last answer, with each payment id
// as id gives it; and how many payments of each kind.
func wantPayments(t *testing.T, acks []string, plan payPlan, id func(kind string, order int64) string) (map[string]string, map[string]int) {
	t.Helper()
	answers := map[string]string{inTime: "200 applied", late: "200 owed order_expired", mismatch: "200 owed amount_mismatch"}
	want, n := map[string]string{}, map[string]int{}
	for _, a := range acks {
		var order, sku, user int64
		fmt.Sscanf(a, "%d %d %d", &order, &sku, &user)
		kind := plan.kind(order)
		if kind == "" {
			continue
		}
		n[kind]++
		want[fmt.Sprintf("%d %d %s %s", order, user, id(kind, order), kind)] = answers[kind]
		if kind == inTime && plan.paidTwice(order) {
			n[duplicate]++
			want[fmt.Sprintf("%d %d %s %s", order, user, id(duplicate, order), duplicate)] = "200 owed duplicate_payment"
		}
	}
	return want, n
}

// checkLines reports the payments file's lines that are not those wanted.
func checkLines(t *testing.T, lines []string, want map[string]string) {
	t.Helper()
	if len(lines) != len(want) {
		t.Errorf("payments file %q, want %d payments", lines, len(want))
	}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) < 5 || want[strings.Join(f[:4], " ")] != strings.Join(f[4:], " ") {
			t.Errorf("payment %q, want one of %v", line, want)
		}
	}
}

// The winners the plan picks have their orders paid by signed events that
// the service's verifier accepts, each naming its order, the payment id of
// its order and what the order owes, delivered again with the same id and
// body when an answer is lost; the late ones come after pay_by, and the
// shop owes each of them back.
func TestPayments(t *testing.T) {
	plan := payPlan{frac: 0.5, lateFrac: 0.3}
	shop := newLifeShop(10, time.Minute)
	shop.failPay, shop.lateWindow, shop.latePlan = true, time.Second, plan
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, acks, lines := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "20", "-c", "20", "-retry",
		"-pay-frac", "0.5", "-late-frac", "0.3", "-late-by", "100ms", "-webhook-secret", testWebhookSecret)
	if len(acks) != 10 || r.Reserved != 10 || r.Payments == nil {
		t.Fatalf("acks %v, reserved %d, payments %v; want 10 reservations and payments", acks, r.Reserved, r.Payments)
	}
	want, n := wantPayments(t, acks, plan, func(_ string, order int64) string { return fmt.Sprintf("pay-%d", order) })
	if n[inTime] == 0 || n[late] == 0 {
		t.Fatalf("orders 1..10 give %v; the test wants payments in time and late", n)
	}
	checkLines(t, lines, want)
	p := r.Payments
	if p.Provider != "webhook" || p.InTime.Sent != n[inTime] || p.InTime.Paid != n[inTime] || p.Late.Sent != n[late] ||
		p.Late.Refused != n[late] || p.InTime.Unanswered+p.Late.Unanswered+p.InTime.Refused+p.Late.Paid != 0 {
		t.Errorf("payments %+v; want %d paid in time, %d late owed back", p, n[inTime], n[late])
	}
	// Three deliveries each, all with one payment id: a 503, one done whose
	// answer was lost, and the answer.
	payments := n[inTime] + n[late]
	if p.Retries != 2*payments || p.Statuses["503"] != payments || p.Statuses["error"] != payments ||
		p.Statuses["200 applied"] != n[inTime] || p.Statuses["200 owed order_expired"] != n[late] {
		t.Errorf("redeliveries %d, statuses %v; want each payment delivered three times", p.Retries, p.Statuses)
	}
	shop.checkDeliveries(t, 3, messageID)
	shop.mu.Lock()
	defer shop.mu.Unlock()
	if len(shop.deliveries) != payments || len(shop.refunds()) != n[late] {
		t.Errorf("the shop saw %d payments and owes %d refunds; want %d and %d", len(shop.deliveries), len(shop.refunds()),
			payments, n[late])
	}
	for id, ev := range shop.received {
		o := shop.orders[ev.Payment.OrderID]
		if o == nil || id != fmt.Sprintf("pay-%d", o.id) || ev.Payment.AmountCents != owes(o.id) || ev.Payment.Currency != "EUR" {
			t.Errorf("payment %s: %+v; want its order's id and what it owes", id, ev.Payment)
			continue
		}
		if reason := shop.refunds()[id]; (reason == "order_expired") != (plan.kind(o.id) == late) {
			t.Errorf("payment %s of order %d (%s): owed back %q", id, o.id, plan.kind(o.id), reason)
		}
	}
}

// The payments sent wrong on purpose are owed back, each for its reason: a
// second payment of an order paid in time, one unit short (its order stays
// reserved), and payments for orders that do not exist, whose ids are the
// run's own.
func TestWrongPayments(t *testing.T) {
	plan := payPlan{frac: 0.4, dupFrac: 0.2, mismatchFrac: 0.3}
	shop := newLifeShop(30, time.Minute)
	srv := httptest.NewServer(shop)
	defer srv.Close()
	args := []string{"-scenario", "hotsku", "-n", "40", "-c", "40", "-webhook-secret", testWebhookSecret, "-unknown-orders", "3"}
	r, acks, lines := runPay(t, srv.URL, append(args, "-pay-frac", "0.4", "-dup-frac", "0.2", "-mismatch-frac", "0.3")...)
	want, n := wantPayments(t, acks, plan, (&standardProvider{}).idOf)
	if n[inTime] == 0 || n[duplicate] == 0 || n[mismatch] == 0 {
		t.Fatalf("orders 1..30 give %v; the test wants payments of each kind", n)
	}
	// The payments for orders that do not exist: orders from unknownOrder
	// on, no buyer, payment ids of the run's own.
	unknownIDs, unknownOrders := map[string]bool{}, map[int64]bool{}
	var unknownLines []string
	for _, line := range lines {
		var order, user int64
		var id, kind string
		fmt.Sscanf(line, "%d %d %s %s", &order, &user, &id, &kind)
		if kind != unknown {
			continue
		}
		unknownLines = append(unknownLines, line)
		unknownIDs[id], unknownOrders[order] = true, true
		if order < unknownOrder || order >= unknownOrder+3 || user != 0 || !strings.HasPrefix(id, fmt.Sprintf("pay-%d-", order)) ||
			!strings.HasSuffix(line, " unknown 200 owed unknown_order") {
			t.Errorf("payment %q: want one for orders %d.., owed back, unknown_order", line, unknownOrder)
		}
	}
	if len(unknownLines) != 3 || len(unknownIDs) != 3 || len(unknownOrders) != 3 {
		t.Fatalf("unknown-order payments %q; want 3, each for an order and with an id of its own", unknownLines)
	}
	checkLines(t, slicesWithout(lines, unknownLines), want)
	p := r.Payments
	if p.InTime.Paid != n[inTime] || p.Duplicate.Sent != n[duplicate] || p.Duplicate.Refused != n[duplicate] ||
		p.Mismatch.Sent != n[mismatch] || p.Mismatch.Refused != n[mismatch] || p.Unknown.Sent != 3 || p.Unknown.Refused != 3 ||
		p.Duplicate.Final["200 owed duplicate_payment"] != n[duplicate] || p.Mismatch.Final["200 owed amount_mismatch"] != n[mismatch] ||
		p.Unknown.Final["200 owed unknown_order"] != 3 || p.DupFrac != 0.2 || p.MismatchFrac != 0.3 || p.UnknownOrders != 3 {
		t.Errorf("payments %+v; want %v", p, n)
	}
	shop.checkDeliveries(t, 1, messageID)

	// A second run's payments for orders that do not exist are payments of
	// their own, owed back again.
	_, _, again := runPay(t, srv.URL, append(args, "-n", "1", "-first-user", "100")...)
	shop.mu.Lock()
	defer shop.mu.Unlock()
	for _, line := range again {
		if f := strings.Fields(line); len(f) < 3 || unknownIDs[f[2]] {
			t.Errorf("second run's payment %q: want an id of its own", line)
		}
	}
	reasons := map[string]int{}
	for _, reason := range shop.refunds() {
		reasons[reason]++
	}
	if len(again) != 3 || reasons["unknown_order"] != 6 || reasons["duplicate_payment"] != n[duplicate] ||
		reasons["amount_mismatch"] != n[mismatch] || len(reasons) != 3 {
		t.Errorf("the shop owes %v after a second run with %q; want 6 unknown_order, %v", reasons, again, n)
	}
	for id, ev := range shop.received {
		o := shop.orders[ev.Payment.OrderID]
		switch {
		case o == nil && ev.Payment.OrderID >= unknownOrder && ev.Payment.AmountCents == unknownAmount:
		case o == nil:
			t.Errorf("payment %s for order %d", id, ev.Payment.OrderID)
		case plan.kind(o.id) == mismatch && (o.status != "reserved" || ev.Payment.AmountCents != owes(o.id)-1):
			t.Errorf("order %d, %s, paid %d short of %d: want reserved, one unit short", o.id, o.status, ev.Payment.AmountCents, owes(o.id))
		case plan.kind(o.id) == inTime && (o.status != "paid" || ev.Payment.AmountCents != owes(o.id) || o.paymentID != fmt.Sprintf("pay-%d", o.id)):
			t.Errorf("order %d, %s by %s, paid %d of %d by %s", o.id, o.status, o.paymentID, ev.Payment.AmountCents, owes(o.id), id)
		}
	}
}

// idOf is paymentID with no run: the ids of the payments for orders that
// exist.
func (p *standardProvider) idOf(kind string, order int64) string { return p.paymentID(kind, order, "") }

// slicesWithout returns the lines of all that are not in some.
func slicesWithout(all, some []string) []string {
	skip := map[string]bool{}
	for _, s := range some {
		skip[s] = true
	}
	var rest []string
	for _, s := range all {
		if !skip[s] {
			rest = append(rest, s)
		}
	}
	return rest
}

// With -stripe each payment of an order's own follows its checkout, made
// at once by its buyer (with its token), and is a payment_intent.succeeded
// event for the checkout's PaymentIntent that stripe-go's verifier accepts,
// with the currency in lower case; a late one is checked out in time and
// paid after pay_by; a second payment has a PaymentIntent of its own.
func TestStripePayments(t *testing.T) {
	plan := payPlan{frac: 0.5, lateFrac: 0.3, dupFrac: 0.2}
	shop := newStripeShop(10, time.Minute)
	shop.failPay, shop.lateWindow, shop.latePlan = true, time.Second, plan
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, acks, lines := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "20", "-c", "20", "-jwt-secret", testSecret,
		"-pay-frac", "0.5", "-late-frac", "0.3", "-dup-frac", "0.2", "-late-by", "100ms", "-stripe", "-webhook-secret", testStripeSecret)
	if len(acks) != 10 || r.Payments == nil {
		t.Fatalf("acks %v, payments %v; want 10 orders and payments", acks, r.Payments)
	}
	want, n := wantPayments(t, acks, plan, func(kind string, order int64) string {
		if kind == duplicate {
			return fmt.Sprintf("pi_dup_%d", order)
		}
		return paymentIntent(order)
	})
	if n[inTime] == 0 || n[late] == 0 || n[duplicate] == 0 {
		t.Fatalf("orders 1..10 give %v; the test wants payments in time, late and twice", n)
	}
	checkLines(t, lines, want)
	p := r.Payments
	checkouts := n[inTime] + n[late]
	if p.Provider != "stripe" || p.InTime.Paid != n[inTime] || p.Late.Refused != n[late] || p.Duplicate.Refused != n[duplicate] ||
		p.Checkouts["503"] != checkouts || p.Checkouts["200"] != checkouts {
		t.Errorf("payments %+v; want %v, each checkout answered 503 then 200", p, n)
	}
	shop.checkDeliveries(t, 3, func(id string) string { return "evt_" + id })
	shop.mu.Lock()
	defer shop.mu.Unlock()
	for order, times := range shop.checkouts {
		o := shop.orders[order]
		if len(times) != 2 || times[1].After(o.payBy) {
			t.Errorf("order %d (%s) checked out at %v, pay_by %v: want twice (a 503, then the PaymentIntent), in time",
				order, plan.kind(order), times, o.payBy)
		}
	}
	if len(shop.checkouts) != checkouts {
		t.Errorf("%d orders checked out, want %d", len(shop.checkouts), checkouts)
	}
	for id, ds := range shop.deliveries {
		ev := shop.received[id]
		var raw struct {
			Data struct {
				Object struct {
					Currency string `json:"currency"`
				} `json:"object"`
			} `json:"data"`
		}
		json.Unmarshal([]byte(ds[0].body), &raw)
		if raw.Data.Object.Currency != "eur" || ev.Payment.AmountCents != owes(ev.Payment.OrderID) || ev.Type != payments.TypePaymentIntentSucceeded {
			t.Errorf("payment %s: %s %+v; want what its order owes, in eur", id, ev.Type, ev.Payment)
		}
	}
}

// Each delivery of a payment is stamped with the time it is sent, and
// signed for it, with the same message id and body: a payment delivered
// again ten minutes after the first is not refused as stale.
func TestDeliveriesStampedAnew(t *testing.T) {
	v, err := payments.NewStandard(testWebhookSecret)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []http.Header
		errs []error
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.Header.Clone())
		sec, _ := strconv.ParseInt(r.Header.Get(standardwebhooks.HeaderWebhookTimestamp), 10, 64)
		// Verified at the time it says it was sent: the verifier refuses
		// a timestamp five minutes away from now.
		if _, err := v.Verify(r.Header, body, time.Unix(sec, 0)); err != nil {
			errs = append(errs, err)
		}
		if len(seen) < 3 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"result":"applied"}`)
	}))
	defer srv.Close()
	pr, err := newStandardProvider(testWebhookSecret)
	if err != nil {
		t.Fatal(err)
	}
	p := newPayer(t.Context(), payPlan{}, pr, "r", retryPolicy{attempts: 3, budget: time.Minute, timeout: 10 * time.Second})
	start := time.Unix(1_700_000_000, 0)
	calls := 0
	p.clock = func() time.Time { // ten minutes later each time
		calls++
		return start.Add(time.Duration(calls) * 10 * time.Minute)
	}
	a := p.pay(payment{base: srv.URL, order: 7, id: "pay-7", kind: inTime, amount: 1007, currency: "EUR", rt: http.DefaultTransport})
	if outcome(a) != "applied" || len(seen) != 3 || len(errs) > 0 {
		t.Fatalf("answer %q after %d deliveries, %v; want applied after 3, each verified", answerKey(a), len(seen), errs)
	}
	for i, h := range seen {
		at := start.Add(time.Duration(i+1) * 10 * time.Minute)
		if h.Get("webhook-id") != "msg_pay-7" || h.Get("webhook-timestamp") != strconv.FormatInt(at.Unix(), 10) ||
			(i > 0 && h.Get("webhook-signature") == seen[i-1].Get("webhook-signature")) {
			t.Errorf("delivery %d: %v; want msg_pay-7, stamped %d, signed anew", i+1, h, at.Unix())
		}
	}
}

// With several secrets (a rotation), every delivery carries a signature
// of each, so that a service that holds only one of them accepts it.
func TestSignsWithEverySecret(t *testing.T) {
	other := "whsec_ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="
	pr, err := newStandardProvider(testWebhookSecret + "," + other)
	if err != nil {
		t.Fatal(err)
	}
	pm := payment{order: 7, id: "pay-7", amount: 1007, currency: "EUR"}
	body, err := pr.event(pm)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	now := time.Now()
	if err := pr.sign(h, pm, body, now); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{testWebhookSecret, other} {
		v, err := payments.NewStandard(secret)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := v.Verify(h, body, now)
		if err != nil || ev.Payment == nil || *ev.Payment != (payments.Payment{OrderID: 7, PaymentID: "pay-7", AmountCents: 1007, Currency: "EUR"}) {
			t.Errorf("a service with one of the secrets: %+v, %v", ev.Payment, err)
		}
	}
	if n := len(strings.Fields(h.Get("webhook-signature"))); n != 2 {
		t.Errorf("signature %q: want 2", h.Get("webhook-signature"))
	}
}

// Payments need the provider's secret, from the flag or the service's
// setting; without one, or with one the service would refuse, the flags
// are a usage error.
func TestPaymentsNeedASecret(t *testing.T) {
	t.Setenv(envWebhookSecret, "")
	t.Setenv(envStripeSecret, "")
	for _, args := range [][]string{{"-pay-frac", "0.5"}, {"-late-frac", "0.1"}, {"-mismatch-frac", "0.1"}, {"-unknown-orders", "1"},
		{"-pay-frac", "0.5", "-webhook-secret", "whsec_c2hvcnQ="}, {"-pay-frac", "0.5", "-webhook-secret", "not-a-secret"},
		{"-pay-frac", "0.5", "-stripe", "-webhook-secret", "sk_test_x"}} {
		_, err := parse(args)
		if err == nil || !strings.Contains(err.Error(), "-webhook-secret") {
			t.Errorf("parse(%q): %v; want an error naming -webhook-secret", args, err)
		}
		var usage usageError
		if err := run(t.Context(), args, io.Discard, io.Discard); !errors.As(err, &usage) {
			t.Errorf("run(%q): %v; want a usage error (exit 2)", args, err)
		}
	}
	if o, err := parse(nil); err != nil || o.provider != nil {
		t.Errorf("no payments: %v, provider %v; want neither error nor provider", err, o.provider)
	}
	t.Setenv(envWebhookSecret, testWebhookSecret)
	if o, err := parse([]string{"-pay-frac", "0.5"}); err != nil || o.provider == nil || o.provider.name() != "webhook" {
		t.Errorf("with %s set: %v", envWebhookSecret, err)
	}
	if _, err := parse([]string{"-pay-frac", "0.5", "-stripe"}); err == nil {
		t.Errorf("-stripe took %s", envWebhookSecret)
	}
	t.Setenv(envStripeSecret, testStripeSecret)
	if o, err := parse([]string{"-pay-frac", "0.5", "-stripe"}); err != nil || o.provider == nil || o.provider.name() != "stripe" {
		t.Errorf("-stripe with %s set: %v", envStripeSecret, err)
	}
}

// A service without a payment step answers status paid: nothing to pay.
func TestNoPaymentWhenPaid(t *testing.T) {
	shop := newLifeShop(5, 0)
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, acks, lines := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "10", "-c", "10", "-pay-frac", "1", "-webhook-secret", testWebhookSecret)
	if len(acks) != 5 || r.Reserved != 0 || len(lines) != 0 || r.Payments.InTime.Sent != 0 || len(shop.deliveries) != 0 {
		t.Errorf("acks %d, reserved %d, payments %q %+v; want 5 paid orders and no payment", len(acks), r.Reserved, lines, r.Payments)
	}
}

// A second wave of new buyers (-first-user) waits for the units the first
// wave's unpaid reservations give back (-until), buys exactly those, under
// keys of its own for each purchase attempt, and pays them all.
func TestSecondWaveBuysReturnedUnits(t *testing.T) {
	// The first wave's reservations lapse not by the clock (their window
	// outlasts the test) but once each of the ten buyers hey sends at once
	// in the second wave (-c 10) has been told sold_out. Until the units
	// come back, none of those buyers is answered, and hey sends no other,
	// so that every unit is bought by a buyer buying again after a
	// sold_out, however long either wave takes on a loaded machine.
	shop := newLifeShop(5, time.Minute)
	srv := httptest.NewServer(shop)
	defer srv.Close()
	first, acks1, _ := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "10", "-c", "10", "-retry")
	if len(acks1) != 5 || first.Reserved != 5 {
		t.Fatalf("first wave: acks %v, reserved %d", acks1, first.Reserved)
	}
	shop.lapseWhenSoldOutTo(10)

	r, acks2, lines := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "20", "-c", "10", "-retry", "-first-user", "101",
		"-until", "5", "-until-for", "20s", "-pay-frac", "1", "-webhook-secret", testWebhookSecret)
	if len(acks2) != 5 || r.Acks != 5 || r.Until != 5 || r.Rebuys == 0 {
		t.Errorf("second wave: acks %v, until %d, rebuys %d; want the 5 returned units, bought after sold_outs", acks2, r.Until, r.Rebuys)
	}
	for _, a := range acks2 {
		var order, sku, user int64
		fmt.Sscanf(a, "%d %d %d", &order, &sku, &user)
		if order <= 5 || user < 101 {
			t.Errorf("second wave's ack %q: not a new order of a new buyer", a)
		}
	}
	if r.Payments.InTime.Paid != 5 || len(lines) != 5 || r.FinalStatuses["201"] != 5 || r.Buyers != 20 {
		t.Errorf("payments %+v, lines %q, final %v; want all 5 winners paid", r.Payments, lines, r.FinalStatuses)
	}
	shop.mu.Lock()
	defer shop.mu.Unlock()
	paid, expired := 0, 0
	for _, o := range shop.orders {
		switch {
		case o.status == "paid" && o.user >= 101:
			paid++
		case o.status == "expired" && o.user <= 10:
			expired++
		default:
			t.Errorf("order %d of user %d is %s", o.id, o.user, o.status)
		}
	}
	if paid != 5 || expired != 5 || shop.stock != 0 {
		t.Errorf("%d paid, %d expired, stock %d; want 5, 5, 0", paid, expired, shop.stock)
	}
	// Every purchase attempt of either wave under a key of its own: none
	// replays another's order.
	if len(shop.keysSent) != 10+20+r.Rebuys {
		t.Errorf("%d keys for 30 buyers and %d purchase attempts after a sold_out", len(shop.keysSent), r.Rebuys)
	}
	for k, n := range shop.keysSent {
		if k == "" || n != 1 {
			t.Errorf("key %q sent %d times", k, n)
		}
	}
}

// Two runs of the same buyers send different keys.
func TestKeysPerRun(t *testing.T) {
	a, _ := parse([]string{"-scenario", "hotsku", "-n", "1", "-retry"})
	b, _ := parse([]string{"-scenario", "hotsku", "-n", "1", "-retry"})
	ka, kb := requests(a)().Header.Get("Idempotency-Key"), requests(b)().Header.Get("Idempotency-Key")
	if ka == kb || !strings.HasPrefix(ka, "lt-1-1-") || len(ka) > 64 {
		t.Errorf("keys %q and %q: want lt-1-1-<run>, one per run", ka, kb)
	}
}

// Any run of consecutive order ids pays close to the share asked for, of
// each kind.
func TestPayShareSpread(t *testing.T) {
	plan := payPlan{frac: 0.5, lateFrac: 0.1, mismatchFrac: 0.2, dupFrac: 0.3}
	for _, first := range []int64{1, 1000, 123457} {
		n := map[string]int{}
		for id := first; id < first+1000; id++ {
			kind := plan.kind(id)
			n[kind]++
			if plan.paidTwice(id) {
				n[duplicate]++
				if kind != inTime {
					t.Errorf("order %d is paid twice, but %q", id, kind)
				}
			}
		}
		if n[inTime] < 495 || n[inTime] > 505 || n[late] < 95 || n[late] > 105 || n[mismatch] < 195 || n[mismatch] > 205 ||
			n[duplicate] < 295 || n[duplicate] > 305 {
			t.Errorf("ids %d..%d: %v; want about 500 in time, 100 late, 200 short, 300 paid twice", first, first+999, n)
		}
	}
	for _, bad := range [][]string{{"-pay-frac", "-0.1"}, {"-pay-frac", "0.7", "-late-frac", "0.4"}, {"-until", "-1"}, {"-until-for", "0"},
		{"-pay-frac", "0.1", "-dup-frac", "0.2"}, {"-pay-frac", "0.6", "-mismatch-frac", "0.5"}, {"-unknown-orders", "-1"}} {
		if _, err := parse(append(bad, "-webhook-secret", testWebhookSecret)); err == nil {
			t.Errorf("parse(%v) accepted", bad)
		}
	}
}

// A payment one unit short of what its order owes is one unit more when
// the order owes one: a payment of nothing is malformed.
func TestMismatchAmount(t *testing.T) {
	for _, tt := range []struct {
		kind       string
		owed, want int64
	}{{inTime, 1000, 1000}, {late, 1, 1}, {mismatch, 1000, 999}, {mismatch, 1, 2}} {
		if got := paid(tt.kind, tt.owed); got != tt.want {
			t.Errorf("paid(%s, %d) = %d, want %d", tt.kind, tt.owed, got, tt.want)
		}
	}
}

// The winners the plan picks for a cancel have their reservation
// cancelled by their buyer, with its user id and token, sent again after a
// 503; the ones it picks for payment are paid, and no order is both.
func TestCancels(t *testing.T) {
	plan := payPlan{frac: 0.5, cancelFrac: 0.3}
	shop := newLifeShop(10, time.Minute)
	shop.failPay = true
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, acks, _ := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "10", "-c", "10", "-jwt-secret", testSecret,
		"-pay-frac", "0.5", "-cancel-frac", "0.3", "-webhook-secret", testWebhookSecret)
	if len(acks) != 10 || r.Payments == nil || r.Cancels == nil {
		t.Fatalf("acks %v, payments %v, cancels %v; want 10 orders, payments and cancels", acks, r.Payments, r.Cancels)
	}
	_, n := wantPayments(t, acks, plan, func(string, int64) string { return "" })
	if n[inTime] == 0 || n[cancelled] == 0 {
		t.Fatalf("orders 1..10 give %v; the test wants payments and cancels", n)
	}
	c := r.Cancels
	if c.Sent != n[cancelled] || c.Cancelled != n[cancelled] || c.Refused+c.Unanswered != 0 ||
		c.Statuses["503"] != n[cancelled] || c.Statuses["200"] != n[cancelled] || c.Attempts.Deliveries != 2*n[cancelled] ||
		c.Attempts.Seconds <= 0 {
		t.Errorf("cancels %+v; want %d cancelled, each on its second attempt", c, n[cancelled])
	}
	if r.Payments.InTime.Paid != n[inTime] {
		t.Errorf("payments %+v; want %d paid", r.Payments.InTime, n[inTime])
	}
	shop.mu.Lock()
	defer shop.mu.Unlock()
	if len(shop.bad) > 0 {
		t.Errorf("requests the shop refuses: %q", shop.bad)
	}
	for id, o := range shop.orders {
		want := map[string]string{inTime: "paid", cancelled: "cancelled", "": "reserved"}[plan.kind(id)]
		if o.status != want {
			t.Errorf("order %d (%q): %s, want %s", id, plan.kind(id), o.status, want)
		}
	}
	if shop.stock != n[cancelled] {
		t.Errorf("stock %d after the cancels; want the %d units back", shop.stock, n[cancelled])
	}
}

// Cancels need no payment secret: a run may cancel without paying.
func TestCancelsWithoutPayments(t *testing.T) {
	shop := newLifeShop(4, time.Minute)
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, _, _ := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "4", "-c", "4", "-cancel-frac", "1")
	if r.Payments != nil || r.Cancels == nil || r.Cancels.Cancelled != 4 {
		t.Errorf("payments %v, cancels %+v; want no payments and 4 cancels", r.Payments, r.Cancels)
	}
}
