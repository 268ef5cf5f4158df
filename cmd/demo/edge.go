package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The edge benchmark (make bench-edge, `bin/demo -edge`): what a flood of a
// public route costs the buyers of a flash sale, through nginx on the
// private stack with the shipped defaults. Every sale is the same: one
// product with edgeOptions.units units and more buyers than units, a crowd
// from many addresses. It runs alone, and while other clients flood one
// route: /healthz, which costs the service nothing and so measures what
// the flood costs the machine (the flooder's CPU and nginx's); the stock
// of the product on sale, which exists; orders guessed by id, anonymously
// with a user id of the guess's own, as anyone may under the stack's
// SHOP_AUTH=none; an absent product's stock; an absent product; and
// malformed orders. The flood's
// clients come from addresses of their own, many of them, as a botnet
// would, so that nginx's per-address limits let it through and the
// service's own bounds are what is measured. A last row is a bot farm:
// many user ids from one address, which nginx's limits are for.
//
// The buyers of each sale run the whole lifecycle: half the reservations
// are paid at once by the payment provider's signed events (bin/loadtest
// -webhook-secret, with the stack's SHOP_PAYMENT_WEBHOOK_SECRET), and
// three in ten cancelled by their buyer. Their rates of placing, paying
// and cancelling under each flood are set beside those under the /healthz
// flood of the same round (edgeLifeTable): a public read must not starve the
// look-ups that payments and cancels make.
//
// Rows alternate within a round (alone, each flood, the bot farm, then
// again), so that a drift of the machine over the run touches every row
// alike, and each figure is the median of the rounds. A row counts only
// the answers it expects: the buyers' 201 and 409, a flood's 200, 404 or
// 400; the 429s and 503s beside them say which limit was met.
//
// Before that table, the ceiling's (ceiling.go): GET /healthz, a cached
// product page, the sale alone and the source articles' sellout, each as a share of
// the /healthz rate, from the same rounds; the order rows also as a share
// of /healthz sent through their own client; and where the CPU went.

// edgeOptions are `bin/demo -edge`'s flags.
type edgeOptions struct {
	state     string // the stack's state directory
	stack     string // scripts/stack.sh
	loadtest  string // bin/loadtest
	out       string
	rounds    int
	units     int
	buyers    int
	workers   int
	srcN      int
	flooders  int
	floodFor  time.Duration
	floodSrcN int
	warmUp    time.Duration
	bots      int

	only          string        // "ceiling": the ceiling's rows alone
	ceilingFor    time.Duration // how long the ceiling's GET floods last
	selloutSKUs   int
	selloutBuyers int
	selloutC      int
	// The overload: buyers of one product with units, so many at once.
	overloadBuyers int
	overloadUnits  int
	overloadC      int
}

// onlyCeiling is -only's value that runs the ceiling's rows alone.
const onlyCeiling = "ceiling"

