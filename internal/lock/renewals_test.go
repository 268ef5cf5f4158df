package lock

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestRenewalsStartDueWatchdogs: one lock's renewals start each lease's
// watchdog once its first renewal is due, not before, whatever the order
// the leases were taken in, and never for a lease released before then.
func TestRenewalsStartDueWatchdogs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var rs renewals
	type first struct {
		i  int
		at time.Time
	}
	// Taken out of the order of their first renewals.
	intervals := []time.Duration{40 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond,
		20 * time.Millisecond, 50 * time.Millisecond}
	const released = 2
	firsts := make(chan first, len(intervals))
	leases := make([]*Lease, len(intervals))
	dues := make([]time.Time, len(intervals))
	for i, interval := range intervals {
		var once sync.Once
		leases[i] = newLease(ctx, "k", 0, func(context.Context) error { return nil })
		dues[i] = time.Now().Add(interval)
		leases[i].watch(&rs, nil, interval, time.Now().Add(time.Hour), func(ctx context.Context, _ time.Time) (time.Time, error) {
			once.Do(func() { firsts <- first{i, time.Now()} })
			return time.Now().Add(time.Hour), nil
		})
	}
	if err := leases[released].Release(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for range len(intervals) - 1 {
		select {
		case f := <-firsts:
			if f.i == released {
				t.Fatalf("lease %d, released before its first renewal, was renewed", f.i)
			}
			if f.at.Before(dues[f.i]) {
				t.Errorf("lease %d renewed %v before its first renewal was due", f.i, dues[f.i].Sub(f.at))
			}
			seen[f.i] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("first renewals seen: %v; want every lease but %d", seen, released)
		}
	}
	for i, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	select {
	case f := <-firsts:
		t.Fatalf("lease %d renewed again for the first time", f.i)
	default:
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.leases) != 0 {
		t.Errorf("%d leases left waiting for a first renewal after every release", len(rs.leases))
	}
}
