package main

import (
	"bytes"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"shop/internal/eventsink"
)

// fake returns a result whose verify report broke the named checks.
func fake(r row, orders, oversold int64, broken ...string) result {
	res := result{Row: r, Load: loadResult{Requests: 800, Seconds: 2, Statuses: map[string]int{"201": int(orders)}}}
	res.Verify.Orders, res.Verify.Oversold = orders, oversold
	for _, name := range append(oversellChecks, "one active order per (user, sku)", "every acknowledged order exists",
		"every acknowledged order has its sku and user") {
		c := check{Name: name}
		for _, b := range broken {
			if b == name {
				c.Violations = 1
			}
		}
		res.Verify.Checks = append(res.Verify.Checks, c)
	}
	res.Verify.OK = len(broken) == 0
	return res
}

func TestOutcome(t *testing.T) {
	must := row{Lock: "redis", Update: "naive", Replicas: 3, MustHold: true}
	race := row{Lock: "none", Update: "naive", Replicas: 3}
	hot := row{Lock: "redis", Update: "guarded", Fencing: true, Replicas: 3, Hot: true, Batch: 1, MustHold: true, WantSold: 300}
	stale := row{Lock: "redis", Update: "naive", Replicas: 3, Pause: true, MustRace: true}
	fault := func(f string) row {
		return row{Lock: "redis", Update: "guarded", Fencing: true, Replicas: 3, Fault: f, Retry: true, MustHold: true, WantSold: 200}
	}
	answered := func(r result, unanswered int, lost map[string]int) result {
		r.Load.Buyers, r.Load.Answered, r.Load.Unanswered = 800, 800-unanswered, unanswered
		for k, v := range lost {
			if k == "error" {
				r.Load.Errors = map[string]int{"connection reset": v}
			} else {
				r.Load.Statuses[k] = v
			}
		}
		return r
	}
	const oversell = "initial_stock == stock + active orders"
	tests := []struct {
		name    string
		res     result
		verdict string
		outcome string
		failed  bool
	}{
		{"must hold, held", fake(must, 200, 0), "correct", "holds, as it must", false},
		{"must hold, oversold", fake(must, 201, 1, oversell), "OVERSOLD", "FAILED: " + oversell, true},
		{"must hold, sold nothing", fake(must, 0, 0), "correct", "FAILED: nothing sold", true},
		{"race, raced", fake(race, 300, 100, oversell), "OVERSOLD", "oversold, as expected", false},
		{"race, did not", fake(race, 200, 0), "correct", "expected to race; did not race this run", false},
		{"race, lost an ack", fake(race, 300, 100, oversell, "every acknowledged order exists"), "BROKEN",
			"FAILED: every acknowledged order exists", true},
		{"hot, sold every unit", fake(hot, 300, 0), "correct", "holds, as it must", false},
		{"hot, sold short", fake(hot, 290, 0), "correct", "FAILED: sold 290, must sell 300", true},
		{"hot, oversold", fake(hot, 301, 1, oversell), "OVERSOLD", "FAILED: " + oversell, true},
		{"hot, an ack for another buyer", fake(hot, 300, 0, "every acknowledged order has its sku and user"), "BROKEN",
			"FAILED: every acknowledged order has its sku and user", true},
		{"stopped holder, raced", fake(stale, 201, 1, oversell), "OVERSOLD", "oversold, as it must", false},
		{"stopped holder, did not race", fake(stale, 200, 0), "correct", "FAILED: did not race", true},
		{"stopped holder, lost an ack", fake(stale, 201, 1, oversell, "every acknowledged order exists"), "BROKEN",
			"FAILED: every acknowledged order exists", true},
		{"fault, every buyer answered", answered(fake(fault(faultKillReplica), 200, 0), 0, map[string]int{"502": 7, "error": 3}),
			"correct", "holds, as it must", false},
		{"fault, a buyer unanswered", answered(fake(fault(faultMariaDB), 200, 0), 1, nil), "correct", "FAILED: 1 buyers unanswered", true},
		{"fault, sold short", answered(fake(fault(faultRedis), 199, 0), 0, nil), "correct", "FAILED: sold 199, must sell 200", true},
		{"rolling restart, nothing lost", answered(fake(fault(faultRolling), 200, 0), 0, map[string]int{"503": 5}),
			"correct", "holds, as it must", false},
		{"rolling restart, a 502", answered(fake(fault(faultRolling), 200, 0), 0, map[string]int{"502": 1}),
			"correct", "FAILED: 1 requests lost in the restart", true},
		{"rolling restart, a reset", answered(fake(fault(faultRolling), 200, 0), 0, map[string]int{"error": 2}),
			"correct", "FAILED: 2 requests lost in the restart", true},
	}
	for _, tt := range tests {
		if got := tt.res.verdict(); got != tt.verdict {
			t.Errorf("%s: verdict %q, want %q", tt.name, got, tt.verdict)
		}
		if got := tt.res.outcome(); got != tt.outcome {
			t.Errorf("%s: outcome %q, want %q", tt.name, got, tt.outcome)
		}
		if got := tt.res.failed(); got != tt.failed {
			t.Errorf("%s: failed %v, want %v", tt.name, got, tt.failed)
		}
	}
}