func parseEdge(args []string) (edgeOptions, error) {
	var o edgeOptions
	fs := flag.NewFlagSet("demo -edge", flag.ContinueOnError)
	fs.StringVar(&o.state, "state", ".state/bench-edge", "state directory of the stack (scripts/stack.sh)")
	fs.StringVar(&o.stack, "stack", "scripts/stack.sh", "the stack script")
	fs.StringVar(&o.loadtest, "loadtest", "bin/loadtest", "the load test binary")
	fs.StringVar(&o.out, "out", "out/bench-edge", "directory for report.md and each run's files")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; every figure is the median over them")
	fs.IntVar(&o.units, "units", 5000, "units of the one product on sale")
	fs.IntVar(&o.buyers, "buyers", 6000, "buyers of the product, each a different user")
	fs.IntVar(&o.workers, "c", 200, "buyers at once, and the clients of the ceiling's GET floods")
	fs.IntVar(&o.srcN, "src-n", crowdSources, "the buyers' loopback source addresses")
	fs.IntVar(&o.flooders, "flooders", 300, "flooding clients at once")
	fs.DurationVar(&o.floodFor, "flood-for", 20*time.Second, "how long each flood lasts: longer than the sale takes under it, at about 500 buyers a second")
	fs.IntVar(&o.floodSrcN, "flood-src-n", 4096, "the flood's source addresses, other than the buyers'")
	fs.DurationVar(&o.warmUp, "warm-up", 2*time.Second, "how long a flood runs before the buyers come")
	fs.IntVar(&o.bots, "bots", 10000, "the bot farm's user ids, all from one address")
	fs.StringVar(&o.only, "only", "", onlyCeiling+": run only the ceiling's rows (GET /healthz, the cached page, GET /healthz through the orders' client, "+
		"the clients side by side, the sale alone, the sellout, the overload); empty: every row")
	fs.DurationVar(&o.ceilingFor, "ceiling-for", 5*time.Second, "how long each of the ceiling's GET floods lasts")
	fs.IntVar(&o.selloutSKUs, "sellout-skus", 5000, "the ceiling's sellout: products, one unit each")
	fs.IntVar(&o.selloutBuyers, "sellout-buyers", 4, "the ceiling's sellout: buyers per product")
	fs.IntVar(&o.selloutC, "sellout-c", 4000, "the ceiling's sellout: buyers at once")
	fs.IntVar(&o.overloadBuyers, "overload-buyers", 60000, "the ceiling's overload: buyers of one product, each a different user")
	fs.IntVar(&o.overloadUnits, "overload-units", 5000, "the ceiling's overload: units of the product")
	fs.IntVar(&o.overloadC, "overload-c", 3000, "the ceiling's overload: buyers at once")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.rounds <= 0 || o.units <= 0 || o.buyers <= 0 || o.workers <= 0 || o.srcN <= 0 || o.flooders <= 0 || o.floodSrcN <= 0 || o.bots <= 0 {
		return o, errors.New("-rounds, -units, -buyers, -c, -src-n, -flooders, -flood-src-n and -bots must be positive")
	}
	if o.floodFor <= o.warmUp || o.warmUp < 0 {
		return o, fmt.Errorf("-flood-for %s must be longer than -warm-up %s", o.floodFor, o.warmUp)
	}
	if o.only != "" && o.only != onlyCeiling {
		return o, fmt.Errorf("-only %q: want %s, or nothing for every row", o.only, onlyCeiling)
	}
	if o.ceilingFor <= 0 || o.selloutSKUs <= 0 || o.selloutBuyers <= 0 || o.selloutC <= 0 {
		return o, errors.New("-ceiling-for, -sellout-skus, -sellout-buyers and -sellout-c must be positive")
	}
	if o.overloadBuyers <= 0 || o.overloadUnits <= 0 || o.overloadC <= 0 {
		return o, errors.New("-overload-buyers, -overload-units and -overload-c must be positive")
	}
	return o, nil
}

// edgeRow is a row of the table: a sale alone, a sale under a flood, or
// the bot farm.
type edgeRow struct {
	Name   string
	Flood  string // the flood's loadtest scenario; "" for none
	Expect string // the status the flood's requests are answered when served
	Bot    bool
}

// The rows' names the ratios refer to.
const (
	edgeAlone   = "alone"
	edgeHealthz = "flood GET /healthz"
)

// edgeRows are the rows in the order each round runs them.
func edgeRows() []edgeRow {
	return []edgeRow{
		{Name: edgeAlone},
		{Name: edgeHealthz, Flood: "healthz", Expect: "200"},
		{Name: "flood GET existing stock", Flood: "stock", Expect: "200"},
		{Name: "flood GET /orders/{random}", Flood: "order-guess", Expect: "404"},
		{Name: "flood GET absent stock", Flood: "absent-stock", Expect: "404"},
		{Name: "flood GET absent product", Flood: "absent", Expect: "404"},
		{Name: "flood POST malformed order", Flood: "malformed", Expect: "400"},
		{Name: "bot farm: one address", Bot: true},
	}
}

