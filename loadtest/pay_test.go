package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// lifeShop sells the units of one SKU as reservations that must be paid
// within window (none: paid when placed), as the service does: a lapsed
// reservation expires and its unit returns to the sale at the next request;
// a payment after pay_by is refused with 409 order_expired and owed back;
// one active order per user; Idempotency-Keys replay the order with its
// current status. With failPay, each payment's first delivery is a 503
// (Retry-After: 0, nothing done) and its second is done but its answer
// lost (the connection closed). With lapseAfter set (lapseWhenSoldOutTo),
// the reservations lapse when a number of buyers have been told sold_out,
// not by the clock.
type lifeShop struct {
	window  time.Duration
	failPay bool

	mu         sync.Mutex
	stock      int
	next       int64
	orders     map[int64]*lifeOrder
	keys       map[string]int64 // user and key → order
	active     map[int64]int64  // user → active order
	keysSent   map[string]int   // Idempotency-Key → orders sent with it
	deliveries map[string]int   // order and payment id → deliveries
	refunds    map[string]string
	lapseAfter int            // above zero: the sold_out users that make the reservations lapse
	soldOutTo  map[int64]bool // users told sold_out since lapseWhenSoldOutTo
}

type lifeOrder struct {
	id, user  int64
	status    string
	payBy     time.Time
	paymentID string
}

func newLifeShop(units int, window time.Duration) *lifeShop {
	return &lifeShop{window: window, stock: units, orders: map[int64]*lifeOrder{}, keys: map[string]int64{},
		active: map[int64]int64{}, keysSent: map[string]int{}, deliveries: map[string]int{}, refunds: map[string]string{}}
}

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
		"status": o.status, "pay_by": payBy})
}

func (s *lifeShop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		User      int64  `json:"user_id"`
		PaymentID string `json:"payment_id"`
	}
	json.NewDecoder(r.Body).Decode(&req)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	if r.URL.Path == "/api/v1/orders" {
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
		if s.window > 0 {
			o.status, o.payBy = "reserved", time.Now().Add(s.window)
		}
		s.orders[o.id], s.active[o.user] = o, o.id
		if key != "" {
			s.keys[fmt.Sprint(req.User, key)] = o.id
		}
		s.order(w, http.StatusCreated, o)
		return
	}
	id, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/orders/"), "/pay"), 10, 64)
	delivery := fmt.Sprint(id, " ", req.PaymentID)
	s.deliveries[delivery]++
	if s.failPay && s.deliveries[delivery] == 1 {
		w.Header().Set("Retry-After", "0")
		s.fail(w, http.StatusServiceUnavailable, "busy")
		return
	}
	o := s.orders[id]
	switch {
	case o == nil || o.user != req.User:
		s.fail(w, http.StatusNotFound, "not_found")
		return
	case o.status == "expired":
		s.refunds[delivery] = "order_expired"
		if !s.lost(w, delivery) {
			s.fail(w, http.StatusConflict, "order_expired")
		}
		return
	case o.status == "paid" && o.paymentID != req.PaymentID:
		s.fail(w, http.StatusConflict, "payment_mismatch")
		return
	}
	o.status, o.paymentID = "paid", req.PaymentID
	if !s.lost(w, delivery) {
		s.order(w, http.StatusOK, o)
	}
}

// lost closes the connection of a payment's second delivery, done, without
// an answer, when failPay is set, and tells whether it did.
func (s *lifeShop) lost(w http.ResponseWriter, delivery string) bool {
	if !s.failPay || s.deliveries[delivery] != 2 {
		return false
	}
	if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
		conn.Close()
	}
	return true
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

