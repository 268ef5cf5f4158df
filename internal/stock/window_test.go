package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// clock is a Service's clock that the test sets.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.set(t)
	return c
}

func (c *clock) now() time.Time  { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) set(t time.Time) { c.ns.Store(t.UnixNano()) }

// countingLocker counts the leases asked of the Locker it wraps: by
// Obtain (a restock, the sweep), and by ObtainWhile (an order's drain).
type countingLocker struct {
	stock.Locker
	obtains atomic.Int64
	drains  atomic.Int64
}

func (l *countingLocker) Obtain(ctx context.Context, key string) (*lock.Lease, error) {
	l.obtains.Add(1)
	return l.Locker.Obtain(ctx, key)
}

func (l *countingLocker) ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*lock.Lease, error) {
	l.drains.Add(1)
	return l.Locker.ObtainWhile(ctx, key, still)
}

// orderPaths are the settings an order is placed with: one order per lock
// hold (Batch 1, the source articles') or batches, each with the guarded and the
// naive update.
var orderPaths = []struct {
	name string
	opt  options
}{
	{"batch 1 guarded", options{Settings: stock.Settings{Batch: 1, Fencing: true}}},
	{"batch 1 naive", options{Settings: stock.Settings{Batch: 1, Fencing: true, Update: stock.Naive}}},
	{"batched guarded", options{Settings: stock.Settings{Fencing: true}}},
	{"batched naive", options{Settings: stock.Settings{Fencing: true, Update: stock.Naive}}},
	// The test servers are MariaDB, which takes INSERT … RETURNING.
	{"batched guarded returning", options{Settings: stock.Settings{Fencing: true, Returning: true}}},
}

// product reads product sku as MySQL has it.
func product(t *testing.T, db *testenv.DB, sku int64) stock.Product {
	t.Helper()
	var p stock.Product
	if err := db.Gorm.Take(&p, sku).Error; err != nil {
		t.Fatal(err)
	}
	return p
}

// An order is judged by the Service's clock against the window: refused
// before it opens and from the moment it closes, with no lock taken and
// nothing written; sold inside it (the start included).
func TestSaleWindowBeforeInsideAfter(t *testing.T) {
	opens := time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)
	closes := opens.Add(time.Hour)
	for _, path := range orderPaths {
		t.Run(path.name, func(t *testing.T) {
			ctx := context.Background()
			db := testenv.MySQL(t)
			rdb, prefix := testenv.Redis(t)
			if err := stock.NewCatalog(db.Gorm).SeedWindow(ctx, 1, 10, stock.Window{StartsAt: &opens, EndsAt: &closes}); err != nil {
				t.Fatal(err)
			}
			locks := &countingLocker{Locker: lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, Wait: 5 * time.Second})}
			clk := newClock(opens.Add(-time.Second))
			opt := path.opt
			opt.Now = clk.now
			svc := newService(db.Open(t), locks, opt)

			refused := func(user int64, want error) {
				t.Helper()
				if _, err := svc.PlaceOrder(ctx, 1, user, ""); !errors.Is(err, want) {
					t.Fatalf("order at %s: %v, want %v", clk.now().Format(time.RFC3339Nano), err, want)
				}
			}
			refused(1, stock.ErrSaleNotStarted)
			clk.set(opens.Add(-time.Microsecond))
			refused(2, stock.ErrSaleNotStarted)
			if n := locks.obtains.Load(); n != 0 {
				t.Errorf("orders before the sale took the lock %d times, want none", n)
			}
			if p := product(t, db, 1); p.Stock != 10 || ordersOf(t, db, 1) != 0 {
				t.Fatalf("before the sale: stock %d, %d orders; want 10, none", p.Stock, ordersOf(t, db, 1))
			}

			clk.set(opens)
			if _, err := svc.PlaceOrder(ctx, 1, 3, ""); err != nil {
				t.Fatalf("order as the sale opens: %v", err)
			}
			clk.set(closes.Add(-time.Microsecond))
			if _, err := svc.PlaceOrder(ctx, 1, 4, ""); err != nil {
				t.Fatalf("order in the sale's last microsecond: %v", err)
			}

			obtained := locks.obtains.Load()
			clk.set(closes)
			refused(5, stock.ErrSaleEnded)
			clk.set(closes.Add(time.Hour))
			refused(6, stock.ErrSaleEnded)
			if n := locks.obtains.Load() - obtained; n != 0 {
				t.Errorf("orders after the sale took the lock %d times, want none", n)
			}
			if r := report(t, db); !r.OK() || r.Orders != 2 || r.Stock != 8 {
				t.Errorf("after the sale: want the 2 orders inside the window\n%s", r)
			}
		})
	}
}

