package lockbench_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	goredisv9 "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// Fairness: every lock gets the same TTL, and gives up after the same wait.
//   - ours: RedisOptions{TTL, Wait, MinBackoff, MaxBackoff}: exponential
//     backoff 2ms…100ms with full jitter, bounded by Wait.
//   - bsm/redislock: redislock.ExponentialBackoff(minBackoff, maxBackoff) —
//     the same bounds, but no jitter (4, 8, 16, … ms) — under a context
//     deadline of Wait. The strategy keeps a counter, so each Obtain gets a
//     fresh one.
//   - redsync: its defaults (retry delay drawn uniformly from 50–250 ms, no
//     backoff) except WithExpiry(TTL) and WithTries(Wait/50ms+1), enough
//     tries that the context deadline of Wait, not the try count, ends the
//     wait. Its delays cannot go below 50 ms, so a waiter polls far less
//     often than the other two.
//
// Ours does more per acquisition than either peer: its obtain script draws a
// fencing token (TIME and a SET … GET of the key's counter) after its SET NX,
// and each lease has a watchdog, started by its lock's one timer when its
// first renewal is due (neither peer renews by itself). The leases here are far shorter than
// TTL/3, so no renewal is ever sent.
const (
	ttl        = 5 * time.Second
	wait       = 2 * time.Second
	minBackoff = 2 * time.Millisecond
	maxBackoff = 100 * time.Millisecond

	hold     = time.Millisecond // how long a holder keeps the lock
	workers  = 64               // goroutines in the contended scenarios
	manyKeys = 5000             // keys in the "many keys" scenario
	poolSize = workers + 32     // connections of each contender's client

	uncontendedFor    = 300 * time.Millisecond
	uncontendedRounds = 15 // interleaved over the contenders; the median round is shown
	contendedFor      = 3 * time.Second
)

// ratioOf picks the contender the "÷ best peer" line is about: the first
// whose name starts with it. Peers are the contenders whose names do not
// start with oursFamily.
const (
	ratioOf    = "ours"
	oursFamily = "ours"
)

// contenders are run in this order, each on its own client. "ours" is the
// lock as the service runs it, waking waiters on release; "ours, backoff
// only" is the same lock without wake-on-release, for the before and after.
// (Pub/sub traffic does not pass the round-trip hook; commandstats counts
// PUBLISH inside the release script and the SUBSCRIBE.)
var contenders = []contender{
	{name: "ours", new: oursWith(func(c *redis.Client, o *lock.RedisOptions) { o.Subscriber = c })},
	{name: "ours, backoff only", new: oursWith(nil)},
	{name: "redsync", new: newRedsync},
	{name: "bsm/redislock", new: newBSM},
}

// floor is no lock at all, only the two round trips every lock here needs
// at the least (SET NX PX, DEL): the uncontended rows' lower bound. It is
// not a peer.
var floor = contender{name: "(floor: SET NX PX + DEL)", new: func(c *redis.Client, prefix string) locker { return floorLocker{c, prefix} }}

type floorLocker struct {
	c      *redis.Client
	prefix string
}

func (f floorLocker) obtain(ctx context.Context, key string) (func(context.Context) error, error) {
	k := f.prefix + key
	if ok, err := f.c.SetNX(ctx, k, "x", ttl).Result(); err != nil || !ok {
		return nil, fmt.Errorf("floor: SET NX %s = %v, %v", k, ok, err)
	}
	return func(ctx context.Context) error { return f.c.Del(ctx, k).Err() }, nil
}

type contender struct {
	name string
	// new makes a Redis lock on c, a client of the contender's own.
	new func(c *redis.Client, prefix string) locker
	// family, for a lock on another kind of server (see families), sets
	// up its servers and client once and returns what makes its locks and
	// what counts its traffic. Its rows are not peers of ours: the lines
	// "÷ ours" compare them with our Redis lock instead.
	family func(e *bench) (func(prefix string) locker, meter)
}

// rig is a contender set up: its locks' maker and its meter.
type rig struct {
	newLocker func(prefix string) locker
	m         meter
}

func (e *bench) rig(c contender) rig {
	if c.family != nil {
		newLocker, m := c.family(e)
		return rig{newLocker, m}
	}
	cl := e.newClient()
	return rig{func(prefix string) locker { return c.new(cl.c, prefix) }, &redisMeter{e: e, cl: cl}}
}

