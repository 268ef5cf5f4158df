package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeCeiling is a run of the ceiling's row name over one second: rate
// counted answers (the buyers' split into 201s and 409s), p99Ms, and, but
// for the hot SKU, questions MySQL statements over 20000 requests, a tenth
// of them each of the four counted kinds. /healthz through the tap is
// answered 200, as the flood is.
func fakeCeiling(round int, name string, rate, p99Ms float64, questions int64, ok bool) ceilingRun {
	rows := ceilingRows()
	row := rows[slices.IndexFunc(rows, func(r ceilingRow) bool { return r.Name == name })]
	r := ceilingRun{Round: round, Row: row, Verify: verifyReport{OK: ok}}
	r.Load = loadResult{Requests: 20000, Seconds: 1, P99Ms: p99Ms, Statuses: map[string]int{"200": int(rate)}}
	if row.orders() {
		r.Load.Statuses = map[string]int{"201": int(rate) / 4, "409": int(rate) - int(rate)/4, "503": 7}
	}
	if row.Kind != aloneLoad {
		r.Stmts = map[string]int64{"Questions": questions}
		for _, c := range statementCounters {
			r.Stmts[c] = 2000
		}
	}
	return r
}

// fakeCeilingRounds are three rounds in which the medians of the ratios to
// /healthz differ from the ratios of the medians: the page keeps 0.70×,
// 0.90× and 0.70× (median 0.70) of 10000, 9000 and 11000 a second, whose
// median rates give 7700 / 10000 = 0.77×. So do the like-for-like ratios:
// the hot SKU keeps 0.625×, 0.60× and 0.50× (median 0.60) of /healthz
// through the tap, 4400 vs 8000 = 0.55× by the medians; the sellout 0.40×,
// 0.50×, 0.55× (0.50×), 2250 vs 5000 = 0.45×.
func fakeCeilingRounds() []ceilingRun {
	var runs []ceilingRun
	for i, hz := range []float64{10000, 9000, 11000} {
		round := i + 1
		page := []float64{7000, 8100, 7700}[i]
		hotTap := []float64{8000, 6000, 8800}[i]
		hot := []float64{5000, 3600, 4400}[i] // 0.50×, 0.40×, 0.40×
		selloutTap := []float64{5000, 4500, 5600}[i]
		sellout := []float64{2000, 2250, 3080}[i] // 0.20×, 0.25×, 0.28×
		runs = append(runs,
			fakeCeiling(round, ceilingHealthz, hz, 20, 200, true),
			fakeCeiling(round, ceilingPage, page, 30, 0, round != 2),
			fakeCeiling(round, ceilingHotTap, hotTap, 40, 100, true),
			fakeCeiling(round, ceilingHot, hot, []float64{300, 350, 320}[i], 0, true),
			fakeCeiling(round, ceilingSelloutTap, selloutTap, 900, 100, true),
			fakeCeiling(round, ceilingSellout, sellout, []float64{400, 600, 450}[i], []int64{18000, 14000, 22000}[i], true))
	}
	return runs
}

func TestCeilingTable(t *testing.T) {
	o, err := parseEdge(nil)
	if err != nil {
		t.Fatal(err)
	}
	tbl := ceilingTable(o, fakeCeilingRounds())
	if n := strings.Count(tbl, "\n"); n != 2+6 {
		t.Errorf("%d lines, want the heading, its rule and 6 rows:\n%s", n, tbl)
	}
	col := func(name string) int { return slices.Index(ceilingColumns, name) }
	for _, tt := range []struct {
		load string
		want map[string]string
	}{
		{"`GET /healthz`: 200 clients for 5s", map[string]string{"rate": "10000/s (200)", "÷ `GET /healthz`": "1.00× (10000 vs 10000)",
			"÷ /healthz, same client": "–", "p99": "20ms", "MySQL statements/req": "0.01", "verify": "ok"}},
		{"cached page, `GET /api/v1/products/1`: 200 clients for 5s", map[string]string{"rate": "7700/s (200)",
			"÷ `GET /healthz`": "0.70× (7700 vs 10000)", "÷ /healthz, same client": "–", "MySQL statements/req": "0.00",
			"verify": "FAIL"}},
		{"`GET /healthz` through the load test's own client, as the hot SKU: 6000 requests, 200 at once", map[string]string{
			"rate": "8000/s (200)", "÷ `GET /healthz`": "0.80× (8000 vs 10000)", "÷ /healthz, same client": "1.00× (8000 vs 8000)",
			"p99": "40ms", "verify": "ok"}},
		{"hot SKU: 6000 buyers of one 5000-unit SKU, 200 at once", map[string]string{"rate": "4400/s (201 + 409)",
			"÷ `GET /healthz`": "0.40× (4400 vs 10000)", "÷ /healthz, same client": "0.60× (4400 vs 8000)", "p99": "320ms",
			"MySQL statements/req": "–", "SELECT · UPDATE · INSERT · COMMIT /req": "–"}},
		{"`GET /healthz` through the load test's own client, as the sellout: 20000 requests, 4000 at once", map[string]string{
			"rate": "5000/s (200)", "÷ /healthz, same client": "1.00× (5000 vs 5000)", "p99": "900ms"}},
		{"sellout: 5000 products × 1 unit, 4 buyers each, 4000 at once", map[string]string{"rate": "2250/s (201 + 409)",
			"÷ `GET /healthz`": "0.25× (2250 vs 10000)", "÷ /healthz, same client": "0.50× (2250 vs 5000)", "p99": "450ms",
			"MySQL statements/req": "0.90", "SELECT · UPDATE · INSERT · COMMIT /req": "0.10 · 0.10 · 0.10 · 0.10", "verify": "ok"}},
	} {
		row := cellsOf(t, tbl, tt.load)
		for name, want := range tt.want {
			if got := row[col(name)]; got != want {
				t.Errorf("%s: %s = %q, want %q", tt.load, name, got, want)
			}
		}
	}
	if tbl := ceilingTable(o, fakeCeilingRounds()[:2]); strings.Contains(tbl, "hot SKU") || strings.Contains(tbl, "sellout") {
		t.Errorf("rows that did not run are shown:\n%s", tbl)
	}
}

