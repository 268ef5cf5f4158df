package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakePhase is a phase whose figures are easy to check: requests over one
// second, with statuses and statement counts as given.
func fakePhase(round int, phase string, c benchConfig, statuses map[string]int, stmts [4]int64, ok bool) benchPhase {
	requests := 0
	for _, n := range statuses {
		requests += n
	}
	p := benchPhase{Round: round, Phase: phase, Config: c,
		Load:  loadResult{Requests: requests, Seconds: 1, RPS: float64(requests), P50Ms: 5, P99Ms: 50, Statuses: statuses},
		Stmts: map[string]int64{}, Txns: 10, TxnOrders: 40, Sold: int64(statuses["201"])}
	for i, name := range statementCounters {
		p.Stmts[name] = stmts[i]
	}
	p.Verify.OK = ok
	p.Verify.Checks = []check{{Name: "stock >= 0"}}
	if !ok {
		p.Verify.Checks[0].Violations = 1
	}
	return p
}

// cellsOf returns the table line whose first cells are prefix.
func cellsOf(t *testing.T, tbl string, prefix ...string) []string {
	t.Helper()
	for _, line := range strings.Split(tbl, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) >= len(prefix) && slices.Equal(cells[:len(prefix)], prefix) {
			return cells
		}
	}
	t.Fatalf("no line %q in\n%s", prefix, tbl)
	return nil
}

func TestBenchTable(t *testing.T) {
	configs := benchConfigs()
	base, lock, def := configs[0], configs[1], configs[2]
	var phases []benchPhase
	for round := 1; round <= 2; round++ {
		for i, c := range configs {
			sold := 100 * (i + 1) * round // 201s per second
			phases = append(phases,
				fakePhase(round, phaseHot, c, map[string]int{"201": sold, "409": 10}, [4]int64{int64(sold), int64(sold), int64(sold), int64(sold)}, true),
				fakePhase(round, phaseAfter, c, map[string]int{"409": 200 * (i + 1)}, [4]int64{50, 0, 0, 0}, !(round == 2 && c.Name == def.Name)))
		}
	}
	col := func(name string) int { return slices.Index(benchColumns, name) }
	tbl := benchTable(phases, 2)

	if n := strings.Count(tbl, "\n"); n != 2+2*3*len(configs) {
		t.Errorf("%d lines, want the heading, its rule and 2 runs and a median for %d configurations in 2 phases:\n%s", n, len(configs), tbl)
	}
	if strings.Index(tbl, "| "+phaseHot+" | "+base.Name+" | 1 |") > strings.Index(tbl, "| "+phaseHot+" | "+lock.Name+" | 1 |") ||
		strings.Index(tbl, "| "+phaseHot) > strings.Index(tbl, "| "+phaseAfter) {
		t.Errorf("not ordered by phase, then configuration:\n%s", tbl)
	}
	row := cellsOf(t, tbl, phaseHot, def.Name, "2")
	for name, want := range map[string]string{"orders/s": "600", "statuses": "201×600 409×10", "sold": "600",
		"SELECT/req": "0.98", "statements/req": "3.93", "orders/transaction": "4.00", "SELECT per refused order": "-",
		"verify": "ok", "× baseline": "3.00×", "p99": "50ms"} {
		if got := row[col(name)]; got != want {
			t.Errorf("hot, default, run 2: %s = %q, want %q", name, got, want)
		}
	}
	row = cellsOf(t, tbl, phaseAfter, lock.Name, "1")
	for name, want := range map[string]string{"orders/s": "0", "requests/s": "400", "SELECT per refused order": "0.125",
		"× baseline": "2.00×"} {
		if got := row[col(name)]; got != want {
			t.Errorf("after sell-out, Redis batch 1: %s = %q, want %q", name, got, want)
		}
	}
	if got := cellsOf(t, tbl, phaseAfter, def.Name, "2")[col("verify")]; got != "FAIL: stock >= 0" {
		t.Errorf("a broken invariant shows as %q", got)
	}
	row = cellsOf(t, tbl, phaseHot, lock.Name, "median of 2")
	if row[col("orders/s")] != "300" || row[col("× baseline")] != "2.00×" || row[col("verify")] != "ok" {
		t.Errorf("median line %q", row)
	}
	if got := cellsOf(t, tbl, phaseAfter, def.Name, "median of 2")[col("verify")]; got != "FAIL" {
		t.Errorf("the median line of a configuration with a failed run says %q", got)
	}
	if one := benchTable(phases[:6], 1); strings.Contains(one, "median") {
		t.Errorf("one round has median lines:\n%s", one)
	}
}