// rows are the edge's rows each round runs: every one, or with -only
// ceiling the sale alone, which is the ceiling's hot SKU.
func (o edgeOptions) rows() []edgeRow {
	if o.only == onlyCeiling {
		return slices.DeleteFunc(edgeRows(), func(row edgeRow) bool { return row.Name != edgeAlone })
	}
	return edgeRows()
}

// buyersServed are the answers a buyer expects: an order, or sold out.
var buyersServed = []string{"201", "409"}

// The sale's lifecycle: the shares of the reservations paid at once and
// cancelled by their buyers (bin/loadtest -pay-frac, -cancel-frac); the
// rest wait for their pay_by, which no row reaches.
const (
	edgePayFrac    = "0.5"
	edgeCancelFrac = "0.3"
)

// edgeRun is one row in one round.
type edgeRun struct {
	Round  int
	Row    edgeRow
	Buyers loadResult
	Flood  loadResult // zero without a flood
	Verify verifyReport
	// Outlasted is set when the buyers were still buying when the flood
	// ended: part of the sale ran without it.
	Outlasted bool
	// CPU is what the buyers' load cost the machine (the flood's load
	// test aside); the ceiling's hot SKU reads it from the sale alone.
	CPU cpuUse
}

// served is the rate of a result's answers with the given statuses.
func served(r loadResult, want ...string) float64 {
	if r.Seconds <= 0 {
		return 0
	}
	n := 0
	for _, s := range want {
		n += r.Statuses[s]
	}
	return float64(n) / r.Seconds
}

// buyersRate is the buyers' served answers per second.
func (r edgeRun) buyersRate() float64 { return served(r.Buyers, buyersServed...) }

// floodRate is the flood's expected answers per second.
func (r edgeRun) floodRate() float64 { return served(r.Flood, r.Row.Expect) }

// payRate is the payments applied per second, over the time from the
// first payment sent to the last one answered.
func (r edgeRun) payRate() float64 {
	p := r.Buyers.Payments
	if p == nil || p.Events.Seconds <= 0 {
		return 0
	}
	return float64(p.InTime.Paid) / p.Events.Seconds
}

// cancelRate is the orders cancelled per second, over the time from the
// first cancel sent to the last one answered.
func (r edgeRun) cancelRate() float64 {
	c := r.Buyers.Cancels
	if c == nil || c.Attempts.Seconds <= 0 {
		return 0
	}
	return float64(c.Cancelled) / c.Attempts.Seconds
}

