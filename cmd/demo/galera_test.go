package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestGaleraRows(t *testing.T) {
	o, err := parse([]string{"-skus", "200", "-stall", "4s", "-out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	all := experiment(o)
	without, _ := parse([]string{"-skus", "200", "-galera=false"})
	before := experiment(without)
	// The Galera rows come after every other row, which keep their
	// numbers.
	if len(all) != len(before)+3 || !slices.EqualFunc(all[:len(before)], before, func(a, b row) bool { return a.slug() == b.slug() }) {
		t.Fatalf("%d rows with the Galera rows, %d without: want the %d others first, in their order, then 3", len(all), len(before), len(before))
	}
	galera := all[len(before):]
	if galera[0].Fault != faultKillDBWriter || galera[1].Life != lifeWriterKill || galera[2].Fault != faultPartitionDB {
		t.Fatalf("Galera rows %q, %q, %q: want the writer killed, the lifecycle sale, the writer partitioned",
			galera[0].label(), galera[1].label(), galera[2].label())
	}
	for _, r := range all {
		env := topologyEnv(r)
		want := "DB_TOPOLOGY=single"
		if slices.Contains(galera, r) {
			want = "DB_TOPOLOGY=galera"
		}
		if env[len(env)-2] != want {
			t.Errorf("%s: the stack's environment ends %q, want %s then REDIS_TOPOLOGY", r.label(), env[len(env)-2:], want)
		}
	}
	for _, r := range galera {
		if !r.Retry || !r.MustHold || r.Lock != "redis" || r.Update != "guarded" || !r.Fencing || r.Replicas != 3 {
			t.Errorf("%s: want the default settings, three replicas, buyers who retry, must hold", r.label())
		}
		if !strings.Contains(r.label(), "MariaDB: Galera ×3 behind HAProxy") || !strings.HasSuffix(r.slug(), "-galera") {
			t.Errorf("%s (%s): the label or slug does not say Galera", r.label(), r.slug())
		}
		stall := slices.Contains(replicaArgs(o, r), "GOFAIL_FAILPOINTS=shopSweepStall=1*return(4000)")
		if stall != (r.Life == lifeWriterKill) {
			t.Errorf("%s: the sweep's failpoint %v", r.label(), stall)
		}
		if r.Fault != "" && r.WantSold != 200 {
			t.Errorf("%s: must sell %d, want every unit, 200", r.label(), r.WantSold)
		}
	}
	// 800 buyers over 1s + 30s: the sale goes on through the failover
	// and the failback.
	for _, f := range []string{faultKillDBWriter, faultPartitionDB} {
		if got, want := faultLoad(o, row{Fault: f}), []string{"-rate", "26", "-c", "2"}; !slices.Equal(got, want) {
			t.Errorf("%s: the load %q, want %q", f, got, want)
		}
	}
	for _, tt := range []struct {
		args []string
		want int
	}{{[]string{"-life=false"}, 2}, {[]string{"-faults=false"}, 1}, {[]string{"-faults=false", "-life=false"}, 0}} {
		o, _ := parse(tt.args)
		if n := len(slices.DeleteFunc(experiment(o), func(r row) bool { return r.DB != dbGalera })); n != tt.want {
			t.Errorf("%v: %d Galera rows, want %d", tt.args, n, tt.want)
		}
	}
	if _, err := parse([]string{"-galera-fault-after", "0s"}); err == nil {
		t.Error("-galera-fault-after 0s accepted")
	}
}

// fakeFailover is a failover as a Galera row measures it: n0 killed (or
// partitioned), the first COMMIT on n1 6.4 s later.
func fakeFailover(what string) *failover {
	return &failover{What: what, Old: 0, New: 1, Committed: true, Lost: 30 * time.Millisecond, LostSeen: true, Commit: 6400 * time.Millisecond,
		Took: 24 * time.Second}
}

// The group connections between the nodes' gcomm ports, from the
// kernel's table: established ones only, by either end's port.
func TestCountLinks(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5B20 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:5B20 0100007F:9C41 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0100007F:9C41 0100007F:5B20 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
   3: 0100007F:C350 0100007F:5B21 01 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
   4: 0100007F:C351 0100007F:5B21 06 00000000:00000000 00:00000000 00000000     0        0 5 1 0 100 0 0 10 0
   5: 0100007F:1F90 0100007F:C352 01 00000000:00000000 00:00000000 00000000     0        0 6 1 0 100 0 0 10 0
`
	// 0x5B20 = 23328, 0x5B21 = 23329: the listener (0A) and the
	// connection in TIME_WAIT (06) are not counted, nor another port's.
	if n := countLinks(table, map[int]bool{23328: true, 23329: true}); n != 3 {
		t.Errorf("%d group connections, want 3", n)
	}
	if n := countLinks(table, map[int]bool{23329: true}); n != 1 {
		t.Errorf("%d group connections on 23329, want 1", n)
	}
	if hexPort("0100007F") != -1 || hexPort("0100007F:ZZ") != -1 || hexPort("0100007F:1F90") != 8080 {
		t.Error("hexPort")
	}
}

func TestGaleraOutcome(t *testing.T) {
	o, err := parse([]string{"-skus", "200", "-out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	galera := galeraRows(o)
	kill, life, part := galera[0], galera[1], galera[2]
	held := func(r row, f *failover) result {
		res := fake(r, 200, 0)
		res.Killed, res.Failover = time.Second, f
		res.Load.Buyers, res.Load.Answered = 800, 800
		return res
	}
	for _, tt := range []struct {
		name    string
		res     result
		outcome string
	}{
		{"killed, held", held(kill, fakeFailover("killed")), "holds, as it must"},
		{"partitioned, held", held(part, fakeFailover("partitioned")), "holds, as it must"},
		{"no failover measured", held(kill, nil), "FAILED: no COMMIT seen on another node after the writer was lost"},
		{"no COMMIT on another node", held(part, &failover{What: "partitioned", Old: 0}),
			"FAILED: no COMMIT seen on another node after the writer was lost"},
		{"a buyer unanswered", func() result { r := held(kill, fakeFailover("killed")); r.Load.Unanswered = 1; return r }(),
			"FAILED: 1 buyers unanswered"},
		{"an acknowledged order lost", func() result {
			r := fake(kill, 199, 0, "every acknowledged order exists")
			r.Failover = fakeFailover("killed")
			return r
		}(), "FAILED: every acknowledged order exists"},
		{"oversold", func() result {
			r := fake(kill, 201, 1, "initial_stock == stock + active orders")
			r.Failover = fakeFailover("killed")
			return r
		}(), "FAILED: initial_stock == stock + active orders"},
		{"lifecycle, held", fakeLife(life, func(r *result) {
			r.Life.Killed, r.Life.Failover = true, fakeFailover("killed")
			r.Life.Fault = "replica 2's sweep stopped before its COMMIT at 21s; " + r.Life.Failover.String()
		}), "holds, as it must"},
		{"lifecycle, no sweep stopped", fakeLife(life, nil), "FAILED: no sweep reached the failpoint"},
		{"lifecycle, no COMMIT on another node", fakeLife(life, func(r *result) {
			r.Life.Killed, r.Life.Failover = true, &failover{What: "killed", Old: 2}
		}), "FAILED: no COMMIT seen on another node after the writer was lost"},
	} {
		if got := tt.res.outcome(); got != tt.outcome {
			t.Errorf("%s: outcome %q, want %q", tt.name, got, tt.outcome)
		}
		if tt.res.failed() != strings.HasPrefix(tt.outcome, "FAILED") {
			t.Errorf("%s: failed() = %v, outcome %q", tt.name, tt.res.failed(), tt.outcome)
		}
	}

	results := []result{held(kill, fakeFailover("killed")), held(part, fakeFailover("partitioned"))}
	results[0].Num, results[1].Num = 35, 37
	tbl := table(results)
	for _, want := range []string{"35 ", "Galera writer killed at 1s: writer n0 killed (30ms after the fault's start); " +
		"first COMMIT on n1 6.4s later (wsrep_local_commits); fault done after 24s",
		"37 ", "Galera writer partitioned, then healed at 1s: writer n0 partitioned"} {
		if !strings.Contains(tbl, want) {
			t.Errorf("table lacks %q:\n%s", want, tbl)
		}
	}
	if got := (&failover{What: "killed", Old: 2}).String(); got != "writer n2 killed (from the fault's start), no COMMIT seen on another node" {
		t.Errorf("a failover with no COMMIT seen: %q", got)
	}
	if err := writeReport(o, results, 2); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "The Galera rows run MariaDB as three Galera nodes behind HAProxy") ||
		!strings.Contains(string(md), "35. **redis/guarded ×3, fencing on, Galera writer killed, buyers retry, MariaDB: Galera ×3 behind HAProxy**") {
		t.Errorf("report.md lacks the Galera rows:\n%s", md)
	}
}
