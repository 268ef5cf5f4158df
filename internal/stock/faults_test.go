package stock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"shop/internal/lock"
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
				svc, l, _ := lined(t, db, 1, 5, stock.Options{Batch: batch}, lock.RedisOptions{})
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
				if r := verify(t, db); !r.OK() || r.Orders != 0 || r.Stock != 5 {
					t.Errorf("a killed order changed the database:\n%s", r)
				}
			})
		}
	}
}
