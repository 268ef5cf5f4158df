package galeratest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"shop/internal/stock"
)

// Two seeds --if-empty at once through two different nodes seed once: the
// one ordered second fails certification on the epoch's row, runs again,
// finds the products of the first and says so. A user lock (GET_LOCK) is
// each node's own and would let both run. Rounds, since two seeds may
// also happen to run one after the other.
func TestSeedIfEmptyThroughTwoNodesSeedsOnce(t *testing.T) {
	c := galera(t)
	name := database(t, c)
	ctx := context.Background()
	catalogs := []*stock.Catalog{stock.NewCatalog(pool(t, c.NodeDSN(0, name))), stock.NewCatalog(pool(t, c.NodeDSN(1, name)))}
	// The checks read each node once it has applied what the cluster
	// committed before (wsrep_sync_wait): a node's reads may lag behind.
	checks := []*stock.Catalog{stock.NewCatalog(pool(t, synced(t, c.NodeDSN(0, name)))), stock.NewCatalog(pool(t, synced(t, c.NodeDSN(1, name))))}
	const products, rounds = 200, 4
	for round := range rounds {
		before, err := checks[0].Epoch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		errs := make([]error, len(catalogs))
		var wg sync.WaitGroup
		for i, catalog := range catalogs {
			wg.Go(func() { errs[i] = catalog.SeedWindowIfEmpty(ctx, products, 1, stock.Window{}) })
		}
		wg.Wait()
		seeded, left := 0, 0
		for i, err := range errs {
			var notEmpty *stock.NotEmptyError
			switch {
			case err == nil:
				seeded++
			case errors.As(err, &notEmpty) && notEmpty.Products == products:
				left++
			default:
				t.Errorf("round %d: the seed through node %d: %v; want seeded, or not seeded for %d products", round, i, err, products)
			}
		}
		if seeded != 1 || left != 1 {
			t.Errorf("round %d: %d seeded, %d not seeded; want one of each", round, seeded, left)
		}
		for i, catalog := range checks {
			ids, epoch, err := catalog.ProductIDsWithEpoch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != products || epoch != before+1 {
				t.Errorf("round %d, node %d: %d products, epoch %d; want %d, %d", round, i, len(ids), epoch, products, before+1)
			}
		}
		// Empty again, on both nodes, for the next round's seeds.
		if err := pool(t, c.DSN(name)).Exec("DELETE FROM products").Error; err != nil {
			t.Fatal(err)
		}
		for _, catalog := range checks {
			if ids, _, err := catalog.ProductIDsWithEpoch(ctx); err != nil || len(ids) != 0 {
				t.Fatalf("after the delete: %d products, %v", len(ids), err)
			}
		}
	}
}