func TestBenchNotesSaleShort(t *testing.T) {
	o := benchOptions{hotUnits: 500, hotBuyers: 600, skus: 100}
	c := benchConfigs()[1]
	phases := []benchPhase{
		fakePhase(1, phaseHot, c, map[string]int{"201": 490, "409": 100, "503": 10}, [4]int64{}, true),
		fakePhase(1, phaseSellout, c, map[string]int{"201": 100, "409": 300}, [4]int64{}, true),
	}
	notes := benchNotes(o, phases)
	if !strings.Contains(notes, "hot SKU, redis, batch 1, run 1 sold 490 units, not 500") || strings.Contains(notes, "sellout") {
		t.Errorf("notes:\n%s", notes)
	}
}

func TestBenchConfigs(t *testing.T) {
	want := [][]string{{"SHOP_LOCK_MODE=none", "SHOP_ORDER_BATCH=1"}, {"SHOP_LOCK_MODE=redis", "SHOP_ORDER_BATCH=1"}, {"SHOP_LOCK_MODE=redis"},
		{"SHOP_LOCK_MODE=redis", "SHOP_AUTH=jwt", "SHOP_JWT_SECRET=" + benchJWTSecret}, {"SHOP_LOCK_MODE=redis"},
		{"SHOP_LOCK_MODE=mysql"}, {"SHOP_LOCK_MODE=etcd"}, {"SHOP_LOCK_MODE=zookeeper"}, {"SHOP_LOCK_MODE=redis"},
		{"SHOP_LOCK_MODE=redis", "SHOP_ORDER_GROUP=8"}, {"SHOP_LOCK_MODE=redis", "SHOP_ORDER_GROUP=8"}}
	configs := benchConfigs()
	if len(configs) != len(want) {
		t.Fatalf("%d configurations, want %d", len(configs), len(want))
	}
	for i, c := range configs {
		if !slices.Equal(c.Env, want[i]) || c.Baseline != (i == 0) {
			t.Errorf("configuration %d: %+v, want settings %q", i, c, want[i])
		}
	}
	// The one with auth on signs with the secret its replicas check, and
	// is set beside the default, which differs by that alone.
	jwt, def := configs[3], configs[2]
	if !slices.Equal(jwt.Load, []string{"-jwt-secret", benchJWTSecret}) || jwt.Beside != def.Name ||
		!slices.Equal(slices.DeleteFunc(slices.Clone(jwt.Env), func(kv string) bool { return strings.HasPrefix(kv, "SHOP_AUTH=") || strings.HasPrefix(kv, "SHOP_JWT_") }), def.Env) {
		t.Errorf("auth configuration %+v is not the default %+v with SHOP_AUTH=jwt", jwt, def)
	}
	// The one with events on is the default with them on, beside it.
	for i, c := range configs {
		if c.Events != (i == 4) {
			t.Errorf("configuration %d (%s): events %v", i, c.Name, c.Events)
		}
	}
	if ev := configs[4]; ev.Name != benchEventsConfig || ev.Beside != def.Name || len(ev.Load) > 0 {
		t.Errorf("events configuration %+v is not the default %+v with events on", ev, def)
	}
	// The one on Galera is the default on Galera, beside the default on
	// the single MariaDB, and so is the grouped one beside the grouped one;
	// every other is on the single MariaDB.
	for i, c := range configs {
		if want := dbSingle; c.dbTopology() != want && i != 8 && i != 10 {
			t.Errorf("configuration %d (%s): DB_TOPOLOGY=%s, want %s", i, c.Name, c.dbTopology(), want)
		}
	}
	if g := configs[8]; g.Name != benchGaleraConfig || g.dbTopology() != dbGalera || g.Beside != def.Name || len(g.Load) > 0 || g.Events {
		t.Errorf("Galera configuration %+v is not the default %+v on Galera", g, def)
	}
	grouped, galeraGrouped := configs[9], configs[10]
	if grouped.Name != benchGroupConfig || grouped.Beside != def.Name || grouped.dbTopology() != dbSingle {
		t.Errorf("grouped configuration %+v is not the default %+v with grouped commits beside it", grouped, def)
	}
	if galeraGrouped.dbTopology() != dbGalera || galeraGrouped.Beside != grouped.Name || !slices.Equal(galeraGrouped.Env, grouped.Env) {
		t.Errorf("grouped Galera configuration %+v is not %+v on Galera, beside it", galeraGrouped, grouped)
	}
	if len(benchJWTSecret) < 32 {
		t.Errorf("benchJWTSecret is %d bytes; SHOP_JWT_SECRET needs 32", len(benchJWTSecret))
	}
}