func runEdge(ctx context.Context, argv []string, stdout, stderr io.Writer) error {
	o, err := parseEdge(argv[2:])
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(o.out, "runs"), 0o755); err != nil {
		return err
	}
	ports, err := readEnvFile(filepath.Join(o.state, "ports.env"))
	if err != nil {
		return fmt.Errorf("%w (is the stack up? SHOP_STATE=%s scripts/stack.sh up)", err, o.state)
	}
	url := "http://127.0.0.1:" + ports["NGINX_PORT"]
	env := stackEnv(o.state)
	db, err := openStackDB(o.state)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	// The shipped defaults: no setting of the replicas' own.
	if _, err := commandEnv(ctx, env, stderr, o.stack, "replicas", "3"); err != nil {
		return err
	}
	c := &ceiling{o: o, env: env, url: url, db: db, stderr: stderr}
	var runs []edgeRun
	var ceil []ceilingRun
	for round := 1; round <= o.rounds; round++ {
		for _, k := range []ceilingKind{floodLoad, clientLoad, clientsLoad} {
			got, err := c.runKind(ctx, round, k)
			ceil = append(ceil, got...)
			if err != nil {
				return err
			}
		}
		for _, row := range o.rows() {
			fmt.Fprintf(stderr, "\n== round %d/%d: %s\n", round, o.rounds, row.Name)
			r, err := runEdgeRow(ctx, o, env, url, round, row, stderr)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, row.Name, err)
			}
			fmt.Fprintf(stderr, "== %s: buyers %s, %.0f/s; flood %s, %.0f/s; CPU over the buyers %s; verify %s\n", row.Name,
				statuses(r.Buyers.Statuses), r.buyersRate(), statuses(r.Flood.Statuses), r.floodRate(), r.CPU, edgeVerdict(r.Verify))
			runs = append(runs, r)
			if row.Name == edgeAlone {
				ceil = append(ceil, hotCeiling(r))
			}
		}
		for _, k := range []ceilingKind{selloutLoad, overloadLoad} {
			got, err := c.runKind(ctx, round, k)
			ceil = append(ceil, got...)
			if err != nil {
				return err
			}
		}
	}

	// Once: how stale a page another replica serves may be.
	fmt.Fprintf(stderr, "\n== page staleness\n")
	stale, err := probeStaleness(ctx, o, env, ports["REPLICA_PORTS"], stderr)
	if err != nil {
		return err
	}

	command := strings.Join(argv, " ")
	cores := runtime.NumCPU()
	ceilTbl := ceilingTable(o, ceil)
	cpuTbl := cpuTable(ceil)
	goals := goalTable(edgeGoals(o, ceil, runs)) + "\n" + clientsTable(ceil) + "\n" + stalenessLine(stale)
	tbl := edgeTable(runs)
	life := edgeLifeTable(runs)
	bots := botTable(o, runs)
	notes := edgeNotes(runs)
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, ceilTbl, "\n", goals, "\n", cpuTbl, "\n")
	fmt.Fprint(stdout, tbl, "\n", life, "\n", bots, notes)
	fmt.Fprintf(stdout, "\n%d CPU cores (runtime.NumCPU). Command: %s\n", cores, command)
	if err := writeEdgeReport(o, ceilingReport(o, ceilTbl, goals, cpuTbl), tbl+"\n"+life, bots, notes, cores, command); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "report: %s\n", filepath.Join(o.out, "report.md"))
	for _, r := range ceil {
		// The hot SKU's verdict is the sale alone's, which the loop below
		// reports under its own name.
		if !r.Verify.OK && r.Row.Kind != aloneLoad {
			fmt.Fprintf(stdout, "FAILED: shop verify, ceiling, %s, round %d\n", r.Row.Name, r.Round)
			return errVerifyFailed
		}
	}
	for _, r := range runs {
		if !r.Verify.OK {
			fmt.Fprintf(stdout, "FAILED: shop verify, %s, round %d\n", r.Row.Name, r.Round)
			return errVerifyFailed
		}
	}
	switch {
	case !stale.Verify.OK:
		fmt.Fprintln(stdout, "FAILED: shop verify, page staleness")
		return errVerifyFailed
	case stale.Own > 0 || stale.Missed > 0:
		fmt.Fprintf(stdout, "FAILED: page staleness: a replica served its own order's page stale %d times, and %d pages did not show an order within %s\n",
			stale.Own, stale.Missed, stalenessLimit)
		return errStalePages
	}
	return nil
}

// errStalePages is a page that broke the staleness promise (see
// probeStaleness).
var errStalePages = errors.New("product pages staler than promised")

