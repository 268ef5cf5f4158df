package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// recording is an Announcer that keeps what it is told, and fails the
// first fail announcements of a kind it is told to fail.
type recording struct {
	mu     sync.Mutex
	told   []notify.Event
	failed int
	fail   map[notify.Kind]int
}

func (r *recording) Announce(ctx context.Context, e notify.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail[e.Kind] > 0 {
		r.fail[e.Kind]--
		r.failed++
		return errors.New("connection reset")
	}
	r.told = append(r.told, e)
	return nil
}

// events returns what r was told, and forgets it.
func (r *recording) events() []notify.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	told := r.told
	r.told = nil
	return told
}

// pair is two replicas on one MySQL and one lock, with fencing on and
// reservations paid within payWindow: a, which announces to rec, and b, on
// the clock clk, which hears only what the test hands it.
type pair struct {
	db   *testenv.DB
	rec  *recording
	l    *lock.Redis
	a, b *stock.Service
	clk  *clock
}

// newPair seeds product 1 with one unit and starts a pair, a with hooks
// h, announcing to rec.
func newPair(t *testing.T, rec *recording, h stock.Hooks) *pair {
	t.Helper()
	f := &pair{db: testenv.MySQL(t), rec: rec, clk: newClock(time.Now())}
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(f.db.Gorm).Seed(context.Background(), 1, 1); err != nil {
		t.Fatal(err)
	}
	f.l = lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 20 * time.Second})
	t.Cleanup(func() { f.l.Close() })
	set := stock.Settings{Fencing: true, PayWindow: payWindow}
	f.a = newService(f.db.Open(t), f.l, options{Settings: set, Hooks: h, Announcer: rec})
	f.b = newService(f.db.Open(t), f.l, options{Settings: set, Now: f.clk.now})
	return f
}

// hearAll has svc hear events, in order.
func hearAll(svc *stock.Service, events []notify.Event) {
	for _, e := range events {
		svc.Hear(e)
	}
}

// hearLate has svc, on clock c, hear events late: past any quiet window
// after what it heard before, as a PUBLISH that ran late is heard.
func hearLate(svc *stock.Service, c *clock, events []notify.Event) {
	c.set(c.now().Add(10 * time.Second))
	hearAll(svc, events)
}

// sells places user 2's order of product 1 on svc, and fails unless it is
// sold: after what says when.
func sells(t *testing.T, db *testenv.DB, svc *stock.Service, after string) {
	t.Helper()
	o, err := svc.PlaceOrder(context.Background(), 1, 2, "")
	if err != nil {
		t.Fatalf("%s: %v, want the unit sold", after, err)
	}
	checkOrder(t, db, o, 1, 2)
}

// raises returns the raises of product 1 among events.
func raises(events []notify.Event) []notify.Event {
	var raised []notify.Event
	for _, e := range events {
		if e.Kind == notify.Raised && e.SKU == 1 {
			raised = append(raised, e)
		}
	}
	return raised
}

// A restock announces itself with its lease's fencing token, so a
// replica that hears the sell-out before it late — past any quiet window —
// still sells the new units.
func TestRestockAnnouncedWithItsToken(t *testing.T) {
	ctx := context.Background()
	f := newPair(t, &recording{}, stock.Hooks{})
	if _, err := f.a.PlaceOrder(ctx, 1, 1, ""); err != nil {
		t.Fatal(err)
	}
	late := f.rec.events() // the sell-out, whose PUBLISH runs late
	if len(late) != 1 || late[0].Kind != notify.SoldOut || late[0].Fence <= 0 {
		t.Fatalf("the last unit's sale announced %+v, want a sell-out with its token", late)
	}
	one := 1
	if _, err := f.a.ChangeProduct(ctx, 1, stock.Change{AddStock: &one}); err != nil {
		t.Fatal(err)
	}
	restock := f.rec.events()
	if r := raises(restock); len(r) != 1 || r[0].Fence <= late[0].Fence {
		t.Errorf("the restock announced %+v: want a raise under a token above the sell-out's %d", restock, late[0].Fence)
	}
	hearAll(f.b, restock)
	// What the admin API announces after the restock's lease, as before.
	f.b.Hear(notify.Event{Kind: notify.Raised, SKU: 1})
	hearLate(f.b, f.clk, late)
	sells(t, f.db, f.b, "a sell-out heard after the restock")
}

