//go:build failpoints

package failpoint

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	gofail "go.etcd.io/gofail/runtime"
)

// gofail registers each failpoint name once per process; replicas run in
// one test process share them.
var (
	register   sync.Once
	staleWrite *gofail.Failpoint
	sweepStall *gofail.Failpoint
	refundKill *gofail.Failpoint
	eventKill  *gofail.Failpoint
	stopped    = &world{}
)

// New returns the hooks of this binary: gofail's failpoints.
func New() Hooks {
	register.Do(func() {
		staleWrite = gofail.NewFailpoint("shopStaleWrite")
		sweepStall = gofail.NewFailpoint("shopSweepStall")
		refundKill = gofail.NewFailpoint("shopRefundKill")
		eventKill = gofail.NewFailpoint("shopEventKill")
	})
	return Hooks{BeforeWrite: beforeWrite, BeforeReturn: beforeReturn, After: stopped.after,
		BetweenRefundCallAndRecord: betweenRefundCallAndRecord, BetweenEventPostAndMark: betweenEventPostAndMark}
}

// betweenEventPostAndMark is the shopEventKill failpoint.
func betweenEventPostAndMark(ctx context.Context, eventID string) {
	d, ok := stop(eventKill)
	if !ok {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint shopEventKill: the relay stops for %s between the POST of event %s and its mark\n", d, eventID)
	time.Sleep(d)
}

// beforeReturn is the shopSweepStall failpoint.
func beforeReturn(ctx context.Context, sku int64) {
	d, ok := stop(sweepStall)
	if !ok {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint shopSweepStall: the sweep of sku %d stops for %s before its COMMIT\n", sku, d)
	time.Sleep(d)
}

// betweenRefundCallAndRecord is the shopRefundKill failpoint.
func betweenRefundCallAndRecord(ctx context.Context, refundID string) {
	d, ok := stop(refundKill)
	if !ok {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint shopRefundKill: the refunder stops for %s between the Refund API call for refund %s and its record\n", d, refundID)
	time.Sleep(d)
}

// beforeWrite is the shopStaleWrite failpoint: while it is off it costs
// one read of the failpoint's terms.
func beforeWrite(ctx context.Context, sku int64) func() {
	d, ok := stop(staleWrite)
	if !ok {
		return nil
	}
	fmt.Fprintf(os.Stderr, "failpoint shopStaleWrite: the holder of sku %d stops for %s between its read and its write\n", sku, d)
	stopped.freeze()
	time.Sleep(d) // a stopped process does not notice its context either
	return stopped.thaw
}

// stop reports whether fp fires, and for how long it stops its caller: its
// terms' value, milliseconds (int) or a duration (string).
func stop(fp *gofail.Failpoint) (time.Duration, bool) {
	v, err := fp.Acquire()
	if err != nil {
		return 0, false
	}
	d, err := duration(v)
	if err != nil {
		fp.BadType(v, "milliseconds (int) or a duration (string)")
		return 0, false
	}
	return d, true
}

func duration(v any) (time.Duration, error) {
	switch v := v.(type) {
	case int:
		return time.Duration(v) * time.Millisecond, nil
	case string:
		return time.ParseDuration(v)
	}
	return 0, fmt.Errorf("bad value %v", v)
}

// world is the part of the process a stop freezes: the timers lease
// watchdogs sleep on. A timer that runs out while the world is frozen fires
// only when it thaws, as it would in a stopped process.
type world struct {
	mu     sync.Mutex
	frozen chan struct{} // closed when the world thaws; nil while it runs
}

func (w *world) freeze() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.frozen == nil {
		w.frozen = make(chan struct{})
	}
}

func (w *world) thaw() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.frozen != nil {
		close(w.frozen)
		w.frozen = nil
	}
}

// after is time.After that does not fire while the world is frozen.
func (w *world) after(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	time.AfterFunc(d, func() {
		w.mu.Lock()
		frozen := w.frozen
		w.mu.Unlock()
		if frozen != nil {
			<-frozen
		}
		ch <- time.Now()
	})
	return ch
}