// In a batch each order is judged by the time it arrived, not by the time
// the batch is placed: an order that came before the end is sold although
// its transaction runs after it, and one that came at the end is refused.
func TestSaleWindowJudgesArrivalInABatch(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	closes := time.Date(2030, 1, 2, 11, 0, 0, 0, time.UTC)
	clk := newClock(closes.Add(-time.Second))
	svc, l := waking(t, db, 1, 10, options{Settings: stock.Settings{Fencing: true}, Now: clk.now})
	if err := db.Gorm.Exec("UPDATE products SET sale_ends_at = ? WHERE id = 1", closes).Error; err != nil {
		t.Fatal(err)
	}

	holder := hold(t, l, 1)
	early := queue(t, ctx, svc, 1, []int64{11}, nil)
	waitWaiting(t, l, 1) // the drain has read the window, for order 11
	clk.set(closes)
	late := queue(t, ctx, svc, 1, []int64{12, 13}, nil)
	clk.set(closes.Add(time.Minute)) // the batch runs after the end
	letGo(t, holder)

	if r := <-early[0]; r.err != nil {
		t.Errorf("order that arrived a second before the end: %v, want it sold", r.err)
	} else {
		checkOrder(t, db, r.order, 1, 11)
	}
	for i, ch := range late {
		if r := <-ch; !errors.Is(r.err, stock.ErrSaleEnded) {
			t.Errorf("order %d that arrived at the end: %+v, %v; want ErrSaleEnded", i, r.order, r.err)
		}
	}
	if r := report(t, db); !r.OK() || r.Orders != 1 {
		t.Errorf("want one order\n%s", r)
	}
}

// A window closed (by ChangeProduct, which needs no lock) while orders wait
// for the SKU's lock — after their turn's pre-lock read found the sale open
// — is honoured for the orders that arrived after its new end, on every
// path: in their transaction when they are placed together, by the next
// turn's read with Batch 1; the order that arrived before it is sold.
func TestSaleWindowClosedWhileOrdersWait(t *testing.T) {
	base := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	for _, path := range orderPaths {
		t.Run(path.name, func(t *testing.T) {
			ctx := context.Background()
			db := testenv.MySQL(t)
			clk := newClock(base)
			opt := path.opt
			opt.Now = clk.now
			svc, l := waking(t, db, 1, 10, opt)

			holder := hold(t, l, 1)
			var answers []<-chan result
			for i, user := range []int64{21, 22} {
				clk.set(base.Add(time.Duration(i) * 10 * time.Second)) // 21 at +0s, 22 at +10s
				answers = append(answers, place(ctx, svc, 1, user, ""))
				// The queue's drain has read the stock and the open
				// window, and waits for the lock.
				waitQueued(t, svc, i+1)
				waitWaiting(t, l, 1)
			}
			end := base.Add(5 * time.Second)
			if _, err := svc.ChangeProduct(ctx, 1, stock.Change{SaleEndsAt: stock.Bound{Set: true, At: &end}}); err != nil {
				t.Fatalf("close the window while the lock is held: %v", err)
			}
			letGo(t, holder)

			if r := <-answers[0]; r.err != nil {
				t.Errorf("order that arrived before the new end: %v, want it sold", r.err)
			}
			if r := <-answers[1]; !errors.Is(r.err, stock.ErrSaleEnded) {
				t.Errorf("order that arrived after the new end, read the open window before the lock: %+v, %v; want ErrSaleEnded", r.order, r.err)
			}
			if r := report(t, db); !r.OK() || r.Orders != 1 || r.Stock != 9 {
				t.Errorf("want one order\n%s", r)
			}
		})
	}
}

// waking is lined with a lock that wakes its waiters on release, and so
// counts them (lock.Stats.Waiting).
func waking(t *testing.T, db *testenv.DB, n, units int, opt options) (*stock.Service, *lock.Redis) {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), n, units); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 20 * time.Second, Subscriber: rdb})
	t.Cleanup(func() { l.Close() })
	return newService(db.Open(t), l, opt), l
}