func TestReport(t *testing.T) {
	o, err := parse([]string{"-skus", "200", "-out", t.TempDir(), "-families=false", "-galera=false"})
	if err != nil {
		t.Fatal(err)
	}
	rows := experiment(o)
	hot := slices.IndexFunc(rows, func(r row) bool { return r.Hot })
	faults := slices.IndexFunc(rows, func(r row) bool { return r.Fault != "" })
	life := slices.IndexFunc(rows, func(r row) bool { return r.Life != "" })
	stripe := slices.IndexFunc(rows, row.stripe)
	if hot != 9 || faults != 12 || life != 18 || stripe != 21 || len(rows) != 24 || rows[23].Life != lifeEvents {
		t.Fatalf("%d rows, the first hot one at %d, the first fault row at %d, the first lifecycle row at %d, the first Stripe row at %d; "+
			"want 9 sell-out rows, 3 hot ones, 6 fault rows, 6 lifecycle rows, 2 of them Stripe rows and the events row last",
			len(rows), hot, faults, life, stripe)
	}
	var results []result
	for i, r := range rows {
		res := fake(r, 200, 0)
		if r.Hot {
			res = fake(r, r.WantSold, 0)
		}
		if !r.MustHold {
			res = fake(r, 200+int64(i), int64(i), "initial_stock == stock + active orders")
		}
		if r.Pause {
			res.Paused = 2 * time.Second
			res.Busy = map[string]int{"lease_lost": 3, "stale_fence": 1}
		}
		if r.Kill {
			res.Killed = 500 * time.Millisecond
		}
		if r.Fault != "" {
			res.Killed = 2 * time.Second
			res.Load.Buyers, res.Load.Answered, res.Load.Retries = 800, 800, 42
		}
		if r.Life != "" {
			res = fakeLife(r, nil)
		}
		results = append(results, res)
	}

	tbl := table(results)
	if lines := strings.Split(strings.TrimSpace(tbl), "\n"); len(lines) != len(rows)-6+1 {
		t.Fatalf("table has %d lines, want %d:\n%s", len(lines), len(rows)-6+1, tbl)
	}
	lt := lifeTable(results)
	if lines := strings.Split(strings.TrimSpace(lt), "\n"); len(lines) != 7 {
		t.Fatalf("lifecycle table has %d lines, want 7:\n%s", len(lines), lt)
	}
	for _, want := range []string{"19  as is", "20  sweep killed: replica 2 killed in its sweep at 21s", "21  SHOP_AUTH=jwt",
		"22  Stripe  ", "23  Stripe, refunder killed: replica 3 killed between the Refund API call for refund " + fakeRefundID(7),
		"2000 + 1500  1000     500           100 (100)", "500      500             500 of 500        1000  100 ",
		"1.2s / 1.8s", "correct  holds, as it must"} {
		if !strings.Contains(lt, want) {
			t.Errorf("lifecycle table lacks %q:\n%s", want, lt)
		}
	}
	st := stripeTable(results)
	if lines := strings.Split(strings.TrimSpace(st), "\n"); len(lines) != 3 {
		t.Fatalf("Stripe table has %d lines, want 3:\n%s", len(lines), st)
	}
	for _, want := range []string{"22  Stripe                   100           100       100               1                       1, = refund_id            -  ",
		"23  Stripe, refunder killed  100           100       101               2                       1, = refund_id            " +
			fakeRefundID(7) + ": 2 calls, 1 key",
		"600 (600) / 600", "100 / 100", "3.5s", "holds, as it must"} {
		if !strings.Contains(st, want) {
			t.Errorf("Stripe table lacks %q:\n%s", want, st)
		}
	}
	if stripeTable(results[:21]) != "" {
		t.Error("a Stripe table without Stripe rows")
	}
	et := eventsTable(results)
	if lines := strings.Split(strings.TrimSpace(et), "\n"); len(lines) != 2 {
		t.Fatalf("events table has %d lines, want 2:\n%s", len(lines), et)
	}
	for _, want := range []string{"24  events on, relay killed  2700              2700                     2700                   3  ",
		"0             0     0           e-7: 2, 2", "10s at 6s", "0 / 0 after 12.5s", "150ms / 14.2s", "no events check", "holds, as it must"} {
		if !strings.Contains(et, want) {
			t.Errorf("events table lacks %q:\n%s", want, et)
		}
	}
	if eventsTable(results[:23]) != "" {
		t.Error("an events table without the events row")
	}
	for _, want := range []string{"redis    guarded", "holder stopped 2s > TTL 500ms", "3 / 1", "oversold, as expected", "oversold, as it must",
		"holds, as it must", "replica 2 killed at 2s", "rolling restart at 2s", "Redis restarted empty at 2s", "MariaDB restarted at 2s",
		"Redis master failed over at 2s", "Redis master killed at 2s",
		"800/800 ",
		"redlock  naive", "master 3 killed at 500ms", "hot SKU  none     guarded  -        1 ", "hot SKU  redis    guarded  on       1 ",
		"hot SKU  redis    guarded  on       default", "sellout  redis    guarded  on       default"} {
		if !strings.Contains(tbl, want) {
			t.Errorf("table lacks %q:\n%s", want, tbl)
		}
	}

	if err := writeReport(o, results, 2); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(md), "\n| "); n != len(rows)+2+1+4 {
		t.Errorf("report.md has %d table lines, want %d (four tables, the Stripe rows and the events row in two):\n%s", n, len(rows)+2+1+4, md)
	}
	if !strings.Contains(string(md), "### Events") || !strings.Contains(string(md), "refuses connections for 10s") {
		t.Errorf("report.md lacks the events table's description:\n%s", md)
	}
	if !strings.Contains(string(md), "### Refunds through Stripe's API") || !strings.Contains(string(md), "lease (1m0s)") {
		t.Errorf("report.md lacks the Stripe table's description:\n%s", md)
	}
	if !strings.Contains(string(md), "22. **lifecycle, redis/guarded ×3, fencing on, SHOP_PAY_WINDOW=20s, SHOP_PAYMENTS=stripe on stripe-mock**") ||
		!strings.Contains(string(md), "23. **lifecycle, redis/guarded ×3, fencing on, SHOP_PAY_WINDOW=20s, SHOP_PAYMENTS=stripe on stripe-mock, "+
			"a replica killed between a Refund API call and its record, buyers and payers retry**") {
		t.Errorf("report.md lacks the Stripe rows' labels:\n%s", md)
	}
	if !strings.Contains(string(md), "19. **lifecycle, redis/guarded ×3, fencing on, SHOP_PAY_WINDOW=20s**") ||
		!strings.Contains(string(md), "One product with 1000 units and 2000 buyers") {
		t.Errorf("report.md lacks the lifecycle rows:\n%s", md)
	}
	data, err := os.ReadFile(filepath.Join(o.out, "report.png"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if _, want := chartLayout(chartFace(t), results); img.Bounds().Dy() != want {
		t.Errorf("chart is %d px high, want %d: one band per row", img.Bounds().Dy(), want)
	}
	if !strings.Contains(string(md), "17. **redis/guarded ×3, fencing on, Redis master failed over, buyers retry, Redis via sentinel**") ||
		!strings.Contains(string(md), "18. **redis/guarded ×3, fencing on, Redis master killed, buyers retry, Redis via sentinel**") {
		t.Errorf("report.md lacks the Sentinel rows:\n%s", md)
	}
	if !strings.Contains(string(md), "hot SKU, redis/guarded ×3, fencing on, default batch") ||
		!strings.Contains(string(md), "one product with 5000 units to 6000 buyers") {
		t.Errorf("report.md lacks the hot rows:\n%s", md)
	}
}

func TestHotRows(t *testing.T) {
	o, err := parse([]string{"-hot-units", "300", "-hot-buyers", "400", "-families=false"})
	if err != nil {
		t.Fatal(err)
	}
	var env [][]string
	for _, r := range experiment(o) {
		if r.Hot {
			if !r.MustHold || r.WantSold != 300 || r.Update != "guarded" {
				t.Errorf("hot row %s: must hold %v, must sell %d", r.label(), r.MustHold, r.WantSold)
			}
			env = append(env, r.env())
		}
	}
	want := [][]string{
		{"SHOP_LOCK_MODE=none", "SHOP_STOCK_UPDATE=guarded", "SHOP_FENCING=on", "SHOP_ORDER_BATCH=1"},
		{"SHOP_LOCK_MODE=redis", "SHOP_STOCK_UPDATE=guarded", "SHOP_FENCING=on", "SHOP_ORDER_BATCH=1"},
		{"SHOP_LOCK_MODE=redis", "SHOP_STOCK_UPDATE=guarded", "SHOP_FENCING=on"},
	}
	if !slices.EqualFunc(env, want, slices.Equal) {
		t.Errorf("hot rows' settings %q, want %q", env, want)
	}
	if o, _ := parse([]string{"-hot-units", "400", "-hot-buyers", "300"}); experiment(o)[9].WantSold != 300 {
		t.Error("more units than buyers: the row must sell one unit per buyer")
	}
	if o, _ := parse([]string{"-hot-units", "0"}); slices.ContainsFunc(experiment(o), func(r row) bool { return r.Hot }) {
		t.Error("-hot-units 0 kept the hot rows")
	}
	for _, bad := range [][]string{{"-hot-units", "-1"}, {"-hot-buyers", "0"}, {"-hot-c", "0"}} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%v) accepted", bad)
		}
	}
	if _, err := parse([]string{"-hot-units", "0", "-hot-buyers", "0"}); err != nil {
		t.Errorf("no hot rows, no hot buyers: %v", err)
	}
}

