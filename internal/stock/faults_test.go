package stock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// An order whose statement or connection is KILLed while its transaction
// waits for the product's row is refused as busy and leaves nothing behind,
// alone and as a batch. MariaDB answers KILL QUERY with 1317; of a KILLed
// connection the driver sees only the socket closing (MySQL would send 1053
// first).
func TestKilledOrderIsBusy(t *testing.T) {
	for _, kill := range []string{"KILL QUERY", "KILL CONNECTION"} {
		for _, batch := range []int{1, 0} {
			t.Run(fmt.Sprintf("%s,batch=%d", kill, batch), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := testenv.MySQL(t)
				svc, l, _ := lined(t, db, 1, 5, options{Settings: stock.Settings{Batch: batch}}, lock.RedisOptions{})
				row := db.Gorm.Begin()
				defer row.Rollback()
				if err := row.Exec("SELECT id FROM products WHERE id = 1 FOR UPDATE").Error; err != nil {
					t.Fatal(err)
				}
				var answers []<-chan result
				if batch == 1 {
					answers = append(answers, place(ctx, svc, 1, 7, ""))
				} else {
					holder := hold(t, l, 1)
					answers = queue(t, ctx, svc, 1, []int64{7, 8, 9}, nil)
					letGo(t, holder)
				}
				id := waitForLockWait(t, db, nil)
				if err := db.Gorm.Exec(kill+" ?", id).Error; err != nil {
					t.Fatal(err)
				}
				for i, ch := range answers {
					r := <-ch
					t.Logf("buyer %d: %v", i+1, r.err)
					if !errors.Is(r.err, stock.ErrBusy) {
						t.Errorf("buyer %d after %s: %v; want ErrBusy", i+1, kill, r.err)
					}
				}
				if err := row.Rollback().Error; err != nil {
					t.Fatal(err)
				}
				if r := report(t, db); !r.OK() || r.Orders != 0 || r.Stock != 5 {
					t.Errorf("a killed order changed the database:\n%s", r)
				}
			})
		}
	}
}

// With MySQL down, every Catalog call is busy (503), seeding included.
func TestCatalogMySQLDownIsBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close() // nothing listens there now
	g, err := mysqldb.Open("root@tcp("+down+")/shop", 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := g.DB(); err == nil {
			sqlDB.Close()
		}
	})
	c := stock.NewCatalog(g)
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		call func() error
	}{
		{"Seed", func() error { return c.Seed(ctx, 3, 1) }},
		{"Product", func() error { _, err := c.Product(ctx, 1); return err }},
		{"Stock", func() error { _, err := c.Stock(ctx, 1); return err }},
		{"ProductIDs", func() error { _, err := c.ProductIDs(ctx); return err }},
	} {
		if err := tt.call(); !errors.Is(err, stock.ErrBusy) {
			t.Errorf("%s with MySQL down: %v, want ErrBusy", tt.name, err)
		}
	}
}
