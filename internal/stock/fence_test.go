package stock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// raisingLock is the Redis lock with a RaiseFence that records its calls
// and raises the counter as stock.Locker.RaiseFence asks (never lower), or fails
// when told to.
type raisingLock struct {
	*lock.Redis
	rdb  *redis.Client
	fail error

	mu     sync.Mutex
	raised []raise
}

type raise struct {
	key     string
	atLeast int64
}

var _ stock.Locker = (*raisingLock)(nil)

func (r *raisingLock) RaiseFence(ctx context.Context, key string, atLeast int64) error {
	r.mu.Lock()
	r.raised = append(r.raised, raise{key, atLeast})
	r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	return r.rdb.Eval(ctx, `if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
		redis.call('SET', KEYS[1], ARGV[1]) end return 0`, []string{r.FenceKey(key)}, atLeast).Err()
}

func (r *raisingLock) calls() []raise {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]raise(nil), r.raised...)
}

// A row fenced above every token the lock gives — its counter fell behind,
// as when a Redis restarts empty with a clock behind the one that counted
// before — refuses the holder's write: the order is busy and stale, nothing
// is written, and the lock is told the row's fence, so that the next
// holder's token is above it and the SKU sells again. A lock that fails to
// raise changes nothing in the order's answer.
func TestStaleFenceRaisesCounter(t *testing.T) {
	const rowFence = int64(1) << 52 // above a counter started from the clock (µs), within a double's integers (Lua)
	for _, batch := range []int{1, 0} {
		for _, fail := range []bool{false, true} {
			t.Run(fmt.Sprintf("batch=%d,raise fails=%v", batch, fail), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := testenv.MySQL(t)
				_, l, rdb := lined(t, db, 1, 5, options{}, lock.RedisOptions{})
				locker := &raisingLock{Redis: l, rdb: rdb}
				if fail {
					locker.fail = errors.New("redis: connection refused")
				}
				logs := &testenv.Log{}
				svc := newService(db.Open(t), locker, options{Settings: stock.Settings{Batch: batch, Fencing: true}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
				if err := db.Gorm.Exec("UPDATE products SET fence = ? WHERE id = 1", rowFence).Error; err != nil {
					t.Fatal(err)
				}

				var errs []error
				if batch == 1 {
					_, err := svc.PlaceOrder(ctx, 1, 7, "")
					errs = append(errs, err)
				} else {
					holder := hold(t, l, 1)
					answers := queue(t, ctx, svc, 1, []int64{7, 8}, nil)
					letGo(t, holder)
					for _, ch := range answers {
						errs = append(errs, (<-ch).err)
					}
				}
				for i, err := range errs {
					if !errors.Is(err, stock.ErrBusy) || !errors.Is(err, stock.ErrStaleFence) {
						t.Errorf("buyer %d, row fenced at %d: %v; want ErrBusy and ErrStaleFence", i+1, rowFence, err)
					}
				}
				if r := report(t, db); r.Orders != 0 || r.Stock != 5 {
					t.Errorf("a refused write changed the database:\n%s", r)
				}
				want := []raise{{stock.LockKey(1), rowFence}}
				if got := locker.calls(); len(got) != 1 || got[0] != want[0] {
					t.Fatalf("RaiseFence calls %v, want %v", got, want)
				}
				if logged := strings.Contains(logs.String(), "raise fencing counter"); logged != fail {
					t.Errorf("failed raise logged: %v, want %v; log:\n%s", logged, fail, logs)
				}

				o, err := svc.PlaceOrder(ctx, 1, 9, "")
				switch {
				case fail && !errors.Is(err, stock.ErrStaleFence):
					t.Errorf("next order, counter not raised: %v; want ErrStaleFence again", err)
				case !fail && err != nil:
					t.Errorf("next order, counter raised: %v; want it placed", err)
				case !fail && o.Fence <= rowFence:
					t.Errorf("next order's fence %d, want above the row's %d", o.Fence, rowFence)
				}
			})
		}
	}
}