func TestParseRefusesPauseWithinTTL(t *testing.T) {
	if _, err := parse([]string{"-ttl", "2s", "-pause", "1s"}); err == nil {
		t.Error("a pause shorter than the TTL was accepted")
	}
	if _, err := parse([]string{"-buyers", "1"}); err == nil {
		t.Error("one buyer per product was accepted: nothing could race")
	}
}

func TestReadEnvFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ports.env")
	os.WriteFile(path, []byte("NGINX_PORT=8080\nREPLICA_PORTS='1 2 3'\n"), 0o644)
	env, err := readEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if env["NGINX_PORT"] != "8080" || env["REPLICA_PORTS"] != "1 2 3" {
		t.Errorf("env = %v", env)
	}
}

func TestPauseAndFaultRows(t *testing.T) {
	o, err := parse([]string{"-skus", "200", "-pause", "1500ms", "-families=false", "-galera=false"})
	if err != nil {
		t.Fatal(err)
	}
	var pauses, faults int
	for _, r := range experiment(o) {
		args := replicaArgs(o, r)
		stops := slices.Contains(args, "GOFAIL_FAILPOINTS=shopStaleWrite=1*return(1500)") &&
			slices.Contains(args, "SHOP_BINARY="+failpointBinary)
		if stops != r.Pause {
			t.Errorf("%s: replicas %q: the failpoint is set %v, the row pauses %v", r.label(), args, stops, r.Pause)
		}
		if r.Pause {
			pauses++
			if r.Fencing != r.MustHold || r.Fencing == r.MustRace {
				t.Errorf("%s: must hold %v, must race %v", r.label(), r.MustHold, r.MustRace)
			}
		}
		sentinel := r.Fault == faultFailover || r.Fault == faultKillMaster
		wantTopology := "REDIS_TOPOLOGY=single"
		if sentinel {
			wantTopology = "REDIS_TOPOLOGY=sentinel"
		}
		if env := topologyEnv(r); env[len(env)-1] != wantTopology || env[len(env)-2] != "DB_TOPOLOGY=single" {
			t.Errorf("%s: the stack's environment ends %q, want DB_TOPOLOGY=single and %q", r.label(), env[len(env)-2:], wantTopology)
		}
		if r.Fault != "" {
			faults++
			if !r.Retry || !r.MustHold || r.WantSold != 200 || r.Lock != "redis" || r.Update != "guarded" || !r.Fencing || r.Batch != 0 {
				t.Errorf("fault row %s: the default settings with retrying buyers, selling every unit", r.label())
			}
		}
	}
	for _, tt := range []struct {
		fault string
		want  []string
	}{
		{faultKillReplica, []string{"-rate", "100", "-c", "10"}}, // 800 buyers over 8s
		{faultRolling, []string{"-rate", "44", "-c", "4"}},       // over 2s + 16s
		{faultFailover, []string{"-rate", "47", "-c", "4"}},      // over 2s + 15s
		{faultKillMaster, []string{"-rate", "47", "-c", "4"}},
	} {
		if got := faultLoad(o, row{Fault: tt.fault}); !slices.Equal(got, tt.want) {
			t.Errorf("%s: the load %q, want %q", tt.fault, got, tt.want)
		}
	}
	if pauses != 2 || faults != 6 {
		t.Errorf("%d pause rows and %d fault rows, want 2 and 6", pauses, faults)
	}
	if o, _ := parse([]string{"-faults=false"}); slices.ContainsFunc(experiment(o), func(r row) bool { return r.Fault != "" }) {
		t.Error("-faults=false kept the fault rows")
	}
	if _, err := parse([]string{"-fault-after", "3s", "-fault-span", "2s"}); err == nil {
		t.Error("a fault after the end of the sale was accepted")
	}
}

