//go:build failpoints

package failpoint

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	gofail "go.etcd.io/gofail/runtime"
)

// The failpoint stops its holder for the time it is given, and the
// watchdogs' timers stay stopped until the holder's transaction has ended:
// a timer that runs out meanwhile fires only after.
func TestStaleWriteStopsTheWorld(t *testing.T) {
	h := New()
	if h.BeforeWrite(context.Background(), 1) != nil {
		t.Fatal("the failpoint fired while off")
	}
	if err := gofail.Enable("shopStaleWrite", "1*return(200)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gofail.Disable("shopStaleWrite") })

	watchdog := h.After(20 * time.Millisecond)
	start := time.Now()
	after := h.BeforeWrite(context.Background(), 1)
	if after == nil {
		t.Fatal("the failpoint did not fire")
	}
	if stopped := time.Since(start); stopped < 200*time.Millisecond {
		t.Errorf("the holder was stopped %s, want 200ms", stopped)
	}
	select {
	case <-watchdog:
		t.Fatal("a watchdog timer fired while the world was stopped")
	case <-time.After(50 * time.Millisecond):
	}
	after()
	select {
	case <-watchdog:
	case <-time.After(5 * time.Second):
		t.Fatal("the watchdog timer never fired after the holder's transaction ended")
	}
	if h.BeforeWrite(context.Background(), 2) != nil {
		t.Error("1*return fired twice")
	}
	// With the world running, timers are plain timers.
	select {
	case <-h.After(time.Millisecond):
	case <-time.After(5 * time.Second):
		t.Fatal("a timer did not fire")
	}
}

// shopRefundKill stops the refunder between its call and its record for
// the time it is given, once, and says so on stderr, where the demo waits
// for that line to kill the process.
func TestRefundKillStopsBetweenCallAndRecord(t *testing.T) {
	h := New()
	if err := gofail.Enable("shopRefundKill", "1*return(100)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gofail.Disable("shopRefundKill") })

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	start := time.Now()
	h.BetweenRefundCallAndRecord(context.Background(), "01JREFUND")
	stopped := time.Since(start)
	os.Stderr = stderr
	w.Close()
	said, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if stopped < 100*time.Millisecond {
		t.Errorf("the refunder was stopped %s, want 100ms", stopped)
	}
	if want := "failpoint shopRefundKill: the refunder stops for 100ms between the Refund API call for refund 01JREFUND and its record\n"; string(said) != want {
		t.Errorf("stderr = %q, want %q", said, want)
	}
	start = time.Now()
	h.BetweenRefundCallAndRecord(context.Background(), "01JREFUND")
	if again := time.Since(start); again >= 100*time.Millisecond {
		t.Errorf("1*return stopped the refunder twice (%s)", again)
	}
}
