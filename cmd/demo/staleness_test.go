package main

import (
	"strings"
	"testing"
	"time"
)

func TestStalenessLine(t *testing.T) {
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	r := stalenessResult{Orders: 2, Own: 0, StaleFirst: 1, Missed: 0, Others: []time.Duration{ms(3), ms(1), ms(2), ms(9)},
		Verify: verifyReport{OK: true}}
	got := stalenessLine(r)
	for _, want := range []string{"2 orders", "stale right after its 201 0 times", "1 of 4 first reads were stale",
		"3ms after its 201 at p50", "9ms at p99", "9ms at most", "0 not within 3s", "verify ok"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in %q", want, got)
		}
	}
	if stalenessLine(stalenessResult{}) != "" {
		t.Error("a probe that did not run has a line")
	}
}