// runEdgeRow reseeds the product, starts the row's flood and, after its
// warm-up, the buyers (or the bot farm); once both have ended, it verifies
// the sale.
func runEdgeRow(ctx context.Context, o edgeOptions, env []string, url string, round int, row edgeRow, stderr io.Writer) (edgeRun, error) {
	r := edgeRun{Round: round, Row: row}
	if _, err := commandEnv(ctx, env, stderr, o.stack, "shop", "seed", "--products", "1", "--stock", strconv.Itoa(o.units)); err != nil {
		return r, err
	}
	base := filepath.Join(o.out, "runs", fmt.Sprintf("%d-%s", round, runSlug(row.Name)))

	var flood *exec.Cmd
	var floodEnd time.Time
	if row.Flood != "" {
		log, err := os.Create(base + ".flood.log")
		if err != nil {
			return r, err
		}
		defer log.Close()
		// Absent ids: above the one product, a thousand of them in turn;
		// the guessed orders' ids are drawn from as many.
		flood = exec.CommandContext(ctx, o.loadtest, "-scenario", row.Flood, "-url", url, "-for", o.floodFor.String(),
			"-c", strconv.Itoa(o.flooders), "-src-n", strconv.Itoa(o.floodSrcN), "-src-from", strconv.Itoa(o.srcN),
			"-skus", "1", "-distinct", "1000", "-first-user", strconv.Itoa(o.buyers+o.bots+1), "-json", base+".flood.json")
		flood.Stdout, flood.Stderr = log, log
		if err := flood.Start(); err != nil {
			return r, err
		}
		floodEnd = time.Now().Add(o.floodFor)
		select {
		case <-ctx.Done():
		case <-time.After(o.warmUp):
		}
	}
	args := []string{"-scenario", "hotsku", "-sku", "1", "-url", url, "-c", strconv.Itoa(o.workers), "-client", ordersClient,
		"-json", base + ".json", "-acks", base + ".acks"}
	if row.Bot {
		args = append(args, "-n", strconv.Itoa(o.bots), "-first-user", strconv.Itoa(o.buyers+1))
	} else {
		args = append(args, "-n", strconv.Itoa(o.buyers), "-src-n", strconv.Itoa(o.srcN),
			"-pay-frac", edgePayFrac, "-cancel-frac", edgeCancelFrac, "-webhook-secret", os.Getenv(envWebhookSecret))
	}
	var loadErr error
	r.CPU, loadErr = measureCPU(o.state, func() (time.Duration, error) {
		return runLoadtest(ctx, o.loadtest, base+".log", io.Discard, args...)
	})
	if flood != nil {
		r.Outlasted = time.Now().After(floodEnd)
		if err := flood.Wait(); err != nil && loadErr == nil {
			loadErr = fmt.Errorf("flood: %w (see %s.flood.log)", err, base)
		}
	}
	if loadErr != nil {
		return r, loadErr
	}
	if err := readJSON(base+".json", &r.Buyers); err != nil {
		return r, err
	}
	if flood != nil {
		if err := readJSON(base+".flood.json", &r.Flood); err != nil {
			return r, err
		}
	}
	var err error
	r.Verify, err = verifySale(ctx, o.stack, base+".acks", base+".verify.json", stderr, env...)
	return r, err
}

// roundRun is one row's run in one round: of the edge's table (edgeRun)
// or of the ceiling's (ceilingRun). The medians and the ratios to another
// row of the same round are taken alike for both.
type roundRun interface {
	roundNo() int
	rowName() string
	verified() bool
}

func (r edgeRun) roundNo() int    { return r.Round }
func (r edgeRun) rowName() string { return r.Row.Name }
func (r edgeRun) verified() bool  { return r.Verify.OK }

// runSlug is a row's name as part of its files' names.
func runSlug(name string) string {
	return strings.NewReplacer(" ", "-", "/", "", ":", "").Replace(name)
}

// allVerified is "ok" when every run's verify found the invariants held,
// else "FAIL".
func allVerified[T roundRun](runs []T) string {
	for _, r := range runs {
		if !r.verified() {
			return "FAIL"
		}
	}
	return "ok"
}

func edgeVerdict(v verifyReport) string {
	if v.OK {
		return "ok"
	}
	return "FAIL"
}

// roundOf returns the run of row name in round, if there is one.
func roundOf[T roundRun](runs []T, name string, round int) (T, bool) {
	i := slices.IndexFunc(runs, func(r T) bool { return r.rowName() == name && r.roundNo() == round })
	if i < 0 {
		var none T
		return none, false
	}
	return runs[i], true
}

// rowRuns returns the rounds of row name.
func rowRuns[T roundRun](runs []T, name string) []T {
	return slices.DeleteFunc(slices.Clone(runs), func(r T) bool { return r.rowName() != name })
}

// medianOf is the median of f over runs.
func medianOf[T any](runs []T, f func(T) float64) float64 {
	xs := make([]float64, len(runs))
	for i, r := range runs {
		xs[i] = f(r)
	}
	return median(xs)
}

