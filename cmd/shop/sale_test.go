package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"shop/internal/admin"
	"shop/internal/handler"
	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// saleFleet is three replicas on one database and Redis key space, with the
// admin API on. Their buyers may wait SHOP_LOCK_WAIT's most, 10 s, for the
// SKU's lock: the buyers of a sale of one SKU through three replicas each
// wait for the other replicas' batches, and on a loaded machine that took
// longer than the default 2 s (503 busy), which says nothing of the sale.
func saleFleet(t *testing.T, seedArgs ...string) (*testenv.DB, []*replica, map[string]string) {
	t.Helper()
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_ADMIN_TOKEN": testAdminToken, "SHOP_LOCK_WAIT": "10s"})
	if code, out := shopWith(vars(), append([]string{"seed"}, seedArgs...)...); code != 0 {
		t.Fatal(out)
	}
	return db, startReplicas(t, 3, vars), vars()
}

// purchase is one order a buyer sent and what it got.
type purchase struct {
	user   int
	sent   time.Time
	status int
	code   string
	order  string
}

// A sale window holds on every replica: before it, inside it, after it,
// and when a PATCH closes it in the middle of the sale.
func TestSaleWindowOnThreeReplicas(t *testing.T) {
	t.Parallel()
	starts := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	db, replicas, vars := saleFleet(t, "--products", "1", "--stock", "100000", "--starts-at", starts)
	orderAll := func(user int, want int, code string) {
		t.Helper()
		for i, r := range replicas {
			if o := r.public.order(1, user+i); o.expect(want) != nil || (code != "" && o.code() != code) {
				t.Fatalf("order of user %d via replica %d: %v; want %d %s", user+i, i, o, want, code)
			}
		}
	}
	stockAndOrders := func() (int, int64) {
		t.Helper()
		var p stock.Product
		var n int64
		if err := db.Gorm.Take(&p, 1).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Gorm.Model(&stock.Order{}).Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		return p.Stock, n
	}

	// productWindow is the window GET product shows through replica i, as
	// RFC 3339 times; "" for a bound that is null.
	productWindow := func(i int) (string, string) {
		t.Helper()
		p := replicas[i].public.product(1)
		if p.expect(200) != nil {
			t.Fatalf("GET product via replica %d: %v", i, p)
		}
		var bounds [2]string
		for j, b := range []*time.Time{p.body.SaleStartsAt, p.body.SaleEndsAt} {
			if b != nil {
				bounds[j] = b.Format(time.RFC3339Nano)
			}
		}
		return bounds[0], bounds[1]
	}

	// Before: refused everywhere, nothing sold; the product pages (cached
	// now) show the start.
	orderAll(1, 403, "sale_not_started")
	for i := range replicas {
		if s, e := productWindow(i); s != starts || e != "" {
			t.Fatalf("product page via replica %d before the sale: %v .. %v; want %s .. null", i, s, e, starts)
		}
	}
	if s, n := stockAndOrders(); s != 100000 || n != 0 {
		t.Fatalf("before the sale: stock %d, %d orders; want 100000, none", s, n)
	}
	// Inside: the start cleared through one replica, every replica sells.
	if p := replicas[0].admin.patchProduct(1, `{"sale_starts_at":null}`); p.expect(200) != nil || p.body.SaleStartsAt != nil {
		t.Fatalf("open the sale: %v", p)
	}
	for i := range replicas {
		if s, e := productWindow(i); s != "" || e != "" {
			t.Errorf("product page via replica %d once the start was cleared: %v .. %v; want no window", i, s, e)
		}
	}
	orderAll(10, 201, "")
	// After: closed through another.
	ended := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	if p := replicas[1].admin.patchProduct(1, `{"sale_ends_at":"`+ended+`"}`); p.expect(200) != nil {
		t.Fatalf("end the sale: %v", p)
	}
	orderAll(20, 403, "sale_ended")
	if s, n := stockAndOrders(); s != 100000-3 || n != 3 {
		t.Fatalf("after the sale: stock %d, %d orders; want 99997, 3", s, n)
	}

	// Closed mid-sale: buyers on every replica, then a PATCH sets the end
	// a moment ahead.
	if p := replicas[2].admin.patchProduct(1, `{"sale_ends_at":null}`); p.expect(200) != nil {
		t.Fatalf("reopen the sale: %v", p)
	}
	crowded(t)
	var (
		mu        sync.Mutex
		purchases []purchase
		nextUser  atomic.Int64
		stop      = make(chan struct{})
		wg        sync.WaitGroup
		sold      atomic.Int64
	)
	nextUser.Store(1000)
	for i := range 24 {
		buyer := replicas[i%3].public
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				user := int(nextUser.Add(1))
				sent := time.Now()
				o := buyer.order(1, user)
				if o.err != nil {
					t.Errorf("order of user %d: %v", user, o.err)
					return
				}
				p := purchase{user: user, sent: sent, status: o.status, code: o.code()}
				if o.status == 201 {
					sold.Add(1)
					p.order = fmt.Sprint(o.body.ID)
				}
				mu.Lock()
				purchases = append(purchases, p)
				mu.Unlock()
			}
		})
	}
	waitFor(t, 30*time.Second, "100 orders sold", func() error {
		if n := sold.Load(); n < 100 {
			return fmt.Errorf("%d sold", n)
		}
		return nil
	})
	// An order is judged by its arrival against the window as MySQL has it
	// in the order's transaction, and a change of the window binds the
	// orders that arrive once it has committed (stock.Service.ChangeProduct):
	// an end that the PATCH commits after it has come leaves sold, rightly,
	// the orders that arrived in between. So the end is set ahead of the
	// PATCH's answer, which comes after its commit; when the answer comes
	// after the end all the same (a loaded machine), the sale is reopened
	// and closed again, further ahead.
	var end, answered time.Time
	for ahead := 250 * time.Millisecond; ; ahead *= 2 {
		end = time.Now().Add(ahead).UTC()
		p := replicas[0].admin.patchProduct(1, `{"sale_ends_at":"`+end.Format(time.RFC3339Nano)+`"}`)
		answered = time.Now().UTC()
		if p.expect(200) != nil {
			t.Fatalf("close the sale mid-sale: %v", p)
		}
		if answered.Before(end) {
			break
		}
		if ahead >= 8*time.Second {
			t.Fatalf("the PATCH that closes the sale %s ahead answered %s after the end", ahead, answered.Sub(end))
		}
		t.Logf("the PATCH that closes the sale %s ahead answered %s after the end: reopened, and closed further ahead", ahead, answered.Sub(end))
		if p := replicas[0].admin.patchProduct(1, `{"sale_ends_at":null}`); p.expect(200) != nil {
			t.Fatalf("reopen the sale: %v", p)
		}
	}
	// The buyers keep coming until each replica has refused a few.
	waitFor(t, 30*time.Second, "30 orders sent after the end", func() error {
		mu.Lock()
		defer mu.Unlock()
		late := 0
		for _, p := range purchases {
			if !p.sent.Before(end) {
				late++
			}
		}
		if late < 30 {
			return fmt.Errorf("%d sent", late)
		}
		return nil
	})
	close(stop)
	wg.Wait()

	sent := map[int]time.Time{}
	var acks []string
	late, afterAnswer := 0, 0
	for _, p := range purchases {
		sent[p.user] = p.sent
		switch {
		case p.status == 201:
			acks = append(acks, p.order)
			if !p.sent.Before(end) {
				t.Errorf("user %d's order, sent at %s, at or after the sale's end %s, was sold", p.user, p.sent.Format(time.RFC3339Nano), end.Format(time.RFC3339Nano))
			}
		case p.status != 403 || p.code != "sale_ended":
			t.Errorf("user %d's order: %d %s", p.user, p.status, p.code)
		}
		if !p.sent.Before(end) {
			late++
			if p.status != 403 {
				t.Errorf("user %d's order, sent at or after the end, got %d", p.user, p.status)
			}
		}
	}
	// In MySQL: every order is one a buyer sent before the end, some
	// committed after the PATCH's answer.
	var orders []stock.Order
	if err := db.Gorm.Where("user_id >= 1000").Find(&orders).Error; err != nil {
		t.Fatal(err)
	}
	for _, o := range orders {
		s, ok := sent[int(o.UserID)]
		if !ok || !s.Before(end) {
			t.Errorf("order %d of user %d (created %s) was not sent before the end %s (sent %s)", o.ID, o.UserID,
				o.CreatedAt.Format(time.RFC3339Nano), end.Format(time.RFC3339Nano), s.Format(time.RFC3339Nano))
		}
		if o.CreatedAt.After(answered) {
			afterAnswer++
		}
	}
	t.Logf("closed mid-sale: %d orders sold, %d buyers refused at or after the end; %d orders committed after the PATCH's answer (sent before the end)",
		len(orders), late, afterAnswer)
	if len(orders) != len(acks) {
		t.Errorf("MySQL has %d orders of the mid-sale buyers, they got %d acknowledgements", len(orders), len(acks))
	}
	if code, out := shopWith(vars, "verify", "--acks", acksFile(t, acks)); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}

