// Package readiness decides whether a replica can serve: whether each of
// its dependencies (MySQL, Redis) has answered since the replica started,
// and has not been silent for longer than a grace period since.
//
// The dependencies are probed in the background, at a fixed pace, and the
// answer to "ready?" is read from memory. A readiness endpoint asked by
// every balancer, every kubelet and, under a flood, by anyone, then costs
// nothing and sends nothing to MySQL or Redis, and how often a dependency
// is probed does not depend on how often the endpoint is asked.
//
// The grace is there because the dependencies are shared: a blip of MySQL
// or Redis reaches every replica at the same instant. Were each replica to
// declare itself unready at the first failed probe, a few seconds' blip
// would take every replica out of its balancer at once — a Kubernetes
// Service left without endpoints refuses every request, where the replicas
// could have answered most of them (product pages from the cache, orders
// after a retry) — and would count every replica as unhealthy for a node
// drain's disruption budget. A dependency that stays silent past the grace
// is an outage, and the replica then says so.
package readiness

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Options.
const (
	// DefaultInterval is how often every dependency is probed.
	DefaultInterval = time.Second
	// DefaultTimeout bounds each probe: a dependency that has not answered
	// within it did not answer.
	DefaultTimeout = time.Second
)

// Check reports whether a dependency answers; an error is no answer.
type Check func(ctx context.Context) error

// Dependency is a dependency to probe: its name, which /readyz and the
// metrics show, and its check.
type Dependency struct {
	Name  string
	Check Check
}

// Options tune a Tracker. The zero value probes every DefaultInterval
// with DefaultTimeout and no grace.
type Options struct {
	// Grace is how long a dependency that has answered once may then go
	// without answering before the replica is not ready; 0 is none.
	Grace time.Duration
	// Interval is how often Run probes; Timeout bounds each probe.
	Interval time.Duration
	Timeout  time.Duration
	// Registerer, when not nil, receives shop_dependency_up and shop_ready.
	Registerer prometheus.Registerer
	// Logger receives a line when a dependency stops or starts answering
	// and when the replica becomes ready or unready; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil is time.Now. Tests set a fake one.
	Now func() time.Time
}

// Tracker probes a replica's dependencies and says which keep it from
// serving. Its methods are safe for concurrent use. The zero value is not
// usable; use New.
type Tracker struct {
	deps     []Dependency
	grace    time.Duration
	interval time.Duration
	timeout  time.Duration
	now      func() time.Time
	log      *slog.Logger
	up       *prometheus.GaugeVec

	mu     sync.Mutex
	states []state
	// failing is what Failing answered after the last probe, for the
	// log's transitions.
	failing []string
}

// state is what the probes have learnt of one dependency.
type state struct {
	// probed is set once a probe has ended, answered is set once the
	// dependency has answered one.
	probed, answered bool
	// up is the last probe's answer; lastAnswer the time of the latest
	// answer.
	up         bool
	lastAnswer time.Time
}

// New returns a Tracker of deps that has probed nothing yet: every
// dependency counts as failing until it answers (Probe, Run).
func New(deps []Dependency, o Options) *Tracker {
	t := &Tracker{
		deps:     slices.Clone(deps),
		grace:    o.Grace,
		interval: orDefault(o.Interval, DefaultInterval),
		timeout:  orDefault(o.Timeout, DefaultTimeout),
		now:      o.Now,
		log:      o.Logger,
		states:   make([]state, len(deps)),
	}
	if t.now == nil {
		t.now = time.Now
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	t.up = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shop_dependency_up",
		Help: "1 if the dependency answered this replica's last readiness probe (every second, bounded by 1s), else 0.",
	}, []string{"dependency"})
	for _, d := range deps {
		t.up.WithLabelValues(d.Name).Set(0)
	}
	t.failing = t.Failing()
	if o.Registerer != nil {
		o.Registerer.MustRegister(t.up, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_ready",
			Help: "1 while every dependency has answered since start-up and none has been silent longer than SHOP_READY_GRACE, else 0; /readyz also answers 503 once the replica drains.",
		}, func() float64 { return boolFloat(len(t.Failing()) == 0) }))
	}
	return t
}

// orDefault is d, or def when d is not positive.
func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Failing returns the names of the dependencies that keep the replica from
// serving now, in the order given to New: those that have never answered,
// and those whose latest answer is older than the grace while the last
// probe got none. Empty means ready.
func (t *Tracker) Failing() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failingLocked(t.now())
}

func (t *Tracker) failingLocked(now time.Time) []string {
	var failing []string
	for i, s := range t.states {
		if !s.answered || (!s.up && now.Sub(s.lastAnswer) > t.grace) {
			failing = append(failing, t.deps[i].Name)
		}
	}
	return failing
}

// Probe checks every dependency once, side by side, each within the
// timeout, and records the answers. It returns when every check has.
func (t *Tracker) Probe(ctx context.Context) {
	errs := make([]error, len(t.deps))
	var wg sync.WaitGroup
	for i, d := range t.deps {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, t.timeout)
			defer cancel()
			errs[i] = d.Check(ctx)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // stopped: the probes' failures are ours, not the dependencies'
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	for i, d := range t.deps {
		s := &t.states[i]
		if err := errs[i]; err != nil {
			if !s.probed || s.up {
				t.log.WarnContext(ctx, "readiness: dependency does not answer", "dependency", d.Name, "err", err, "grace", t.grace.String())
			}
			s.up = false
		} else {
			if s.answered && !s.up {
				t.log.InfoContext(ctx, "readiness: dependency answers again", "dependency", d.Name,
					"silent", now.Sub(s.lastAnswer).Round(time.Millisecond).String())
			}
			s.answered, s.up, s.lastAnswer = true, true, now
		}
		s.probed = true
		t.up.WithLabelValues(d.Name).Set(boolFloat(s.up))
	}
	failing := t.failingLocked(now)
	switch {
	case len(failing) > 0 && !slices.Equal(failing, t.failing):
		t.log.WarnContext(ctx, "readiness: not ready", "failing", failing)
	case len(failing) == 0 && len(t.failing) > 0:
		t.log.InfoContext(ctx, "readiness: ready")
	}
	t.failing = failing
}

// boolFloat is a gauge's value for b.
func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Run probes at once, then every interval, until ctx is done. A probe that
// is still running when the next is due delays it: probes of one
// dependency never overlap.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for {
		t.Probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
