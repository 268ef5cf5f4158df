// Command demo reproduces the source articles' experiment on the local stack: for each
// row it restarts the replicas with one lock mode, reseeds the catalog, fires
// the sell-out load at nginx and asks `shop verify` whether the sale held.
// Then the hot SKU: one product with many units and more buyers than units,
// sold lock-free one order at a time, under the Redis lock one order at a
// time, and with the service's default order coalescing.
//
//	scripts/demo.sh            (make demo: starts the stack, runs this, stops it)
//	bin/demo -state .state/demo -out out/demo
//	bin/demo -bench ...        (make bench-orders: the order path side by side, see bench.go)
//	bin/demo -edge ...         (make bench-edge: the buyers under floods of public routes, see edge.go)
//
// Every verdict comes from `shop verify --json`; the load's figures come from
// the loadtest's JSON result. It prints one table, writes report.md and
// report.png to -out, and exits 1 when a row that must hold did not.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	switch {
	case len(os.Args) > 1 && (os.Args[1] == "-bench" || os.Args[1] == "--bench"):
		err = runBench(ctx, os.Args, os.Stdout, os.Stderr)
	case len(os.Args) > 1 && (os.Args[1] == "-edge" || os.Args[1] == "--edge"):
		err = runEdge(ctx, os.Args, os.Stdout, os.Stderr)
	default:
		err = run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}
	stop()
	switch {
	case errors.Is(err, errRowsFailed), errors.Is(err, errVerifyFailed):
		os.Exit(1)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// crowdSources is how many source addresses the demo's and the benches'
// buyers come from by default. nginx lets one address place 10 orders a
// second, with bursts of 20 (deploy/nginx.conf); the fastest sales here
// run at about 7000 orders a second, which 2048 addresses share at under 4
// a second each, and the 4000 buyers who arrive together at 2 each.
const crowdSources = 2048

// errRowsFailed means a row that must hold did not; the table says which.
var errRowsFailed = errors.New("a row that must hold did not")

type options struct {
	state    string // the stack's state directory
	stack    string // scripts/stack.sh
	loadtest string // bin/loadtest
	out      string
	srcN     int // the load test's -src-n: source addresses of the buyers
	skus     int
	buyers   int
	workers  int
	ttl      time.Duration // lock TTL of the pause rows
	pause    time.Duration // how long a holder is stopped between its read and its write
	after    time.Duration // how long into the load a Redlock master is killed

	faults     bool          // run the fault rows
	families   bool          // run the rows of the other lock families (MySQL table, etcd, ZooKeeper)
	faultAfter time.Duration // how long into the load a fault row's fault begins
	faultSpan  time.Duration // a fault row's load is spread over at least this long

	hotUnits   int // units of the hot SKU; 0 skips the hot rows
	hotBuyers  int // buyers of the hot SKU
	hotWorkers int // concurrent buyers of the hot SKU

	rows []int // the row numbers to run; none: every row

	life         bool          // run the lifecycle rows
	lifeUnits    int           // units of the lifecycle rows' SKU
	lifeBuyers   int           // the first wave's buyers
	resaleBuyers int           // the second wave's buyers, who wait for returned units
	lifeWorkers  int           // concurrent buyers of either wave
	payWindow    time.Duration // SHOP_PAY_WINDOW of the lifecycle rows
	payFrac      float64       // the share of the first wave's winners who pay at once
	lateFrac     float64       // the share who pay a second after their pay_by
	stall        time.Duration // how long the sweep-kill row's failpoint stops a sweep before its COMMIT
	jwtSecret    string        // SHOP_JWT_SECRET of the jwt row, drawn anew by each run
	stripe       bool          // run the Stripe rows (lifecycle rows on stripe-mock)
	events       bool          // run the events row (the lifecycle sale with events on)

	galera      bool          // run the Galera rows (galera.go)
	galeraAfter time.Duration // how long into the load a Galera row's fault begins

	// webhookSecret is the payment provider's secret, the stack's
	// SHOP_PAYMENT_WEBHOOK_SECRET (from the environment): the lifecycle
	// rows' payments and the refunds' settlements are signed with it.
	webhookSecret string
	// stripeSecret is the Stripe endpoint's signing secret, the stack's
	// SHOP_STRIPE_WEBHOOK_SECRET (from the environment): the Stripe rows'
	// payments and their seeds' settlements are signed with it.
	stripeSecret string
	// replica is a replica's public URL, where the refunds the rows left
	// are settled before each seed (set by run, from the stack's ports).
	replica string
}

func parse(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.StringVar(&o.state, "state", ".state/demo", "state directory of the stack (scripts/stack.sh)")
	fs.StringVar(&o.stack, "stack", "scripts/stack.sh", "the stack script")
	fs.StringVar(&o.loadtest, "loadtest", "bin/loadtest", "the load test binary")
	fs.StringVar(&o.out, "out", "out/demo", "directory for report.md, report.png and each row's files")
	fs.IntVar(&o.srcN, "src-n", crowdSources, "the buyers' loopback source addresses (bin/loadtest -src-n), so that nginx's per-address limits meet them as a crowd")
	fs.IntVar(&o.skus, "skus", 5000, "products, one unit each")
	fs.IntVar(&o.buyers, "buyers", 4, "buyers per product, arriving together")
	fs.IntVar(&o.workers, "c", 4000, "concurrent buyers")
	fs.DurationVar(&o.ttl, "ttl", 500*time.Millisecond, "lock TTL of the pause rows")
	fs.DurationVar(&o.pause, "pause", 2*time.Second, "how long the stopped holder stays stopped (more than -ttl)")
	fs.DurationVar(&o.after, "pause-after", 500*time.Millisecond, "how long into the load the Redlock master is killed")
	fs.BoolVar(&o.faults, "faults", true, "run the fault rows (a replica killed, a rolling restart, Redis and MariaDB restarted, the Redis master failed over)")
	fs.BoolVar(&o.families, "families", true, "run the rows of the source articles' other lock families: the MySQL lock table, etcd and ZooKeeper (sellout, hot SKU, a fault each)")
	fs.Func("rows", "run only these rows of the table, by number: 17,18 (default all)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("%q: want row numbers from 1, comma-separated", v)
			}
			o.rows = append(o.rows, n)
		}
		return nil
	})
	fs.DurationVar(&o.faultAfter, "fault-after", 2*time.Second, "how long into the load a fault row's fault begins")
	fs.DurationVar(&o.faultSpan, "fault-span", 8*time.Second, "a fault row's load is sent over at least this long (its rate is capped)")
	fs.IntVar(&o.hotUnits, "hot-units", 5000, "units of the hot SKU (0 skips the hot rows)")
	fs.IntVar(&o.hotBuyers, "hot-buyers", 6000, "buyers of the hot SKU, each a different user")
	fs.IntVar(&o.hotWorkers, "hot-c", 200, "concurrent buyers of the hot SKU")
	fs.BoolVar(&o.life, "life", true, "run the lifecycle rows (reservations paid or lapsing, units returned and resold)")
	fs.IntVar(&o.lifeUnits, "life-units", 1000, "lifecycle rows: units of the one SKU")
	fs.IntVar(&o.lifeBuyers, "life-buyers", 2000, "lifecycle rows: the first wave's buyers, each a different user")
	fs.IntVar(&o.resaleBuyers, "resale-buyers", 1500, "lifecycle rows: the second wave's new buyers, who wait for the returned units")
	fs.IntVar(&o.lifeWorkers, "life-c", 200, "lifecycle rows: concurrent buyers of either wave")
	fs.DurationVar(&o.payWindow, "pay-window", 20*time.Second, "lifecycle rows: SHOP_PAY_WINDOW, long enough for retrying payers to outlast the sweep-kill row's restarts")
	fs.Float64Var(&o.payFrac, "pay-frac", 0.5, "lifecycle rows: the share of the first wave's winners who pay at once")
	fs.Float64Var(&o.lateFrac, "late-frac", 0.1, "lifecycle rows: the share of the first wave's winners who pay a second after their pay_by, and must be owed back")
	fs.DurationVar(&o.stall, "stall", 5*time.Second, "lifecycle rows: how long the sweep-kill row's failpoint stops a sweep before its COMMIT")
	fs.BoolVar(&o.stripe, "stripe", true, "with the lifecycle rows, run the Stripe rows: the lifecycle sale paid through Stripe on stripe-mock, "+
		"its late payments refunded through the Refund API, and again with a refunder's replica killed between its call and its record")
	fs.BoolVar(&o.events, "events", true, "with the lifecycle rows, run the events row: the lifecycle sale with events on, delivered to bin/eventsink, "+
		"the receiver down mid-sale and a relay killed between a POST and its mark")
	fs.BoolVar(&o.galera, "galera", true, "run the Galera rows: MariaDB as three Galera nodes behind HAProxy, the writer killed mid-sale "+
		"(the sellout, and the lifecycle sale inside a sweep) and partitioned mid-sale, buyers retrying")
	fs.DurationVar(&o.galeraAfter, "galera-fault-after", time.Second, "how long into the load a Galera sellout row's fault begins")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.jwtSecret = newJWTSecret()
	o.webhookSecret = os.Getenv(envWebhookSecret)
	o.stripeSecret = os.Getenv(envStripeSecret)
	switch {
	case o.life && (o.lifeUnits <= 0 || o.lifeBuyers <= o.lifeUnits || o.resaleBuyers <= 0 || o.lifeWorkers <= 0):
		return o, errors.New("-life-units, -resale-buyers and -life-c must be positive, and -life-buyers above -life-units")
	case o.life && (o.payFrac < 0 || o.lateFrac < 0 || o.payFrac+o.lateFrac >= 1):
		return o, errors.New("-pay-frac and -late-frac must not be negative, and leave some winners who never pay")
	case o.life && (o.payWindow < time.Second || o.stall <= 0):
		return o, errors.New("-pay-window must be at least 1s and -stall positive")
	case o.skus <= 0 || o.buyers <= 1 || o.workers <= 0:
		return o, errors.New("-skus and -c must be positive and -buyers above 1")
	case o.hotUnits < 0 || o.hotUnits > 0 && (o.hotBuyers <= 0 || o.hotWorkers <= 0):
		return o, errors.New("-hot-units must not be negative, and with hot units -hot-buyers and -hot-c must be positive")
	case o.pause <= o.ttl:
		return o, fmt.Errorf("-pause %s must be longer than -ttl %s, or no lease runs out", o.pause, o.ttl)
	case o.galera && o.galeraAfter <= 0:
		return o, errors.New("-galera-fault-after must be positive")
	case o.faults && o.faultSpan <= o.faultAfter:
		return o, fmt.Errorf("-fault-span %s must be longer than -fault-after %s, or the fault lands after the sale", o.faultSpan, o.faultAfter)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(o.out, "rows"), 0o755); err != nil {
		return err
	}
	ports, err := readEnvFile(filepath.Join(o.state, "ports.env"))
	if err != nil {
		return fmt.Errorf("%w (is the stack up? scripts/stack.sh up)", err)
	}
	url := "http://127.0.0.1:" + ports["NGINX_PORT"]
	adminPorts, err := stackPorts(o.state, ports, "ADMIN_PORTS", 3)
	if err != nil {
		return err
	}
	replicaPorts, err := stackPorts(o.state, ports, "REPLICA_PORTS", 1)
	if err != nil {
		return err
	}
	o.replica = "http://127.0.0.1:" + replicaPorts[0]

	rows := experiment(o)
	if o.webhookSecret == "" && slices.ContainsFunc(rows, func(r row) bool { return r.Life != "" }) {
		return fmt.Errorf("%s is not set: the lifecycle rows' payments are events signed with the stack's secret "+
			"(scripts/demo.sh passes it; or run with -life=false)", envWebhookSecret)
	}
	if o.stripeSecret == "" && slices.ContainsFunc(rows, row.stripe) {
		return fmt.Errorf("%s is not set: the Stripe rows' payments are Stripe events signed with the stack's secret "+
			"(scripts/demo.sh passes it; or run with -stripe=false)", envStripeSecret)
	}
	var results []result
	for i, r := range rows {
		if len(o.rows) > 0 && !slices.Contains(o.rows, i+1) {
			continue
		}
		fmt.Fprintf(stderr, "\n== row %d/%d: %s\n", i+1, len(rows), r.label())
		res, err := runRow(ctx, o, url, adminPorts[:r.Replicas], i+1, r, stderr)
		if err != nil {
			return fmt.Errorf("row %d (%s): %w", i+1, r.label(), err)
		}
		res.Num = i + 1
		fmt.Fprintf(stderr, "== %s: %s, %s\n", r.label(), res.verdict(), res.outcome())
		results = append(results, res)
	}

	cores := runtime.NumCPU()
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, table(results))
	for _, t := range []string{lifeTable(results), stripeTable(results), eventsTable(results)} {
		if t != "" {
			fmt.Fprintln(stdout)
			fmt.Fprint(stdout, t)
		}
	}
	fmt.Fprintf(stdout, "\n%d products × %d buyers through nginx (%s), %d at once; %d CPU cores.\n",
		o.skus, o.buyers, url, min(o.workers, o.skus*o.buyers), cores)
	if o.hotUnits > 0 {
		fmt.Fprintf(stdout, "Hot SKU: one product with %d units, %d buyers, %d at once.\n",
			o.hotUnits, o.hotBuyers, min(o.hotWorkers, o.hotBuyers))
	}
	if o.life {
		fmt.Fprintf(stdout, "Lifecycle: one product with %d units, %d buyers (%d at once), SHOP_PAY_WINDOW=%s; %.0f%% of the winners pay, %.0f%% pay late; then %d new buyers wait for the returned units.\n",
			o.lifeUnits, o.lifeBuyers, o.lifeWorkers, o.payWindow, 100*o.payFrac, 100*o.lateFrac, o.resaleBuyers)
	}
	if o.life && o.stripe {
		fmt.Fprintf(stdout, "Stripe rows: the lifecycle sale with SHOP_PAYMENTS=stripe on stripe-mock; the Refund API calls and keys "+
			"from the recording proxy's log; every refund owed must be refunded within %s of the sale's end (%s with the refunder killed).\n",
			refundsWithin(row{}), refundsWithin(row{RefundStall: refundStall}))
	}
	if slices.ContainsFunc(results, func(r result) bool { return r.Row.DB == dbGalera }) {
		fmt.Fprintf(stdout, "Galera rows: MariaDB as three Galera nodes behind HAProxy, buyers retrying; the writer killed (SIGKILL) "+
			"%s into the sellout, killed under a sweep's open transaction in the lifecycle sale, and cut off (gmcast.isolate) %s into "+
			"the sellout, then healed. The failover is timed from the writer's loss (the killed node's failed ping; the partitioned node's "+
			"group connections closing) to the first rise of another node's wsrep_local_commits, polled every %s.\n",
			o.galeraAfter, o.galeraAfter, failoverPoll)
	}
	if o.life && o.events {
		fmt.Fprintf(stdout, "Events row: the lifecycle sale with events on, %.0f%% of the reservations also cancelled; the receiver down %s "+
			"mid-sale; replica 1's relay killed between a POST answered 2xx and its mark; the outbox must drain within %s of the sale's end.\n",
			100*eventsCancelFrac, eventsDown, eventsDrain)
	}
	if err := writeReport(o, results, cores); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "report: %s, %s\n", filepath.Join(o.out, "report.md"), filepath.Join(o.out, "report.png"))
	for _, r := range results {
		if r.failed() {
			fmt.Fprintf(stdout, "FAILED: %s\n", r.Row.label())
			return errRowsFailed
		}
	}
	return nil
}

