package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The ceiling (the first table of make bench-edge): how close the sale's
// routes come to the most the stack answers on this machine. GET /healthz
// asks nothing of Redis or MySQL, so its rate is what nginx, the replicas'
// HTTP stack and the load generator manage together: the ceiling. Each
// other row's rate is divided by the /healthz rate of the same round: a
// cached product page; the hot SKU (the edge's sale alone, one product with
// many units, reused rather than run twice); and the source articles' sellout (many
// products with one unit each, thousands of buyers at once), whose MariaDB
// statements per request are counted too, as bench-orders counts them.
// The two GET rows are floods (bin/loadtest -for): through hey, with its
// bookkeeping of every request, the load generator would measure itself
// rather than the stack. Every load comes from a crowd of source
// addresses, as the edge's sales do, so that nginx's per-address limits
// are not what is measured.
//
// The orders' own client is bin/loadtest's (-client direct): each buyer its
// own body, user and key, sent from the crowd's addresses over kept-alive
// connections, without hey or the tap's proxy between (loadtest/direct.go).
// It is still not the flood's bare client, so /healthz is measured through
// it too, at the hot SKU's concurrency and at the sellout's, and each
// order row is also divided by its own: the like-for-like ratio, which
// tells what the order costs beyond what its client costs. The client that
// sent the orders before it, hey through the tap, is measured beside it
// once more (the clients' rows: /healthz and hot-SKU orders through each),
// with what each costs its own process per request. For every row, the
// CPU each process group spent over the load (cpu.go) tells where the time
// went. Last in each round, the overload: many more buyers than units,
// thousands at once, whose p99 and unanswered buyers are held to a goal.

// The ceiling's rows, by name.
const (
	ceilingHealthz    = "GET /healthz"
	ceilingPage       = "cached page"
	ceilingHotTap     = "GET /healthz like hot SKU"
	ceilingHot        = "hot SKU"
	ceilingSelloutTap = "GET /healthz like sellout"
	ceilingSellout    = "sellout"
	// The clients' rows: hot-SKU orders (no payments, no cancels) through
	// the orders' client, and /healthz and the same orders through hey
	// and the tap.
	ceilingOrders     = "hot SKU orders"
	ceilingHeyHealthz = "GET /healthz like hot SKU, hey"
	ceilingHeyOrders  = "hot SKU orders, hey"
	ceilingOverload   = "overload"
)

// The clients of bin/loadtest -client: the orders' own, which every order
// row but the hey rows uses, and hey through the tap.
const (
	ordersClient = "direct"
	heyClient    = "hey"
)

// ceilingKind is how a ceiling row's load is made, and when in a round it
// runs: the floods first, then /healthz through the orders' client, then
// the clients' rows, then the edge's rows (the sale alone among them),
// then the sellout and the overload.
type ceilingKind int

const (
	floodLoad    ceilingKind = iota // a flood of one GET route
	clientLoad                      // GET /healthz through the orders' client, as an order row sends its requests
	clientsLoad                     // the clients side by side: /healthz and hot-SKU orders through each
	aloneLoad                       // the edge's sale alone
	selloutLoad                     // the source articles' sellout
	overloadLoad                    // many more buyers of one product than its units, thousands at once
)

// ceilingRow is a row of the ceiling's table.
type ceilingRow struct {
	Name     string
	Kind     ceilingKind
	Scenario string   // a flood's or a clients' row's bin/loadtest scenario
	Route    string   // a flood's route, for the table
	Served   []string // the answers its rate counts
	// Client is the bin/loadtest -client of an order or clientLoad row.
	Client string
	// Like is the order row whose concurrency a clientLoad row takes.
	Like ceilingKind
	// SameClient names the row whose load comes through the same client
	// at the same concurrency: an order row's /healthz row, which the
	// like-for-like ratio divides by; "" for none.
	SameClient string
}

