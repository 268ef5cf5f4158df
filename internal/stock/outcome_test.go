package stock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// invalidations records what a Service announces, by product.
type invalidations struct {
	mu   sync.Mutex
	skus map[int64]int
}

func (r *invalidations) Announce(_ context.Context, e notify.Event) error {
	sku := e.SKU
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.skus == nil {
		r.skus = map[int64]int{}
	}
	r.skus[sku]++
	return nil
}

func (r *invalidations) of(sku int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skus[sku]
}

// throughProxy returns a pool on db that goes through a proxy of its own,
// and the proxy.
func throughProxy(t *testing.T, db *testenv.DB) (*gorm.DB, *testenv.Proxy) {
	t.Helper()
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProxy(t, cfg.Addr)
	cfg.Addr = p.Addr
	return (&testenv.DB{DSN: cfg.FormatDSN()}).Open(t), p
}

// cutReply arms p to lose the reply to the next statement that contains
// match (that is, for "COMMIT", the next COMMIT), and returns a func that
// fails the test unless that has happened.
func cutReply(t *testing.T, p *testenv.Proxy, match string) func() {
	t.Helper()
	m := []byte(match)
	if match == "COMMIT" {
		m = testenv.MySQLQuery(match)
	}
	cut := p.CutReply(m)
	return func() {
		t.Helper()
		select {
		case <-cut:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s went through the proxy", match)
		}
	}
}

// When the connection dies after COMMIT was sent — here MySQL committed and
// its answer was lost — the order is neither acknowledged nor reported as
// not written: ErrOutcomeUnknown, and the cache is told that the product
// may have changed. A buyer with an idempotency key gets its order back.
// When it dies before (the INSERT's answer lost), MySQL rolls back: ErrBusy,
// nothing written, the cache left alone.
func TestLostReplyIsOutcomeUnknownOnlyAfterCommit(t *testing.T) {
	ctx := context.Background()
	for _, cut := range []string{"COMMIT", "INSERT INTO"} {
		for _, batch := range []int{1, 0} {
			t.Run(cut+"/"+map[int]string{1: "alone", 0: "batch"}[batch], func(t *testing.T) {
				t.Parallel()
				committed := cut == "COMMIT"
				db := testenv.MySQL(t)
				_, l, _ := lined(t, db, 1, 10, options{}, lock.RedisOptions{})
				orders, p := throughProxy(t, db)
				cache := &invalidations{}
				svc := newService(orders, l, options{Settings: stock.Settings{Batch: batch}, Announcer: cache, Reads: db.Gorm})

				// Alone, each buyer's transaction loses a reply; in a
				// batch, the one transaction of all three.
				type buyer struct {
					user int64
					key  string
				}
				buyers := []buyer{{7, ""}, {8, "key-8"}, {9, ""}}
				txs := 1
				var got []result
				if batch == 1 {
					txs = len(buyers)
					for _, b := range buyers {
						lost := cutReply(t, p, cut)
						o, err := svc.PlaceOrder(ctx, 1, b.user, b.key)
						lost()
						got = append(got, result{o, err})
					}
				} else {
					var users []int64
					var keys []string
					for _, b := range buyers {
						users, keys = append(users, b.user), append(keys, b.key)
					}
					holder := hold(t, l, 1)
					answers := queue(t, ctx, svc, 1, users, keys)
					lost := cutReply(t, p, cut)
					letGo(t, holder)
					for _, ch := range answers {
						got = append(got, <-ch)
					}
					lost()
				}
				for i, b := range buyers {
					r := got[i]
					t.Logf("user %d, key %q: %v, replayed %v", b.user, b.key, r.err, r.order.Replayed)
					switch {
					case !committed:
						if !errors.Is(r.err, stock.ErrBusy) || errors.Is(r.err, stock.ErrOutcomeUnknown) {
							t.Errorf("user %d, reply to %s lost: %v; want ErrBusy", b.user, cut, r.err)
						}
					case b.key == "":
						if !errors.Is(r.err, stock.ErrOutcomeUnknown) || errors.Is(r.err, stock.ErrBusy) {
							t.Errorf("user %d, reply to COMMIT lost: %v; want ErrOutcomeUnknown, not ErrBusy", b.user, r.err)
						}
					case r.err != nil || !r.order.Replayed:
						t.Errorf("user %d with key %q, reply to COMMIT lost: %v; want the committed order, replayed", b.user, b.key, r.err)
					default:
						checkOrder(t, db, r.order, 1, b.user)
					}
				}
				want, told := 0, 0
				if committed {
					want, told = len(buyers), txs
				}
				if r := report(t, db); !r.OK() || r.Orders != int64(want) {
					t.Errorf("want %d orders:\n%s", want, r)
				}
				if n := cache.of(1); n != told {
					t.Errorf("the cache was told %d times, want %d: once per transaction that may have committed", n, told)
				}
			})
		}
	}
}