// ratioTo is the median over runs of each run's rate over that of row name
// in the same round.
func ratioTo[T roundRun](all, runs []T, name string, rate func(T) float64) float64 {
	return medianOf(runs, func(r T) float64 {
		base, ok := roundOf(all, name, r.roundNo())
		if !ok || rate(base) <= 0 {
			return 0
		}
		return rate(r) / rate(base)
	})
}

// ratioCell renders ratioTo with the median rates of runs and of row name
// beside it: the ratio is the median of each round's, not the ratio of the
// medians, and the two may differ.
func ratioCell[T roundRun](all, runs []T, name string, rate func(T) float64) string {
	return fmt.Sprintf("%.2f× (%.0f vs %.0f)", ratioTo(all, runs, name, rate), medianOf(runs, rate), medianOf(rowRuns(all, name), rate))
}

// limitCounts sums a result's 429s and 503s over runs, the limits that
// were met (nginx's or the service's rate limits; the service's busy
// answers), and the answers that are neither those nor expected, with the
// transport errors.
func limitCounts(runs []edgeRun, of func(edgeRun) loadResult, expected ...string) string {
	var tooMany, busy, other int
	for _, r := range runs {
		for s, n := range of(r).Statuses {
			switch {
			case s == "429":
				tooMany += n
			case s == "503":
				busy += n
			case !slices.Contains(expected, s):
				other += n
			}
		}
		other += sumCounts(of(r).Errors)
	}
	return fmt.Sprintf("%d · %d · %d", tooMany, busy, other)
}

// edgeColumns are the main table's headings.
var edgeColumns = []string{"row", "flood served/s", "flood 429 · 503 · other", "buyers served/s", "× alone",
	"× under /healthz flood", "buyers p99", "buyers 429 · 503 · other", "verify"}

