package lock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"shop/internal/lock"
)

// localFamily is the Local lock as the conformance suite runs it. Every
// handle of a world is the one lock: it excludes nobody in another
// process.
func localFamily() family {
	return family{name: "local", claims: []property{exclusion, boundedWaits, stillEndsWait}, woken: true,
		servers: func(*testing.T) func(*testing.T, settings) world {
			return func(_ *testing.T, opt settings) world {
				wait := opt.Wait
				if wait == 0 {
					wait = 2 * time.Second
				}
				l := lock.NewLocal(wait)
				return func() *handle { return &handle{locker: l} }
			}
		}}
}

// noneFamily is None as the conformance suite runs it: it claims nothing.
func noneFamily() family {
	return family{name: "none",
		servers: func(*testing.T) func(*testing.T, settings) world {
			return func(*testing.T, settings) world {
				return func() *handle { return &handle{locker: lock.None{}} }
			}
		}}
}

// A key's entry lives only while someone holds or waits for it: after
// holders of two keys have come and gone, and a waiter has given up, the
// map is empty.
func TestLocalForgetsKeysNobodyHolds(t *testing.T) {
	t.Parallel()
	l := lock.NewLocal(10 * time.Second)
	var wg sync.WaitGroup
	for i := range 200 {
		key := []string{"a", "b"}[i%2]
		wg.Go(func() {
			lease, err := l.Obtain(context.Background(), key)
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Microsecond)
			if err := lease.Release(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := l.Len(); n != 0 {
		t.Errorf("%d keys left in the map after every release: entries leak", n)
	}

	short := lock.NewLocal(50 * time.Millisecond)
	holder, err := short.Obtain(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := short.Obtain(context.Background(), "k"); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("err = %v, want ErrNotObtained", err)
	}
	if n := short.Len(); n != 1 {
		t.Errorf("Len = %d while one key is held and its waiter gave up, want 1", n)
	}
	if err := holder.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := short.Len(); n != 0 {
		t.Errorf("Len = %d after release, want 0", n)
	}
}

func TestNoneExcludesNobody(t *testing.T) {
	t.Parallel()
	var l lock.None
	a, _ := l.Obtain(context.Background(), "k")
	b, err := l.Obtain(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if a.Context().Err() != nil || b.Context().Err() != nil {
		t.Error("lease contexts done before release")
	}
	_ = b.Release(context.Background())
	if b.Context().Err() == nil {
		t.Error("lease context still live after release")
	}
}
