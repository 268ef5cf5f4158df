package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Where the time goes: the CPU each of the machine's busy processes spent
// over a ceiling row's load, per request. The load test's comes from its
// own rusage (runLoadtest); the stack's servers' from /proc/PID/stat,
// read right before and right after the load, by the pids the stack
// recorded under its state directory (scripts/stack.sh); the machine's
// busy share from /proc/stat alike. Without /proc (not Linux) only the
// load test's figure is known.

// The process groups whose CPU is accounted for, in the table's order.
const (
	cpuLoadtest = "loadtest"
	cpuReplicas = "replicas"
	cpuMariaDB  = "MariaDB"
	cpuRedis    = "Redis"
	cpuNginx    = "nginx"
	// cpuHAProxy is HAProxy in front of a Galera cluster and its nodes'
	// agents (shop db-agent): read when the stack runs Galera, and shown
	// only beside the Galera configuration of make bench-orders.
	cpuHAProxy = "HAProxy"
)

// cpuGroups are the groups in the table's order.
var cpuGroups = []string{cpuLoadtest, cpuReplicas, cpuMariaDB, cpuRedis, cpuNginx}

// stackPidFiles are, for each of the stack's groups, the patterns of the
// pid files scripts/stack.sh writes under its state directory: the
// replicas' `shop serve`; mariadbd, the single server's and the Galera
// nodes' when the stack has them; every Redis server (the three masters
// and a Cluster's or a Sentinel set-up's, when the topology has one);
// nginx's master, whose workers are its children; HAProxy and the Galera
// nodes' agents.
var stackPidFiles = map[string][]string{
	cpuReplicas: {"replica*/pid"},
	cpuMariaDB:  {"mariadb/pid", "galera/nodes/n*/pid"},
	cpuRedis:    {"redis*/pid", "redis-cluster/*/pid", "redis-sentinel/*/pid"},
	cpuNginx:    {"nginx/pid"},
	cpuHAProxy:  {"galera/haproxy/pid", "galera/agent*/pid"},
}

// userHZ is the unit of the times in /proc/PID/stat and /proc/stat: the
// kernel's USER_HZ, which is 100 on every architecture Go builds for on
// Linux; sysconf(_SC_CLK_TCK) would need cgo to ask.
const userHZ = 100

// procDir is where the kernel's process table is.
const procDir = "/proc"

// cpuUse is the CPU spent over one load.
type cpuUse struct {
	// Seconds are each group's CPU seconds, user and system; a group
	// missing was not read (no /proc, no pid file, or a process of it
	// gone before the second reading).
	Seconds map[string]float64
	// Busy is the machine's busy share, 0 to 1, over the load; Machine
	// tells whether it was read.
	Busy    float64
	Machine bool
}

// stackCPU is one reading of the stack's processes and of the machine.
type stackCPU struct {
	pids  map[string][]int
	ticks map[string]int64 // by group; a group missing was not read
	// busy and total are /proc/stat's ticks of the machine; ok tells
	// whether it was read.
	busy, total int64
	ok          bool
}

// readStackCPU reads the CPU of the stack whose state directory is state:
// the pids its pid files name now (and nginx's workers), and their ticks.
func readStackCPU(state string) stackCPU {
	s := stackCPU{pids: map[string][]int{}}
	if _, err := os.Stat(filepath.Join(procDir, "stat")); err != nil {
		return s
	}
	for group, patterns := range stackPidFiles {
		pids := pidsOf(state, patterns)
		if group == cpuNginx {
			pids = append(pids, childrenOf(pids)...)
		}
		s.pids[group] = pids
	}
	return s.again()
}

// again reads the ticks of the same processes and the machine's anew: a
// process that started after the first reading is not counted, and a
// group one of whose processes has gone is unknown.
func (s stackCPU) again() stackCPU {
	next := stackCPU{pids: s.pids, ticks: map[string]int64{}}
	if text, err := os.ReadFile(filepath.Join(procDir, "stat")); err == nil {
		next.busy, next.total, err = parseProcStat(string(text))
		next.ok = err == nil
	}
	for group, pids := range s.pids {
		if len(pids) == 0 {
			continue
		}
		var sum int64
		for _, pid := range pids {
			st, err := readPidStat(pid)
			if err != nil {
				sum = -1
				break
			}
			sum += st.ticks
		}
		if sum >= 0 {
			next.ticks[group] = sum
		}
	}
	return next
}

// cpuBetween is the CPU spent between two readings of the stack, with the
// load test's own.
func cpuBetween(before, after stackCPU, loadtest time.Duration) cpuUse {
	u := cpuUse{Seconds: map[string]float64{cpuLoadtest: loadtest.Seconds()}}
	for group, t := range after.ticks {
		if t0, ok := before.ticks[group]; ok && t >= t0 {
			u.Seconds[group] = float64(t-t0) / userHZ
		}
	}
	if before.ok && after.ok && after.total > before.total {
		u.Busy, u.Machine = float64(after.busy-before.busy)/float64(after.total-before.total), true
	}
	return u
}