// saleTable renders the sale rows (not the bot farm's) that runs has as
// one Markdown table under columns, each row's cells as cells gives them
// from the row and its rounds.
func saleTable(runs []edgeRun, columns []string, cells func(row edgeRow, rr []edgeRun) []string) string {
	var b strings.Builder
	line := func(cells ...string) { fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | ")) }
	line(columns...)
	fmt.Fprintf(&b, "|%s\n", strings.Repeat("---|", len(columns)))
	for _, row := range edgeRows() {
		if rr := rowRuns(runs, row.Name); !row.Bot && len(rr) > 0 {
			line(cells(row, rr)...)
		}
	}
	return b.String()
}

// edgeTable renders the sale rows as one Markdown table of medians.
func edgeTable(runs []edgeRun) string {
	return saleTable(runs, edgeColumns, func(row edgeRow, rr []edgeRun) []string {
		flood, floodLimits := "–", "–"
		if row.Flood != "" {
			flood = fmt.Sprintf("%.0f (%s)", medianOf(rr, edgeRun.floodRate), row.Expect)
			floodLimits = limitCounts(rr, func(r edgeRun) loadResult { return r.Flood }, row.Expect)
		}
		rate := medianOf(rr, edgeRun.buyersRate)
		vsAlone := ratioCell(runs, rr, edgeAlone, edgeRun.buyersRate)
		vsHealthz := "–"
		if row.Flood != "" {
			vsHealthz = ratioCell(runs, rr, edgeHealthz, edgeRun.buyersRate)
		}
		return []string{row.Name, flood, floodLimits, fmt.Sprintf("%.0f", rate), vsAlone, vsHealthz,
			ms(medianOf(rr, func(r edgeRun) float64 { return r.Buyers.P99Ms })),
			limitCounts(rr, func(r edgeRun) loadResult { return r.Buyers }, buyersServed...), allVerified(rr)}
	})
}

// edgeLifeColumns are the edge's lifecycle table's headings.
var edgeLifeColumns = []string{"row", "placed/s", "× under /healthz flood", "paid/s", "× under /healthz flood", "cancelled/s",
	"× under /healthz flood", "payments 429 · 503 · other", "cancels 429 · 503 · other"}

// edgeLifeTable renders the buyers' lifecycle in the sale rows: their rates of
// placing (201 and 409), paying and cancelling, each beside its ratio to
// the same round's under the /healthz flood, as one Markdown table of
// medians.
func edgeLifeTable(runs []edgeRun) string {
	return saleTable(runs, edgeLifeColumns, func(row edgeRow, rr []edgeRun) []string {
		cells := []string{row.Name}
		for _, rate := range lifeRates {
			x := "–"
			if row.Flood != "" && row.Name != edgeHealthz {
				x = fmt.Sprintf("%.2f×", ratioTo(runs, rr, edgeHealthz, rate.of))
			}
			cells = append(cells, fmt.Sprintf("%.0f", medianOf(rr, rate.of)), x)
		}
		pays := lifeLimits(rr, func(r edgeRun) map[string]int {
			if r.Buyers.Payments == nil {
				return nil
			}
			return r.Buyers.Payments.Statuses
		}, "200")
		cancels := lifeLimits(rr, func(r edgeRun) map[string]int {
			if r.Buyers.Cancels == nil {
				return nil
			}
			return r.Buyers.Cancels.Statuses
		}, "200")
		return append(cells, pays, cancels)
	})
}

// lifeRates are the buyers' rates that edgeLifeTable and edgeNotes hold to
// the goal.
var lifeRates = []struct {
	name string
	of   func(edgeRun) float64
}{{"placing", edgeRun.buyersRate}, {"paying", edgeRun.payRate}, {"cancelling", edgeRun.cancelRate}}

// lifeLimits sums the 429s and 503s over runs among every attempt's
// answer that of gives (keyed as bin/loadtest keys them: "503",
// "429 rate_limited", "200 applied", "error"), and the answers whose
// status is neither those nor expected.
func lifeLimits(runs []edgeRun, of func(edgeRun) map[string]int, expected string) string {
	var tooMany, busy, other int
	for _, r := range runs {
		for key, n := range of(r) {
			switch status, _, _ := strings.Cut(key, " "); status {
			case "429":
				tooMany += n
			case "503":
				busy += n
			case expected:
			default:
				other += n
			}
		}
	}
	return fmt.Sprintf("%d · %d · %d", tooMany, busy, other)
}

// botTable renders the bot farm's row: how many of its requests got an
// answer from the sale and how many nginx refused.
func botTable(o edgeOptions, runs []edgeRun) string {
	var b strings.Builder
	for _, row := range edgeRows() {
		rr := rowRuns(runs, row.Name)
		if !row.Bot || len(rr) == 0 {
			continue
		}
		count := func(r edgeRun, s ...string) float64 {
			n := 0
			for _, k := range s {
				n += r.Buyers.Statuses[k]
			}
			return float64(n)
		}
		fmt.Fprintln(&b, "| bot farm | user ids | from | got through (201 · 409) | refused 429 | other | took | verify |")
		fmt.Fprintln(&b, "|---|---|---|---|---|---|---|---|")
		fmt.Fprintf(&b, "| %s | %d | 127.0.0.1 | %.0f (%.0f · %.0f) | %.0f | %.0f | %.1fs | %s |\n", row.Name, o.bots,
			medianOf(rr, func(r edgeRun) float64 { return count(r, buyersServed...) }),
			medianOf(rr, func(r edgeRun) float64 { return count(r, "201") }),
			medianOf(rr, func(r edgeRun) float64 { return count(r, "409") }),
			medianOf(rr, func(r edgeRun) float64 { return count(r, "429") }),
			medianOf(rr, func(r edgeRun) float64 {
				return float64(r.Buyers.Requests) - count(r, "201", "409", "429")
			}),
			medianOf(rr, func(r edgeRun) float64 { return r.Buyers.Seconds }), allVerified(rr))
	}
	return b.String()
}

// edgeNotes states the goal's verdict for each flood of a public route
// (the buyers keep at least 0.9× of their rate under the /healthz flood),
// and what the medians do not show.
func edgeNotes(runs []edgeRun) string {
	var b strings.Builder
	b.WriteString("\n")
	for _, row := range edgeRows() {
		if row.Flood == "" || row.Name == edgeHealthz {
			continue
		}
		rr := rowRuns(runs, row.Name)
		if len(rr) == 0 {
			continue
		}
		for _, rate := range lifeRates {
			x := ratioTo(runs, rr, edgeHealthz, rate.of)
			verdict := "met"
			if x < 0.9 {
				verdict = "NOT met"
			}
			fmt.Fprintf(&b, "goal (buyers %s keep ≥ 0.90× of their rate under the /healthz flood), %s: %.2f×, %s\n",
				rate.name, row.Name, x, verdict)
		}
	}
	for _, r := range runs {
		if r.Outlasted {
			fmt.Fprintf(&b, "note: round %d, %s: the buyers were still buying when the flood ended.\n", r.Round, r.Row.Name)
		}
	}
	return b.String()
}

// writeEdgeReport writes report.md to o.out: the ceiling's section, then
// the edge's tables.
func writeEdgeReport(o edgeOptions, ceiling, tbl, bots, notes string, cores int, command string) error {
	var b strings.Builder
	b.WriteString("# The public edge\n\n")
	b.WriteString(ceiling)
	b.WriteString("\n## Under floods\n\n")
	fmt.Fprintf(&b, "Through nginx on the private stack (three replicas, one MariaDB, one Redis), with the shipped defaults. "+
		"Each sale: one product with %d units, %d buyers (each a different user, %d at once, from %d loopback addresses). "+
		"A flood: %d clients for %s from %d other addresses, the buyers starting %s in. "+
		"%d rounds, rows alternating; every figure is the median over the rounds, the 429 · 503 · other counts their sums. "+
		"Machine: %d CPU cores. Run %s.\n\n",
		o.units, o.buyers, o.workers, o.srcN, o.flooders, o.floodFor, o.floodSrcN, o.warmUp, o.rounds, cores,
		time.Now().UTC().Format(time.RFC3339))
	b.WriteString(tbl)
	b.WriteString("\n")
	b.WriteString(bots)
	b.WriteString(notes)
	b.WriteString(`
- **flood served/s**: the flood's answers with the status it expects (in brackets) per second of the flood.
- **placed/s, paid/s, cancelled/s**: the buyers' lifecycle. Of the reservations, ` + edgePayFrac + ` are paid at once by the
  payment provider's signed events and ` + edgeCancelFrac + ` cancelled by their buyer (` + "`bin/loadtest -pay-frac -cancel-frac -webhook-secret`" + `);
  placed/s is buyers served/s, paid/s the payments applied per second from the first sent to the last answered,
  cancelled/s the same of the cancels (200). **× under /healthz flood** is the median of each round's ratio.
- **payments, cancels 429 · 503 · other**: every attempt's answer of that kind over the rounds (payments and cancels
  are sent again after a 429 or 503, as a provider and a buyer would).
- **buyers served/s**: the buyers' 201 and 409 (sold out) per second of the sale; **× alone** and **× under /healthz
  flood** divide it by the same round's sale alone and under the ` + "`/healthz`" + ` flood, the absolute medians beside.
  The ` + "`/healthz`" + ` flood costs the service nothing: what it takes from the buyers is the machine's share the flood
  itself takes (the flooder, nginx), the bar that a flood of any other route is held to.
- **429 · 503 · other**: every answer of that kind over the rounds; 429 is a rate limit (nginx's per address, or
  the service's per user or address), 503 the service refusing work it has no room for; other is any other
  status or a transport error.
- **bot farm**: user ids from one address (127.0.0.1), ` + "`bin/loadtest`" + ` without ` + "`-src-n`" + `; nginx's limits per address
  refuse what is beyond them.
- **verify**: ` + "`shop verify --acks`" + ` after each sale, ok only if every round's was.
`)
	fmt.Fprintf(&b, "\nCommand: `%s`\n", command)
	return os.WriteFile(filepath.Join(o.out, "report.md"), []byte(b.String()), 0o644)
}