// The source articles' other lock families follow every other row: on three
// replicas with fencing, each family's sellout and hot SKU must hold; the
// etcd and ZooKeeper leaders are killed mid-sale (fault rows, gone with
// -faults=false), and a MySQL-table holder is stopped past its lease, which
// oversells without fencing and holds with it.
func TestFamilyRows(t *testing.T) {
	o, err := parse([]string{"-skus", "200", "-hot-units", "300", "-hot-buyers", "400"})
	if err != nil {
		t.Fatal(err)
	}
	rows := experiment(o)
	first := slices.IndexFunc(rows, func(r row) bool { return r.Lock == "mysql" })
	if first != 21 || len(rows) != 37 || !rows[31].stripe() || !rows[32].stripe() || rows[33].Life != lifeEvents ||
		slices.IndexFunc(rows, func(r row) bool { return r.DB == dbGalera }) != 34 {
		t.Fatalf("%d rows, the first of the families at %d; want them after the 21 others, 10 of them, then the 2 Stripe rows, "+
			"the events row and the 3 Galera rows", len(rows), first)
	}
	var got []string
	for _, r := range rows[first : first+10] {
		got = append(got, r.slug())
		if !r.tokens() || r.fencing() == "-" || r.Replicas != 3 {
			t.Errorf("%s: a family row on three replicas with tokens", r.label())
		}
		switch {
		case r.Pause && !r.Fencing:
			if !r.MustRace || r.MustHold || r.TTL != o.ttl {
				t.Errorf("%s: must race", r.label())
			}
		case !r.MustHold || r.WantSold != map[bool]int64{false: 200, true: 300}[r.Hot]:
			t.Errorf("%s: must hold, selling every unit: %v, %d", r.label(), r.MustHold, r.WantSold)
		}
	}
	want := []string{
		"mysql-guarded-x3-fencing-on", "hot-mysql-guarded-x3-fencing-on-batch-default",
		"mysql-naive-x3-fencing-off-pause", "mysql-naive-x3-fencing-on-pause",
		"etcd-guarded-x3-fencing-on", "hot-etcd-guarded-x3-fencing-on-batch-default", "etcd-guarded-x3-fencing-on-kill-etcd-leader",
		"zookeeper-guarded-x3-fencing-on", "hot-zookeeper-guarded-x3-fencing-on-batch-default", "zookeeper-guarded-x3-fencing-on-kill-zk-leader",
	}
	if !slices.Equal(got, want) {
		t.Errorf("family rows %q, want %q", got, want)
	}
	for _, r := range rows[first : first+10] {
		if r.Fault != "" && !r.Retry {
			t.Errorf("%s: its buyers must retry", r.label())
		}
	}
	if o, _ := parse([]string{"-faults=false"}); slices.ContainsFunc(experiment(o), func(r row) bool { return r.Fault != "" }) {
		t.Error("-faults=false kept the families' fault rows")
	}
	if o, _ := parse([]string{"-families=false"}); slices.ContainsFunc(experiment(o), func(r row) bool { return r.Lock == "etcd" }) {
		t.Error("-families=false kept the family rows")
	}
}

