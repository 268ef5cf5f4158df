package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// ledger is payment id's row in the payments ledger: its order and
// outcome; "" when there is none.
func ledger(t *testing.T, db *testenv.DB, id string) (order int64, outcome string) {
	t.Helper()
	var row struct {
		OrderID int64
		Outcome string
	}
	if err := db.Gorm.Raw("SELECT order_id, outcome FROM payments WHERE payment_id = ?", id).Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	return row.OrderID, row.Outcome
}

// refundOf is the refund owed for payment id, failing unless there is
// exactly one.
func refundOf(t *testing.T, db *testenv.DB, id string) stock.Refund {
	t.Helper()
	var rs []stock.Refund
	if err := db.Gorm.Raw("SELECT * FROM refunds WHERE payment_id = ?", id).Scan(&rs).Error; err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("refunds of payment %s: %+v, want one", id, rs)
	}
	return rs[0]
}

// Each row of the table in payments.go: what a payment does to its order,
// to the ledger and to the refunds, delivered once and then again.
func TestPaymentOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
		svc, db, _ := open(options{})
		place := func(sku, user int64) stock.Order {
			t.Helper()
			o, err := svc.PlaceOrder(ctx, sku, user, "")
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		reserved, short, cancelled, lapsed := place(1, 1), place(1, 2), place(2, 1), place(2, 2)
		if _, err := svc.Cancel(ctx, 1, cancelled.ID); err != nil {
			t.Fatal(err)
		}
		lapse(t, db, lapsed.ID)
		wrongCurrency := place(3, 1)
		for _, c := range []struct {
			name    string
			p       stock.Payment
			outcome string
			reason  string
			status  string // the order's status after
			order   int64
		}{
			{name: "right amount", outcome: stock.OutcomeApplied, status: stock.StatusPaid, order: reserved.ID,
				p: stock.Payment{PaymentID: "p-ok", OrderID: reserved.ID, AmountCents: *reserved.AmountCents, Currency: "USD"}},
			{name: "too little", outcome: stock.OutcomeOwed, reason: stock.RefundAmountMismatch, status: stock.StatusReserved, order: short.ID,
				p: stock.Payment{PaymentID: "p-short", OrderID: short.ID, AmountCents: *short.AmountCents - 1, Currency: "USD"}},
			{name: "another currency", outcome: stock.OutcomeOwed, reason: stock.RefundAmountMismatch, status: stock.StatusReserved, order: wrongCurrency.ID,
				p: stock.Payment{PaymentID: "p-eur", OrderID: wrongCurrency.ID, AmountCents: *wrongCurrency.AmountCents, Currency: "EUR"}},
			{name: "cancelled", outcome: stock.OutcomeOwed, reason: stock.RefundOrderCancelled, status: stock.StatusCancelled, order: cancelled.ID,
				p: stock.Payment{PaymentID: "p-cancelled", OrderID: cancelled.ID, AmountCents: *cancelled.AmountCents, Currency: "USD"}},
			{name: "lapsed", outcome: stock.OutcomeOwed, reason: stock.RefundOrderExpired, status: stock.StatusReserved, order: lapsed.ID,
				p: stock.Payment{PaymentID: "p-late", OrderID: lapsed.ID, AmountCents: *lapsed.AmountCents, Currency: "USD"}},
			{name: "second payment", outcome: stock.OutcomeOwed, reason: stock.RefundDuplicatePayment, status: stock.StatusPaid, order: reserved.ID,
				p: stock.Payment{PaymentID: "p-twice", OrderID: reserved.ID, AmountCents: *reserved.AmountCents, Currency: "USD"}},
			{name: "no such order", outcome: stock.OutcomeOwed, reason: stock.RefundUnknownOrder,
				p: stock.Payment{PaymentID: "p-nowhere", OrderID: 1 << 40, AmountCents: 500, Currency: "USD"}},
		} {
			c.p.Provider, c.p.EventID = "webhook", "msg_"+c.p.PaymentID
			for _, again := range []bool{false, true} {
				r, err := svc.Receive(ctx, c.p)
				if err != nil || r.Outcome != c.outcome || r.Reason != c.reason || r.Again != again {
					t.Errorf("%s (again %v) = %+v, %v; want %s %s", c.name, again, r, err, c.outcome, c.reason)
				}
			}
			if order, outcome := ledger(t, db, c.p.PaymentID); order != c.p.OrderID || outcome != c.outcome {
				t.Errorf("%s: ledger has order %d, %q; want %d, %s", c.name, order, outcome, c.p.OrderID, c.outcome)
			}
			if c.outcome == stock.OutcomeOwed {
				r := refundOf(t, db, c.p.PaymentID)
				if r.Reason != c.reason || r.State != stock.RefundOwed || r.AmountCents == nil || *r.AmountCents != c.p.AmountCents ||
					r.Currency == nil || *r.Currency != c.p.Currency || stock.CheckRefundID(r.RefundID) != nil {
					t.Errorf("%s: refund %+v, want owed %s of %d %s with a ULID", c.name, r, c.reason, c.p.AmountCents, c.p.Currency)
				}
			}
			if c.status != "" {
				wantStatus(t, db, c.order, c.status)
			}
		}
		// The order whose payment was short is still payable, and paid by
		// the right amount.
		if r, err := pay(ctx, svc, short, "p-short-2"); err != nil || r.Outcome != stock.OutcomeApplied {
			t.Errorf("the right amount after a short one = %+v, %v; want applied", r, err)
		}
		verified(t, db)
	})
}