// locker is what the harness drives. obtain waits at most the contender's
// wait; when it gives up it returns an error wrapping errTimeout. Any other
// error is a failure of the benchmark.
type locker interface {
	obtain(ctx context.Context, key string) (release func(context.Context) error, err error)
}

var errTimeout = errors.New("timed out waiting for the lock")

// ours: shop/internal/lock.

// oursWith returns the constructor of our lock with the common options,
// changed by tweak (if not nil).
func oursWith(tweak func(*redis.Client, *lock.RedisOptions)) func(*redis.Client, string) locker {
	return func(c *redis.Client, prefix string) locker {
		opt := lock.RedisOptions{Prefix: prefix, TTL: ttl, Wait: wait, MinBackoff: minBackoff, MaxBackoff: maxBackoff}
		if tweak != nil {
			tweak(c, &opt)
		}
		return leaseLocker{lock.NewRedis(c, opt)}
	}
}

// redsync, on one Redis through its go-redis v9 pool.

type redsyncLocker struct {
	rs     *redsync.Redsync
	prefix string
	opts   []redsync.Option
}

func newRedsync(c *redis.Client, prefix string) locker {
	return &redsyncLocker{
		rs:     redsync.New(goredisv9.NewPool(c)),
		prefix: prefix,
		opts: []redsync.Option{
			redsync.WithExpiry(ttl),
			// The smallest default delay is 50 ms.
			redsync.WithTries(int(wait/(50*time.Millisecond)) + 1),
		},
	}
}

func (r *redsyncLocker) obtain(ctx context.Context, key string) (func(context.Context) error, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	// A Mutex keeps the value of its current holding, so it is one per
	// acquisition, as redsync's examples use it.
	m := r.rs.NewMutex(r.prefix+key, r.opts...)
	if err := m.LockContext(ctx); err != nil {
		var taken *redsync.ErrTaken
		if ctx.Err() != nil || errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
			return nil, fmt.Errorf("%w: %w", errTimeout, err)
		}
		return nil, err
	}
	return func(ctx context.Context) error {
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: unlock: not held")
		}
		return err
	}, nil
}

// bsm/redislock.

type bsmLocker struct {
	c      *redislock.Client
	prefix string
}

func newBSM(c *redis.Client, prefix string) locker {
	return bsmLocker{redislock.New(c), prefix}
}

func (l bsmLocker) obtain(ctx context.Context, key string) (func(context.Context) error, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	opt := &redislock.Options{RetryStrategy: redislock.ExponentialBackoff(minBackoff, maxBackoff)}
	lk, err := l.c.Obtain(ctx, l.prefix+key, ttl, opt)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, redislock.ErrNotObtained) {
			return nil, fmt.Errorf("%w: %w", errTimeout, err)
		}
		return nil, err
	}
	return lk.Release, nil
}

// row is one line of the table. Fields that do not apply are NaN.
type row struct {
	scenario, name string
	family         bool    // a lock on another kind of server: not a peer
	acqPerSec      float64 // acquisitions per second (uncontended: 1e9/ns per op)
	nsPerOp        float64 // uncontended: one obtain+release
	allocsPerAcq   float64 // all mallocs of the process during the run ÷ acquisitions (1 of them the harness's release func value, for every lock)
	p50, p99       float64 // wait in obtain of the successful obtains, ns
	fails          int64   // obtains that gave up (timeouts)
	again          float64 // contended: % of acquisitions by the key's previous holder
	cmdsPerAcq     float64 // INFO commandstats, Lua-internal calls included
	tripsPerAcq    float64 // client round trips (hook)
	mix            string  // commandstats per acquisition, by command
}

// run is what one measured run hands back.
type run struct {
	acqs, inWindow, fails, errs, overlaps, relErrs int64
	again                                          int64 // acquisitions by the key's previous holder
	waits                                          []time.Duration
	firstErr, firstRelErr                          error
	window                                         time.Duration
}

// bench holds what every scenario shares.
type bench struct {
	b     *testing.B
	ctx   context.Context
	admin *redis.Client // the measurement's own commands; not counted
	addr  string
}