// runRow restarts the replicas in the row's mode, reseeds, runs the load
// (killing a Redlock master or running the row's fault partway, if the row
// says so) and verifies; adminPorts are the row's replicas' operators'
// listeners, where their metrics are.
func runRow(ctx context.Context, o options, url string, adminPorts []string, n int, r row, stderr io.Writer) (result, error) {
	if r.Life != "" {
		return runLifeRow(ctx, o, url, adminPorts, n, r, stderr)
	}
	res := result{Row: r}
	if r.Pause {
		res.Paused = o.pause
	}
	if _, err := commandEnv(ctx, topologyEnv(r), stderr, o.stack, replicaArgs(o, r)...); err != nil {
		return res, err
	}
	products, units := o.skus, 1
	if r.Hot {
		products, units = 1, o.hotUnits
	}
	if err := seed(ctx, o, false, products, units, stderr); err != nil {
		return res, err
	}

	base := filepath.Join(o.out, "rows", fmt.Sprintf("%d-%s", n, r.slug()))
	acks := base + ".acks"
	args := []string{"-scenario", "sellout", "-url", url,
		"-skus", strconv.Itoa(o.skus), "-buyers", strconv.Itoa(o.buyers), "-c", strconv.Itoa(o.workers)}
	if r.Hot {
		args = []string{"-scenario", "hotsku", "-url", url, "-sku", "1",
			"-n", strconv.Itoa(o.hotBuyers), "-c", strconv.Itoa(o.hotWorkers)}
	}
	if r.Retry {
		args = append(args, "-retry")
	}
	if r.Fault != "" {
		args = append(args, faultLoad(o, r)...)
	}
	load := exec.CommandContext(ctx, o.loadtest, append(args, "-src-n", strconv.Itoa(o.srcN), "-json", base+".json", "-acks", acks)...)
	logFile, err := os.Create(base + ".log")
	if err != nil {
		return res, err
	}
	defer logFile.Close()
	load.Stdout, load.Stderr = logFile, io.MultiWriter(logFile, stderr)
	if err := load.Start(); err != nil {
		return res, err
	}
	var pauseErr error
	switch {
	case r.Kill:
		res.Killed, pauseErr = killMaster(ctx, o, r.KilledMaster(), stderr)
	case r.DB == dbGalera && r.Fault != "":
		res.Killed, res.Failover, pauseErr = injectGaleraFault(ctx, o, r, stderr)
	case r.Fault != "":
		res.Killed, pauseErr = injectFault(ctx, o, r, stderr)
	}
	if err := load.Wait(); err != nil {
		return res, fmt.Errorf("loadtest: %w (see %s.log)", err, base)
	}
	if pauseErr != nil {
		return res, pauseErr
	}
	if err := readJSON(base+".json", &res.Load); err != nil {
		return res, err
	}
	if res.Busy, err = busyCauses(ctx, adminPorts); err != nil {
		return res, err
	}

	res.Verify, err = verifySale(ctx, o.stack, acks, base+".verify.json", stderr)
	return res, err
}