// ceilingRows are the ceiling's rows in the table's order.
func ceilingRows() []ceilingRow {
	return []ceilingRow{
		{Name: ceilingHealthz, Kind: floodLoad, Scenario: "healthz", Route: "`GET /healthz`", Served: []string{"200"}},
		{Name: ceilingPage, Kind: floodLoad, Scenario: "hotread", Route: "`GET /api/v1/products/1`", Served: []string{"200"}},
		{Name: ceilingHotTap, Kind: clientLoad, Scenario: "healthz", Served: []string{"200"}, Client: ordersClient, Like: aloneLoad,
			SameClient: ceilingHotTap},
		{Name: ceilingHot, Kind: aloneLoad, Served: buyersServed, Client: ordersClient, SameClient: ceilingHotTap},
		{Name: ceilingOrders, Kind: clientsLoad, Scenario: "hotsku", Served: buyersServed, Client: ordersClient,
			SameClient: ceilingHotTap},
		{Name: ceilingHeyHealthz, Kind: clientsLoad, Scenario: "healthz", Served: []string{"200"}, Client: heyClient,
			Like: aloneLoad, SameClient: ceilingHeyHealthz},
		{Name: ceilingHeyOrders, Kind: clientsLoad, Scenario: "hotsku", Served: buyersServed, Client: heyClient,
			SameClient: ceilingHeyHealthz},
		{Name: ceilingSelloutTap, Kind: clientLoad, Scenario: "healthz", Served: []string{"200"}, Client: ordersClient,
			Like: selloutLoad, SameClient: ceilingSelloutTap},
		{Name: ceilingSellout, Kind: selloutLoad, Served: buyersServed, Client: ordersClient, SameClient: ceilingSelloutTap},
		{Name: ceilingOverload, Kind: overloadLoad, Served: buyersServed, Client: ordersClient},
	}
}

// orders tells whether the row's load places orders: its acknowledged
// orders are verified.
func (row ceilingRow) orders() bool {
	return row.Kind == aloneLoad || row.Kind == selloutLoad || row.Kind == overloadLoad || row.Scenario == "hotsku"
}

// atOnce is how many of a /healthz row's requests are in flight at once:
// as many as its order row's.
func (row ceilingRow) atOnce(o edgeOptions) int {
	if row.Like == selloutLoad {
		return o.selloutC
	}
	return o.workers
}

// tapRequests is how many requests a /healthz row sends: as many as its
// order row's buyers (the hot SKU's, or the sellout's), so that the two
// are like for like in every way but the route: the same client, the same
// concurrency, and as many requests over the same source addresses, each
// of which dials its connections once whatever it then sends. Rounded up
// to a multiple of the concurrency, since the load test would rather
// lower hey's concurrency to a divisor of them (hey drops a remainder).
func (row ceilingRow) tapRequests(o edgeOptions) int {
	c, n := row.atOnce(o), o.buyers
	if row.Like == selloutLoad {
		n = o.selloutSKUs * o.selloutBuyers
	}
	return (n + c - 1) / c * c
}

// clientName is how the table names a row's client.
func (row ceilingRow) clientName() string {
	if row.Client == heyClient {
		return "hey through the tap"
	}
	return "the load test's own client"
}

// load describes the row's load for the table.
func (row ceilingRow) load(o edgeOptions) string {
	switch {
	case row.Scenario == "healthz" && row.Kind != floodLoad:
		like := ceilingHot
		if row.Like == selloutLoad {
			like = ceilingSellout
		}
		return fmt.Sprintf("`GET /healthz` through %s, as the %s: %d requests, %d at once", row.clientName(), like,
			row.tapRequests(o), row.atOnce(o))
	case row.Scenario == "hotsku":
		return fmt.Sprintf("%s: %d buyers of one %d-unit SKU, %d at once, no payments, through %s", row.Name, o.buyers, o.units,
			o.workers, row.clientName())
	case row.Kind == aloneLoad:
		return fmt.Sprintf("%s: %d buyers of one %d-unit SKU, %d at once", row.Name, o.buyers, o.units, o.workers)
	case row.Kind == selloutLoad:
		return fmt.Sprintf("%s: %d products × 1 unit, %d buyers each, %d at once", row.Name, o.selloutSKUs, o.selloutBuyers,
			o.selloutC)
	case row.Kind == overloadLoad:
		return fmt.Sprintf("%s: %d buyers of one %d-unit SKU, %d at once", row.Name, o.overloadBuyers, o.overloadUnits,
			o.overloadC)
	}
	what := row.Route
	if row.Name != ceilingHealthz {
		what = row.Name + ", " + row.Route
	}
	return fmt.Sprintf("%s: %d clients for %s", what, o.workers, o.ceilingFor)
}

