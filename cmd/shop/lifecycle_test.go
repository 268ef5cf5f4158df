package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/eventsink"
	"shop/internal/testenv"
)

// A sale on three replicas with a payment window: the winners reserve
// every unit at the product's price, and half are paid by the provider's
// signed events (each delivered to all three replicas at once), and every
// replica learns the product sold out. The other reservations lapse; the
// replicas' sweeps give their units back, once, and announce it, so that
// the replicas that remembered the product sold out sell it again to new
// buyers. A payment after the window is owed back, in MySQL; verify
// --acks holds throughout.
//
// Events are on: two replicas relay them (SHOP_EVENTS_URL), the third
// writes them and does not. Every change reaches the receiver, in order
// per order, and nothing is left pending or dead.
func TestLifecycleOnThreeReplicas(t *testing.T) {
	t.Parallel()
	// The first wave, 13 orders one after the other, and the payments must
	// all come within the pay window: a window of 3 s was outlasted on a
	// loaded machine, and the first reservations lapsed and sold again to
	// the buyers who were to find the product sold out.
	const units, payWindow = 10, 10 * time.Second
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_PAY_WINDOW": payWindow.String(), "SHOP_SWEEP_INTERVAL": "200ms"})
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", fmt.Sprint(units)); code != 0 {
		t.Fatal(out)
	}
	sinkCtx, stopSink := context.WithCancel(context.Background())
	t.Cleanup(stopSink)
	sink, err := eventsink.Start(sinkCtx, eventsink.Options{Secret: testEventsSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	relaying := 0
	replicas := startReplicas(t, 3, func() map[string]string {
		m := vars()
		if relaying++; relaying <= 2 {
			m["SHOP_EVENTS_URL"], m["SHOP_EVENTS_SECRET"] = sink.URL(), testEventsSecret
		} else {
			m["SHOP_ADMIN_TOKEN"] = "lifecycle-test-admin-token-0123456789"
		}
		return m
	})
	var acks []string
	type reservation struct {
		order
		user  int
		payBy time.Time
	}
	var won []reservation
	began := time.Now()
	for user := 1; user <= units+3; user++ {
		o := replicas[user%3].public.order(1, user)
		switch {
		case o.err == nil && o.status == 201 && o.body.Status == "reserved":
			if o.body.PayBy == nil {
				t.Fatalf("order of user %d: %v; want a pay_by", user, o)
			}
			payBy, err := time.Parse(time.RFC3339Nano, *o.body.PayBy)
			if err != nil {
				t.Fatalf("pay_by %v: %v", *o.body.PayBy, err)
			}
			if o.body.Amount == nil || *o.body.Amount != 137 || o.body.Currency == nil || *o.body.Currency != "USD" {
				t.Fatalf("order of user %d: %v; want it to owe 137 USD, the product's price", user, o)
			}
			won = append(won, reservation{o.body, user, payBy})
			acks = append(acks, fmt.Sprint(o.body.ID))
		case o.status == 409 && o.code() == "sold_out" && user > units:
		default:
			t.Fatalf("order of user %d: %v", user, o)
		}
	}
	if len(won) != units {
		t.Fatalf("%d reservations, want %d (the orders took %s, the pay window is %s)", len(won), units, time.Since(began), payWindow)
	}
	for _, r := range won[:units/2] {
		payment := fmt.Sprintf("pay-%d", r.ID)
		// The same event to the three replicas at once: one applies it,
		// the others find it applied; all answer 200.
		answers := make(chan reply[event], len(replicas))
		for _, rep := range replicas {
			go func() { answers <- rep.public.pays(r.order, payment) }()
		}
		first := 0
		for range replicas {
			a := <-answers
			if a.expect(200) != nil || a.body.Result != "applied" {
				t.Fatalf("payment of order %d: %v", r.ID, a)
			}
			if !a.body.Again {
				first++
			}
		}
		if first != 1 {
			t.Errorf("payment of order %d applied by %d deliveries, want 1", r.ID, first)
		}
		if o := replicas[0].public.getOrder(r.ID, r.user); o.expect(200) != nil || o.body.Status != "paid" || o.body.PaymentID == nil || *o.body.PaymentID != payment {
			t.Fatalf("order %d after its payment: %v", r.ID, o)
		}
	}
	// Someone else's order is not found, nor is one that does not exist.
	if o := replicas[0].public.getOrder(won[0].ID, 999); o.status != 404 {
		t.Errorf("another buyer's order: %v, want 404", o)
	}

	// The unpaid half lapses; the sweeps give the units back and every
	// replica sells them again.
	late := won[units-1]
	waitFor(t, time.Until(late.payBy)+12*time.Second, "the unpaid reservations expired", func() error {
		if o := replicas[2].public.getOrder(late.ID, late.user); o.err != nil || o.body.Status != "expired" {
			return fmt.Errorf("the last one: %v", o)
		}
		return nil
	})
	if o := replicas[0].public.pays(late.order, fmt.Sprintf("late-%d", late.ID)); o.expect(200) != nil || o.body.Result != "owed" || o.body.Reason != "order_expired" {
		t.Errorf("late payment: %v, want 200 owed order_expired", o)
	}
	var refunds int
	if err := db.Gorm.Raw("SELECT COUNT(*) FROM refunds WHERE order_id = ? AND reason = 'order_expired' AND amount_cents = 137 AND state = 'owed'",
		late.ID).Scan(&refunds).Error; err != nil || refunds != 1 {
		t.Errorf("refunds owed for the late payment: %d, %v; want 1", refunds, err)
	}
	for i := range units / 2 {
		user := 100 + i
		o := replicas[i%3].public.order(1, user)
		if o.expect(201) != nil {
			t.Fatalf("second wave, user %d via replica %d: %v, want 201", user, i%3, o)
		}
		acks = append(acks, fmt.Sprint(o.body.ID))
	}
	if o := replicas[1].public.order(1, 200); o.status != 409 || o.code() != "sold_out" {
		t.Errorf("after the second wave: %v, want 409 sold_out", o)
	}
	var expired, returned int
	if err := db.Gorm.Raw("SELECT COUNT(*), COUNT(returned_at) FROM orders WHERE status = 'expired'").Row().Scan(&expired, &returned); err != nil {
		t.Fatal(err)
	}
	if expired != units/2 || returned != expired {
		t.Errorf("expired orders %d (returned %d), want %d, each returned", expired, returned, units/2)
	}
	if code, out := shop(t, db, "verify", "--acks", acksFile(t, acks)); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
	wantEventsDelivered(t, db, sink, replicas[2])
}

// testEventsSecret signs the events the tests' replicas send.
const testEventsSecret = "whsec_dGhlIHRlc3RzJyBldmVudHMgcmVsYXkgc2VjcmV0IQ=="

// wantEventsDelivered waits until the outbox has no pending event, then
// fails unless the receiver acknowledged each of the outbox's events, in
// order per stream, none sent twice at once, and the operators' listing
// (through admin's replica) shows none pending or dead.
func wantEventsDelivered(t *testing.T, db *testenv.DB, sink *eventsink.Sink, admin *replica) {
	t.Helper()
	var events int
	waitFor(t, 30*time.Second, "every event delivered", func() error {
		var undelivered int
		if err := db.Gorm.Raw("SELECT COUNT(*), COALESCE(SUM(state <> 'delivered'), 0) FROM outbox").Row().Scan(&events, &undelivered); err != nil {
			return err
		}
		if undelivered > 0 {
			return fmt.Errorf("%d of %d events not delivered", undelivered, events)
		}
		return nil
	})
	s := sink.Summary()
	if events == 0 || s.Acknowledged != events || s.OutOfOrder != 0 || s.Gaps != 0 || s.Concurrent != 0 {
		t.Errorf("outbox %d events; receiver: %+v; want each acknowledged, none out of order, no gap, none concurrent", events, s)
	}
	for _, state := range []string{"pending", "dead"} {
		page := adminCall[struct {
			Events []struct{} `json:"events"`
		}](admin.admin, "GET", "/api/v1/admin/events?state="+state, "")
		if page.expect(200) != nil || len(page.body.Events) != 0 {
			t.Errorf("events %s: %v, want none", state, page)
		}
	}
}

// The provider's events are paid for by the order path, not the public
// gate: under a flood of anonymous stock reads, which the gate answers 503
// when it is full, every payment of a reservation is answered 200 and
// applied, in its window.
func TestPaymentsUnderAReadFlood(t *testing.T) {
	t.Parallel()
	const reservations, readers = 20, 48
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_PAY_WINDOW": "20s"})
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", fmt.Sprint(reservations)); code != 0 {
		t.Fatal(out)
	}
	r := startReplica(t, vars())
	var won []order
	for user := 1; user <= reservations; user++ {
		o := r.public.order(1, user)
		if o.expect(201) != nil {
			t.Fatalf("order of user %d: %v", user, o)
		}
		won = append(won, o.body)
	}
	ctx, stop := context.WithCancel(context.Background())
	var reads, refused atomic.Int64
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				s := r.public.send("GET", "/api/v1/products/1/stock", "", withContext(ctx))
				reads.Add(1)
				if s.status == 503 {
					refused.Add(1)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // the flood is on
	for _, o := range won {
		began := time.Now()
		e := r.public.pays(o, fmt.Sprintf("flood-%d", o.ID))
		if e.expect(200) != nil || e.body.Result != "applied" {
			t.Errorf("payment of order %d under the flood: %v (after %s)", o.ID, e, time.Since(began))
		}
	}
	stop()
	wg.Wait()
	t.Logf("%d stock reads during the payments, %d answered 503", reads.Load(), refused.Load())
	var paid int64
	if err := db.Gorm.Raw("SELECT COUNT(*) FROM orders WHERE status = 'paid' AND payment_id LIKE 'flood-%'").Scan(&paid).Error; err != nil || paid != reservations {
		t.Errorf("paid orders: %d, %v; want %d", paid, err, reservations)
	}
	if code, out := shop(t, db, "verify"); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}