// seed settles the refunds the rows before left (a seed refuses while one
// is unsettled) as the provider of the replicas' mode, stripe or not, then
// reseeds the catalog: products products with units units each, and no
// orders.
func seed(ctx context.Context, o options, stripe bool, products, units int, stderr io.Writer) error {
	db, err := openStackDB(o.state)
	if err != nil {
		return err
	}
	defer db.Close()
	n, err := settleRefunds(ctx, db, o.replica, stripe, o.webhookSecret, o.stripeSecret)
	if err != nil {
		return err
	}
	if n > 0 {
		event := "refund.succeeded"
		if stripe {
			event = "Stripe's refund.updated"
		}
		fmt.Fprintf(stderr, "demo: %d refunds settled (signed %s, provider_refund_id re_demo_<refund_id>)\n", n, event)
	}
	_, err = command(ctx, stderr, o.stack, "shop", "seed", "--products", strconv.Itoa(products), "--stock", strconv.Itoa(units))
	return err
}

// replicaArgs are the stack script's arguments that restart the replicas
// for row r.
func replicaArgs(o options, r row) []string {
	args := append([]string{"replicas", strconv.Itoa(r.Replicas)}, r.env()...)
	if r.Pause {
		args = append(args, stopFor(o.pause)...)
	}
	if r.Stall > 0 {
		args = append(args, stallFor(r.Stall)...)
	}
	if r.RefundStall > 0 {
		args = append(args, refundStallFor(r.RefundStall)...)
	}
	return args
}

