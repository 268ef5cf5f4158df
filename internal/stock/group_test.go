package stock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// The tests below place the batches of several SKUs in one group: a plug,
// an order of a product of its own, holds its transaction until the
// batches the test sends wait for the next group, which then holds them
// all.

// plug is a BeforeWrite hook for a Service of groups (Settings.Group). The
// transaction of product sku holds until n batches wait for a group, and
// then runs then (when set) once it has ended; other products' writes run
// other (when set).
type plug struct {
	svc     *stock.Service
	sku     int64
	n       int
	entered chan struct{}
	then    func()
	other   func(ctx context.Context, sku int64) func()
}

func newPlug(sku int64, n int) *plug { return &plug{sku: sku, n: n, entered: make(chan struct{})} }

func (p *plug) hook(ctx context.Context, sku int64) func() {
	if sku != p.sku {
		if p.other != nil {
			return p.other(ctx, sku)
		}
		return nil
	}
	close(p.entered)
	for p.svc.Stats().Grouping < p.n && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	return p.then
}

// A batch waiting for a group is answered ErrBusy when its buyer's deadline
// comes, while the group in flight still runs: the wait for a group is
// bounded by the deadline as the transaction is. Nothing of it is written,
// and the group in flight commits.
func TestGroupWaitBoundedByBuyersDeadline(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	release := make(chan struct{})
	pl := newPlug(2, 0)
	svc, _, _ := lined(t, db, 2, 5, options{Settings: stock.Settings{Group: 2, Fencing: true}, Hooks: stock.Hooks{BeforeWrite: func(ctx context.Context, sku int64) func() {
		pl.hook(ctx, sku) // enters, and waits for nothing
		<-release
		return nil
	}}}, lock.RedisOptions{})
	pl.svc = svc
	plugged := place(ctx, svc, 2, 1000, "")
	<-pl.entered
	hurried, cancel := context.WithTimeout(ctx, stock.MinTimeLeft+500*time.Millisecond)
	defer cancel()
	waiting := place(hurried, svc, 1, 100, "")
	waitGrouping(t, svc, 1)
	var r result
	select {
	case r = <-waiting:
	case <-time.After(10 * time.Second):
		t.Error("the order whose deadline came is not answered while the group in flight runs")
		close(release)
		r = <-waiting
		release = nil
	}
	if release != nil {
		close(release)
	}
	if !errors.Is(r.err, stock.ErrBusy) {
		t.Errorf("order whose deadline came while it waited for a group: %+v, %v; want ErrBusy", r.order, r.err)
	}
	placed(t, db, <-plugged, 2, 1000, "the group in flight")
	if st := svc.Stats(); st.Grouping != 0 || st.Batches != 1 {
		t.Errorf("stats %+v: want nothing waiting for a group, and the one transaction in flight", st)
	}
	if p := product(t, db, 1); p.Stock != 5 {
		t.Errorf("product 1's stock %d, want 5: its buyer's deadline came before its group", p.Stock)
	}
}

// group places the plug's order, and then each order of users (one per
// product, products 1, 2, …) once the one before waits for the group; it
// returns the plug's answer and theirs.
func (p *plug) group(t *testing.T, ctx context.Context, users []int64, keys []string) (<-chan result, []<-chan result) {
	t.Helper()
	plugged := place(context.Background(), p.svc, p.sku, 1000, "")
	select {
	case <-p.entered:
	case r := <-plugged:
		t.Fatalf("the plug's order ended before its write: %v", r.err)
	}
	var answers []<-chan result
	for i, user := range users {
		key := ""
		if keys != nil {
			key = keys[i]
		}
		answers = append(answers, place(ctx, p.svc, int64(i+1), user, key))
		waitGrouping(t, p.svc, i+1)
	}
	return plugged, answers
}

