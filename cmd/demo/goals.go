package main

import (
	"fmt"
	"math"
	"strings"
)

// The goals of the near-the-wire issue, part two, as make bench-edge
// prints them: each figure the median over the rounds (which alternate
// their rows), each ratio the median of the rounds' own ratios, and a
// verdict. A figure that was not measured (its row did not run, or a
// reading failed) is "–" and its goal not met: a run that leaves a row out
// proves nothing about it.

// Each goal's bound.
const (
	goalHotRatio       = 0.5  // hot SKU ÷ /healthz, same client, same concurrency: at least
	goalSelloutRatio   = 0.5  // sellout ÷ /healthz at its concurrency, same client: at least
	goalSelloutP99     = 1.5  // sellout p99 ÷ that /healthz p99: at most
	goalStatements     = 0.8  // MySQL statements per sellout request: at most
	goalMariaDBMicros  = 80   // MariaDB CPU per sellout request, µs: at most
	goalClientCPURatio = 1.5  // the client's CPU per order ÷ per /healthz: at most
	goalPageRatio      = 0.9  // cached page ÷ /healthz: at least
	goalOverloadP99Ms  = 1000 // the overload's p99: at most, every buyer answered
)

// goal is a row of the goal table.
type goal struct {
	Row    string // what is measured
	Figure string // the figure, "–" when it was not measured
	Bound  string // the goal
	Met    bool
}

// verdict is the goal's verdict cell.
func (g goal) verdict() string {
	if g.Met {
		return "met"
	}
	return "not met"
}

// roundRatio is the median over the rounds of row name's f over that of
// row base in the same round; NaN when no round has both, known and base's
// above zero.
func roundRatio(runs []ceilingRun, name, base string, f func(ceilingRun) float64) float64 {
	return medianKnown(rowRuns(runs, name), func(r ceilingRun) float64 {
		b, ok := roundOf(runs, base, r.Round)
		if !ok || !(f(b) > 0) {
			return math.NaN()
		}
		return f(r) / f(b)
	})
}

// rowMedian is the median of f over row name's rounds, NaN when none is
// known.
func rowMedian(runs []ceilingRun, name string, f func(ceilingRun) float64) float64 {
	return medianKnown(rowRuns(runs, name), f)
}

// clientMicros is the load test's own CPU (its rusage) per request, µs.
func clientMicros(r ceilingRun) float64 { return r.CPU.perRequest(cpuLoadtest, r.Load.Requests) }

// mariadbMicros is MariaDB's CPU per request, µs.
func mariadbMicros(r ceilingRun) float64 { return r.CPU.perRequest(cpuMariaDB, r.Load.Requests) }

// allAnswered tells whether every buyer of the run had an answer: as many
// buyers as requests, each one's last answer a 2xx or a 4xx but 429.
func allAnswered(r ceilingRun) bool {
	l := r.Load
	return l.Requests > 0 && l.Buyers == l.Requests && l.Answered == l.Buyers && l.Unanswered == 0
}

// atLeast and atMost are a goal on x with its figure as figure renders it;
// an x that is not known is not met.
func atLeast(row string, x, bound float64, figure, boundText string) goal {
	return goal{Row: row, Figure: figureOr(x, figure), Bound: boundText, Met: !math.IsNaN(x) && x >= bound}
}

func atMost(row string, x, bound float64, figure, boundText string) goal {
	return goal{Row: row, Figure: figureOr(x, figure), Bound: boundText, Met: !math.IsNaN(x) && x <= bound}
}

func figureOr(x float64, figure string) string {
	if math.IsNaN(x) {
		return "–"
	}
	return figure
}

// ratioFigure renders a ratio with the medians of its two rows beside it.
func ratioFigure(x float64, format string, a, b float64) string {
	return fmt.Sprintf("%.2f× ("+format+" vs "+format+")", x, a, b)
}