// topologyEnv is the environment of the stack script's `replicas` for row
// r: this process's, with the row's MariaDB and Redis topologies, which
// the stack then keeps for the seed, the fault and the verify.
func topologyEnv(r row) []string {
	return append(os.Environ(), "DB_TOPOLOGY="+r.dbTopology(), "REDIS_TOPOLOGY="+r.topology())
}

// verifySale runs `shop verify --json --acks acks` on the stack (with env,
// if given, as the stack script's environment), keeps its output in path and
// returns its report. A broken invariant is in the report, not an error.
func verifySale(ctx context.Context, stack, acks, path string, stderr io.Writer, env ...string) (verifyReport, error) {
	var v verifyReport
	// verify exits 1 when an invariant is broken; its JSON says which.
	out, err := commandEnv(ctx, env, stderr, stack, "shop", "verify", "--json", "--acks", acks)
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return v, err
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return v, fmt.Errorf("shop verify: %w: %q", err, out)
	}
	return v, os.WriteFile(path, out, 0o644)
}

// rollingRestartTakes is about how long scripts/stack.sh rolling-restart
// takes for three replicas: each drains (2s, nginx's idle timeout), starts,
// and is given 2s to be back in nginx's rotation.
const rollingRestartTakes = 16 * time.Second

// redisFailoverTakes is about how long scripts/stack.sh failover-redis and
// kill-redis-master take: the Sentinels promote the replica within about 4s
// (a killed master is seen down after 3s), but make the old master a replica
// of the new one only at their next look at it, up to 10s later (their INFO
// period), and until then it is a master that a replica which missed the
// switch may still write to.
const redisFailoverTakes = 15 * time.Second

