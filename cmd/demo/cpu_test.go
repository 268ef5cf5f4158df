package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParsePidStat(t *testing.T) {
	for _, tt := range []struct {
		line        string
		ppid        int
		ticks       int64
		wantFailure bool
	}{
		// mariadbd, as Linux 6 prints it: utime 650, stime 120.
		{line: "4242 (mariadbd) S 1 4242 4242 0 -1 4194560 52000 0 12 0 650 120 0 0 20 0 38 0 1234567 1800000000 60000 " +
			"18446744073709551615 1 1 0 0 0 0 0 4096 1260 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n", ppid: 1, ticks: 770},
		// A command name with a space and a parenthesis of its own.
		{line: "77 (nginx: w) rk) R 70 70 70 0 -1 0 0 0 0 0 5 7 0 0 20 0 1 0 9 0 0", ppid: 70, ticks: 12},
		{line: "77 nginx R 70", wantFailure: true},
		{line: "77 (nginx) R 70 70 70 0 -1 0 0 0 0 0 5", wantFailure: true},
		{line: "77 (nginx) R 70 70 70 0 -1 0 0 0 0 0 x 7", wantFailure: true},
	} {
		st, err := parsePidStat(tt.line)
		if tt.wantFailure {
			if err == nil {
				t.Errorf("parsePidStat(%q) = %+v, want an error", tt.line, st)
			}
			continue
		}
		if err != nil || st.ppid != tt.ppid || st.ticks != tt.ticks {
			t.Errorf("parsePidStat(%q) = %+v, %v; want ppid %d, ticks %d", tt.line, st, err, tt.ppid, tt.ticks)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice:
	// busy = 100+5+50+0+7+3 = 165 and the guest fields, inside user and
	// nice already, not again.
	text := "cpu  100 5 50 800 20 0 7 3 40 1\ncpu0 50 2 25 400 10 0 3 1 20 0\nintr 1 2 3\n"
	busy, total, err := parseProcStat(text)
	if err != nil || busy != 165 || total != 985 {
		t.Errorf("parseProcStat = %d, %d, %v; want 165, 985", busy, total, err)
	}
	// An old kernel's four fields.
	if busy, total, err := parseProcStat("cpu 10 0 10 80\n"); err != nil || busy != 20 || total != 100 {
		t.Errorf("four fields: %d, %d, %v", busy, total, err)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5\n", "cpu 1 2 3\n", "cpu 1 2 x 4 5\n"} {
		if _, _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q) accepted", bad)
		}
	}
}

// The CPU between two readings: each group's ticks in seconds, with the
// load test's rusage; a group missing from either reading is not known,
// nor is the machine when /proc/stat was not read.
func TestCPUBetween(t *testing.T) {
	before := stackCPU{ticks: map[string]int64{cpuReplicas: 1000, cpuMariaDB: 50, cpuNginx: 7}, busy: 100, total: 1000, ok: true}
	after := stackCPU{ticks: map[string]int64{cpuReplicas: 1600, cpuMariaDB: 150, cpuRedis: 9}, busy: 250, total: 1200, ok: true}
	u := cpuBetween(before, after, 1500*time.Millisecond)
	want := map[string]float64{cpuLoadtest: 1.5, cpuReplicas: 6, cpuMariaDB: 1}
	if len(u.Seconds) != len(want) {
		t.Errorf("seconds %v, want %v", u.Seconds, want)
	}
	for g, s := range want {
		if u.Seconds[g] != s {
			t.Errorf("%s: %v seconds, want %v", g, u.Seconds[g], s)
		}
	}
	if !u.Machine || u.Busy != 0.75 {
		t.Errorf("machine busy %v (%v), want 0.75", u.Busy, u.Machine)
	}
	if got := u.perRequest(cpuReplicas, 20000); got != 300 {
		t.Errorf("replicas %v µs/req, want 300", got)
	}
	u = cpuBetween(stackCPU{}, stackCPU{}, time.Second)
	if u.Machine || len(u.Seconds) != 1 || !math.IsNaN(u.busy()) || !math.IsNaN(u.perRequest(cpuNginx, 10)) {
		t.Errorf("without /proc: %+v", u)
	}
}

