package admin_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/admin"
	"shop/internal/cache"
	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// productCache is a product cache of catalog on rdb under prefix, with its
// Bloom filter, closed when the test ends.
func productCache(t *testing.T, rdb redis.UniversalClient, prefix string, catalog *stock.Catalog) *cache.Products {
	t.Helper()
	mutex := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix + "mutex:", NoFencing: true})
	products := cache.New(cache.Deps{Redis: rdb, Source: catalog, Mutex: mutex}, cache.Settings{Prefix: prefix + "cache:", Bloom: true})
	t.Cleanup(products.Close)
	return products
}

// cancelAfterSeed seeds, then cancels the caller's context, as a client
// that gives up right after the commit does.
type cancelAfterSeed struct {
	catalog *stock.Catalog
	cancel  context.CancelFunc
}

func (c cancelAfterSeed) SeedWith(ctx context.Context, n, units int, o stock.SeedOptions) error {
	err := c.catalog.SeedWith(ctx, n, units, o)
	c.cancel()
	return err
}

// What follows a committed seed does not depend on the client staying: the
// Bloom filter is rebuilt even when the request's context ends right after
// the commit, so the new products are not refused as absent.
func TestSeedFollowUpOutlivesTheRequest(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	catalog := stock.NewCatalog(db.Gorm)
	ctx := context.Background()
	if err := catalog.Seed(ctx, 3, 1); err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	rdb, prefix := testenv.Redis(t)
	products := productCache(t, rdb, prefix, catalog)
	if _, err := products.Reset(ctx); err != nil { // the filter of products 1..3
		t.Fatal(err)
	}
	if _, err := products.Product(ctx, 9); !errors.Is(err, stock.ErrNotFound) {
		t.Fatalf("product 9 before the seed: %v, want not found", err)
	}

	adm := &admin.Admin{Catalog: cancelAfterSeed{catalog, cancel}, Cache: products, Restocks: notify.New(rdb, prefix)}
	warnings, err := adm.Seed(reqCtx, 10, 1, stock.SeedOptions{})
	if err != nil || len(warnings) != 0 {
		t.Errorf("seed whose client left after the commit: %q, %v; want no warning", warnings, err)
	}
	if p, err := products.Product(ctx, 9); err != nil || p.ID != 9 {
		t.Errorf("product 9 after the seed: %+v, %v; the Bloom filter was not rebuilt", p, err)
	}
}

// changerFunc is an admin.Changer that answers with a function.
type changerFunc func(ctx context.Context, sku int64, c stock.Change) (stock.Product, error)

func (f changerFunc) ChangeProduct(ctx context.Context, sku int64, c stock.Change) (stock.Product, error) {
	return f(ctx, sku, c)
}

// dropped records what an admin.Cache is told to drop, and resets
// nothing.
type dropped struct {
	mu   sync.Mutex
	skus []int64
}

func (d *dropped) Invalidate(_ context.Context, sku int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.skus = append(d.skus, sku)
	return nil
}

func (d *dropped) Reset(context.Context) (int, error) { return 0, errors.New("not reset") }

func (d *dropped) take() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.skus
	d.skus = nil
	return s
}

// A restock whose outcome is unknown is followed up as one that committed —
// announced to the other replicas, its cached product dropped — since it may
// have, and both are harmless if it did not; its error is returned all the
// same. A restock that failed is followed by nothing.
func TestChangeOfUnknownOutcomeIsFollowedUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	restocks := notify.New(rdb, prefix)
	heard := make(chan int64, 16)
	ready, stop := restocks.Listen(func(e notify.Event) {
		if e.Kind == notify.Raised {
			heard <- e.SKU
		}
	})
	t.Cleanup(func() { stop() })
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("never subscribed to the restocks")
	}
	if got := <-heard; got != notify.All {
		t.Fatalf("on subscribing: heard %d, want All", got)
	}
	next := func(t *testing.T) int64 {
		t.Helper()
		select {
		case sku := <-heard:
			return sku
		case <-time.After(10 * time.Second):
			t.Fatal("no announcement heard")
			return 0
		}
	}

	tests := []struct {
		name string
		err  error
		// told: whether the restock is announced and the cache dropped.
		told bool
	}{
		{"committed", nil, true},
		{"outcome unknown", fmt.Errorf("%w: sku 7: connection lost at COMMIT", stock.ErrChangeOutcomeUnknown), true},
		{"busy", fmt.Errorf("%w: sku 7: invalid connection", stock.ErrBusy), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := &dropped{}
			changer := changerFunc(func(context.Context, int64, stock.Change) (stock.Product, error) {
				if tt.err != nil {
					return stock.Product{}, tt.err
				}
				return stock.Product{ID: 7, Stock: 5, InitialStock: 5}, nil
			})
			adm := &admin.Admin{Changer: changer, Cache: cache, Restocks: restocks}
			p, warnings, err := adm.ChangeProduct(ctx, 7, stock.Change{AddStock: new(5)})
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) || len(warnings) != 0 || (err == nil) != (p.ID == 7) {
				t.Errorf("ChangeProduct: %+v, %q, %v; want the changer's answer, %v", p, warnings, err, tt.err)
			}
			// A marker announced after the call: heard first, it shows
			// that the call announced nothing.
			if !tt.told {
				if err := restocks.Announce(ctx, 99); err != nil {
					t.Fatal(err)
				}
			}
			want, wantDropped := int64(7), []int64{7}
			if !tt.told {
				want, wantDropped = 99, nil
			}
			if got := next(t); got != want {
				t.Errorf("heard sku %d, want %d", got, want)
			}
			if got := cache.take(); !slices.Equal(got, wantDropped) {
				t.Errorf("cache entries dropped: %v, want %v", got, wantDropped)
			}
		})
	}
}
