package main

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"shop/internal/payments"
	"shop/internal/stock"
	"shop/internal/stripepay"
	"shop/internal/striperec"
	"shop/internal/testenv"
)

// A Stripe row's figures come from MySQL and from the log a real recording
// proxy in front of stripe-mock writes: the row waits until its refunds
// are refunded, then counts each refund's Refund API calls and keys (a
// call repeated after a kill, under the same key, counts twice with one
// key), the PaymentIntents created (a checkout's repeated call, one key)
// against the orders with one, and the cancellations against the lapsed
// orders with one; calls logged before the row began are not its.
func TestStripeFigures(t *testing.T) {
	t.Parallel() // each on a database of its own
	ctx := context.Background()
	m := newMoneyDB(t, false)
	state := t.TempDir()
	if err := os.Mkdir(filepath.Join(state, "stripe"), 0o755); err != nil {
		t.Fatal(err)
	}
	rec, err := striperec.New(testenv.StripeMock(t), filepath.Join(state, "stripe", "calls.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(rec)
	t.Cleanup(func() { proxy.Close(); rec.Close() })
	client, err := stripepay.New(stripepay.Config{SecretKey: "sk_test_123", APIBase: proxy.URL})
	if err != nil {
		t.Fatal(err)
	}
	intent := func(order int64, key string) string {
		t.Helper()
		in, err := client.CreateIntent(ctx, order, 1500, "USD", key)
		if err != nil {
			t.Fatal(err)
		}
		return in.ID
	}
	refund := func(id, intent string) {
		t.Helper()
		if _, err := client.Refund(ctx, stripepay.RefundRequest{RefundID: id, PaymentIntent: intent, AmountCents: 1500}); err != nil {
			t.Fatal(err)
		}
	}

	intent(99, "a-row-before") // not this row's
	var since time.Time
	if err := m.db.QueryRowContext(ctx, "SELECT NOW(6)").Scan(&since); err != nil {
		t.Fatal(err)
	}
	s := &stripeResult{From: time.Now()}
	paid, late, lapsed := m.order(t, 1, "paid", 1500), m.order(t, 2, "expired", 1500), m.order(t, 3, "expired", 1500)
	intents := map[int64]string{paid: intent(paid, "key-paid"), late: intent(late, "key-late")}
	intent(late, "key-late") // the checkout's call again, after a kill
	for id, pi := range intents {
		if _, err := m.db.Exec("UPDATE orders SET payment_intent = ? WHERE id = ?", pi, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.CancelIntent(ctx, intents[late]); err != nil {
		t.Fatal(err)
	}
	killed := m.pay(t, late, intents[late], 1500)
	other := m.pay(t, lapsed, "pi_unpaid_checkout", 1500)
	refund(killed.RefundID, intents[late])
	refund(killed.RefundID, intents[late]) // again, under the same key, once the lease ran out
	refund(other.RefundID, intents[late])
	settle := func(id string) {
		t.Helper()
		if _, err := m.svc.Settle(ctx, stock.Settlement{Provider: payments.ProviderStripe, RefundID: id, ProviderRefundID: "re_" + id}); err != nil {
			t.Fatal(err)
		}
	}
	settle(killed.RefundID)
	go func() {
		time.Sleep(300 * time.Millisecond)
		m.svc.Settle(ctx, stock.Settlement{Provider: payments.ProviderStripe, RefundID: other.RefundID, ProviderRefundID: "re_other"})
	}()

	if err := stripeFigures(ctx, options{state: state}, m.db, since, time.Minute, s, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := []refundCalls{
		{RefundID: killed.RefundID, State: "refunded", Calls: 2, Keys: []string{killed.RefundID}},
		{RefundID: other.RefundID, State: "refunded", Calls: 1, Keys: []string{other.RefundID}},
	}
	slices.SortFunc(want, func(a, b refundCalls) int { return strings.Compare(a.RefundID, b.RefundID) })
	if !slices.EqualFunc(s.Refunds, want, func(a, b refundCalls) bool { return a.String() == b.String() }) {
		t.Errorf("refunds %v, want %v", s.Refunds, want)
	}
	if s.Waited < 300*time.Millisecond || s.Waited > 30*time.Second {
		t.Errorf("waited %s for a refund settled 300ms in", s.Waited)
	}
	if s.Created != 3 || s.CreateKeys != 2 || s.CheckedOut != 2 || s.Cancelled != 1 || s.Lapsed != 1 || s.Unnamed != 0 {
		t.Errorf("PaymentIntents created %d under %d keys for %d orders, %d cancelled of %d lapsed, %d unnamed refund calls; "+
			"want 3 under 2 for 2, 1 of 1, none", s.Created, s.CreateKeys, s.CheckedOut, s.Cancelled, s.Lapsed, s.Unnamed)
	}
	s.Killed = killed.RefundID
	if p := s.problems(true); len(p) > 0 {
		t.Errorf("problems %q, want none", p)
	}
	s.Killed = other.RefundID
	if p := s.problems(true); !slices.Equal(p, []string{fmt.Sprintf("the refund in flight when killed, %s, called for 1 times, want 2 or more", other.RefundID)}) {
		t.Errorf("problems %q, want the refund in flight called for once", p)
	}

	// A refund still owed when the bound runs out: the row says so.
	owed := m.pay(t, m.order(t, 4, "expired", 1500), "pi_owed", 1500)
	s = &stripeResult{From: time.Now()}
	if err := stripeFigures(ctx, options{state: state}, m.db, since, 200*time.Millisecond, s, io.Discard); err != nil {
		t.Fatal(err)
	}
	if s.Waited < 200*time.Millisecond || s.refunded() != 2 || len(s.Refunds) != 3 || s.Created != 0 {
		t.Errorf("waited %s, %d of %d refunded, %d PaymentIntents created since; want the bound, 2 of 3, none",
			s.Waited, s.refunded(), len(s.Refunds), s.Created)
	}
	if p := s.problems(false); len(p) == 0 || !strings.HasPrefix(p[0], "1 of 3 refunds not refunded 200ms after the sale (first: "+owed.RefundID+" owed: 0 calls") {
		t.Errorf("problems %q, want the owed refund first", p)
	}
}

// What a Stripe row's money must do: every refund refunded, each called
// for under exactly one key, its refund_id; no call without a refund id;
// a PaymentIntent key per order checked out; in the refund-kill row, the
// refund in flight called for again. Any miss fails the row.
func TestStripeOutcome(t *testing.T) {
	stripe, kill := row{Life: lifeStripe, Payments: payStripe, MustHold: true},
		row{Life: lifeRefundKill, Payments: payStripe, RefundStall: refundStall, Retry: true, MustHold: true}
	life := func(r row, change func(*lifeResult)) result {
		return fakeLife(r, func(res *result) { change(res.Life) })
	}
	for _, tt := range []struct {
		name    string
		res     result
		outcome string
	}{
		{"held", life(stripe, func(*lifeResult) {}), "holds, as it must"},
		{"killed, held", life(kill, func(*lifeResult) {}), "holds, as it must"},
		{"a refund left owed", life(stripe, func(l *lifeResult) { l.Stripe.Refunds[3].State = "owed" }),
			"FAILED: 1 of 100 refunds not refunded 1m0s after the sale (first: " + fakeRefundID(3) + " owed: 1 calls, keys [\"" + fakeRefundID(3) + "\"])"},
		{"a refund failed", life(kill, func(l *lifeResult) { l.Stripe.Refunds[0].State = "failed" }),
			"FAILED: 1 of 100 refunds not refunded 2m30s after the sale (first: " + fakeRefundID(0) + " failed: 1 calls, keys [\"" + fakeRefundID(0) + "\"])"},
		{"a refund under two keys", life(stripe, func(l *lifeResult) {
			l.Stripe.Refunds[1].Calls, l.Stripe.Refunds[1].Keys = 2, append(l.Stripe.Refunds[1].Keys, "other")
		}), "FAILED: 1 refunds not called for under exactly one Idempotency-Key, their refund_id (first: " + fakeRefundID(1) +
			" refunded: 2 calls, keys [\"" + fakeRefundID(1) + "\" \"other\"])"},
		{"a refund under another key", life(stripe, func(l *lifeResult) { l.Stripe.Refunds[2].Keys = []string{"other"} }),
			"FAILED: 1 refunds not called for under exactly one Idempotency-Key, their refund_id (first: " + fakeRefundID(2) +
				" refunded: 1 calls, keys [\"other\"])"},
		{"a refund never called for", life(stripe, func(l *lifeResult) { l.Stripe.Refunds[4].Calls, l.Stripe.Refunds[4].Keys = 0, nil }),
			"FAILED: 1 refunds not called for under exactly one Idempotency-Key, their refund_id (first: " + fakeRefundID(4) +
				" refunded: 0 calls, keys [])"},
		{"a call without a refund id", life(stripe, func(l *lifeResult) { l.Stripe.Unnamed = 1 }),
			"FAILED: 1 Refund API calls without a metadata.refund_id"},
		{"a PaymentIntent key short", life(stripe, func(l *lifeResult) { l.Stripe.CreateKeys = 599 }),
			"FAILED: PaymentIntents created under 599 Idempotency-Keys for 600 orders with one"},
		{"the refund in flight called once", life(kill, func(l *lifeResult) { l.Stripe.Refunds[7].Calls = 1 }),
			"FAILED: the refund in flight when killed, " + fakeRefundID(7) + ", called for 1 times, want 2 or more"},
		{"the refund in flight not the row's", life(kill, func(l *lifeResult) { l.Stripe.Killed = "01JOTHER" }),
			"FAILED: the refund in flight when killed, 01JOTHER, is not one of the row's"},
		{"the failpoint never fired", life(kill, func(l *lifeResult) { l.Killed, l.Stripe.Killed = false, "" }),
			"FAILED: no refund reached the failpoint"},
		{"no figures of Stripe's API", life(stripe, func(l *lifeResult) { l.Stripe = nil }), "FAILED: no figures of Stripe's API"},
	} {
		if got := tt.res.outcome(); got != tt.outcome {
			t.Errorf("%s: outcome %q, want %q", tt.name, got, tt.outcome)
		}
		if got, want := tt.res.failed(), tt.outcome != "holds, as it must"; got != want {
			t.Errorf("%s: failed %v, want %v", tt.name, got, want)
		}
	}
}

// The calls of a Stripe row are those logged from its start; a Refund API
// call without metadata.refund_id is counted apart.
func TestStripeCount(t *testing.T) {
	from := time.Now()
	post := func(path, key, refund string, at time.Duration) striperec.Call {
		return striperec.Call{Time: from.Add(at), Method: "POST", Path: path, IdempotencyKey: key, RefundID: refund, Status: 200}
	}
	s := &stripeResult{From: from, Refunds: []refundCalls{{RefundID: "r1", State: "refunded"}, {RefundID: "r2", State: "owed"}}}
	s.count([]striperec.Call{
		post("/v1/refunds", "r1", "r1", -time.Second), // a row before's
		post("/v1/payment_intents", "k0", "", -time.Second),
		post("/v1/refunds", "r1", "r1", 0),
		post("/v1/refunds", "r1", "r1", time.Second),
		post("/v1/refunds", "x", "", time.Second),
		post("/v1/payment_intents", "k1", "", time.Second),
		post("/v1/payment_intents", "k1", "", time.Second),
		post("/v1/payment_intents/pi_1/cancel", "c1", "", time.Second),
		{Time: from.Add(time.Second), Method: "GET", Path: "/v1/payment_intents/pi_1/cancel"},
		{Time: from.Add(time.Second), Method: "GET", Path: "/v1/refunds", Query: "payment_intent=pi_1"},
	})
	want := []refundCalls{{RefundID: "r1", State: "refunded", Calls: 2, Keys: []string{"r1"}}, {RefundID: "r2", State: "owed"}}
	if !slices.EqualFunc(s.Refunds, want, func(a, b refundCalls) bool { return a.String() == b.String() }) {
		t.Errorf("refunds %v, want %v", s.Refunds, want)
	}
	if s.Unnamed != 1 || s.Created != 2 || s.CreateKeys != 1 || s.Cancelled != 1 || s.maxCalls() != 2 || s.refunded() != 1 {
		t.Errorf("%d unnamed, %d created under %d keys, %d cancelled, at most %d calls, %d refunded; want 1, 2 under 1, 1, 2, 1",
			s.Unnamed, s.Created, s.CreateKeys, s.Cancelled, s.maxCalls(), s.refunded())
	}
	if got := s.keysPerRefund(); got != "0–1" {
		t.Errorf("keys per refund %q, want 0–1", got)
	}
	path := filepath.Join(t.TempDir(), "row.refunds")
	if err := s.writeRefunds(path); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(path); err != nil || string(data) != "r1 refunded 2 r1\nr2 owed 0 \n" {
		t.Errorf("refunds file %q, %v", data, err)
	}
}

// The demo finds the replica whose refunder stopped at the failpoint by
// its line in that replica's shop.log, past what the log held when the row
// began, and reads the refund in flight from it.
func TestAwaitRefundKillLine(t *testing.T) {
	state := t.TempDir()
	line := "failpoint shopRefundKill: the refunder stops for 30s between the Refund API call for refund 01JABC and its record"
	logs := []string{"earlier row\n" + line + "\n", "starting\n", "starting\nserving\n"}
	for i, text := range logs {
		dir := filepath.Join(state, fmt.Sprintf("replica%d", i+1))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "shop.log"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	offsets := replicaLogSizes(state, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if i, got := awaitLine(ctx, state, offsets, refundKillLine); i != 0 || got != "" {
		t.Errorf("before the row's line: replica %d, %q; want none (replica 1's is a row before's)", i, got)
	}
	f, err := os.OpenFile(filepath.Join(state, "replica3", "shop.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, strings.Replace(line, "01JABC", "01JXYZ", 1))
	f.Close()
	i, got := awaitLine(context.Background(), state, offsets, refundKillLine)
	if i != 3 || inFlightRefund(got) != "01JXYZ" {
		t.Errorf("replica %d, %q: refund %q; want replica 3, refund 01JXYZ", i, got, inFlightRefund(got))
	}
	if id := inFlightRefund("failpoint shopRefundKill: something else"); id != "" {
		t.Errorf("a line without a refund: %q", id)
	}
}