// A hold that found no unit wrote nothing, so its token orders nothing:
// a holder with an older token whose lease ran out may return units after
// it. It does not announce a sell-out, and a replica that heard the return
// sells the returned unit.
func TestHoldThatFoundNoUnitAnnouncesNoSellOut(t *testing.T) {
	ctx := context.Background()
	var f *pair
	var once sync.Once
	taken := func(ctx context.Context, sku int64) func() {
		// The last unit goes between the stock's read and the hold's
		// write, as a sale by a holder whose lease ran out would take it.
		once.Do(func() {
			if err := f.db.Gorm.Exec("UPDATE products SET stock = 0 WHERE id = 1").Error; err != nil {
				t.Error(err)
			}
		})
		return nil
	}
	f = newPair(t, &recording{}, stock.Hooks{BeforeWrite: taken})
	stale := hold(t, f.l, 1) // the holder whose lease runs out
	letGo(t, stale)
	if _, err := f.a.PlaceOrder(ctx, 1, 1, ""); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("a hold that found no unit: %v, want ErrSoldOut", err)
	}
	told := f.rec.events()
	for _, e := range told {
		if e.Kind == notify.SoldOut {
			t.Errorf("a hold that took no unit announced %+v", e)
		}
	}
	// The stale holder returns the unit, and says so under its token.
	if err := f.db.Gorm.Exec("UPDATE products SET stock = 1, fence = ? WHERE id = 1", stale.Fence()).Error; err != nil {
		t.Fatal(err)
	}
	f.b.Hear(notify.Event{Kind: notify.Raised, SKU: 1, Fence: stale.Fence()})
	hearLate(f.b, f.clk, told)
	sells(t, f.db, f.b, "a hold's finding heard after the return")
}

// A replica that heard another's sell-out, and missed the raise after it,
// sells again once SoldOutHeardTTL has passed: a few seconds, not the
// minute of its own findings.
func TestSoldOutHeardLapsesWithinSeconds(t *testing.T) {
	ctx := context.Background()
	f := newPair(t, &recording{}, stock.Hooks{})
	if _, err := f.a.PlaceOrder(ctx, 1, 1, ""); err != nil {
		t.Fatal(err)
	}
	hearAll(f.b, f.rec.events())
	if _, err := f.b.PlaceOrder(ctx, 1, 2, ""); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("after the sell-out was heard: %v, want ErrSoldOut", err)
	}
	// A restock whose announcement was lost.
	if err := f.db.Gorm.Exec("UPDATE products SET stock = 1, initial_stock = 2 WHERE id = 1").Error; err != nil {
		t.Fatal(err)
	}
	f.clk.set(f.clk.now().Add(stock.SoldOutHeardTTL))
	sells(t, f.db, f.b, fmt.Sprintf("%v after the sell-out was heard", stock.SoldOutHeardTTL))
}

// The announcement of units returned is tried again when it fails.
func TestReturnAnnouncementRetried(t *testing.T) {
	ctx := context.Background()
	f := newPair(t, &recording{fail: map[notify.Kind]int{notify.Raised: 2}}, stock.Hooks{})
	o, err := f.a.PlaceOrder(ctx, 1, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	f.rec.events()
	if _, err := f.a.Cancel(ctx, 1, o.ID); err != nil {
		t.Fatal(err)
	}
	if r := raises(f.rec.events()); len(r) != 1 || r[0].Fence <= 0 || f.rec.failed != 2 {
		t.Errorf("after two failed tries the return announced %+v (%d failed), want one raise with its token", r, f.rec.failed)
	}
}