// A restock of a SKU that every replica found sold out makes every replica
// sell it again at once: the PATCH's replica forgets at once, the others
// when its announcement arrives.
func TestRestockOfSoldOutSKUOnEveryReplica(t *testing.T) {
	t.Parallel()
	db, replicas, vars := saleFleet(t, "--products", "1", "--stock", "1")
	if o := replicas[0].public.order(1, 1); o.expect(201) != nil {
		t.Fatalf("first order: %v", o)
	}
	for i, r := range replicas {
		if o := r.public.order(1, 10+i); o.expect(409) != nil {
			t.Fatalf("order via replica %d of a sold-out SKU: %v", i, o)
		}
	}
	restock := replicas[0].admin.patchProduct(1, `{"add_stock":5}`)
	patched := time.Now()
	if restock.expect(200) != nil || restock.body.Stock != 5 || restock.body.InitialStock != 6 || restock.body.Warnings != nil {
		t.Fatalf("restock: %v; want 200, stock 5, initial_stock 6, no warnings", restock)
	}
	for i, r := range replicas {
		user := 20 + 10*i
		waitFor(t, time.Second-time.Since(patched), fmt.Sprintf("replica %d sells within 1s of the restock", i), func() error {
			o := r.public.order(1, user)
			user++
			return o.expect(201)
		})
	}
	var p stock.Product
	if err := db.Gorm.Take(&p, 1).Error; err != nil {
		t.Fatal(err)
	}
	if p.Stock != 2 || p.InitialStock != 6 {
		t.Errorf("MySQL after the restock and 3 more orders: stock %d, initial_stock %d; want 2, 6", p.Stock, p.InitialStock)
	}
	if code, out := shopWith(vars, "verify"); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}