// faultLoad are the load test's arguments that spread a fault row's sale
// over o.faultSpan, so that the fault lands in the middle of it: a capped
// rate, and a tenth of a second's worth of buyers at once. hey starts its
// workers' requests together, so fewer workers make a smoother stream.
func faultLoad(o options, r row) []string {
	span := o.faultSpan
	switch r.Fault {
	case faultRolling:
		// Each replica drains, starts and is back in nginx in about 5s:
		// the sale lasts until the third has restarted.
		span = max(span, o.faultAfter+rollingRestartTakes)
	case faultFailover, faultKillMaster:
		// The sale lasts until the old master follows the new one.
		span = max(span, o.faultAfter+redisFailoverTakes)
	case faultKillDBWriter, faultPartitionDB:
		// The sale lasts through the failover and the failback.
		span = max(span, o.galeraAfter+galeraFailoverTakes)
	}
	rate := max(1, float64(o.skus*o.buyers)/span.Seconds())
	workers := min(o.workers, max(1, int(rate/10)))
	return []string{"-rate", strconv.FormatFloat(rate, 'f', 0, 64), "-c", strconv.Itoa(workers)}
}

// injectFault runs the row's fault o.faultAfter into the load, with the
// stack script, and returns how far into the load it began.
func injectFault(ctx context.Context, o options, r row, stderr io.Writer) (time.Duration, error) {
	start := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(o.faultAfter):
	}
	began := time.Since(start)
	fmt.Fprintf(stderr, "demo: %s\n", r.faultName())
	if _, err := command(ctx, stderr, o.stack, r.faultArgs()...); err != nil {
		return began, fmt.Errorf("%s: %w", r.faultName(), err)
	}
	fmt.Fprintf(stderr, "demo: %s: done after %s\n", r.faultName(), (time.Since(start) - began).Round(100*time.Millisecond))
	return began, nil
}