// client is a contender's own client with its round-trip counter.
type client struct {
	c    *redis.Client
	hook *testenv.RoundTrips
}

func (e *bench) newClient() client {
	c := redis.NewClient(&redis.Options{Addr: e.addr, PoolSize: poolSize})
	e.b.Cleanup(func() { c.Close() })
	// Dial the whole pool now, not inside a measured run.
	conns := make([]*redis.Conn, poolSize)
	for i := range conns {
		conns[i] = c.Conn()
		if err := conns[i].Ping(e.ctx).Err(); err != nil {
			e.b.Fatalf("redis: %v", err)
		}
	}
	for _, cn := range conns {
		cn.Close()
	}
	h := &testenv.RoundTrips{}
	c.AddHook(h)
	return client{c, h}
}

// meter counts what one contender's lock sent and what its server ran, for
// the per-acquisition columns.
type meter interface {
	// start begins a measured run.
	start()
	// read returns the round trips the lock's client made since start, and
	// the commands its server ran, by name.
	read() (trips int64, cmds map[string]int64)
}

// redisMeter counts a Redis lock's round trips with a hook on its client,
// and its server's commands with INFO commandstats (which the harness's own
// INFO and CONFIG are left out of).
type redisMeter struct {
	e      *bench
	cl     client
	trips0 int64
}

func (m *redisMeter) start() {
	if err := m.e.admin.ConfigResetStat(m.e.ctx).Err(); err != nil {
		m.e.b.Fatalf("CONFIG RESETSTAT: %v", err)
	}
	m.trips0 = m.cl.hook.N()
}

func (m *redisMeter) read() (int64, map[string]int64) {
	return m.cl.hook.N() - m.trips0, commandStats(m.e.b, m.e.ctx, m.e.admin)
}

// measure runs body between two snapshots of m and of mallocs and fills the
// per-acquisition columns of r. body must return only when all its
// goroutines have stopped and every lease is released.
func (e *bench) measure(m meter, r *row, body func() run) run {
	runtime.GC()
	m.start()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	res := body()
	runtime.ReadMemStats(&m1)
	trips, stats := m.read()

	var cmds int64
	for _, n := range stats {
		cmds += n
	}
	acqs := float64(res.acqs)
	r.allocsPerAcq = perAcq(float64(m1.Mallocs-m0.Mallocs), acqs)
	r.cmdsPerAcq = perAcq(float64(cmds), acqs)
	r.tripsPerAcq = perAcq(float64(trips), acqs)
	r.fails = res.fails
	r.mix = mix(stats, acqs)
	if len(res.waits) > 0 {
		slices.Sort(res.waits)
		r.p50 = float64(percentile(res.waits, 50))
		r.p99 = float64(percentile(res.waits, 99))
	}
	if res.window > 0 {
		r.acqPerSec = float64(res.inWindow) / res.window.Seconds()
		r.again = 100 * perAcq(float64(res.again), acqs)
	}
	if res.errs > 0 {
		e.b.Errorf("%s, %s: %d obtain errors other than timeouts, the first: %v", r.scenario, r.name, res.errs, res.firstErr)
	}
	if res.relErrs > 0 {
		e.b.Errorf("%s, %s: %d release errors, the first: %v", r.scenario, r.name, res.relErrs, res.firstRelErr)
	}
	if res.overlaps > 0 {
		e.b.Errorf("%s, %s: %d times two holders held one key", r.scenario, r.name, res.overlaps)
	}
	return res
}

func perAcq(n, acqs float64) float64 {
	if acqs == 0 {
		return math.NaN()
	}
	return n / acqs
}

func percentile(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p+99)/100 - 1
	return sorted[max(i, 0)]
}

// commandStats reads the calls per command since the last CONFIG RESETSTAT,
// without the measurement's own INFO and CONFIG.
func commandStats(tb testing.TB, ctx context.Context, admin *redis.Client) map[string]int64 {
	s, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	stats := map[string]int64{}
	for line := range strings.Lines(s) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		if base, _, _ := strings.Cut(name, "|"); base == "info" || base == "config" {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					tb.Fatalf("commandstats %q: %v", line, err)
				}
				stats[name] = n
			}
		}
	}
	return stats
}