// The winners the plan picks pay, each with the payment id of its order,
// delivered again with the same id when an answer is lost; the late ones
// pay after pay_by and are refused, and the shop owes each of them back.
func TestPayments(t *testing.T) {
	shop := newLifeShop(10, time.Second)
	shop.failPay = true
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, acks, lines := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "20", "-c", "20", "-retry",
		"-pay-frac", "0.5", "-late-frac", "0.3", "-late-by", "100ms")
	if len(acks) != 10 || r.Reserved != 10 || r.Payments == nil {
		t.Fatalf("acks %v, reserved %d, payments %v; want 10 reservations and payments", acks, r.Reserved, r.Payments)
	}
	plan := payPlan{frac: 0.5, lateFrac: 0.3}
	want := map[string]string{} // "order user payment_id when" → last answer
	var inTimeN, lateN int
	for _, a := range acks {
		var order, sku, user int64
		fmt.Sscanf(a, "%d %d %d", &order, &sku, &user)
		switch when := plan.when(order); when {
		case inTime:
			inTimeN++
			want[fmt.Sprintf("%d %d pay-%d %s", order, user, order, when)] = "200"
		case late:
			lateN++
			want[fmt.Sprintf("%d %d pay-%d %s", order, user, order, when)] = "409 order_expired"
		}
	}
	if inTimeN == 0 || lateN == 0 {
		t.Fatalf("orders 1..10 give %d payments in time and %d late; the test wants both", inTimeN, lateN)
	}
	if len(lines) != len(want) {
		t.Errorf("payments file %q, want %d payments", lines, len(want))
	}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) < 5 || want[strings.Join(f[:4], " ")] != strings.Join(f[4:], " ") {
			t.Errorf("payment %q, want one of %v", line, want)
		}
	}
	p := r.Payments
	if p.InTime.Sent != inTimeN || p.InTime.Paid != inTimeN || p.Late.Sent != lateN || p.Late.Refused != lateN ||
		p.InTime.Unanswered+p.Late.Unanswered+p.InTime.Refused+p.Late.Paid != 0 {
		t.Errorf("payments %+v; want %d paid in time, %d refused late", p, inTimeN, lateN)
	}
	// Three deliveries each, all with one payment id: a 503, one done whose
	// answer was lost, and the answer.
	if p.Retries != 2*(inTimeN+lateN) || p.Statuses["503"] != inTimeN+lateN || p.Statuses["error"] != inTimeN+lateN {
		t.Errorf("redeliveries %d, statuses %v; want each payment delivered three times", p.Retries, p.Statuses)
	}
	shop.mu.Lock()
	defer shop.mu.Unlock()
	for delivery, n := range shop.deliveries {
		if n != 3 {
			t.Errorf("payment %s delivered %d times, want 3", delivery, n)
		}
	}
	if len(shop.deliveries) != inTimeN+lateN || len(shop.refunds) != lateN {
		t.Errorf("the shop saw %d payments and owes %d refunds; want %d and %d", len(shop.deliveries), len(shop.refunds),
			inTimeN+lateN, lateN)
	}
	for line, answer := range want {
		f := strings.Fields(line)
		delivery := f[0] + " " + f[2]
		if got := shop.refunds[delivery] != ""; got != (answer != "200") {
			t.Errorf("payment %s: owed back %v", line, got)
		}
	}
}

// A service without a payment step answers status paid: nothing to pay.
func TestNoPaymentWhenPaid(t *testing.T) {
	shop := newLifeShop(5, 0)
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, acks, lines := runPay(t, srv.URL, "-scenario", "hotsku", "-n", "10", "-c", "10", "-pay-frac", "1")
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
		"-until", "5", "-until-for", "20s", "-pay-frac", "1")
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

// Any run of consecutive order ids pays close to the share asked for.
func TestPayShareSpread(t *testing.T) {
	plan := payPlan{frac: 0.5, lateFrac: 0.1}
	for _, first := range []int64{1, 1000, 123457} {
		n := map[string]int{}
		for id := first; id < first+1000; id++ {
			n[plan.when(id)]++
		}
		if n[inTime] < 495 || n[inTime] > 505 || n[late] < 95 || n[late] > 105 {
			t.Errorf("ids %d..%d: %v; want about 500 in time, 100 late", first, first+999, n)
		}
	}
	for _, bad := range [][]string{{"-pay-frac", "-0.1"}, {"-pay-frac", "0.7", "-late-frac", "0.4"}, {"-until", "-1"}, {"-until-for", "0"}} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%v) accepted", bad)
		}
	}
}
