package stock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"shop/internal/lock"
	"shop/internal/outbox"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// outboxRow is one event as the outbox has it.
type outboxRow struct {
	EventID  string
	Type     string
	Stream   string
	Sequence int64
	Data     string
}

// outboxRows are the outbox's events, in its order.
func outboxRows(t *testing.T, db *testenv.DB) []outboxRow {
	t.Helper()
	var rows []outboxRow
	if err := db.Gorm.Raw("SELECT event_id, type, stream, sequence, data FROM outbox ORDER BY id").Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	return rows
}

// eventsOn turns events on in db, as shop migrate --events does.
func eventsOn(t *testing.T, db *testenv.DB) {
	t.Helper()
	if _, err := outbox.NewStore(db.Gorm).Enable(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// streamOf is the events of stream, as "type:sequence", in the outbox's
// order.
func streamOf(rows []outboxRow, stream string) string {
	var s []string
	for _, r := range rows {
		if r.Stream == stream {
			s = append(s, fmt.Sprintf("%s:%d", r.Type, r.Sequence))
		}
	}
	return strings.Join(s, " ")
}

// dataOf decodes an event's data.
func dataOf(t *testing.T, r outboxRow) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(r.Data), &m); err != nil {
		t.Fatalf("event %s: data %q: %v", r.EventID, r.Data, err)
	}
	return m
}

// Every change of the lifecycle writes its event, in its transaction, on
// its order's stream, numbered from 1: placed, paid, cancelled, expired,
// a late payment owed back and its settlement; a payment for no order is a
// stream of its refund's own; a payment id that pays another order is a
// conflict on the order it named. Each event's data is the row as the
// change left it.
func TestEventsOfTheLifecycle(t *testing.T) {
	pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
		ctx := context.Background()
		svc, db, _ := open(options{})
		// An order paid by a payment id from before the ledger and amounts,
		// and before events.
		old, err := svc.PlaceOrder(ctx, 2, 99, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Gorm.Exec("UPDATE orders SET status = 'paid', payment_id = 'p-old', paid_at = UTC_TIMESTAMP(6), amount_cents = NULL, currency = NULL WHERE id = ?", old.ID).Error; err != nil {
			t.Fatal(err)
		}
		eventsOn(t, db)
		var ids [4]int64
		var orders [4]stock.Order
		for i := range ids {
			o, err := svc.PlaceOrder(ctx, int64(1+i%3), int64(10+i), "")
			if err != nil {
				t.Fatal(err)
			}
			ids[i], orders[i] = o.ID, o
		}
		if _, err := pay(ctx, svc, orders[0], "pay-0"); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Cancel(ctx, 11, ids[1]); err != nil {
			t.Fatal(err)
		}
		lapse(t, db, ids[2])
		if _, err := svc.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		late, err := pay(ctx, svc, orders[2], "pay-late")
		if err != nil || late.RefundID == "" {
			t.Fatalf("late payment: %+v, %v", late, err)
		}
		if _, err := svc.Settle(ctx, stock.Settlement{Provider: "webhook", RefundID: late.RefundID, ProviderRefundID: "re_1"}); err != nil {
			t.Fatal(err)
		}
		unknown, err := svc.Receive(ctx, stock.Payment{Provider: "webhook", PaymentID: "pay-nobody", OrderID: 999999,
			AmountCents: 100, Currency: "USD", EventID: "msg_nobody"})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := pay(ctx, svc, orders[3], "p-old"); err != nil || r.Outcome != stock.OutcomeConflict {
			t.Fatalf("a payment id on an order from before the ledger: %+v, %v; want a conflict", r, err)
		}

		rows := outboxRows(t, db)
		order := func(i int) string { return fmt.Sprintf("order:%d", ids[i]) }
		for stream, want := range map[string]string{
			order(0):                     "order.reserved:1 order.paid:2",
			order(1):                     "order.reserved:1 order.cancelled:2",
			order(2):                     "order.reserved:1 order.expired:2 refund.owed:3 refund.refunded:4",
			order(3):                     "order.reserved:1 payment.conflict:2",
			"refund:" + unknown.RefundID: "refund.owed:1",
		} {
			if got := streamOf(rows, stream); got != want {
				t.Errorf("stream %s: %q, want %q", stream, got, want)
			}
		}
		if len(rows) != 11 {
			t.Errorf("%d events, want 11: %+v", len(rows), rows)
		}
		seen := map[string]bool{}
		for _, r := range rows {
			if seen[r.EventID] {
				t.Errorf("event id %s twice", r.EventID)
			}
			seen[r.EventID] = true
			d := dataOf(t, r)
			if d["sequence"] != float64(r.Sequence) {
				t.Errorf("%s %s: data sequence %v, want %d", r.Stream, r.Type, d["sequence"], r.Sequence)
			}
			switch r.Type {
			case stock.EventOrderPaid:
				if d["status"] != "paid" || d["payment_id"] != "pay-0" || d["paid_at"] == nil {
					t.Errorf("order.paid data %v", d)
				}
			case stock.EventOrderExpired, stock.EventOrderCancelled:
				if d["status"] != strings.TrimPrefix(r.Type, "order.") || d["returned_at"] == nil {
					t.Errorf("%s data %v", r.Type, d)
				}
			case stock.EventOrderReserved:
				if d["status"] != "reserved" || d["pay_by"] == nil || d["amount_cents"] == nil {
					t.Errorf("order.reserved data %v", d)
				}
			case stock.EventRefundRefunded:
				if d["state"] != "refunded" || d["provider_refund_id"] != "re_1" || d["refund_id"] != late.RefundID {
					t.Errorf("refund.refunded data %v", d)
				}
			case stock.EventPaymentConflict:
				if d["payment_id"] != "p-old" || d["paid_order_id"] != float64(old.ID) || d["order_id"] != float64(ids[3]) {
					t.Errorf("payment.conflict data %v", d)
				}
			}
		}
		verified(t, db)
	})
}