// mix formats the commands per acquisition, most frequent first.
func mix(stats map[string]int64, acqs float64) string {
	if acqs == 0 {
		return ""
	}
	names := make([]string, 0, len(stats))
	for name := range stats {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if stats[names[i]] != stats[names[j]] {
			return stats[names[i]] > stats[names[j]]
		}
		return names[i] < names[j]
	})
	var parts []string
	for _, name := range names {
		if x := float64(stats[name]) / acqs; x >= 0.005 {
			parts = append(parts, fmt.Sprintf("%s %.2f", name, x))
		}
	}
	return strings.Join(parts, ", ")
}

// uncontended: obtain+release of one key on one goroutine, for a while.
func (e *bench) uncontended(m meter, l locker, r *row) {
	const key = "solo"
	for range 200 { // load the scripts, warm the path
		rel, err := l.obtain(e.ctx, key)
		if err != nil {
			e.b.Fatalf("%s: warm-up: %v", r.name, err)
		}
		if err := rel(e.ctx); err != nil {
			e.b.Fatalf("%s: warm-up release: %v", r.name, err)
		}
	}
	var elapsed time.Duration
	res := e.measure(m, r, func() run {
		res := run{waits: make([]time.Duration, 0, 1<<16)}
		start := time.Now()
		for time.Since(start) < uncontendedFor {
			t := time.Now()
			rel, err := l.obtain(e.ctx, key)
			got := time.Now()
			if err != nil {
				e.b.Fatalf("%s: uncontended obtain: %v", r.name, err)
			}
			res.waits = append(res.waits, got.Sub(t))
			if err := rel(e.ctx); err != nil {
				e.b.Fatalf("%s: uncontended release: %v", r.name, err)
			}
			res.acqs++
		}
		elapsed = time.Since(start)
		return res
	})
	r.nsPerOp = float64(elapsed) / float64(res.acqs)
	r.acqPerSec = 1e9 / r.nsPerOp
}