func TestParseRows(t *testing.T) {
	o, err := parse([]string{"-rows", "17, 18"})
	if err != nil || !slices.Equal(o.rows, []int{17, 18}) {
		t.Errorf("-rows 17,18: %v, %v", o.rows, err)
	}
	for _, bad := range []string{"0", "x", "17,"} {
		if _, err := parse([]string{"-rows", bad}); err == nil {
			t.Errorf("-rows %q accepted", bad)
		}
	}
	res := []result{{Row: row{Lock: "redis", Update: "guarded", Replicas: 3}, Num: 17}}
	if tbl := table(res); !strings.Contains(tbl, "\n17 ") {
		t.Errorf("a row run alone keeps its number:\n%s", tbl)
	}
}

// fakeLife returns a lifecycle row's result: 1000 units, 500 paid in time,
// 100 paid late and owed back (each a refund in MySQL), 400 lapsing unpaid,
// all 500 resold and paid; change, if given, alters its figures first.
func fakeLife(r row, change func(*result)) result {
	res := fake(r, 1500, 0)
	pays1 := &payResult{InTime: payTally{Sent: 500, Paid: 500}, Late: payTally{Sent: 100, Refused: 100}, Retries: 3}
	pays2 := &payResult{InTime: payTally{Sent: 500, Paid: 500}}
	l := &lifeResult{Units: 1000, Buyers: 2000, Resold: 500,
		Wave1:  loadResult{Buyers: 2000, Answered: 2000, Acks: 1000, Payments: pays1, Retries: 7},
		Wave2:  loadResult{Buyers: 1500, Answered: 1500, Acks: 500, Payments: pays2, Until: 500, Rebuys: 9000},
		Orders: map[string]int64{"paid": 1000, "expired": 500}, Back: map[string]int64{"paid": 0, "expired": 500},
		ReturnLag: lag{N: 500, P50: 300 * time.Millisecond, Max: 900 * time.Millisecond},
		ResaleLag: lag{N: 500, P50: 1200 * time.Millisecond, Max: 1800 * time.Millisecond}}
	for i := range 100 {
		l.Late = append(l.Late, fmt.Sprintf("%d pay-%d", i, i))
	}
	slices.Sort(l.Late)
	l.Refunds = slices.Clone(l.Late)
	if r.Life == lifeSweepKill {
		l.Killed, l.Fault = true, "replica 2 killed in its sweep at 21s, MariaDB restarted, replica back at 28s"
	}
	if r.stripe() {
		l.Stripe = fakeStripe(r)
	}
	if r.Life == lifeRefundKill {
		l.Killed, l.Fault = true, "replica 3 killed between the Refund API call for refund "+fakeRefundID(7)+" and its record at 23s, replica back at 25s"
	}
	if r.Life == lifeEvents {
		l.Killed, l.Fault = true, "replica 1 killed between the POST of event e-7 and its mark at 0.4s, replica back at 2.1s"
		l.Events = &eventsResult{Outbox: 2700, Changes: 2700, Drained: 12500 * time.Millisecond, Down: 6 * time.Second,
			Killed: "e-7", KilledAcks: 2, KilledStamps: 2,
			Summary: eventsink.Summary{Acknowledged: 2700, Duplicates: 3, LagP50Ms: 151, LagMaxMs: 14203, OK: true}}
	}
	res.Life, res.Load = l, l.Wave1
	res.Verify.Stock = 0
	if change != nil {
		change(&res)
	}
	return res
}