// A change that committed stands when what follows it fails: 200 with
// warnings, as for a seed, and the change is in MySQL.
func TestChangeThatCommittedIsNotAFailure(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	catalog := stock.NewCatalog(db.Gorm)
	if err := catalog.Seed(context.Background(), 1, 1); err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.ReleaseMode)
	cfg := testConfig(t, map[string]string{"SHOP_REDIS_ADDR": deadAddr(t), "SHOP_REDIS_PREFIX": redisPrefix(t)})
	rdb, products := testCache(t, cfg, catalog)
	orders := stock.NewService(stock.Deps{DB: db.Gorm, Locks: lock.NewLocal(time.Second)}, stock.Settings{}, stock.Hooks{})
	srv := httptest.NewServer(handler.New(handler.Deps{
		Admin: &admin.Admin{Changer: orders, Cache: products, Restocks: notify.New(rdb, cfg.Redis.Prefix)},
	}, handler.Settings{AdminToken: testAdminToken}).Admin)
	t.Cleanup(srv.Close)
	admin := operators(srv.URL, testAdminToken)
	if p := admin.patchProduct(1, `{"add_stock":2}`); p.expect(200) != nil || p.body.Stock != 3 || len(p.body.Warnings) != 2 {
		t.Errorf("restock with Redis down: %v; want 200, stock 3, two warnings", p)
	}
	if p := admin.patchProduct(1, `{"sale_ends_at":"2030-01-01T00:00:00Z"}`); p.expect(200) != nil || len(p.body.Warnings) != 1 {
		t.Errorf("window change with Redis down: %v; want 200 and one warning (the cache)", p)
	}
	var p stock.Product
	if err := db.Gorm.Take(&p, 1).Error; err != nil || p.Stock != 3 || p.InitialStock != 3 || p.SaleEndsAt == nil {
		t.Errorf("MySQL after the changes: %+v, %v", p, err)
	}
}

func TestSeedWindowFlags(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "2", "--stock", "1", "--starts-at", "2030-01-02T03:04:05+02:00", "--ends-at", "2030-01-03T00:00:00.5Z"); code != 0 {
		t.Fatalf("seed with a window: %d %s", code, out)
	}
	var ps []stock.Product
	if err := db.Gorm.Order("id").Find(&ps).Error; err != nil || len(ps) != 2 {
		t.Fatal(ps, err)
	}
	for _, p := range ps {
		if p.SaleStartsAt == nil || !p.SaleStartsAt.Equal(time.Date(2030, 1, 2, 1, 4, 5, 0, time.UTC)) ||
			p.SaleEndsAt == nil || !p.SaleEndsAt.Equal(time.Date(2030, 1, 3, 0, 0, 0, 5e8, time.UTC)) {
			t.Errorf("product %d: %v .. %v", p.ID, p.SaleStartsAt, p.SaleEndsAt)
		}
	}
	for _, bad := range [][]string{
		{"--starts-at", "tomorrow"},
		{"--ends-at", "2030-01-03"},
		{"--starts-at", "2030-01-03T00:00:00Z", "--ends-at", "2030-01-03T00:00:00Z"},
	} {
		if code, out := shop(t, db, append([]string{"seed", "--products", "5", "--stock", "1"}, bad...)...); code != 2 {
			t.Errorf("seed %v: exit %d, want 2\n%s", bad, code, out)
		}
	}
	if code, out := shop(t, db, "verify"); code != 0 || !strings.Contains(out, "products 2,") {
		t.Errorf("a refused seed changed the catalog: %d\n%s", code, out)
	}
}
