package ratelimit

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestLocalForgetsFullAllowances: keys whose allowance is full again are
// dropped once there are many, so that a flood of addresses seen once
// does not grow the map for ever.
func TestLocalForgetsFullAllowances(t *testing.T) {
	var l Local
	// A microsecond a request: each key's allowance is full again as soon
	// as the clock moves.
	lim := Limit{Rate: 1, Burst: 1, Period: time.Microsecond}
	for i := range 3 * minPrune {
		if wait, _ := l.Take(context.Background(), strconv.Itoa(i), lim); wait != 0 {
			t.Fatalf("key %d: wait %v; want to go on", i, wait)
		}
		time.Sleep(time.Microsecond)
	}
	if n := len(l.tats); n >= 2*minPrune {
		t.Errorf("%d keys kept after %d of full allowance; want fewer than %d", n, 3*minPrune, 2*minPrune)
	}
}