// The pair table sets the configuration with auth beside the default, each
// phase and run, with the ratio of their rates.
func TestBenchPairs(t *testing.T) {
	configs := benchConfigs()
	def, jwt := configs[2], configs[3]
	phases := []benchPhase{
		fakePhase(1, phaseHot, def, map[string]int{"201": 1000}, [4]int64{}, true),
		fakePhase(1, phaseHot, jwt, map[string]int{"201": 900}, [4]int64{}, true),
		fakePhase(1, phaseAfter, def, map[string]int{"409": 400}, [4]int64{}, true),
		fakePhase(1, phaseAfter, jwt, map[string]int{"409": 300}, [4]int64{}, true),
	}
	got := benchPairs(phases)
	for _, want := range []string{
		"| hot SKU | 1 | redis, default batch, jwt vs redis, default batch | 1000 | 900 | 0.90× |",
		"| after sell-out | 1 | redis, default batch, jwt vs redis, default batch | 400 | 300 | 0.75× |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("pairs lack %q:\n%s", want, got)
		}
	}
	if benchPairs(phases[:1]) != "" {
		t.Error("a pair with one side missing is shown")
	}
}

func TestParseBench(t *testing.T) {
	o, err := parseBench(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.rounds != 1 || o.hotUnits != 5000 || o.hotBuyers != 6000 || o.skus != 5000 || o.buyers != 4 || o.workers != 200 ||
		o.state != ".state/bench-orders" || o.out != "out/bench-orders" {
		t.Errorf("defaults %+v", o)
	}
	if o.only != nil {
		t.Errorf("by default every configuration runs, not those of %q", o.only)
	}
	if o, err := parseBench([]string{"-configs", "^redis, default batch(, events)?$"}); err != nil || !o.only.MatchString(benchEventsConfig) ||
		o.only.MatchString("redis, default batch, jwt") {
		t.Errorf("-configs: %v, %v", o.only, err)
	}
	for _, bad := range [][]string{{"-rounds", "0"}, {"-hot-units", "0"}, {"-c", "-1"}, {"extra"}, {"-configs", "("}} {
		if _, err := parseBench(bad); err == nil {
			t.Errorf("parseBench(%q) accepted", bad)
		}
	}
}

func TestStackEnvKeepsNoServiceSetting(t *testing.T) {
	t.Setenv("SHOP_ORDER_BATCH", "7")
	t.Setenv("SHOP_STATE", "elsewhere")
	env := stackEnv("/tmp/x")
	if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "SHOP_ORDER_BATCH=") }) ||
		!slices.Contains(env, "SHOP_STATE=/tmp/x") || slices.Contains(env, "SHOP_STATE=elsewhere") {
		t.Errorf("env %q", env)
	}
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) && os.Getenv("PATH") != "" {
		t.Error("PATH dropped")
	}
}

func TestScrapeMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP shop_order_transactions_total x\n# TYPE shop_order_transactions_total counter\n"+
			"shop_order_transactions_total 12\nshop_order_transaction_orders_total 3.5e+01\n"+
			`shop_orders_busy_total{cause="lease_lost"} 2`+"\n")
	}))
	defer srv.Close()
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	got := map[string]float64{}
	err := scrapeMetrics(t.Context(), []string{port, port}, func(series string, v float64) { got[series] += v })
	if err != nil {
		t.Fatal(err)
	}
	if got["shop_order_transactions_total"] != 24 || got["shop_order_transaction_orders_total"] != 70 {
		t.Errorf("sums %v", got)
	}
	busy, err := busyCauses(t.Context(), []string{port})
	if err != nil || busy["lease_lost"] != 2 {
		t.Errorf("busyCauses = %v, %v", busy, err)
	}
}

func TestConcatFiles(t *testing.T) {
	dir := t.TempDir()
	a, b, out := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "out")
	os.WriteFile(a, []byte("1 1 1\n"), 0o644)
	os.WriteFile(b, []byte("2 2 2\n"), 0o644)
	if err := concatFiles(out, a, b); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(out); string(data) != "1 1 1\n2 2 2\n" {
		t.Errorf("%q", data)
	}
}