// waitWaiting waits until n callers wait for a key of l.
func waitWaiting(t *testing.T, l *lock.Redis, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().Waiting < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting for the lock, want %d", l.Stats().Waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func units(n int) *int { return &n }

// A restock waits for the SKU's lock like an order, raises initial_stock and
// stock together in one fenced write, and moves the row's fence to its own
// token, so the holder before it can no longer write.
func TestRestockUnderTheLock(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, l := waking(t, db, 1, 2, options{Settings: stock.Settings{Fencing: true}})

	holder := hold(t, l, 1)
	done := make(chan error, 1)
	var got stock.Product
	go func() {
		var err error
		got, err = svc.ChangeProduct(ctx, 1, stock.Change{AddStock: units(5)})
		done <- err
	}()
	waitWaiting(t, l, 1)
	if p := product(t, db, 1); p.InitialStock != 2 || p.Stock != 2 {
		t.Fatalf("restock wrote while another held the lock: initial %d, stock %d", p.InitialStock, p.Stock)
	}
	letGo(t, holder)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	p := product(t, db, 1)
	if p.InitialStock != 7 || p.Stock != 7 || got.InitialStock != 7 || got.Stock != 7 {
		t.Errorf("after adding 5 to 2: MySQL initial %d stock %d, answered %d/%d; want 7 and 7", p.InitialStock, p.Stock, got.InitialStock, got.Stock)
	}
	if p.Fence <= holder.Fence() {
		t.Errorf("row fence %d after the restock, not above the previous holder's token %d", p.Fence, holder.Fence())
	}
	if r := report(t, db); !r.OK() {
		t.Errorf("after the restock:\n%s", r)
	}
}

// A restock of a product this Service found sold out makes it sell again at
// once, where stock raised behind the Service's back is not seen.
func TestRestockClearsSoldOutMemory(t *testing.T) {
	for _, path := range orderPaths {
		t.Run(path.name, func(t *testing.T) {
			ctx := context.Background()
			svc, db, _ := seeded(t, 1, 1, path.opt)
			if _, err := svc.PlaceOrder(ctx, 1, 1, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.PlaceOrder(ctx, 1, 2, ""); !errors.Is(err, stock.ErrSoldOut) {
				t.Fatalf("second buyer of one unit: %v", err)
			}
			// The refusal now comes from memory.
			if err := db.Gorm.Exec("UPDATE products SET stock = stock + 1, initial_stock = initial_stock + 1 WHERE id = 1").Error; err != nil {
				t.Fatal(err)
			}
			if _, err := svc.PlaceOrder(ctx, 1, 3, ""); !errors.Is(err, stock.ErrSoldOut) {
				t.Fatalf("after stock raised by hand: %v; want the remembered ErrSoldOut", err)
			}
			if _, err := svc.ChangeProduct(ctx, 1, stock.Change{AddStock: units(1)}); err != nil {
				t.Fatal(err)
			}
			for _, user := range []int64{4, 5} {
				if _, err := svc.PlaceOrder(ctx, 1, user, ""); err != nil {
					t.Errorf("order of user %d right after the restock: %v", user, err)
				}
			}
			if r := report(t, db); !r.OK() || r.Orders != 3 || r.Stock != 0 {
				t.Errorf("want 3 orders of 3 units\n%s", r)
			}
		})
	}
}

// Restocks in the middle of a sale keep initial_stock == stock + orders:
// each is one write of both columns under the lock.
func TestRestockUnderLoad(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, _, _ := lined(t, db, 2, 20, options{Settings: stock.Settings{Fencing: true}}, lock.RedisOptions{})
	var (
		wg              sync.WaitGroup
		sold, restocked atomic.Int64
	)
	for user := int64(1); user <= 300; user++ {
		wg.Go(func() {
			if _, err := svc.PlaceOrder(ctx, 1+user%2, user, ""); err == nil {
				sold.Add(1)
			} else if !errors.Is(err, stock.ErrSoldOut) {
				t.Errorf("order of user %d: %v", user, err)
			}
		})
		if user%50 == 0 {
			wg.Go(func() {
				if _, err := svc.ChangeProduct(ctx, 1+(user/50)%2, stock.Change{AddStock: units(10)}); err != nil {
					t.Errorf("restock: %v", err)
					return
				}
				restocked.Add(10)
			})
		}
	}
	wg.Wait()
	r := report(t, db)
	t.Logf("sold %d, restocked %d units: %s", sold.Load(), restocked.Load(), r.String())
	if !r.OK() || r.InitialStock != 40+restocked.Load() || r.Orders != sold.Load() {
		t.Errorf("after restocks under load: want initial stock %d and %d orders\n%s", 40+restocked.Load(), sold.Load(), r)
	}
}

// A change that is refused changes nothing.
func TestChangeProductRefusalsChangeNothing(t *testing.T) {
	ctx := context.Background()
	svc, db, _ := seeded(t, 1, 1_000_000_000, options{Settings: stock.Settings{Fencing: true}})
	starts := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ends := starts.Add(time.Hour)
	if _, err := svc.ChangeProduct(ctx, 1, stock.Change{SaleStartsAt: stock.Bound{Set: true, At: &starts}, SaleEndsAt: stock.Bound{Set: true, At: &ends}}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.ChangeProduct(ctx, 1, stock.Change{AddStock: units(stock.MaxAddStock)}); err != nil {
		t.Fatal(err)
	}
	before := product(t, db, 1)
	late, early, ancient := ends.Add(time.Second), starts.Add(-time.Second), time.Date(999, 12, 31, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		sku    int64
		change stock.Change
		want   error
	}{
		{"nothing", 1, stock.Change{}, stock.ErrInvalid},
		{"zero units", 1, stock.Change{AddStock: units(0)}, stock.ErrInvalid},
		{"negative units", 1, stock.Change{AddStock: units(-1)}, stock.ErrInvalid},
		{"too many units", 1, stock.Change{AddStock: units(stock.MaxAddStock + 1)}, stock.ErrInvalid},
		{"more than an INT holds", 1, stock.Change{AddStock: units(stock.MaxAddStock)}, stock.ErrInvalid},
		{"start after the end", 1, stock.Change{SaleStartsAt: stock.Bound{Set: true, At: &late}}, stock.ErrInvalid},
		{"start at the end", 1, stock.Change{SaleStartsAt: stock.Bound{Set: true, At: &ends}}, stock.ErrInvalid},
		{"end before the start", 1, stock.Change{SaleEndsAt: stock.Bound{Set: true, At: &early}}, stock.ErrInvalid},
		{"year 999", 1, stock.Change{SaleEndsAt: stock.Bound{Set: true, At: &ancient}}, stock.ErrInvalid},
		{"no such product", 2, stock.Change{AddStock: units(1)}, stock.ErrNotFound},
		{"bad id", 0, stock.Change{AddStock: units(1)}, stock.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if p, err := svc.ChangeProduct(ctx, tt.sku, tt.change); !errors.Is(err, tt.want) {
				t.Fatalf("got %+v, %v; want %v", p, err, tt.want)
			}
			if after := product(t, db, 1); row(after) != row(before) {
				t.Errorf("a refused change wrote:\nbefore %s\nafter  %s", row(before), row(after))
			}
		})
	}
}

// An unset bound is left as it is, a bound set to nil is cleared.
func TestChangeProductBounds(t *testing.T) {
	ctx := context.Background()
	svc, db, _ := seeded(t, 1, 1, options{})
	starts := time.Date(2030, 1, 1, 0, 0, 0, 123456789, time.FixedZone("CET", 3600))
	ends := starts.Add(time.Hour)
	p, err := svc.ChangeProduct(ctx, 1, stock.Change{SaleStartsAt: stock.Bound{Set: true, At: &starts}, SaleEndsAt: stock.Bound{Set: true, At: &ends}})
	if err != nil {
		t.Fatal(err)
	}
	// Stored in UTC to the microsecond, and answered as stored.
	want := starts.UTC().Truncate(time.Microsecond)
	if got := product(t, db, 1); got.SaleStartsAt == nil || !got.SaleStartsAt.Equal(want) || p.SaleStartsAt == nil || !p.SaleStartsAt.Equal(want) || p.SaleStartsAt.Location() != time.UTC {
		t.Errorf("starts: MySQL %v, answered %v; want %v", got.SaleStartsAt, p.SaleStartsAt, want)
	}
	if _, err := svc.ChangeProduct(ctx, 1, stock.Change{SaleStartsAt: stock.Bound{Set: true}}); err != nil {
		t.Fatal(err)
	}
	got := product(t, db, 1)
	if want := ends.Truncate(time.Microsecond); got.SaleStartsAt != nil || got.SaleEndsAt == nil || !got.SaleEndsAt.Equal(want) {
		t.Errorf("after clearing the start: %v .. %v; want nil .. %v", got.SaleStartsAt, got.SaleEndsAt, want)
	}
}

// row is what MySQL holds of p, as text to compare.
func row(p stock.Product) string {
	bound := func(t *time.Time) string {
		if t == nil {
			return "none"
		}
		return t.Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("initial %d, stock %d, fence %d, window %s .. %s, updated %s",
		p.InitialStock, p.Stock, p.Fence, bound(p.SaleStartsAt), bound(p.SaleEndsAt), p.UpdatedAt.Format(time.RFC3339Nano))
}