// A restock whose COMMIT reply is lost may have been made — here MySQL
// committed it — so it is neither acknowledged nor reported as not written:
// ErrChangeOutcomeUnknown, which is an ErrOutcomeUnknown and not an
// ErrBusy; the units are in MySQL once, this Service no longer refuses the
// product from its sold-out memory, and the SKU's lock is released. A
// restock whose UPDATE's reply is lost rolls back: ErrBusy, nothing written.
func TestLostRestockReplyIsOutcomeUnknownOnlyAfterCommit(t *testing.T) {
	ctx := context.Background()
	for _, cut := range []string{"COMMIT", "UPDATE products SET initial_stock"} {
		t.Run(cut, func(t *testing.T) {
			t.Parallel()
			committed := cut == "COMMIT"
			db := testenv.MySQL(t)
			// A lease that outlives the test: only a release frees the
			// SKU's lock before the test ends.
			_, l, rdb := lined(t, db, 1, 1, options{}, lock.RedisOptions{TTL: time.Minute})
			pool, p := throughProxy(t, db)
			svc := newService(pool, l, options{Settings: stock.Settings{Fencing: true}})
			if _, err := svc.PlaceOrder(ctx, 1, 1, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.PlaceOrder(ctx, 1, 2, ""); !errors.Is(err, stock.ErrSoldOut) {
				t.Fatalf("second buyer of one unit: %v; want ErrSoldOut", err)
			}

			lost := cutReply(t, p, cut)
			_, err := svc.ChangeProduct(ctx, 1, stock.Change{AddStock: units(5)})
			lost()
			t.Logf("restock, reply to %s lost: %v", cut, err)
			want := stock.Product{InitialStock: 1, Stock: 0}
			if committed {
				want = stock.Product{InitialStock: 6, Stock: 5}
				if !errors.Is(err, stock.ErrChangeOutcomeUnknown) || !errors.Is(err, stock.ErrOutcomeUnknown) || errors.Is(err, stock.ErrBusy) {
					t.Errorf("restock, reply to COMMIT lost: %v; want ErrChangeOutcomeUnknown (an ErrOutcomeUnknown), not ErrBusy", err)
				}
			} else if !errors.Is(err, stock.ErrBusy) || errors.Is(err, stock.ErrOutcomeUnknown) {
				t.Errorf("restock, reply to %s lost: %v; want ErrBusy", cut, err)
			}
			if got := product(t, db, 1); got.InitialStock != want.InitialStock || got.Stock != want.Stock {
				t.Errorf("MySQL after the restock: initial_stock %d, stock %d; want %d, %d", got.InitialStock, got.Stock, want.InitialStock, want.Stock)
			}
			if r := report(t, db); !r.OK() || r.Orders != 1 {
				t.Errorf("want 1 order:\n%s", r)
			}
			if n, err := rdb.Exists(ctx, l.Key(stock.LockKey(1))).Result(); err != nil || n != 0 {
				t.Errorf("lock key exists = %d (%v) after the restock returned; want it released", n, err)
			}
			if committed {
				// The units may be there: this Service asks MySQL, which
				// has them, instead of refusing from memory.
				if _, err := svc.PlaceOrder(ctx, 1, 3, ""); err != nil {
					t.Errorf("order right after the restock of unknown outcome: %v", err)
				}
				// A change of the window alone, which takes no lock, is
				// answered the same.
				ends := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
				lost := cutReply(t, p, "COMMIT")
				_, err := svc.ChangeProduct(ctx, 1, stock.Change{SaleEndsAt: stock.Bound{Set: true, At: &ends}})
				lost()
				if !errors.Is(err, stock.ErrChangeOutcomeUnknown) || errors.Is(err, stock.ErrBusy) {
					t.Errorf("window change, reply to COMMIT lost: %v; want ErrChangeOutcomeUnknown, not ErrBusy", err)
				}
				if got := product(t, db, 1); got.SaleEndsAt == nil || !got.SaleEndsAt.Equal(ends) {
					t.Errorf("MySQL after the window change: ends %v; want %v", got.SaleEndsAt, ends)
				}
			}
		})
	}
}