// placed fails unless r is an order of user for sku that MySQL holds; who
// names it.
func placed(t *testing.T, db *testenv.DB, r result, sku, user int64, who string) {
	t.Helper()
	if r.err != nil {
		t.Errorf("%s: %v; want it placed", who, r.err)
		return
	}
	checkOrder(t, db, r.order, sku, user)
}

// waitGrouping waits until n batches wait for a group.
func waitGrouping(t *testing.T, svc *stock.Service, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); svc.Stats().Grouping < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d batches wait for a group, want %d", svc.Stats().Grouping, n)
		}
	}
}

// A holder stopped past its lease inside a group: its product's write is
// refused for its stale fence after another replica sold the product under
// a newer token, and the other product of the group is sold in the same
// COMMIT all the same. The group is one transaction; MySQL holds the orders
// of the plug, the other replica and the other product, and nothing of the
// stale holder.
func TestGroupStaleFenceRefusesOnlyItsProduct(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 3, 2); err != nil {
		t.Fatal(err)
	}
	// A's leases run out after 200ms: its watchdog is stopped.
	lockA := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 200 * time.Millisecond, Wait: 5 * time.Second,
		After: func(time.Duration) <-chan time.Time { return nil }})
	pl := newPlug(3, 2)
	read, resume := make(chan struct{}), make(chan struct{})
	pl.other = func(_ context.Context, sku int64) func() {
		if sku == 1 {
			close(read)
			<-resume
		}
		return nil
	}
	a := newService(db.Open(t), lockA, options{Settings: stock.Settings{Group: 2, Fencing: true}, Hooks: stock.Hooks{BeforeWrite: pl.hook}})
	pl.svc = a
	lockB := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 5 * time.Second, Wait: 5 * time.Second})
	b := newService(db.Open(t), lockB, options{Settings: stock.Settings{Fencing: true}})

	plugged, answers := pl.group(t, ctx, []int64{100, 200}, nil)
	<-read
	// A's lease of product 1 runs out while A is stopped; B's Obtain waits
	// for it, and B sells a unit of product 1 under a newer token.
	ob, err := b.PlaceOrder(ctx, 1, 500, "")
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	checkOrder(t, db, ob, 1, 500)
	close(resume)

	if r := <-plugged; r.err != nil {
		t.Errorf("the plug's order: %v", r.err)
	}
	if r := <-answers[0]; !errors.Is(r.err, stock.ErrBusy) || !errors.Is(r.err, stock.ErrStaleFence) {
		t.Errorf("stale holder's order of product 1: %+v, %v; want ErrBusy and ErrStaleFence", r.order, r.err)
	}
	placed(t, db, <-answers[1], 2, 200, "product 2's order in the stale holder's group")
	if st := a.Stats(); st.Batches != 2 {
		t.Errorf("stats %+v: want two transactions, the plug's and the group's", st)
	}
	if r := report(t, db); !r.OK() || r.Orders != 3 || r.Stock != 3 {
		t.Errorf("want the orders of the plug, B and product 2 only:\n%s", r)
	}
	if p := product(t, db, 1); p.Stock != 1 || p.Fence != ob.Fence {
		t.Errorf("product 1: stock %d, fence %d; want 1 and B's %d", p.Stock, p.Fence, ob.Fence)
	}
}

