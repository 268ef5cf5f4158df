package readiness_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/readiness"
)

// clock is a fake clock that a test moves by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fake is a dependency whose answer the test sets.
type fake struct{ down atomic.Bool }

func (f *fake) check(context.Context) error {
	if f.down.Load() {
		return errors.New("connection refused")
	}
	return nil
}

// world is a Tracker of two fake dependencies, mysql and redis, on a fake
// clock, with its metrics on a registry of its own.
type world struct {
	mysql, redis *fake
	clock        *clock
	reg          *prometheus.Registry
	tracker      *readiness.Tracker
}

func newWorld(t *testing.T, grace time.Duration) *world {
	t.Helper()
	w := &world{mysql: &fake{}, redis: &fake{}, clock: &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}, reg: prometheus.NewRegistry()}
	w.tracker = readiness.New([]readiness.Dependency{
		{Name: "mysql", Check: w.mysql.check},
		{Name: "redis", Check: w.redis.check},
	}, readiness.Options{Grace: grace, Registerer: w.reg, Now: w.clock.Now})
	return w
}

// probeFor probes once a second, as Run does, for d of the fake clock,
// and returns every answer of Failing in between that was not empty.
func (w *world) probeFor(d time.Duration) [][]string {
	var unready [][]string
	for end := w.clock.Now().Add(d); w.clock.Now().Before(end); {
		w.clock.Advance(time.Second)
		w.tracker.Probe(context.Background())
		if f := w.tracker.Failing(); len(f) > 0 {
			unready = append(unready, f)
		}
	}
	return unready
}

func (w *world) wantFailing(t *testing.T, when string, want ...string) {
	t.Helper()
	if got := w.tracker.Failing(); !slices.Equal(got, want) {
		t.Errorf("%s: failing %q; want %q", when, got, want)
	}
	ready := 0.0
	if len(want) == 0 {
		ready = 1
	}
	if got := gauge(t, w.reg, "shop_ready"); got != ready {
		t.Errorf("%s: shop_ready %v; want %v", when, got, ready)
	}
}

// gauge is the value of the gauge name with labels (name=value) in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var got []string
			for _, l := range m.GetLabel() {
				got = append(got, l.GetName()+"="+l.GetValue())
			}
			if slices.Equal(got, labels) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s} exported", name, strings.Join(labels, ","))
	return 0
}

func (w *world) wantUp(t *testing.T, when, dep string, want float64) {
	t.Helper()
	if got := gauge(t, w.reg, "shop_dependency_up", "dependency="+dep); got != want {
		t.Errorf("%s: shop_dependency_up{dependency=%q} %v; want %v", when, dep, got, want)
	}
}

// A replica is not ready until every dependency has answered once, whatever
// the grace: a replica that has never reached MySQL or Redis has nothing to
// ride out.
func TestNotReadyUntilEachDependencyAnswered(t *testing.T) {
	w := newWorld(t, 10*time.Second)
	w.wantFailing(t, "before any probe", "mysql", "redis")
	w.wantUp(t, "before any probe", "mysql", 0)

	w.redis.down.Store(true)
	if unready := w.probeFor(30 * time.Second); len(unready) != 30 || !slices.Equal(unready[29], []string{"redis"}) {
		t.Errorf("30 s with Redis never reached: unready %d times, last %q; want 30 times, redis", len(unready), unready[len(unready)-1])
	}
	w.wantUp(t, "MySQL answers, Redis never did", "mysql", 1)
	w.wantUp(t, "MySQL answers, Redis never did", "redis", 0)

	w.redis.down.Store(false)
	w.probeFor(time.Second)
	w.wantFailing(t, "both answered")
	w.wantUp(t, "both answered", "redis", 1)
}

// After both have answered, an outage shorter than the grace leaves the
// replica ready throughout; a longer one makes it unready, naming the
// dependency, once the grace is over; the answer that ends it makes it
// ready again. The dependency's own gauge shows each probe's answer.
func TestOutageAgainstGrace(t *testing.T) {
	const grace = 10 * time.Second
	for _, dep := range []string{"mysql", "redis"} {
		t.Run(dep, func(t *testing.T) {
			w := newWorld(t, grace)
			f := map[string]*fake{"mysql": w.mysql, "redis": w.redis}[dep]
			w.probeFor(time.Second)
			w.wantFailing(t, "both up")

			f.down.Store(true)
			if unready := w.probeFor(grace - time.Second); len(unready) > 0 {
				t.Errorf("a %s outage of %s with a grace of %s: unready %q", dep, grace-time.Second, grace, unready)
			}
			w.wantFailing(t, "inside the grace")
			w.wantUp(t, "inside the grace", dep, 0)
			f.down.Store(false)
			w.probeFor(time.Second)
			w.wantUp(t, "back", dep, 1)

			f.down.Store(true)
			w.probeFor(grace)
			w.wantFailing(t, "at the grace's end")
			w.probeFor(time.Second)
			w.wantFailing(t, "past the grace", dep)
			w.probeFor(time.Minute)
			w.wantFailing(t, "a minute past the grace", dep)

			f.down.Store(false)
			w.probeFor(time.Second)
			w.wantFailing(t, "back after a long outage")
		})
	}
}

// Failing is read against the clock, not the last probe: a dependency whose
// probes stop coming back (the probe loop stuck, say) does not stay ready
// past the grace on the strength of an old answer being its last.
func TestFailingAgesWithoutProbes(t *testing.T) {
	w := newWorld(t, 5*time.Second)
	w.probeFor(time.Second)
	w.redis.down.Store(true)
	w.probeFor(time.Second)
	w.wantFailing(t, "a second into the outage")
	w.clock.Advance(5 * time.Second)
	w.wantFailing(t, "6 s into the outage, no probe since", "redis")
}

// A grace of 0 is none: the first probe without an answer makes the
// replica unready.
func TestNoGrace(t *testing.T) {
	w := newWorld(t, 0)
	w.probeFor(time.Second)
	w.wantFailing(t, "both up")
	w.mysql.down.Store(true)
	w.probeFor(time.Second)
	w.wantFailing(t, "one probe of MySQL unanswered", "mysql")
}

// Each probe is bounded by the timeout, and the dependencies are probed side
// by side: a MySQL that hangs does not hold up Redis's answer.
func TestProbeIsBoundedAndSideBySide(t *testing.T) {
	hung := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	var redisProbes atomic.Int32
	tr := readiness.New([]readiness.Dependency{
		{Name: "mysql", Check: hung},
		{Name: "redis", Check: func(context.Context) error { redisProbes.Add(1); return nil }},
	}, readiness.Options{Timeout: 50 * time.Millisecond})
	start := time.Now()
	tr.Probe(context.Background())
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a probe with a hung dependency took %s; want about the 50ms timeout", took)
	}
	if got := tr.Failing(); !slices.Equal(got, []string{"mysql"}) || redisProbes.Load() != 1 {
		t.Errorf("failing %q after %d Redis probes; want mysql after 1", got, redisProbes.Load())
	}
}

// Run probes at once, then every interval, and returns when its context is
// done.
func TestRunProbesUntilStopped(t *testing.T) {
	var probes atomic.Int32
	tr := readiness.New([]readiness.Dependency{
		{Name: "redis", Check: func(context.Context) error { probes.Add(1); return nil }},
	}, readiness.Options{Interval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tr.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for probes.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d probes in 10 s at an interval of 10ms", probes.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if f := tr.Failing(); len(f) > 0 {
		t.Errorf("failing %q after %d answered probes", f, probes.Load())
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return once its context was done")
	}
}