// An order placed paid emits order.reserved, then order.paid, both in its
// batch's transaction; with events off nothing is written, and the orders
// count no events.
func TestEventsOfOrdersPlacedPaid(t *testing.T) {
	ctx := context.Background()
	svc, db, _, _ := openPool(t, "orders pool", options{Settings: stock.Settings{PayWindow: -1}})
	first, err := svc.PlaceOrder(ctx, 1, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	if rows := outboxRows(t, db); len(rows) != 0 || first.EventSeq != 0 {
		t.Fatalf("events off: %d events, order's event_seq %d; want none", len(rows), first.EventSeq)
	}
	eventsOn(t, db)
	o, err := svc.PlaceOrder(ctx, 2, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	if o.Status != stock.StatusPaid || o.EventSeq != 2 {
		t.Fatalf("placed %+v, want paid with 2 events", o)
	}
	rows := outboxRows(t, db)
	if got := streamOf(rows, fmt.Sprintf("order:%d", o.ID)); got != "order.reserved:1 order.paid:2" || len(rows) != 2 {
		t.Errorf("events %+v, want order.reserved:1 order.paid:2 of order %d alone", rows, o.ID)
	}
	verified(t, db)
}

// A Service that has not seen events on writes them as soon as they are
// on, without being told: it asks the database in each change. An order
// placed before has a stream that begins at the first change after.
func TestEventsTurnedOnUnderARunningService(t *testing.T) {
	ctx := context.Background()
	svc, db, _, _ := openPool(t, "orders pool", options{})
	before, err := svc.PlaceOrder(ctx, 1, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	eventsOn(t, db)
	after, err := svc.PlaceOrder(ctx, 2, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Cancel(ctx, 1, before.ID); err != nil {
		t.Fatal(err)
	}
	rows := outboxRows(t, db)
	if got := streamOf(rows, fmt.Sprintf("order:%d", before.ID)); got != "order.cancelled:1" {
		t.Errorf("order placed before events: %q, want order.cancelled:1", got)
	}
	if got := streamOf(rows, fmt.Sprintf("order:%d", after.ID)); got != "order.reserved:1" {
		t.Errorf("order placed after events: %q, want order.reserved:1", got)
	}
	verified(t, db)
}

// An event is written with its change or not at all: a cancellation whose
// transaction fails before its COMMIT leaves the order reserved, its unit
// taken, and no event.
func TestEventRolledBackWithItsChange(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc, db, _, _ := openPool(t, "orders pool", options{Hooks: stock.Hooks{BeforeReturn: func(context.Context, int64) { cancel() }}})
	eventsOn(t, db)
	o, err := svc.PlaceOrder(ctx, 1, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Cancel(ctx, 1, o.ID); err == nil || errors.Is(err, stock.ErrCancelOutcomeUnknown) {
		t.Fatalf("cancel with its context ended before COMMIT: %v, want a failure that changed nothing", err)
	}
	wantStatus(t, db, o.ID, stock.StatusReserved)
	if got := streamOf(outboxRows(t, db), fmt.Sprintf("order:%d", o.ID)); got != "order.reserved:1" {
		t.Errorf("events %q, want only order.reserved:1", got)
	}
	if n := stockOf(t, db, 1); n != 1 {
		t.Errorf("stock %d, want 1: the unit still the order's", n)
	}
	verified(t, db)
}