// args are the load test's arguments of the row's load but its files.
func (row ceilingRow) args(o edgeOptions, url string) []string {
	src := []string{"-src-n", strconv.Itoa(o.srcN)}
	switch {
	case row.Kind == selloutLoad:
		return slices.Concat([]string{"-scenario", "sellout", "-url", url, "-skus", strconv.Itoa(o.selloutSKUs),
			"-buyers", strconv.Itoa(o.selloutBuyers), "-c", strconv.Itoa(o.selloutC)}, src, []string{"-client", row.Client})
	case row.Kind == overloadLoad:
		return slices.Concat([]string{"-scenario", "hotsku", "-sku", "1", "-url", url, "-n", strconv.Itoa(o.overloadBuyers),
			"-c", strconv.Itoa(o.overloadC)}, src, []string{"-client", row.Client})
	case row.Scenario == "hotsku":
		return slices.Concat([]string{"-scenario", "hotsku", "-sku", "1", "-url", url, "-n", strconv.Itoa(o.buyers),
			"-c", strconv.Itoa(o.workers)}, src, []string{"-client", row.Client})
	case row.Kind == clientLoad || row.Kind == clientsLoad:
		// No -for: the load test sends -n requests through the row's
		// client, as it sends the buyers'.
		return slices.Concat([]string{"-scenario", row.Scenario, "-url", url, "-n", strconv.Itoa(row.tapRequests(o)),
			"-c", strconv.Itoa(row.atOnce(o))}, src, []string{"-client", row.Client})
	}
	return slices.Concat([]string{"-scenario", row.Scenario, "-url", url, "-sku", "1", "-for", o.ceilingFor.String(),
		"-c", strconv.Itoa(o.workers)}, src)
}

// ceilingCounters are the MariaDB counters a ceiling row's statements are
// counted by: Questions, every statement the clients sent (BEGIN and the
// replicas' background work included), then bench-orders' own.
var ceilingCounters = slices.Concat([]string{"Questions"}, statementCounters)

// ceilingRun is one ceiling row in one round.
type ceilingRun struct {
	Round int
	Row   ceilingRow
	Load  loadResult
	// Stmts are ceilingCounters' deltas over the load; nil for the hot
	// SKU, which is the edge's sale alone and reads none.
	Stmts  map[string]int64
	Verify verifyReport
	CPU    cpuUse
}

func (r ceilingRun) roundNo() int    { return r.Round }
func (r ceilingRun) rowName() string { return r.Row.Name }
func (r ceilingRun) verified() bool  { return r.Verify.OK }

// rate is the run's counted answers per second.
func (r ceilingRun) rate() float64 { return served(r.Load, r.Row.Served...) }

func (r ceilingRun) p99() float64 { return r.Load.P99Ms }

// statements is the MySQL statements per request: Questions' delta over
// the requests.
func (r ceilingRun) statements() float64 { return r.perRequest("Questions") }

func (r ceilingRun) perRequest(counter string) float64 {
	return perRequest(r.Stmts, counter, r.Load.Requests)
}

// hotCeiling is the ceiling's hot SKU in the round of alone, the edge's
// sale alone: the same sale, so it is not run twice.
func hotCeiling(alone edgeRun) ceilingRun {
	i := slices.IndexFunc(ceilingRows(), func(row ceilingRow) bool { return row.Kind == aloneLoad })
	return ceilingRun{Round: alone.Round, Row: ceilingRows()[i], Load: alone.Buyers, Verify: alone.Verify, CPU: alone.CPU}
}