// fakeRefundID is the i-th refund id of fakeStripe.
func fakeRefundID(i int) string { return fmt.Sprintf("01JDEMO%019d", i) }

// fakeStripe returns a Stripe row's figures: 100 refunds, each refunded,
// called for once under its refund_id (the one in flight when the
// refund-kill row killed its replica, twice), 600 PaymentIntents for 600
// orders, the 100 that lapsed cancelled.
func fakeStripe(r row) *stripeResult {
	s := &stripeResult{Waited: 3500 * time.Millisecond, Bound: refundsWithin(r), Created: 600, CreateKeys: 600, CheckedOut: 600,
		Cancelled: 100, Lapsed: 100}
	for i := range 100 {
		id := fakeRefundID(i)
		s.Refunds = append(s.Refunds, refundCalls{RefundID: id, State: "refunded", Calls: 1, Keys: []string{id}})
	}
	if r.Life == lifeRefundKill {
		s.Killed = fakeRefundID(7)
		s.Refunds[7].Calls = 2
	}
	return s
}

func TestLifeRows(t *testing.T) {
	o, err := parse([]string{"-pay-window", "20s", "-stall", "4s", "-galera=false"})
	if err != nil {
		t.Fatal(err)
	}
	var life []row
	for _, r := range experiment(o) {
		if r.Life != "" {
			life = append(life, r)
		}
	}
	if len(life) != 6 || life[0].Life != lifeAsIs || life[1].Life != lifeSweepKill || life[2].Life != lifeJWT ||
		life[3].Life != lifeStripe || life[4].Life != lifeRefundKill || life[5].Life != lifeEvents {
		t.Fatalf("lifecycle rows %v", life)
	}
	for _, r := range life {
		args := replicaArgs(o, r)
		if !slices.Contains(args, "SHOP_PAY_WINDOW=20s") || !slices.Contains(args, "SHOP_LOCK_MODE=redis") || !r.MustHold {
			t.Errorf("%s: replicas %q", r.label(), args)
		}
		stall := slices.Contains(args, "GOFAIL_FAILPOINTS=shopSweepStall=1*return(4000)") && slices.Contains(args, "SHOP_BINARY="+failpointBinary)
		refund := slices.Contains(args, "GOFAIL_FAILPOINTS=shopRefundKill=1*return(30000)") && slices.Contains(args, "SHOP_BINARY="+failpointBinary)
		if stall != (r.Life == lifeSweepKill) || refund != (r.Life == lifeRefundKill) ||
			r.Retry != (r.Life == lifeSweepKill || r.Life == lifeRefundKill || r.Life == lifeEvents) {
			t.Errorf("%s: the sweep's failpoint %v, the refund's %v, buyers retry %v", r.label(), stall, refund, r.Retry)
		}
		stripe := r.Life == lifeStripe || r.Life == lifeRefundKill
		if slices.Contains(args, "SHOP_PAYMENTS=stripe") != stripe || r.stripe() != stripe || slices.ContainsFunc(args, func(a string) bool {
			return strings.HasPrefix(a, "SHOP_PAYMENTS=") && a != "SHOP_PAYMENTS=stripe"
		}) {
			t.Errorf("%s: replicas %q; want SHOP_PAYMENTS=stripe in the Stripe rows only", r.label(), args)
		}
		jwt := slices.Contains(args, "SHOP_AUTH=jwt") && slices.Contains(args, "SHOP_JWT_SECRET="+o.jwtSecret) && len(o.jwtSecret) >= 32
		if jwt != (r.Life == lifeJWT) {
			t.Errorf("%s: SHOP_AUTH=jwt with a secret %v", r.label(), jwt)
		}
	}
	if o, _ := parse([]string{"-life=false"}); slices.ContainsFunc(experiment(o), func(r row) bool { return r.Life != "" }) {
		t.Error("-life=false kept the lifecycle rows")
	}
	if o, _ := parse([]string{"-stripe=false", "-galera=false"}); slices.ContainsFunc(experiment(o), row.stripe) ||
		len(slices.DeleteFunc(experiment(o), func(r row) bool { return r.Life == "" })) != 4 {
		t.Error("-stripe=false kept the Stripe rows, or dropped others")
	}
	if o, _ := parse([]string{"-events=false", "-galera=false"}); slices.ContainsFunc(experiment(o), isEventsRow) ||
		len(slices.DeleteFunc(experiment(o), func(r row) bool { return r.Life == "" })) != 5 {
		t.Error("-events=false kept the events row, or dropped others")
	}
	for _, bad := range [][]string{{"-life-units", "0"}, {"-life-buyers", "1000"}, {"-pay-frac", "0.6", "-late-frac", "0.4"},
		{"-pay-window", "500ms"}} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%v) accepted", bad)
		}
	}
}