// edgeGoals are the goal table's rows from the ceiling's runs and the
// edge's (whose sales' verdicts count too).
func edgeGoals(o edgeOptions, ceil []ceilingRun, edge []edgeRun) []goal {
	rate, p99 := ceilingRun.rate, ceilingRun.p99
	var gs []goal

	x := roundRatio(ceil, ceilingHot, ceilingHotTap, rate)
	gs = append(gs, atLeast("hot SKU ÷ `/healthz`, same client, same concurrency", x, goalHotRatio,
		ratioFigure(x, "%.0f/s", rowMedian(ceil, ceilingHot, rate), rowMedian(ceil, ceilingHotTap, rate)), "≥ 0.5×"))

	// The same buyers placing orders alone, without the sale's payments and
	// cancels: the order path's own share.
	x = roundRatio(ceil, ceilingOrders, ceilingHotTap, rate)
	gs = append(gs, atLeast("hot SKU orders, no payments ÷ `/healthz`, same client, same concurrency", x, goalHotRatio,
		ratioFigure(x, "%.0f/s", rowMedian(ceil, ceilingOrders, rate), rowMedian(ceil, ceilingHotTap, rate)), "≥ 0.5×"))

	x = roundRatio(ceil, ceilingSellout, ceilingSelloutTap, rate)
	gs = append(gs, atLeast(fmt.Sprintf("sellout (%d × %d, %d at once) ÷ `/healthz` at %d at once, same client", o.selloutSKUs,
		o.selloutBuyers, o.selloutC, o.selloutC), x, goalSelloutRatio,
		ratioFigure(x, "%.0f/s", rowMedian(ceil, ceilingSellout, rate), rowMedian(ceil, ceilingSelloutTap, rate)), "≥ 0.5×"))

	x = roundRatio(ceil, ceilingSellout, ceilingSelloutTap, p99)
	gs = append(gs, atMost("sellout p99 ÷ that `/healthz` p99", x, goalSelloutP99,
		ratioFigure(x, "%.0f ms", rowMedian(ceil, ceilingSellout, p99), rowMedian(ceil, ceilingSelloutTap, p99)), "≤ 1.5×"))

	x = rowMedian(ceil, ceilingSellout, func(r ceilingRun) float64 {
		if r.Stmts == nil {
			return math.NaN()
		}
		return r.statements()
	})
	gs = append(gs, atMost("sellout: MySQL statements per request", x, goalStatements, fmt.Sprintf("%.2f", x), "≤ 0.8"))

	x = rowMedian(ceil, ceilingSellout, mariadbMicros)
	gs = append(gs, atMost("sellout: MariaDB CPU per request", x, goalMariaDBMicros, fmt.Sprintf("%.0f µs", x), "≤ 80 µs"))

	x = roundRatio(ceil, ceilingOrders, ceilingHotTap, clientMicros)
	gs = append(gs, atMost("the bench client's CPU per order ÷ its CPU per `/healthz`", x, goalClientCPURatio,
		ratioFigure(x, "%.0f µs", rowMedian(ceil, ceilingOrders, clientMicros), rowMedian(ceil, ceilingHotTap, clientMicros)),
		"≤ 1.5×"))

	x = roundRatio(ceil, ceilingPage, ceilingHealthz, rate)
	gs = append(gs, atLeast("cached page ÷ `/healthz`", x, goalPageRatio,
		ratioFigure(x, "%.0f/s", rowMedian(ceil, ceilingPage, rate), rowMedian(ceil, ceilingHealthz, rate)), "≥ 0.9×"))

	over := rowRuns(ceil, ceilingOverload)
	x = rowMedian(ceil, ceilingOverload, p99)
	unanswered := 0
	answered := len(over) > 0
	for _, r := range over {
		answered = answered && allAnswered(r)
		unanswered += r.Load.Requests - r.Load.Answered
	}
	g := atMost(fmt.Sprintf("overload: %d buyers of %d units, %d at once: p99, all answered", o.overloadBuyers, o.overloadUnits,
		o.overloadC), x, goalOverloadP99Ms, fmt.Sprintf("%.0f ms, %d unanswered", x, unanswered), "≤ 1 s, all answered")
	g.Met = g.Met && answered
	gs = append(gs, g)

	sales, failed := 0, 0
	for _, r := range ceil {
		// The hot SKU is the edge's sale alone, counted below.
		if r.Row.orders() && r.Row.Kind != aloneLoad {
			sales++
			if !r.Verify.OK {
				failed++
			}
		}
	}
	for _, r := range edge {
		sales++
		if !r.Verify.OK {
			failed++
		}
	}
	verify := goal{Row: "every sale's `shop verify --acks`", Figure: "–", Bound: "correct", Met: sales > 0 && failed == 0}
	if sales > 0 {
		verify.Figure = fmt.Sprintf("%d of %d correct", sales-failed, sales)
	}
	return append(gs, verify)
}

// goalTable renders the goals as one Markdown table.
func goalTable(gs []goal) string {
	var b strings.Builder
	mdHeading(&b, "row", "figure", "goal", "verdict")
	for _, g := range gs {
		mdLine(&b, g.Row, g.Figure, g.Bound, g.verdict())
	}
	return b.String()
}

// clientsColumns are the headings of the clients side by side.
var clientsColumns = []string{"client", "`GET /healthz`/s", "hot SKU orders/s", "orders ÷ /healthz", "client µs per /healthz",
	"client µs per order", "per order ÷ per /healthz"}

// clientsTable sets the two clients side by side: /healthz and hot-SKU
// orders (no payments) through each at the hot SKU's concurrency, their
// rates and what each request cost the client's own process (its
// rusage), medians over the rounds; "" when neither client's rows ran.
func clientsTable(runs []ceilingRun) string {
	var b strings.Builder
	for _, c := range []struct{ name, healthz, orders string }{
		{"the load test's own (`-client direct`)", ceilingHotTap, ceilingOrders},
		{"hey through the tap (`-client hey`)", ceilingHeyHealthz, ceilingHeyOrders},
	} {
		if len(rowRuns(runs, c.orders)) == 0 {
			continue
		}
		if b.Len() == 0 {
			mdHeading(&b, clientsColumns...)
		}
		mdLine(&b, c.name, orDash("%.0f", rowMedian(runs, c.healthz, ceilingRun.rate)),
			orDash("%.0f", rowMedian(runs, c.orders, ceilingRun.rate)),
			orDash("%.2f×", roundRatio(runs, c.orders, c.healthz, ceilingRun.rate)),
			orDash("%.0f", rowMedian(runs, c.healthz, clientMicros)), orDash("%.0f", rowMedian(runs, c.orders, clientMicros)),
			orDash("%.2f×", roundRatio(runs, c.orders, c.healthz, clientMicros)))
	}
	return b.String()
}