// ceiling runs the ceiling's own rows on the stack.
type ceiling struct {
	o      edgeOptions
	env    []string // of every stack.sh command
	url    string   // nginx
	db     *sql.DB  // the stack's MariaDB, for its counters
	stderr io.Writer
}

// runKind runs the ceiling's rows of kind k, in order, in round.
func (c *ceiling) runKind(ctx context.Context, round int, k ceilingKind) ([]ceilingRun, error) {
	var runs []ceilingRun
	for _, row := range ceilingRows() {
		if row.Kind != k {
			continue
		}
		fmt.Fprintf(c.stderr, "\n== round %d/%d: ceiling, %s\n", round, c.o.rounds, row.Name)
		r, err := c.run(ctx, round, row)
		if err != nil {
			return runs, fmt.Errorf("round %d, ceiling, %s: %w", round, row.Name, err)
		}
		fmt.Fprintf(c.stderr, "== ceiling, %s: %s, %.0f/s, p99 %s, %.2f MySQL statements a request; CPU %s; verify %s\n",
			row.Name, statuses(r.Load.Statuses), r.rate(), ms(r.p99()), r.statements(), r.CPU, edgeVerdict(r.Verify))
		runs = append(runs, r)
	}
	return runs, nil
}

// run reseeds the catalog for the row (a flood and the clients' rows: the
// edge's one product; the sellout: its products with one unit each; the
// overload: one product with its units), runs the row's load between
// two readings of MariaDB's counters, and verifies the catalog: with the
// acknowledged orders of a row that places them, or with none after
// /healthz or a flood, which place no order but must leave every
// invariant as it found it.
func (c *ceiling) run(ctx context.Context, round int, row ceilingRow) (ceilingRun, error) {
	o := c.o
	r := ceilingRun{Round: round, Row: row}
	products, units := 1, o.units
	switch row.Kind {
	case selloutLoad:
		products, units = o.selloutSKUs, 1
	case overloadLoad:
		units = o.overloadUnits
	}
	if _, err := commandEnv(ctx, c.env, c.stderr, o.stack, "shop", "seed", "--products", strconv.Itoa(products),
		"--stock", strconv.Itoa(units)); err != nil {
		return r, err
	}
	base := filepath.Join(o.out, "runs", fmt.Sprintf("%d-ceiling-%s", round, runSlug(row.Name)))
	acks := base + ".acks"
	args := append(row.args(o, c.url), "-json", base+".json")
	if row.orders() {
		args = append(args, "-acks", acks)
	} else if err := os.WriteFile(acks, nil, 0o644); err != nil {
		return r, err
	}
	before, err := mysqlStatus(ctx, c.db, ceilingCounters)
	if err != nil {
		return r, err
	}
	r.CPU, err = measureCPU(o.state, func() (time.Duration, error) {
		return runLoadtest(ctx, o.loadtest, base+".log", io.Discard, args...)
	})
	if err != nil {
		return r, err
	}
	after, err := mysqlStatus(ctx, c.db, ceilingCounters)
	if err != nil {
		return r, err
	}
	r.Stmts = counterDeltas(ceilingCounters, before, after)
	if err := readJSON(base+".json", &r.Load); err != nil {
		return r, err
	}
	r.Verify, err = verifySale(ctx, o.stack, acks, base+".verify.json", c.stderr, c.env...)
	return r, err
}

// ceilingColumns are the ceiling table's headings.
var ceilingColumns = []string{"load", "rate", "÷ `GET /healthz`", "÷ /healthz, same client", "p99", "MySQL statements/req",
	"SELECT · UPDATE · INSERT · COMMIT /req", "verify"}