// A payment id on an order from before the ledger (a buyer's word) is a
// conflict when the provider reports it for another order: recorded,
// nothing else done. Reported for its own order, it is that order's
// payment.
func TestPaymentConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
		svc, db, _ := open(options{})
		old, err := svc.PlaceOrder(ctx, 1, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Gorm.Exec("UPDATE orders SET status = 'paid', payment_id = 'p-old', paid_at = UTC_TIMESTAMP(6) WHERE id = ?", old.ID).Error; err != nil {
			t.Fatal(err)
		}
		other, err := svc.PlaceOrder(ctx, 2, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		r, err := pay(ctx, svc, other, "p-old")
		if err != nil || r.Outcome != stock.OutcomeConflict {
			t.Errorf("a payment id already on another order = %+v, %v; want conflict", r, err)
		}
		wantStatus(t, db, other.ID, stock.StatusReserved)
		if _, outcome := ledger(t, db, "p-old"); outcome != stock.OutcomeConflict {
			t.Errorf("ledger outcome %q, want conflict", outcome)
		}
		var refunds int64
		if err := db.Gorm.Raw("SELECT COUNT(*) FROM refunds").Scan(&refunds).Error; err != nil || refunds != 0 {
			t.Errorf("refunds = %d, %v; want none for a conflict", refunds, err)
		}
	})
}

// The same payment delivered to three replicas at once is one payment: one
// applies it, the others find it in the ledger.
func TestPaymentDeliveredToThreeReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, pool := range []string{"orders pool", "repeatable read, snapshot isolation"} {
		svc, db, l, orders := openPool(t, pool, options{})
		second := options{}
		second.PayWindow, second.Fencing = payWindow, true
		replicas := []*stock.Service{svc, newService(orders, l, second), newService(orders, l, second)}
		if err := stock.NewCatalog(db.Gorm).Seed(ctx, 3, 10); err != nil {
			t.Fatal(err)
		}
		for round := range 10 {
			o, err := svc.PlaceOrder(ctx, 1+int64(round%3), int64(100+round), "")
			if err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("p-%d", round)
			var wg sync.WaitGroup
			receipts := make([]stock.Receipt, len(replicas))
			errs := make([]error, len(replicas))
			for i, r := range replicas {
				wg.Add(1)
				go func() { defer wg.Done(); receipts[i], errs[i] = pay(ctx, r, o, id) }()
			}
			wg.Wait()
			firsts := 0
			for i := range replicas {
				if errs[i] != nil || receipts[i].Outcome != stock.OutcomeApplied {
					t.Errorf("round %d replica %d = %+v, %v; want applied", round, i, receipts[i], errs[i])
				}
				if !receipts[i].Again {
					firsts++
				}
			}
			if firsts != 1 {
				t.Errorf("round %d: %d deliveries applied the payment, want 1", round, firsts)
			}
			wantStatus(t, db, o.ID, stock.StatusPaid)
		}
		verified(t, db)
	}
}