// measureCPU runs load, which returns the load test's CPU time, between
// two readings of the stack's.
func measureCPU(state string, load func() (time.Duration, error)) (cpuUse, error) {
	before := readStackCPU(state)
	lt, err := load()
	if err != nil {
		return cpuUse{}, err
	}
	return cpuBetween(before, before.again(), lt), nil
}

// pidsOf reads the pids of the pid files matching patterns under state.
// A file that is not there, or holds no number, names no process.
func pidsOf(state string, patterns []string) []int {
	var pids []int
	for _, p := range patterns {
		files, _ := filepath.Glob(filepath.Join(state, p))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 {
				pids = append(pids, pid)
			}
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids)
}

// childrenOf finds the children of parents in the process table: nginx's
// workers, whose CPU is not their master's until they have exited.
func childrenOf(parents []int) []int {
	if len(parents) == 0 {
		return nil
	}
	dirs, _ := filepath.Glob(filepath.Join(procDir, "[0-9]*"))
	var kids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if st, err := readPidStat(pid); err == nil && slices.Contains(parents, st.ppid) {
			kids = append(kids, pid)
		}
	}
	return kids
}

// pidStat is what the ceiling reads of /proc/PID/stat.
type pidStat struct {
	ppid  int
	ticks int64 // utime + stime, in userHZ
}

func readPidStat(pid int) (pidStat, error) {
	data, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return pidStat{}, err
	}
	return parsePidStat(string(data))
}

// parsePidStat parses a /proc/PID/stat line. The command name (field 2)
// is in parentheses and may hold spaces and parentheses itself, so the
// fields are counted from the last ')': state is field 3, ppid 4, utime
// 14 and stime 15 (proc(5)).
func parsePidStat(line string) (pidStat, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return pidStat{}, fmt.Errorf("/proc/PID/stat %q: no command name", line)
	}
	f := strings.Fields(line[i+1:])
	const state, ppid, utime, stime = 3, 4, 14, 15
	at := func(field int) int { return field - state }
	if len(f) <= at(stime) {
		return pidStat{}, fmt.Errorf("/proc/PID/stat %q: %d fields after the command name, want %d or more", line, len(f), at(stime)+1)
	}
	var st pidStat
	var err error
	if st.ppid, err = strconv.Atoi(f[at(ppid)]); err != nil {
		return st, fmt.Errorf("/proc/PID/stat ppid: %w", err)
	}
	u, err := strconv.ParseInt(f[at(utime)], 10, 64)
	if err != nil {
		return st, fmt.Errorf("/proc/PID/stat utime: %w", err)
	}
	s, err := strconv.ParseInt(f[at(stime)], 10, 64)
	if err != nil {
		return st, fmt.Errorf("/proc/PID/stat stime: %w", err)
	}
	st.ticks = u + s
	return st, nil
}

// parseProcStat reads the machine's ticks from /proc/stat's "cpu" line:
// user nice system idle iowait irq softirq steal (guest and guest_nice
// are counted in user and nice already). Busy is all of them but idle
// and iowait.
func parseProcStat(text string) (busy, total int64, err error) {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		if len(f) < 5 {
			return 0, 0, fmt.Errorf("/proc/stat %q: want user, nice, system, idle and more", line)
		}
		var idle int64
		for i, v := range f[1:min(len(f), 9)] {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("/proc/stat %q: %w", line, err)
			}
			total += n
			if i == 3 || i == 4 { // idle, iowait
				idle += n
			}
		}
		return total - idle, total, nil
	}
	return 0, 0, errors.New("/proc/stat: no cpu line")
}

// String renders the CPU seconds of each group and the machine's busy
// share, for the log of a run.
func (u cpuUse) String() string {
	parts := make([]string, 0, len(cpuGroups)+1)
	for _, g := range cpuGroups {
		parts = append(parts, g+" "+orDash("%.1fs", u.seconds(g)))
	}
	return strings.Join(append(parts, "machine "+orDash("%.0f%% busy", u.busy()*100)), ", ")
}

// seconds is a group's CPU seconds, NaN when it was not read.
func (u cpuUse) seconds(group string) float64 {
	if s, ok := u.Seconds[group]; ok {
		return s
	}
	return math.NaN()
}

// perRequest is a group's CPU over the load in µs per request; NaN when
// it was not read.
func (u cpuUse) perRequest(group string, requests int) float64 {
	if requests <= 0 {
		return math.NaN()
	}
	return u.seconds(group) * 1e6 / float64(requests)
}

// busy is the machine's busy share, NaN when it was not read.
func (u cpuUse) busy() float64 {
	if !u.Machine {
		return math.NaN()
	}
	return u.Busy
}

// medianKnown is the median of f over runs that are not NaN; NaN when
// none is.
func medianKnown[T any](runs []T, f func(T) float64) float64 {
	var xs []float64
	for _, r := range runs {
		if x := f(r); !math.IsNaN(x) {
			xs = append(xs, x)
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	return median(xs)
}

// orDash renders x with format, or "–" when it is not known.
func orDash(format string, x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmt.Sprintf(format, x)
}