// ceilingTable renders the ceiling's rows as one Markdown table of medians
// over the rounds.
func ceilingTable(o edgeOptions, runs []ceilingRun) string {
	var b strings.Builder
	mdHeading(&b, ceilingColumns...)
	for row, rr := range ceilingRowsRun(runs) {
		stmts, each := "–", "–"
		if rr[0].Stmts != nil {
			stmts = fmt.Sprintf("%.2f", medianOf(rr, ceilingRun.statements))
			per := make([]string, len(statementCounters))
			for i, counter := range statementCounters {
				per[i] = fmt.Sprintf("%.2f", medianOf(rr, func(r ceilingRun) float64 { return r.perRequest(counter) }))
			}
			each = strings.Join(per, " · ")
		}
		same := "–"
		if row.SameClient != "" {
			same = ratioCell(runs, rr, row.SameClient, ceilingRun.rate)
		}
		mdLine(&b, row.load(o), fmt.Sprintf("%.0f/s (%s)", medianOf(rr, ceilingRun.rate), strings.Join(row.Served, " + ")),
			ratioCell(runs, rr, ceilingHealthz, ceilingRun.rate), same, ms(medianOf(rr, ceilingRun.p99)), stmts, each,
			allVerified(rr))
	}
	return b.String()
}

// cpuColumns are the headings of where the time goes.
var cpuColumns = slices.Concat([]string{"row", "requests"}, cpuGroupColumns(), []string{"machine busy"})

// cpuGroupColumns are the headings of the groups' µs per request.
func cpuGroupColumns() []string {
	cols := make([]string, len(cpuGroups))
	for i, g := range cpuGroups {
		cols[i] = g + " µs/req"
	}
	return cols
}

// cpuTable renders where the time goes: for each ceiling row, each
// process group's CPU over the load in µs per request, and the machine's
// busy share, medians over the rounds; "–" for what was not read.
func cpuTable(runs []ceilingRun) string {
	var b strings.Builder
	mdHeading(&b, cpuColumns...)
	for row, rr := range ceilingRowsRun(runs) {
		cells := []string{row.Name, fmt.Sprintf("%.0f", medianOf(rr, func(r ceilingRun) float64 { return float64(r.Load.Requests) }))}
		for _, g := range cpuGroups {
			cells = append(cells, orDash("%.0f", medianKnown(rr, func(r ceilingRun) float64 {
				return r.CPU.perRequest(g, r.Load.Requests)
			})))
		}
		busy := medianKnown(rr, func(r ceilingRun) float64 { return r.CPU.busy() })
		mdLine(&b, append(cells, orDash("%.0f%%", busy*100))...)
	}
	return b.String()
}

// ceilingRowsRun yields, in the table's order, each ceiling row that ran,
// with its runs.
func ceilingRowsRun(runs []ceilingRun) iter.Seq2[ceilingRow, []ceilingRun] {
	return func(yield func(ceilingRow, []ceilingRun) bool) {
		for _, row := range ceilingRows() {
			if rr := rowRuns(runs, row.Name); len(rr) > 0 && !yield(row, rr) {
				return
			}
		}
	}
}

// mdLine writes one line of a Markdown table.
func mdLine(w io.Writer, cells ...string) { fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | ")) }

// mdHeading writes a Markdown table's headings and the rule under them.
func mdHeading(w io.Writer, columns ...string) {
	mdLine(w, columns...)
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(columns)))
}

