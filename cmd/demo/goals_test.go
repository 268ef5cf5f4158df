package main

import (
	"strings"
	"testing"
)

// fakeGoalRounds are three rounds of every ceiling row the goals read,
// each goal's median on its bound or on one side of it:
//   - hot SKU ÷ its /healthz: 0.50×, 0.375×, 0.55× → 0.50×, met on the bound;
//   - sellout ÷ its /healthz: 0.40×, 0.48×, 0.52× → 0.48×, not met;
//   - sellout p99 ÷ its /healthz p99: 1.33×, 1.50×, 2.22× → 1.50×, met on the bound;
//   - statements per sellout request: 0.70, 0.80, 1.50 → 0.80, met on the bound;
//   - MariaDB per sellout request: 60, 90, 100 µs → 90 µs, not met;
//   - the client's CPU per order ÷ per /healthz: 1.4×, 1.6×, 1.2× → 1.4×, met;
//   - cached page ÷ /healthz: 0.95×, 0.85×, 0.90× → 0.90×, met on the bound;
//   - the overload's p99: 800, 900, 1200 ms → 900 ms, every buyer answered: met.
func fakeGoalRounds() []ceilingRun {
	var runs []ceilingRun
	for i := range 3 {
		round := i + 1
		with := func(r ceilingRun, cpu map[string]float64) ceilingRun {
			r.CPU = cpuUse{Seconds: cpu}
			return r
		}
		overload := fakeCeiling(round, ceilingOverload, 3000, []float64{800, 900, 1200}[i], 0, true)
		overload.Load.Buyers, overload.Load.Answered = overload.Load.Requests, overload.Load.Requests
		runs = append(runs,
			fakeCeiling(round, ceilingHealthz, 10000, 20, 0, true),
			fakeCeiling(round, ceilingPage, []float64{9500, 8500, 9000}[i], 30, 0, true),
			with(fakeCeiling(round, ceilingHotTap, 8000, 40, 0, true), map[string]float64{cpuLoadtest: 1}),
			fakeCeiling(round, ceilingHot, []float64{4000, 3000, 4400}[i], 300, 0, true),
			with(fakeCeiling(round, ceilingOrders, 4000, 300, 0, true), map[string]float64{cpuLoadtest: []float64{1.4, 1.6, 1.2}[i]}),
			with(fakeCeiling(round, ceilingHeyHealthz, 6000, 50, 0, true), map[string]float64{cpuLoadtest: 2}),
			with(fakeCeiling(round, ceilingHeyOrders, 2400, 400, 0, true), map[string]float64{cpuLoadtest: 10}),
			fakeCeiling(round, ceilingSelloutTap, 5000, 900, 100, true),
			with(fakeCeiling(round, ceilingSellout, []float64{2000, 2400, 2600}[i], []float64{1200, 1350, 2000}[i],
				[]int64{14000, 16000, 30000}[i], true), map[string]float64{cpuMariaDB: []float64{1.2, 1.8, 2.0}[i]}),
			overload)
	}
	return runs
}

func TestEdgeGoals(t *testing.T) {
	o, err := parseEdge(nil)
	if err != nil {
		t.Fatal(err)
	}
	edge := []edgeRun{{Round: 1, Row: edgeRows()[0], Verify: verifyReport{OK: true}}}
	verdicts := func(gs []goal) string {
		var v []string
		for _, g := range gs {
			v = append(v, g.verdict())
		}
		return strings.Join(v, ", ")
	}
	gs := edgeGoals(o, fakeGoalRounds(), edge)
	if got, want := verdicts(gs), "met, met, not met, met, met, not met, met, met, met, met"; got != want {
		t.Errorf("verdicts %s, want %s:\n%s", got, want, goalTable(gs))
	}
	tbl := goalTable(gs)
	for _, want := range []string{
		"| row | figure | goal | verdict |",
		"| hot SKU ÷ `/healthz`, same client, same concurrency | 0.50× (4000/s vs 8000/s) | ≥ 0.5× | met |",
		"| hot SKU orders, no payments ÷ `/healthz`, same client, same concurrency | 0.50× (4000/s vs 8000/s) | ≥ 0.5× | met |",
		"| sellout (5000 × 4, 4000 at once) ÷ `/healthz` at 4000 at once, same client | 0.48× (2400/s vs 5000/s) | ≥ 0.5× | not met |",
		"| sellout p99 ÷ that `/healthz` p99 | 1.50× (1350 ms vs 900 ms) | ≤ 1.5× | met |",
		"| sellout: MySQL statements per request | 0.80 | ≤ 0.8 | met |",
		"| sellout: MariaDB CPU per request | 90 µs | ≤ 80 µs | not met |",
		"| the bench client's CPU per order ÷ its CPU per `/healthz` | 1.40× (70 µs vs 50 µs) | ≤ 1.5× | met |",
		"| cached page ÷ `/healthz` | 0.90× (9000/s vs 10000/s) | ≥ 0.9× | met |",
		"| overload: 60000 buyers of 5000 units, 3000 at once: p99, all answered | 900 ms, 0 unanswered | ≤ 1 s, all answered | met |",
		"| every sale's `shop verify --acks` | 13 of 13 correct | correct | met |",
	} {
		if !strings.Contains(tbl, want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, tbl)
		}
	}

	// A buyer of the overload unanswered in one round, a sale that
	// verify found wrong, and rows that did not run: none of those goals
	// is met, and what was not measured reads "–".
	runs := fakeGoalRounds()
	for i, r := range runs {
		if r.Row.Name == ceilingOverload && r.Round == 2 {
			runs[i].Load.Answered--
			runs[i].Load.Unanswered++
		}
	}
	edge[0].Verify.OK = false
	gs = edgeGoals(o, runs, edge)
	if got, want := verdicts(gs), "met, met, not met, met, met, not met, met, met, not met, not met"; got != want {
		t.Errorf("with an unanswered buyer and a failed verify: verdicts %s, want %s:\n%s", got, want, goalTable(gs))
	}
	if g := gs[8]; g.Figure != "900 ms, 1 unanswered" {
		t.Errorf("overload figure %q", g.Figure)
	}
	if g := gs[9]; g.Figure != "12 of 13 correct" {
		t.Errorf("verify figure %q", g.Figure)
	}
	var floods []ceilingRun
	for _, r := range fakeGoalRounds() {
		if r.Row.Kind == floodLoad {
			floods = append(floods, r)
		}
	}
	gs = edgeGoals(o, floods, nil)
	for i, g := range gs {
		if g.Met != (i == 7) || (i != 7) != (g.Figure == "–") {
			t.Errorf("floods alone: %s: %s, %s; want only the cached page measured and met", g.Row, g.Figure, g.verdict())
		}
	}
}

// The clients side by side: each client's /healthz and hot-SKU orders, and
// what each request cost the client itself.
func TestClientsTable(t *testing.T) {
	tbl := clientsTable(fakeGoalRounds())
	for _, want := range []string{
		"| the load test's own (`-client direct`) | 8000 | 4000 | 0.50× | 50 | 70 | 1.40× |",
		"| hey through the tap (`-client hey`) | 6000 | 2400 | 0.40× | 100 | 500 | 5.00× |",
	} {
		if !strings.Contains(tbl, want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, tbl)
		}
	}
	if tbl := clientsTable(fakeCeilingRounds()); tbl != "" {
		t.Errorf("no clients' rows ran, but:\n%s", tbl)
	}
}