// The events configuration's runs are set against the default's rates in
// the hot SKU and the sellout, against the goal.
func TestEventsGoals(t *testing.T) {
	configs := benchConfigs()
	def, ev := configs[2], configs[4]
	on := fakePhase(1, phaseSellout, ev, map[string]int{"201": 850}, [4]int64{}, true)
	on.Delivered = 4000
	phases := []benchPhase{
		fakePhase(1, phaseHot, def, map[string]int{"201": 1000}, [4]int64{}, true),
		fakePhase(1, phaseHot, ev, map[string]int{"201": 950}, [4]int64{}, true),
		fakePhase(1, phaseSellout, def, map[string]int{"201": 1000}, [4]int64{}, true),
		on,
		fakePhase(1, phaseAfter, def, map[string]int{"409": 400}, [4]int64{}, true),
		fakePhase(1, phaseAfter, ev, map[string]int{"409": 100}, [4]int64{}, true),
	}
	got := eventsGoals(phases)
	for _, want := range []string{
		"events on ÷ default, hot SKU, run 1: 0.95× (meets the goal of 0.90×)",
		"events on ÷ default, sellout, run 1: 0.85× (BELOW the goal of 0.90×); 4000 events delivered during the phase.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("goals lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "after sell-out") {
		t.Errorf("goals set the round after the sell-out against the goal:\n%s", got)
	}
	if !strings.Contains(benchPairs(phases), got) {
		t.Error("the pairs table leaves the goals out")
	}
	if eventsGoals(phases[:1]) != "" {
		t.Error("goals without the events configuration")
	}
}

func TestGaleraNotes(t *testing.T) {
	configs := benchConfigs()
	def, gal := configs[2], configs[8]
	galera := func(round int, phase string, sold int) benchPhase {
		p := fakePhase(round, phase, gal, map[string]int{"201": sold}, [4]int64{}, true)
		p.Wsrep = map[string]int64{"wsrep_replicated": int64(sold) / 4, "wsrep_replicated_bytes": int64(sold) / 4 * 900,
			"wsrep_local_cert_failures": 2, "wsrep_local_bf_aborts": 1, "wsrep_flow_control_paused_ns": 1500e6}
		p.CPU = cpuUse{Seconds: map[string]float64{cpuReplicas: 0.5, cpuMariaDB: 0.25}, Busy: 0.9, Machine: true}
		return p
	}
	var phases []benchPhase
	for round, r := range []struct{ def, hot, sellout int }{{1000, 600, 900}, {1000, 800, 950}, {1000, 500, 850}} {
		phases = append(phases,
			fakePhase(round+1, phaseHot, def, map[string]int{"201": r.def}, [4]int64{}, true), galera(round+1, phaseHot, r.hot),
			fakePhase(round+1, phaseSellout, def, map[string]int{"201": r.def}, [4]int64{}, true), galera(round+1, phaseSellout, r.sellout),
			galera(round+1, phaseAfter, 0))
	}
	grouped, galeraGrouped := configs[9], configs[10]
	phases = append(phases,
		fakePhase(1, phaseHot, grouped, map[string]int{"201": 1000}, [4]int64{}, true),
		fakePhase(1, phaseHot, galeraGrouped, map[string]int{"201": 900}, [4]int64{}, true))
	got := galeraNotes(phases)
	for _, want := range []string{
		"Galera, group 8 ÷ single MariaDB, hot SKU: 0.90× (median of 1 runs), at or above 0.70×.",
		"Galera ÷ single MariaDB, hot SKU: 0.60× (median of 3 runs), BELOW 0.70×.",
		"Galera ÷ single MariaDB, sellout: 0.90× (median of 3 runs).",
		"Galera, hot SKU, run 1: 0.25 writesets per order (900 B each), 2 certification failures, 1 brute-force aborts, " +
			"flow control paused 1.50s; CPU µs per request: replicas 833, MariaDB 417; machine busy 90%",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Galera notes lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, phaseAfter) {
		t.Errorf("Galera notes speak of the round after the sell-out:\n%s", got)
	}
	if !strings.Contains(benchPairs(phases), got) {
		t.Error("the pairs table leaves the Galera notes out")
	}
	if galeraNotes(phases[:1]) != "" {
		t.Error("Galera notes without the Galera configuration")
	}
}