// ceilingReport is the ceiling's section of report.md: what was run, the
// table, the goals and what the columns mean, then where the time went.
func ceilingReport(o edgeOptions, tbl, goals, cpu string) string {
	var b strings.Builder
	b.WriteString("## The ceiling\n\n")
	fmt.Fprintf(&b, "Through nginx on the private stack (three replicas, one MariaDB, one Redis), with the shipped defaults: "+
		"how close the sale's routes come to `GET /healthz`, which asks nothing of Redis or MySQL, so that its rate is "+
		"what nginx, the replicas' HTTP stack and the load generator manage together on this machine. Each round runs "+
		"`GET /healthz` and the cached page as floods (`bin/loadtest -for %s`, %d clients), then `GET /healthz` through "+
		"the orders' own client (`bin/loadtest -client direct -n`, at the hot SKU's and at the sellout's concurrency), "+
		"then the clients side by side (`GET /healthz` and hot-SKU orders through hey and the tap, `-client hey`, and the "+
		"same orders through the orders' client), then the rows under floods below (the first of which, the sale alone, "+
		"is the hot SKU here), then the sellout after `shop seed --products %d --stock 1`, then the overload after "+
		"`shop seed --products 1 --stock %d`. Every load comes from %d loopback addresses. %d round(s), their rows "+
		"alternating; every figure is the median over them.\n\n",
		o.ceilingFor, o.workers, o.selloutSKUs, o.overloadUnits, o.srcN, o.rounds)
	b.WriteString(tbl)
	b.WriteString("\n")
	b.WriteString(goals)
	b.WriteString(`
- **rate**: the answers counted (in brackets) per second: a flood's ` + "`200`" + `s per second of the flood, the buyers'
  ` + "`201`" + ` and ` + "`409`" + ` (sold out) per second of the sale.
- **÷ ` + "`GET /healthz`" + `**: the rate over the same round's ` + "`GET /healthz`" + ` rate, the median of the rounds' ratios;
  the absolute medians beside. The cached page's goal is set on this one.
- **÷ /healthz, same client**: like for like. The orders' load generator is ` + "`bin/loadtest`" + `'s own client: every
  buyer its own body, user and Idempotency-Key, without the flood's bare loop, on the same cores as the stack, so
  part of what an order row loses against the flood's ` + "`/healthz`" + ` is its client's cost, not the order's. This
  column divides each order row by ` + "`GET /healthz`" + ` sent through the same client at the same concurrency, in the
  same round; the absolute medians beside. What is left is what the order itself costs beyond answering
  ` + "`/healthz`" + `. The order rows' goals are set on this one.
- **p99**: of every answer (a flood's answered requests; each buyer's whole wait in a sale).
- **MySQL statements/req**: the growth of MariaDB's ` + "`Questions`" + ` (` + "`SHOW GLOBAL STATUS`" + `: every statement a client sent,
  BEGIN and the replicas' background work included) from right before to right after the load, over its requests;
  beside it ` + "`Com_select`, `Com_update`, `Com_insert`, `Com_commit`" + ` alike. The hot SKU is the sale alone below,
  which does not read them.
- **verify**: ` + "`shop verify --acks`" + ` after each load, ok only if every round's was: with the sellout's acknowledged
  orders, and with none after a flood, which places no order.

The goals are the table above the rows' notes; the clients' table beside it sets ` + "`bin/loadtest`" + `'s own client and
hey through the tap side by side: the same ` + "`GET /healthz`" + ` and hot-SKU orders (no payments), and what each request
cost the client's own process (its rusage).
`)
	b.WriteString("\n### Where the time goes\n\n")
	b.WriteString(cpu)
	b.WriteString(`
- **µs/req**: CPU time (user and system) each process group spent over the row's load, over its requests: the
  load generator (` + "`bin/loadtest`" + `'s own rusage: its own client, hey and the tap, or the flood's clients), the three ` + "`shop serve`" + `
  replicas, MariaDB, every Redis server, and nginx's master and workers, read from ` + "`/proc/PID/stat`" + ` right
  before and right after the load by the pids the stack recorded. The groups together, times the rate, is about
  how many of the machine's cores they kept busy while the rate was measured.
- **machine busy**: the share of all cores' time that was not idle (` + "`/proc/stat`" + `) over the same span: the load
  test's whole run, its start and its end included, which the rate's seconds leave out and which keep the machine
  less busy, so it may read below what the groups times the rate say. Other processes of the machine count in it
  too.
- "–": not read (no ` + "`/proc`" + ` on this system, or a process that ended during the load).
`)
	return b.String()
}