func TestLifeOutcome(t *testing.T) {
	as, kill := row{Life: lifeAsIs, MustHold: true}, row{Life: lifeSweepKill, Retry: true, MustHold: true}
	for _, tt := range []struct {
		name    string
		res     result
		outcome string
	}{
		{"held", fakeLife(as, nil), "holds, as it must"},
		{"killed in the sweep, held", fakeLife(kill, nil), "holds, as it must"},
		{"the failpoint never fired", fakeLife(kill, func(r *result) { r.Life.Killed = false }), "FAILED: no sweep reached the failpoint"},
		{"a unit paid short", fakeLife(as, func(r *result) { r.Life.Orders["paid"] = 999 }), "FAILED: paid 999, must be 1000"},
		{"an active order returned", fakeLife(as, func(r *result) { r.Life.Back["paid"] = 1 }),
			"FAILED: returned_at on map[expired:500 paid:1] of the orders map[expired:500 paid:1000]"},
		{"resold short", fakeLife(as, func(r *result) { r.Life.Wave2.Acks = 499 }),
			"FAILED: 500 units lapsed, 500 to resell, the waves won 1000 + 499 of 1000 units"},
		{"cancelled in the first wave and won again there", fakeLife(as, cancelled(107, 0)), "holds, as it must"},
		{"cancelled in the first wave and not won again", fakeLife(as, cancelled(107, 1)),
			"FAILED: 607 units lapsed, 500 to resell, the waves won 1106 + 500 of 1000 units"},
		{"a late payment not owed back", fakeLife(as, func(r *result) { r.Life.Refunds = r.Life.Refunds[1:] }),
			"FAILED: 99 refunds owed in MySQL, 100 payments made late"},
		{"a refund of a payment not late", fakeLife(as, func(r *result) { r.Life.Refunds[99] = "99 pay-100" }),
			"FAILED: 100 refunds owed in MySQL, 100 payments made late"},
		{"a late payment owed for another reason", fakeLife(as, func(r *result) {
			r.Life.WrongRefunds = []string{"order 7, payment pay-7: amount_mismatch, 1006 USD for an order of 1007 USD"}
		}), "FAILED: 1 refunds not owed as order_expired of what their order owes (first: order 7, payment pay-7: " +
			"amount_mismatch, 1006 USD for an order of 1007 USD)"},
		{"a late payment paid", fakeLife(as, func(r *result) { r.Life.Wave1.Payments.Late.Refused = 99 }),
			"FAILED: 99 of 100 late payments answered owed"},
		{"a payment unanswered", fakeLife(as, func(r *result) { r.Life.Wave2.Payments.InTime.Unanswered = 2 }),
			"FAILED: 2 payments unanswered"},
		{"a retrying buyer unanswered", fakeLife(kill, func(r *result) { r.Life.Wave2.Unanswered = 1 }),
			"FAILED: 1 buyers unanswered"},
		{"verify broken", fakeLife(as, func(r *result) { *r = withBroken(*r, "initial_stock == stock + active orders") }),
			"FAILED: initial_stock == stock + active orders"},
	} {
		if got := tt.res.outcome(); got != tt.outcome {
			t.Errorf("%s: outcome %q, want %q", tt.name, got, tt.outcome)
		}
		if got, want := tt.res.failed(), tt.outcome != "holds, as it must"; got != want {
			t.Errorf("%s: failed %v, want %v", tt.name, got, want)
		}
	}
}

// cancelled makes a lifecycle result's first wave cancel n of its orders,
// and win their units again but short of them.
func cancelled(n, short int) func(*result) {
	return func(r *result) {
		l := r.Life
		l.Orders["cancelled"], l.Back["cancelled"] = int64(n), int64(n)
		l.Wave1.Acks += n - short
	}
}

// withBroken marks the named check of res's verify report broken.
func withBroken(res result, name string) result {
	res.Verify.OK = false
	for i := range res.Verify.Checks {
		if res.Verify.Checks[i].Name == name {
			res.Verify.Checks[i].Violations = 1
		}
	}
	return res
}

func isEventsRow(r row) bool { return r.Life == lifeEvents }
