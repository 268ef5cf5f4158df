package verify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/outbox"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// The event checks that Verify makes once events are on.
const (
	checkEventWritten  = "every change since events were turned on has its event, in the outbox or removed by retention"
	checkEventSequence = "every stream's events in the outbox run without a gap up to its event_seq"
)

// eventSale is a sale made by a stock.Service, events turned on after its
// first order; its orders by what became of them, each writing its events
// on the stream order:<id>:
//
//	before:    placed before events, paid after: order.paid:1
//	paid:      order.reserved:1 order.paid:2
//	cancelled: order.reserved:1 order.cancelled:2
//	expired:   order.reserved:1 order.expired:2 refund.owed:3 refund.refunded:4 (a late payment, owed back and settled)
//	reserved:  order.reserved:1 payment.conflict:2 (paid by the payment id of paid, from another provider)
//
// and a payment for no order, owed back on the stream refund:<refund_id>:
// refund.owed:1. Twelve events, all pending.
type eventSale struct {
	db                                         *testenv.DB
	before, paid, cancelled, expired, reserved int64
}

func newEventSale(t *testing.T) eventSale {
	t.Helper()
	ctx := context.Background()
	db := testenv.MySQL(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 3, 3); err != nil {
		t.Fatal(err)
	}
	svc := stock.NewService(stock.Deps{DB: db.Gorm, Locks: lock.NewLocal(time.Second)}, stock.Settings{PayWindow: time.Minute}, stock.Hooks{})
	place := func(sku, user int64) stock.Order {
		return must[stock.Order](t)(svc.PlaceOrder(ctx, sku, user, ""))
	}
	pay := func(o stock.Order, provider, id string) stock.Receipt {
		return must[stock.Receipt](t)(svc.Receive(ctx, stock.Payment{Provider: provider, PaymentID: id, OrderID: o.ID,
			AmountCents: *o.AmountCents, Currency: *o.Currency, EventID: "msg_" + id}))
	}
	before := place(1, 1)
	if _, err := outbox.NewStore(db.Gorm).Enable(ctx); err != nil {
		t.Fatal(err)
	}
	pay(before, "webhook", "pay-before")
	paid := place(1, 2)
	pay(paid, "webhook", "pay-paid")
	cancelled := place(2, 3)
	if _, err := svc.Cancel(ctx, 3, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	expired := place(2, 4)
	if err := db.Gorm.Exec("UPDATE orders SET pay_by = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?", expired.ID).Error; err != nil {
		t.Fatal(err)
	}
	if n, err := svc.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v; want the lapsed order expired", n, err)
	}
	late := pay(expired, "webhook", "pay-late")
	if _, err := svc.Settle(ctx, stock.Settlement{Provider: "webhook", RefundID: late.RefundID, ProviderRefundID: "re_1"}); err != nil {
		t.Fatal(err)
	}
	reserved := place(3, 5)
	if r := pay(reserved, "stripe", "pay-paid"); r.Outcome != stock.OutcomeConflict {
		t.Fatalf("a payment id of another order: %+v, want a conflict", r)
	}
	if _, err := svc.Receive(ctx, stock.Payment{Provider: "webhook", PaymentID: "pay-nobody", OrderID: 999999,
		AmountCents: 100, Currency: "USD", EventID: "msg_nobody"}); err != nil {
		t.Fatal(err)
	}
	return eventSale{db: db, before: before.ID, paid: paid.ID, cancelled: cancelled.ID, expired: expired.ID, reserved: reserved.ID}
}

// must returns what a call returned, failing t if it failed.
func must[T any](t *testing.T) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// eventsLine matches the report's information line on events.
var eventsLine = regexp.MustCompile(`(?m)^info  events on since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: (.*)$`)