// injectGaleraFault runs a Galera row's fault o.galeraAfter into the
// load, with the failover watch beside it, and returns how far into the
// load it began and the failover it measured.
func injectGaleraFault(ctx context.Context, o options, r row, stderr io.Writer) (time.Duration, *failover, error) {
	start := time.Now()
	select {
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	case <-time.After(o.galeraAfter):
	}
	began := time.Since(start)
	f, err := galeraFault(ctx, o, r.Fault, galeraFailoverTakes, stderr)
	return began, f, err
}

// killMaster kills Redis master i (SIGKILL, counted from 1) o.after into the
// load, as a crash would. The next `stack.sh replicas` starts it again,
// empty. It returns how far into the load it was killed.
func killMaster(ctx context.Context, o options, i int, stderr io.Writer) (time.Duration, error) {
	start := time.Now()
	pid, err := signalAfter(ctx, o, fmt.Sprintf("redis%d", i-1), syscall.SIGKILL)
	if err != nil {
		return 0, fmt.Errorf("kill Redis master %d: %w", i, err)
	}
	fmt.Fprintf(stderr, "demo: Redis master %d (pid %d) killed\n", i, pid)
	return time.Since(start), nil
}

// signalAfter sends sig, o.after from now, to the process whose pid file is
// in the stack's state directory dir, and returns its pid.
func signalAfter(ctx context.Context, o options, dir string, sig syscall.Signal) (int, error) {
	path := filepath.Join(o.state, dir, "pid")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(o.after):
	}
	return pid, syscall.Kill(pid, sig)
}