// A payment and a cancellation of the same reservation, at once, many
// times: exactly one wins each time, neither is refused as busy (they take
// the order's locks in one order: no deadlock), the unit is back exactly
// when the cancellation won, and a payment that lost is owed back.
func TestPaymentRacesCancellation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc, db, _ := openOrdersPool(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 100); err != nil {
		t.Fatal(err)
	}
	for round := range 40 {
		user := int64(1000 + round)
		o, err := svc.PlaceOrder(ctx, 1, user, "")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var r stock.Receipt
		var payErr, cancelErr error
		wg.Add(2)
		go func() { defer wg.Done(); r, payErr = pay(ctx, svc, o, fmt.Sprintf("race-%d", round)) }()
		go func() { defer wg.Done(); _, cancelErr = svc.Cancel(ctx, user, o.ID) }()
		wg.Wait()
		if payErr != nil {
			t.Fatalf("round %d: payment: %v", round, payErr)
		}
		switch r.Outcome {
		case stock.OutcomeApplied:
			if !errors.Is(cancelErr, stock.ErrOrderPaid) {
				t.Fatalf("round %d: paid, and the cancellation: %v", round, cancelErr)
			}
			wantStatus(t, db, o.ID, stock.StatusPaid)
		case stock.OutcomeOwed:
			if cancelErr != nil || r.Reason != stock.RefundOrderCancelled {
				t.Fatalf("round %d: owed %s, and the cancellation: %v", round, r.Reason, cancelErr)
			}
			wantStatus(t, db, o.ID, stock.StatusCancelled)
		default:
			t.Fatalf("round %d: %+v", round, r)
		}
		if t.Failed() {
			return
		}
	}
	verified(t, db)
}

// openOrdersPool is a Service on the orders pool, with a payment window.
func openOrdersPool(t *testing.T) (*stock.Service, *testenv.DB, *lock.Redis) {
	t.Helper()
	svc, db, l, _ := openPool(t, "orders pool", options{})
	return svc, db, l
}

// Bad payments are refused and change nothing.
func TestPaymentInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc, db, _ := openOrdersPool(t)
	good := stock.Payment{Provider: "webhook", PaymentID: "p-1", OrderID: 1, AmountCents: 100, Currency: "USD", EventID: "msg_1"}
	for name, change := range map[string]func(*stock.Payment){
		"order 0":        func(p *stock.Payment) { p.OrderID = 0 },
		"negative order": func(p *stock.Payment) { p.OrderID = -1 },
		"amount 0":       func(p *stock.Payment) { p.AmountCents = 0 },
		"lower currency": func(p *stock.Payment) { p.Currency = "usd" },
		"currency US":    func(p *stock.Payment) { p.Currency = "US" },
		"payment id":     func(p *stock.Payment) { p.PaymentID = "a b" },
		"no event id":    func(p *stock.Payment) { p.EventID = "" },
		"no provider":    func(p *stock.Payment) { p.Provider = "" },
	} {
		p := good
		change(&p)
		if _, err := svc.Receive(ctx, p); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	var n int64
	if err := db.Gorm.Raw("SELECT (SELECT COUNT(*) FROM payments) + (SELECT COUNT(*) FROM refunds)").Scan(&n).Error; err != nil || n != 0 {
		t.Errorf("rows written by bad payments: %d, %v", n, err)
	}
}