// eventFigures are the figures of events in r's JSON.
func eventFigures(t *testing.T, r verify.Report) map[string]any {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Events map[string]any `json:"events"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m.Events
}

// A sale whose every change since events were turned on wrote its event
// holds, and still does once retention has deleted the oldest delivered
// events of some streams (all of one): their rows count them.
func TestVerifyEventsHoldThroughRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newEventSale(t)
	r := saleAfter(t, s.db, nil)
	expectFailing(t, r, nil)
	for _, name := range []string{checkEventWritten, checkEventSequence} {
		checkOf(t, r, name)
	}
	m := eventsLine.FindStringSubmatch(r.String())
	if m == nil || !regexp.MustCompile(`^pending 12 \(the oldest occurred \d+\.\ds ago\), delivered 0, dead 0$`).MatchString(m[1]) {
		t.Errorf("the events line %q, want 12 pending:\n%s", m, r)
	}
	if e := eventFigures(t, r); e["on"] != true || e["on_since"] == nil || e["pending"] != 12.0 || e["delivered"] != 0.0 || e["dead"] != 0.0 {
		t.Errorf("JSON events %v, want on, 12 pending", e)
	}

	// Delivered, and the oldest of three streams a week and a day old.
	err := s.db.Gorm.Exec(`UPDATE outbox SET state = 'delivered', delivered_at = UTC_TIMESTAMP(6),
		occurred_at = IF(stream IN (?, ?) OR stream = ? AND sequence <= 2, occurred_at - INTERVAL 8 DAY, occurred_at)`,
		fmt.Sprint("order:", s.paid), fmt.Sprint("order:", s.before), fmt.Sprint("order:", s.expired)).Error
	if err != nil {
		t.Fatal(err)
	}
	if n, err := outbox.NewStore(s.db.Gorm).Prune(ctx, 7*24*time.Hour, 1000); err != nil || n != 5 {
		t.Fatalf("prune: %d, %v; want 5 events deleted", n, err)
	}
	r = saleAfter(t, s.db, nil)
	expectFailing(t, r, nil)
	if m := eventsLine.FindStringSubmatch(r.String()); m == nil || m[1] != "pending 0, delivered 7, dead 0" {
		t.Errorf("the events line %q, want 7 delivered:\n%s", m, r)
	}
}

// A change without its event, or an event gone that retention did not
// take, breaks the sale; each is counted by one check.
func TestVerifyEventsViolations(t *testing.T) {
	t.Parallel()
	// The SQL and the examples name the sale's orders as {expired},
	// {reserved} and {cancelled}.
	tests := []violation{
		{"an event deleted from the middle of its stream",
			[]string{"DELETE FROM outbox WHERE stream = 'order:{expired}' AND sequence = 2"},
			checkEventSequence, []string{"order:{expired} event_seq 4, the outbox has sequences 1,3,4"}},
		{"an order cancelled by hand, without its event", []string{
			"UPDATE orders SET status = 'cancelled', returned_at = UTC_TIMESTAMP(6) WHERE id = {reserved}",
			"UPDATE products SET stock = stock + 1 WHERE id = 3",
		}, checkEventWritten, []string{"order:{reserved} lacks order.cancelled: event_seq 2, 2 in the outbox"}},
		{"an event counted on its order, and not written", []string{
			"UPDATE orders SET status = 'cancelled', returned_at = UTC_TIMESTAMP(6), event_seq = event_seq + 1 WHERE id = {reserved}",
			"UPDATE products SET stock = stock + 1 WHERE id = 3",
		}, checkEventSequence, []string{"order:{reserved} event_seq 3, the outbox has sequences 1,2"}},
		{"an order placed by hand", []string{
			"INSERT INTO orders (id, sku_id, user_id, status, pay_by) VALUES (1000, 3, 50, 'reserved', UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE)",
			"UPDATE products SET stock = stock - 1 WHERE id = 3",
		}, checkEventWritten, []string{"order:1000 lacks order.reserved: event_seq 0, 0 in the outbox"}},
		// Retention took both events of the cancelled order's stream,
		// which its event_seq 2 allows; a third change without its event
		// is beyond what it counts.
		{"events removed by retention, then a change without its event", []string{
			"UPDATE outbox SET state = 'delivered', occurred_at = occurred_at - INTERVAL 8 DAY WHERE stream = 'order:{cancelled}'",
			"DELETE FROM outbox WHERE state = 'delivered' AND occurred_at < UTC_TIMESTAMP(6) - INTERVAL 7 DAY",
			`INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at)
				VALUES ('rx', {cancelled}, 'pay-x', 3, 2, 'order_cancelled', UTC_TIMESTAMP(6))`,
		}, checkEventWritten, []string{"order:{cancelled} lacks order.cancelled, order.reserved, refund.owed: event_seq 2, 0 in the outbox"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newEventSale(t)
			ids := strings.NewReplacer("{expired}", fmt.Sprint(s.expired), "{reserved}", fmt.Sprint(s.reserved),
				"{cancelled}", fmt.Sprint(s.cancelled))
			sql, ex := make([]string, len(tt.sql)), make([]string, len(tt.examples))
			for i, q := range tt.sql {
				sql[i] = ids.Replace(q)
			}
			for i, e := range tt.examples {
				ex[i] = ids.Replace(e)
			}
			r := saleAfter(t, s.db, sql)
			expectFailing(t, r, []verify.Check{{Name: tt.check, Violations: int64(len(ex)), Examples: ex}})
		})
	}
}

// With events off there is nothing to check: the report says so, and
// makes no check of events.
func TestVerifyEventsOff(t *testing.T) {
	t.Parallel()
	r := saleAfter(t, soldTwo(t), nil)
	expectFailing(t, r, nil)
	expectLines(t, r, "info  events off: none is written, none is checked\n")
	if hasCheck(r, checkEventWritten) || hasCheck(r, checkEventSequence) || strings.Contains(r.String(), "event_seq") {
		t.Errorf("events off, and checked:\n%s", r)
	}
	if e := eventFigures(t, r); e["on"] != false {
		t.Errorf("JSON events %v, want off", e)
	}
}