// A group's transaction ends at its earliest buyer's deadline: that
// buyer's batch is answered ErrBusy with nothing written, and the rest of
// the group runs again without it, its buyers none the wiser.
func TestGroupBoundedByBuyersDeadline(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	pl := newPlug(3, 2)
	ended := make(chan time.Time, 1)
	pl.other = func(ctx context.Context, sku int64) func() {
		if sku == 1 {
			<-ctx.Done() // the group's transaction ends with the buyer's deadline
			ended <- time.Now()
		}
		return nil
	}
	svc, _, _ := lined(t, db, 3, 5, options{Settings: stock.Settings{Group: 2, Fencing: true}, Hooks: stock.Hooks{BeforeWrite: pl.hook}}, lock.RedisOptions{})
	pl.svc = svc
	// Taken into its batch at once, with more than stock.MinTimeLeft left.
	hurried, cancel := context.WithTimeout(ctx, stock.MinTimeLeft+time.Second)
	defer cancel()
	plugged := place(ctx, svc, 3, 1000, "")
	<-pl.entered
	first := place(hurried, svc, 1, 100, "")
	waitGrouping(t, svc, 1)
	second := place(ctx, svc, 2, 200, "")
	waitGrouping(t, svc, 2)

	if r := <-plugged; r.err != nil {
		t.Errorf("the plug's order: %v", r.err)
	}
	if r := <-first; !errors.Is(r.err, stock.ErrBusy) {
		t.Errorf("order whose deadline came in its group's transaction: %+v, %v; want ErrBusy", r.order, r.err)
	}
	deadline, _ := hurried.Deadline()
	if at := <-ended; at.Before(deadline) {
		t.Errorf("the group's transaction ended at %v, before the buyer's deadline %v", at, deadline)
	}
	placed(t, db, <-second, 2, 200, "the other order of the group")
	if st := svc.Stats(); st.Batches != 2 || st.Orders != 3 {
		t.Errorf("stats %+v: want two transactions of three orders, the plug's and the group's", st)
	}
	if rep := report(t, db); !rep.OK() || rep.Orders != 2 {
		t.Errorf("want the plug's order and product 2's only:\n%s", rep)
	}
	if p := product(t, db, 1); p.Stock != 5 {
		t.Errorf("product 1's stock %d, want 5: its buyer's deadline came before the COMMIT", p.Stock)
	}
}

// A group whose COMMIT's answer is lost — here MySQL committed — is
// ErrOutcomeUnknown for every buyer of every product in it; the buyer with
// an idempotency key gets its committed order back, and the cache is told
// of each product once. No order is lost.
func TestGroupLostCommitReplyIsOutcomeUnknownForAll(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	_, l, _ := lined(t, db, 4, 10, options{}, lock.RedisOptions{})
	orders, p := throughProxy(t, db)
	cache := &invalidations{}
	pl := newPlug(4, 3)
	var lost func()
	pl.then = func() { lost = cutReply(t, p, "COMMIT") } // after the plug's own COMMIT
	svc := newService(orders, l, options{Settings: stock.Settings{Group: 3, Fencing: true}, Hooks: stock.Hooks{BeforeWrite: pl.hook},
		Announcer: cache, Reads: db.Gorm})
	pl.svc = svc

	users, keys := []int64{7, 8, 9}, []string{"", "key-8", ""}
	plugged, answers := pl.group(t, ctx, users, keys)
	if r := <-plugged; r.err != nil {
		t.Errorf("the plug's order: %v", r.err)
	}
	for i, user := range users {
		sku := int64(i + 1)
		r := <-answers[i]
		t.Logf("user %d, key %q, sku %d: %v, replayed %v", user, keys[i], sku, r.err, r.order.Replayed)
		switch {
		case keys[i] == "":
			if !errors.Is(r.err, stock.ErrOutcomeUnknown) || errors.Is(r.err, stock.ErrBusy) {
				t.Errorf("user %d, reply to the group's COMMIT lost: %v; want ErrOutcomeUnknown, not ErrBusy", user, r.err)
			}
		case r.err != nil || !r.order.Replayed:
			t.Errorf("user %d with key %q, reply to the group's COMMIT lost: %v; want the committed order, replayed", user, keys[i], r.err)
		default:
			checkOrder(t, db, r.order, sku, user)
		}
		if n := cache.of(sku); n != 1 {
			t.Errorf("the cache was told of product %d %d times, want once: its order may have committed", sku, n)
		}
	}
	lost()
	if st := svc.Stats(); st.Batches != 2 {
		t.Errorf("stats %+v: want two transactions, the plug's and the group's", st)
	}
	if r := report(t, db); !r.OK() || r.Orders != 4 {
		t.Errorf("want the plug's order and the group's three:\n%s", r)
	}
}