// command runs name with args and returns its standard output; its standard
// error goes to stderr.
func command(ctx context.Context, stderr io.Writer, name string, args ...string) ([]byte, error) {
	return commandEnv(ctx, nil, stderr, name, args...)
}

// commandEnv is command with env as the environment (nil: this process's).
func commandEnv(ctx context.Context, env []string, stderr io.Writer, name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &out, stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out.Bytes(), err
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// stackPorts returns the first n ports of the list name (REPLICA_PORTS,
// ADMIN_PORTS) in ports, the stack's ports.env in state.
func stackPorts(state string, ports map[string]string, name string, n int) ([]string, error) {
	list := strings.Fields(ports[name])
	if len(list) < n {
		return nil, fmt.Errorf("%s: want %d %s, have %q (a stack from an older scripts/stack.sh? make down, then up)",
			filepath.Join(state, "ports.env"), n, name, ports[name])
	}
	return list[:n], nil
}

// readEnvFile reads NAME=value lines, as scripts/stack.sh writes them.
func readEnvFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			env[k] = strings.Trim(v, `'"`)
		}
	}
	return env, nil
}

// busyCauses sums the replicas' shop_orders_busy_total by cause. A replica
// that a fault row killed is left out: its counts died with it.
func busyCauses(ctx context.Context, ports []string) (map[string]int, error) {
	sum := map[string]int{}
	err := scrapeMetrics(ctx, ports, func(series string, v float64) {
		if rest, ok := strings.CutPrefix(series, `shop_orders_busy_total{cause="`); ok {
			sum[strings.TrimSuffix(rest, `"}`)] += int(v)
		}
	})
	return sum, err
}

// scrapeMetrics reads /metrics of the replicas whose operators' listeners
// (SHOP_ADMIN_ADDR) are on ports, and calls each with every sample: the
// series (name and labels) and its value. The public port and nginx answer
// 404 for /metrics.
func scrapeMetrics(ctx context.Context, ports []string, each func(series string, v float64)) error {
	for _, port := range ports {
		req, err := http.NewRequestWithContext(ctx, "GET", "http://127.0.0.1:"+port+"/metrics", nil)
		if err != nil {
			return err
		}
		// No idle connection left behind: a replica that stops drains until
		// its connections are closed, up to SHOP_DRAIN.
		req.Close = true
		res, err := http.DefaultClient.Do(req)
		if errors.Is(err, syscall.ECONNREFUSED) {
			continue // not running
		}
		if err != nil {
			return fmt.Errorf("metrics of replica on %s: %w", port, err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return fmt.Errorf("metrics of replica on %s: %w", port, err)
		}
		for _, line := range strings.Split(string(body), "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			if i < 0 {
				return fmt.Errorf("metrics of replica on %s: %q: no value", port, line)
			}
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				return fmt.Errorf("metrics of replica on %s: %q: %w", port, line, err)
			}
			each(line[:i], v)
		}
	}
	return nil
}