// The pids of a stack's groups are those its pid files name; a file that
// holds no number names none.
func TestPidsOf(t *testing.T) {
	state := t.TempDir()
	for path, pid := range map[string]string{"replica1/pid": "301\n", "replica2/pid": "302", "replica3/pid": "junk",
		"redis0/pid": "10", "redis2/pid": "12", "redis-cluster/7001/pid": "21", "mariadb/pid": "5", "nginx/pid": "9",
		"galera/nodes/n0/pid": "40", "galera/nodes/n2/pid": "42", "galera/haproxy/pid": "50", "galera/agent1/pid": "51"} {
		if err := os.MkdirAll(filepath.Join(state, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(state, path), []byte(pid), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for group, want := range map[string][]int{cpuReplicas: {301, 302}, cpuRedis: {10, 12, 21}, cpuMariaDB: {5, 40, 42}, cpuNginx: {9},
		cpuHAProxy: {50, 51}} {
		if got := pidsOf(state, stackPidFiles[group]); !slices.Equal(got, want) {
			t.Errorf("%s: pids %v, want %v", group, got, want)
		}
	}
}

// On Linux the stack's processes are read from /proc by their pid files:
// here this test's own process stands for a replica, and spends some CPU
// between the readings.
func TestReadStackCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	state := t.TempDir()
	if err := os.MkdirAll(filepath.Join(state, "replica1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "replica1", "pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := measureCPU(state, func() (time.Duration, error) {
		// Spin until the kernel has counted a few ticks of it, however
		// busy the machine is.
		start, err := readPidStat(os.Getpid())
		for end := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(end); {
			var now pidStat
			if now, err = readPidStat(os.Getpid()); now.ticks >= start.ticks+3 {
				break
			}
		}
		return time.Second, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := u.Seconds[cpuReplicas]; !ok || s <= 0 || !u.Machine || u.Busy <= 0 || u.Seconds[cpuLoadtest] != 1 {
		t.Errorf("%+v: want the replica's CPU, the load test's second and the machine's busy share", u)
	}
	if _, ok := u.Seconds[cpuMariaDB]; ok {
		t.Errorf("%+v: MariaDB has no pid file, yet was read", u)
	}
}

// Where the time goes: medians over the rounds of each group's µs per
// request, the rounds where a group was not read left out, and "–" where
// no round read it.
func TestCPUTable(t *testing.T) {
	runs := fakeCeilingRounds()
	for i := range runs {
		r := &runs[i]
		n := float64(r.Load.Requests) / 1e6 // seconds at 1 µs a request
		k := float64(r.Round)
		r.CPU = cpuUse{Seconds: map[string]float64{cpuLoadtest: 500 * k * n, cpuReplicas: 600 * n, cpuMariaDB: 100 * n,
			cpuRedis: 30 * n}, Busy: 0.9 + 0.02*k, Machine: true}
		if r.Round == 2 {
			delete(r.CPU.Seconds, cpuMariaDB)
		}
		if r.Row.Name == ceilingSellout {
			r.CPU = cpuUse{Seconds: map[string]float64{cpuLoadtest: 400 * n}}
		}
	}
	tbl := cpuTable(runs)
	if n := strings.Count(tbl, "\n"); n != 2+6 {
		t.Errorf("%d lines, want the heading, its rule and 6 rows:\n%s", n, tbl)
	}
	if !strings.HasPrefix(tbl, "| row | requests | loadtest µs/req | replicas µs/req | MariaDB µs/req | Redis µs/req | nginx µs/req | machine busy |\n") {
		t.Errorf("heading:\n%s", tbl)
	}
	for _, tt := range []struct {
		row  string
		want []string
	}{
		{ceilingHealthz, []string{"20000", "1000", "600", "100", "30", "–", "94%"}},
		{ceilingHot, []string{"20000", "1000", "600", "100", "30", "–", "94%"}},
		{ceilingSellout, []string{"20000", "400", "–", "–", "–", "–", "–"}},
	} {
		if got := cellsOf(t, tbl, tt.row); !slices.Equal(got[1:], tt.want) {
			t.Errorf("%s: %q, want %q", tt.row, got[1:], tt.want)
		}
	}
}