// The hot SKU is the edge's sale alone of the same round, its buyers and
// its verdict.
func TestHotCeiling(t *testing.T) {
	alone := edgeRun{Round: 2, Row: edgeRows()[0], Verify: verifyReport{OK: true},
		Buyers: loadResult{Seconds: 4, P99Ms: 310, Statuses: map[string]int{"201": 5000, "409": 1000, "503": 3}},
		CPU:    cpuUse{Seconds: map[string]float64{cpuLoadtest: 3}, Busy: 0.9, Machine: true}}
	r := hotCeiling(alone)
	if r.Round != 2 || r.Row.Name != ceilingHot || r.rate() != 1500 || r.p99() != 310 || !r.Verify.OK || r.Stmts != nil ||
		r.CPU.Seconds[cpuLoadtest] != 3 || r.CPU.Busy != 0.9 {
		t.Errorf("hot SKU of the sale alone: %+v, rate %.0f", r, r.rate())
	}
}

func TestParseEdge(t *testing.T) {
	o, err := parseEdge(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.only != "" || o.ceilingFor != 5*time.Second || o.selloutSKUs != 5000 || o.selloutBuyers != 4 || o.selloutC != 4000 ||
		o.workers != 200 || o.srcN != crowdSources || o.rounds != 3 || o.overloadBuyers != 60000 || o.overloadUnits != 5000 ||
		o.overloadC != 3000 {
		t.Errorf("defaults %+v", o)
	}
	if got := o.rows(); !slices.Equal(got, edgeRows()) {
		t.Errorf("by default a round runs %v", got)
	}
	o, err = parseEdge([]string{"-only", "ceiling"})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.rows(); len(got) != 1 || got[0].Name != edgeAlone {
		t.Errorf("-only ceiling runs the edge's rows %v, want the sale alone", got)
	}
	for _, bad := range [][]string{{"-only", "floods"}, {"-ceiling-for", "0s"}, {"-tap-n", "100"}, {"-sellout-skus", "0"}, {"-sellout-buyers", "-1"},
		{"-sellout-c", "0"}, {"-overload-buyers", "0"}, {"-overload-units", "0"}, {"-overload-c", "-3"}, {"extra"}} {
		if _, err := parseEdge(bad); err == nil {
			t.Errorf("parseEdge(%q) accepted", bad)
		}
	}
}

// The ceiling's rows ask bin/loadtest for what the table says they are:
// 200 clients from the crowd for -ceiling-for, the source articles' sale,
// the overload; /healthz through a client (no -for) at the hot SKU's and
// the sellout's concurrency, as many requests as the order row's buyers
// (-buyers 6100 at 200 at once: rounded up to 6200); every
// order row but the hey rows through the load test's own client.
func TestCeilingArgs(t *testing.T) {
	o, err := parseEdge([]string{"-ceiling-for", "7s", "-src-n", "99", "-buyers", "6100"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		ceilingHealthz: {"-scenario", "healthz", "-url", "U", "-sku", "1", "-for", "7s", "-c", "200", "-src-n", "99"},
		ceilingPage:    {"-scenario", "hotread", "-url", "U", "-sku", "1", "-for", "7s", "-c", "200", "-src-n", "99"},
		ceilingHotTap: {"-scenario", "healthz", "-url", "U", "-n", "6200", "-c", "200", "-src-n", "99",
			"-client", "direct"},
		ceilingOrders: {"-scenario", "hotsku", "-sku", "1", "-url", "U", "-n", "6100", "-c", "200", "-src-n", "99",
			"-client", "direct"},
		ceilingHeyHealthz: {"-scenario", "healthz", "-url", "U", "-n", "6200", "-c", "200", "-src-n", "99", "-client", "hey"},
		ceilingHeyOrders: {"-scenario", "hotsku", "-sku", "1", "-url", "U", "-n", "6100", "-c", "200", "-src-n", "99",
			"-client", "hey"},
		ceilingSelloutTap: {"-scenario", "healthz", "-url", "U", "-n", "20000", "-c", "4000", "-src-n", "99",
			"-client", "direct"},
		ceilingSellout: {"-scenario", "sellout", "-url", "U", "-skus", "5000", "-buyers", "4", "-c", "4000", "-src-n", "99",
			"-client", "direct"},
		ceilingOverload: {"-scenario", "hotsku", "-sku", "1", "-url", "U", "-n", "60000", "-c", "3000", "-src-n", "99",
			"-client", "direct"},
	}
	for _, row := range ceilingRows() {
		if row.Kind == aloneLoad {
			continue
		}
		if got := row.args(o, "U"); !slices.Equal(got, want[row.Name]) {
			t.Errorf("%s: %q, want %q", row.Name, got, want[row.Name])
		}
	}
	if !slices.Equal(ceilingCounters, []string{"Questions", "Com_select", "Com_update", "Com_insert", "Com_commit"}) {
		t.Errorf("counters %q", ceilingCounters)
	}
}

// report.md opens with the ceiling, its goals and its notes, then the
// edge's tables.
func TestEdgeReportCeilingFirst(t *testing.T) {
	o, err := parseEdge([]string{"-out", t.TempDir(), "-only", "ceiling"})
	if err != nil {
		t.Fatal(err)
	}
	runs := []edgeRun{{Round: 1, Row: edgeRows()[0], Verify: verifyReport{OK: true},
		Buyers: loadResult{Seconds: 4, Statuses: map[string]int{"201": 5000, "409": 1000}}}}
	ceil := fakeCeilingRounds()
	tbl := ceilingTable(o, ceil)
	if err := writeEdgeReport(o, ceilingReport(o, tbl, goalTable(edgeGoals(o, ceil, runs)), cpuTable(ceil)), edgeTable(runs), botTable(o, runs), edgeNotes(runs), 2,
		"bin/demo -edge -only ceiling"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(o.out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(data)
	order := []string{"# The public edge", "## The ceiling", "| load | rate |", "| row | figure | goal | verdict |",
		"| cached page ÷ `/healthz` |",
		"- **rate**", "- **÷ /healthz, same client**", "### Where the time goes", "| row | requests | loadtest µs/req |",
		"- **µs/req**", "## Under floods", "| row | flood served/s", "| alone |", "Command: `bin/demo -edge -only ceiling`"}
	at := -1
	for _, s := range order {
		i := strings.Index(md, s)
		if i <= at {
			t.Errorf("report.md: %q at %d, not after what comes before it:\n%s", s, i, md)
		}
		at = i
	}
}

// The lifecycle table sets each flood's rates of placing, paying and
// cancelling beside the same round's under the /healthz flood, and the
// notes hold each to the goal.
func TestEdgeLifeTable(t *testing.T) {
	sale := func(row edgeRow, placed, paid, cancelled int, busy int) edgeRun {
		return edgeRun{Round: 1, Row: row, Verify: verifyReport{OK: true}, Buyers: loadResult{Seconds: 10,
			Statuses: map[string]int{"201": placed},
			Payments: &payResult{InTime: payTally{Paid: paid}, Events: eventTiming{Seconds: 10},
				Statuses: map[string]int{"200 applied": paid}},
			Cancels: &cancelResult{Cancelled: cancelled, Attempts: eventTiming{Seconds: 10},
				Statuses: map[string]int{"200": cancelled, "503": busy, "429 rate_limited": 1}}}}
	}
	rows := edgeRows()
	runs := []edgeRun{sale(rows[0], 5000, 2500, 1500, 0), sale(rows[1], 4000, 2000, 1000, 0), sale(rows[2], 4000, 2000, 500, 7)}
	if rows[1].Name != edgeHealthz || rows[2].Flood != "stock" {
		t.Fatalf("rows %v; the test wants /healthz's flood second and the stock's third", rows)
	}
	tbl := edgeLifeTable(runs)
	for _, want := range []string{
		"| alone | 500 | – | 250 | – | 150 | – | 0 · 0 · 0 | 1 · 0 · 0 |",
		"| flood GET /healthz | 400 | – | 200 | – | 100 | – | 0 · 0 · 0 | 1 · 0 · 0 |",
		"| flood GET existing stock | 400 | 1.00× | 200 | 1.00× | 50 | 0.50× | 0 · 0 · 0 | 1 · 7 · 0 |",
	} {
		if !strings.Contains(tbl, want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, tbl)
		}
	}
	notes := edgeNotes(runs)
	for _, want := range []string{"buyers paying keep ≥ 0.90× of their rate under the /healthz flood), flood GET existing stock: 1.00×, met",
		"buyers cancelling keep ≥ 0.90× of their rate under the /healthz flood), flood GET existing stock: 0.50×, NOT met"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}
