package lock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/lock"
)

func TestLocalMutualExclusion(t *testing.T) {
	l := lock.NewLocal(10 * time.Second)
	var (
		inside atomic.Int32
		bad    atomic.Bool
		wg     sync.WaitGroup
	)
	for i := range 200 {
		key := []string{"a", "b"}[i%2]
		wg.Go(func() {
			lease, err := l.Obtain(context.Background(), key)
			if err != nil {
				t.Error(err)
				return
			}
			if key == "a" && inside.Add(1) != 1 {
				bad.Store(true)
			}
			time.Sleep(100 * time.Microsecond)
			if key == "a" {
				inside.Add(-1)
			}
			if err := lease.Release(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if bad.Load() {
		t.Error("two holders of one key at once")
	}
	if n := l.Len(); n != 0 {
		t.Errorf("%d keys left in the map after every release: entries leak", n)
	}
}

func TestLocalWaitIsBounded(t *testing.T) {
	l := lock.NewLocal(50 * time.Millisecond)
	holder, err := l.Obtain(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Obtain(context.Background(), "k"); !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrNotObtained joined with DeadlineExceeded", err)
	}
	if n := l.Len(); n != 1 {
		t.Errorf("Len = %d while one key is held, want 1", n)
	}
	if err := holder.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := l.Len(); n != 0 {
		t.Errorf("Len = %d after release, want 0", n)
	}
	if holder.Fence() != 0 {
		t.Errorf("local lease fence = %d, want 0 (no tokens)", holder.Fence())
	}
}

func TestNoneExcludesNobody(t *testing.T) {
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