// contended: workers goroutines loop for contendedFor, each obtaining a
// random one of keys, holding it for hold and releasing it. The obtains
// started before the end are finished, and their leases released, before the
// snapshot: acq/s counts the locks got within the window; waits, fails and
// the per-acquisition columns count every obtain.
func (e *bench) contended(m meter, l locker, r *row, keys []string) {
	// Warm-up: every key once, spread over the workers (ours creates a key's
	// fencing counter on its first use).
	var wg sync.WaitGroup
	var next atomic.Int64
	for range min(workers, len(keys)) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(keys)); i = next.Add(1) - 1 {
				rel, err := l.obtain(e.ctx, keys[i])
				if err == nil {
					err = rel(e.ctx)
				}
				if err != nil {
					e.b.Errorf("%s: warm-up %s: %v", r.name, keys[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	if e.b.Failed() {
		e.b.FailNow()
	}

	holders := make([]atomic.Int32, len(keys))
	last := make([]atomic.Int32, len(keys)) // the worker that held a key last, +1
	e.measure(m, r, func() run {
		per := make([]run, workers)
		end := time.Now().Add(contendedFor)
		var wg sync.WaitGroup
		for w := range per {
			wg.Go(func() {
				res := &per[w]
				res.waits = make([]time.Duration, 0, 8192)
				rng := rand.New(rand.NewPCG(uint64(w), uint64(len(keys))))
				for time.Now().Before(end) {
					k := rng.IntN(len(keys))
					start := time.Now()
					rel, err := l.obtain(e.ctx, keys[k])
					got := time.Now()
					switch {
					case errors.Is(err, errTimeout):
						res.fails++
						continue
					case err != nil:
						res.errs++
						if res.firstErr == nil {
							res.firstErr = err
						}
						continue
					}
					res.acqs++
					if !got.After(end) {
						res.inWindow++
					}
					res.waits = append(res.waits, got.Sub(start))
					if holders[k].Add(1) != 1 {
						res.overlaps++
					}
					if last[k].Swap(int32(w+1)) == int32(w+1) {
						res.again++
					}
					time.Sleep(hold)
					holders[k].Add(-1)
					if err := rel(e.ctx); err != nil {
						res.relErrs++
						if res.firstRelErr == nil {
							res.firstRelErr = err
						}
					}
				}
			})
		}
		wg.Wait()
		all := run{window: contendedFor}
		for _, p := range per {
			all.acqs += p.acqs
			all.inWindow += p.inWindow
			all.fails += p.fails
			all.errs += p.errs
			all.overlaps += p.overlaps
			all.again += p.again
			all.relErrs += p.relErrs
			all.waits = append(all.waits, p.waits...)
			all.firstErr = cmp.Or(all.firstErr, p.firstErr)
			all.firstRelErr = cmp.Or(all.firstRelErr, p.firstRelErr)
		}
		return all
	})
}

// column is one numeric column of the table.
type column struct {
	head   string
	key    string // in the names of the reported ratio metrics
	get    func(row) float64
	format func(float64) string
	// higher is better: the best peer has the highest value, not the lowest.
	higher bool
	// noRatio leaves the column out of the ratio line.
	noRatio bool
}

var columns = []column{
	{head: "acq/s", key: "acq/s", get: func(r row) float64 { return r.acqPerSec }, format: fixed(0), higher: true},
	{head: "ns/op", key: "ns/op", get: func(r row) float64 { return r.nsPerOp }, format: fixed(0)},
	{head: "allocs/acq", key: "allocs/op", get: func(r row) float64 { return r.allocsPerAcq }, format: fixed(1)},
	{head: "p50 wait", key: "p50", get: func(r row) float64 { return r.p50 }, format: duration},
	{head: "p99 wait", key: "p99", get: func(r row) float64 { return r.p99 }, format: duration},
	{head: "fails", get: func(r row) float64 { return float64(r.fails) }, format: fixed(0), noRatio: true},
	{head: "same holder", get: func(r row) float64 { return r.again }, format: percent, noRatio: true},
	{head: "server cmds/acq", key: "cmds/acq", get: func(r row) float64 { return r.cmdsPerAcq }, format: fixed(2)},
	{head: "round trips/acq", key: "trips/acq", get: func(r row) float64 { return r.tripsPerAcq }, format: fixed(2)},
}

func fixed(prec int) func(float64) string {
	return func(x float64) string { return strconv.FormatFloat(x, 'f', prec, 64) }
}

func percent(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) + "%" }

func duration(ns float64) string {
	switch d := time.Duration(ns); {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", ns/1e3)
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1fms", ns/1e6)
	default:
		return fmt.Sprintf("%.0fms", ns/1e6)
	}
}

func cell(c column, x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return c.format(x)
}

// meanSleep is how long time.Sleep(d) really takes, on average.
func meanSleep(d time.Duration) time.Duration {
	const n = 500
	start := time.Now()
	for range n {
		time.Sleep(d)
	}
	return time.Since(start) / n
}

// familyRatio is one lock family's row ÷ ours, per column.
type familyRatio struct {
	name string
	rs   []float64
}

// familyRatios returns, for each family's row of rows (one scenario's),
// its figures ÷ those of the row named ratioOf, per column (NaN where it does
// not apply).
func familyRatios(rows []row) []familyRatio {
	o := slices.IndexFunc(rows, func(r row) bool { return r.name == ratioOf })
	if o < 0 {
		return nil
	}
	var out []familyRatio
	for _, r := range rows {
		if r.family {
			out = append(out, familyRatio{name: r.name, rs: rowRatios(r, rows[o])})
		}
	}
	return out
}

// versus is the peer that an "ours ÷ <peer>" line compares the row named
// ratioOf with, column by column, beside the best peer: the one the lock's
// goal for uncontended acquisitions is set against (issue 37).
const versus = "bsm/redislock"

// versusRatios returns, from rows (one scenario's), the figures of the row
// named ratioOf ÷ those of the row named versus, per column; nil when either
// is missing.
func versusRatios(rows []row) []float64 {
	o := slices.IndexFunc(rows, func(r row) bool { return r.name == ratioOf })
	v := slices.IndexFunc(rows, func(r row) bool { return r.name == versus })
	if o < 0 || v < 0 {
		return nil
	}
	return rowRatios(rows[o], rows[v])
}

// rowRatios returns a's figures ÷ b's, per column (NaN where it does not
// apply).
func rowRatios(a, b row) []float64 {
	rs := make([]float64, len(columns))
	for i, c := range columns {
		rs[i] = math.NaN()
		if d := c.get(b); !c.noRatio && d != 0 {
			rs[i] = c.get(a) / d
		}
	}
	return rs
}

// ratioLine writes one "÷" line of the table: label and rs, per column, and
// reports the ratios of the columns whose keys are in report as metrics
// named metric-<key>-suffix.
func ratioLine(b *testing.B, tw io.Writer, scenario, label string, rs []float64, report []string, metric, suffix string) {
	fmt.Fprintf(tw, "%s\t%s", scenario, label)
	for i, c := range columns {
		if x := rs[i]; !math.IsNaN(x) && !math.IsInf(x, 0) {
			fmt.Fprintf(tw, "\t%.2f×", x)
			if slices.Contains(report, c.key) {
				b.ReportMetric(x, metric+"-"+c.key+"-"+suffix)
			}
		} else {
			fmt.Fprint(tw, "\t-")
		}
	}
	fmt.Fprint(tw, "\t\n")
}

// ratios returns, per column, ours ÷ the best peer in rows (one scenario's),
// NaN where it does not apply, and the name of the row called ours ("" when
// there is none).
func ratios(rows []row) (ours string, rs []float64) {
	rs = make([]float64, len(columns))
	for i := range rs {
		rs[i] = math.NaN()
	}
	o := slices.IndexFunc(rows, func(r row) bool { return strings.HasPrefix(r.name, ratioOf) })
	if o < 0 {
		return "", rs
	}
	for i, c := range columns {
		if c.noRatio {
			continue
		}
		best := math.NaN()
		for _, r := range rows {
			x := c.get(r)
			if strings.HasPrefix(r.name, oursFamily) || r.name == floor.name || r.family || math.IsNaN(x) {
				continue
			}
			if math.IsNaN(best) || (c.higher && x > best) || (!c.higher && x < best) {
				best = x
			}
		}
		if best != 0 {
			rs[i] = c.get(rows[o]) / best
		}
	}
	return rows[o].name, rs
}

// BenchmarkCompare compares our Redis lock with redsync and bsm/redislock on
// one private redis-server and prints one table. It does every measurement
// itself; run it once:
//
//	go test -run '^$' -bench '^BenchmarkCompare$' -benchtime 1x ./internal/lock/lockbench
func BenchmarkCompare(b *testing.B) {
	addr, _ := testenv.RedisServer(b)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { admin.Close() })
	e := &bench{b: b, ctx: ctx, admin: admin, addr: addr}

	info, err := admin.Info(ctx, "server").Result()
	if err != nil {
		b.Fatalf("INFO server: %v", err)
	}
	version := "?"
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			version = v
		}
	}

	all := append(slices.Clone(contenders), families...)
	rigs := make([]rig, len(all)+1) // the last for the floor
	for i, c := range append(slices.Clone(all), floor) {
		rigs[i] = e.rig(c)
	}
	hot := []string{"hot"}
	many := make([]string, manyKeys)
	for i := range many {
		many[i] = "k" + strconv.Itoa(i)
	}
	scenarios := []struct {
		name, metric string
		report       []string // column keys whose ratios are reported as metrics
		rounds       int
		floor        bool // with the floor row
		run          func(meter, locker, *row)
	}{
		{"uncontended, same key", "uncontended", []string{"ns/op", "allocs/op", "cmds/acq"}, uncontendedRounds, true, e.uncontended},
		{fmt.Sprintf("%d goroutines, 1 key", workers), "contended", []string{"acq/s", "p99", "cmds/acq"}, 1, false,
			func(m meter, l locker, r *row) { e.contended(m, l, r, hot) }},
		{fmt.Sprintf("%d goroutines, %d keys", workers, manyKeys), "manykeys", []string{"acq/s", "p99", "cmds/acq"}, 1, false,
			func(m meter, l locker, r *row) { e.contended(m, l, r, many) }},
	}

	nan := math.NaN()
	var table [][]row
	for _, sc := range scenarios {
		// Every contender runs the scenario in turn, rounds times; a
		// contender's row is its median round by ns/op (rounds > 1 only for
		// the short uncontended runs, which a 2-core machine makes noisy).
		cs := all
		if sc.floor {
			cs = append(slices.Clone(all), floor)
		}
		rounds := make([][]row, len(cs))
		for round := range sc.rounds {
			// Each round starts with the next contender: no lock always
			// runs first, or right after the same one.
			for j := range cs {
				i := (j + round) % len(cs)
				c := cs[i]
				r := row{scenario: sc.name, name: c.name, family: c.family != nil, acqPerSec: nan, nsPerOp: nan, allocsPerAcq: nan,
					p50: nan, p99: nan, again: nan, cmdsPerAcq: nan, tripsPerAcq: nan}
				ri := i
				if c.name == floor.name {
					ri = len(all)
				}
				prefix := "bench:" + testenv.Name() + ":"
				sc.run(rigs[ri].m, rigs[ri].newLocker(prefix), &r)
				rounds[i] = append(rounds[i], r)
			}
		}
		var rows []row
		for _, rs := range rounds {
			slices.SortStableFunc(rs, func(a, b row) int { return cmp.Compare(a.nsPerOp, b.nsPerOp) })
			rows = append(rows, rs[len(rs)/2])
		}
		table = append(table, rows)
	}

	fmt.Printf("\nlock comparison on %d CPUs, %s/%s, %s, redis-server %s (private, loopback)\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), version)
	fmt.Printf("every lock: TTL %v, gives up after %v; holders keep the lock %v; contended runs last %v; uncontended: median of %d rounds of %v\n",
		ttl, wait, hold, contendedFor, uncontendedRounds, uncontendedFor)
	held := meanSleep(hold)
	fmt.Printf("one key is held one holder at a time: a %v sleep takes %v here, so no lock can pass %.0f acq/s on it\n\n",
		hold, held.Round(time.Microsecond), 1/held.Seconds())
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "scenario\tlock")
	for _, c := range columns {
		fmt.Fprint(tw, "\t", c.head)
	}
	fmt.Fprint(tw, "\tcommands/acq (commandstats)\n")
	var oursName string
	for s, rows := range table {
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s", r.scenario, r.name)
			for _, c := range columns {
				fmt.Fprint(tw, "\t", cell(c, c.get(r)))
			}
			fmt.Fprintf(tw, "\t%s\n", r.mix)
		}
		sc := scenarios[s]
		for _, fr := range familyRatios(rows) {
			ratioLine(b, tw, sc.name, fr.name+" ÷ ours", fr.rs, nil, "", "")
		}
		name, rs := ratios(rows)
		if name == "" {
			continue
		}
		oursName = name
		ratioLine(b, tw, sc.name, name+" ÷ best peer", rs, sc.report, sc.metric, "ratio")
		if rs := versusRatios(rows); rs != nil {
			ratioLine(b, tw, sc.name, ratioOf+" ÷ "+versus, rs, sc.report, sc.metric, "bsm-ratio")
		}
	}
	tw.Flush()
	fmt.Printf("\n%q ÷ best peer: best = highest acq/s, lowest in every other column; so ours is ahead where the acq/s ratio is > 1 or another ratio is < 1.\n", oursName)
	fmt.Printf("%q ÷ %s: the same, against that one peer (the lock's goal for uncontended acquisitions is ns/op at or below 1×).\n", ratioOf, versus)
	fmt.Println("<family> ÷ ours: that lock family's figure ÷ our Redis lock's (\"ours\"), column by column; acq/s below 1 or a wait above 1 is the family behind.")
	fmt.Println("acq/s counts the locks got within the run; waits (time in obtain of the obtains that got the lock), fails (obtains that gave up)")
	fmt.Println("and the per-acquisition columns also count the obtains finished after it. allocs/acq: all mallocs of the test process ÷ acquisitions.")
	fmt.Println("same holder: share of acquisitions by the goroutine that held the key last (released it and got it straight back).")
	fmt.Println("server cmds/acq: for Redis, INFO commandstats, commands run inside Lua scripts included; round trips/acq: a go-redis hook on the lock's client.")
	fmt.Println("For the other families, see their meters: MariaDB's Questions and Com_* counters; etcd's RPCs and stream messages sent, counted by")
	fmt.Println("gRPC interceptors on the lock's client; ZooKeeper's requests by opcode, read off the lock's connection as it writes them (pings included),")
	fmt.Println("whose round trips leave out the exists that its lock sends together with the children list.")
}
