package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The Galera rows: the sale on three MariaDB nodes with Galera behind
// HAProxy (scripts/stack.sh's DB_TOPOLOGY=galera, which `replicas` starts
// and keeps, as REDIS_TOPOLOGY), its writer lost mid-sale. The service has
// no Galera mode: SHOP_MYSQL_DSN is HAProxy's port, which sends every
// connection to one node, the writer, and the others only when it is
// marked down. Three rows, buyers and payers retrying in each: the sellout
// with the writer SIGKILLed (stack.sh kill-db-writer, which also starts
// the node again and waits until it is Synced, so that HAProxy fails back
// to it mid-sale); the lifecycle sale with the writer SIGKILLed while a
// sweep that returns units has its transaction open on it (the
// shopSweepStall failpoint); and the sellout with the writer cut off from
// the other two without being killed (stack.sh partition-db-writer,
// gmcast.isolate), healed (heal-db-partition) while the sale goes on.
//
// Each row measures the failover: from the moment the writer is lost (the
// killed node stops answering a ping; the partitioned node closes its
// group connections, which the kernel's table of TCP connections shows,
// as nothing on the nodes does until the others are evicted, about 6 s
// later) to the first COMMIT on another node, seen as
// the first rise of a survivor's wsrep_local_commits, which counts the
// transactions a node committed as their origin (writesets it replicated)
// and not those it applied from others. Before the loss no client writes
// to a backup node, so the first rise is the first transaction committed
// through HAProxy on the new writer. That may be the stack's own: its
// fault commands probe with a write through HAProxy every 0.1 s until one
// commits on another node, so the figure times the cluster and HAProxy,
// not the buyers' backoff. The nodes are polled directly, on their own
// ports (ports.env's DB_NODE_PORTS), every failoverPoll.

// dbGalera is stack.sh's DB_TOPOLOGY of the Galera rows; dbSingle, of
// every other row, is the one MariaDB.
const (
	dbGalera = "galera"
	dbSingle = "single"
)

// The Galera rows' faults: scripts/stack.sh commands.
const (
	faultKillDBWriter  = "kill-db-writer"
	faultPartitionDB   = "partition-db-writer"
	faultHealPartition = "heal-db-partition"
)

// lifeWriterKill is the Galera lifecycle row's variant: the writer node
// SIGKILLed while a sweep's transaction is open on it.
const lifeWriterKill = "writer-kill"

// galeraFailoverTakes is about how long a Galera fault lasts, and so how
// long past it the rows' sale goes on: the cluster evicts the lost node
// after about 6 s and HAProxy moves to a backup; the killed node is
// started again and is Synced by IST within about 20 s, when HAProxy
// fails back to it; a partition is healed and the node Synced within about
// 8 s of that.
const galeraFailoverTakes = 30 * time.Second

// failoverPoll is how often the failover watch polls the nodes.
const failoverPoll = 20 * time.Millisecond

// galeraRows are the Galera rows (see above): the sellout with the writer
// killed, the lifecycle sale with the writer killed in a sweep (unless
// -life=false), the sellout with the writer partitioned (the sellout rows
// unless -faults=false).
func galeraRows(o options) []row {
	sellout := func(f, shows string) row {
		return row{Lock: "redis", Update: "guarded", Fencing: true, Replicas: 3, DB: dbGalera, Fault: f, Retry: true,
			MustHold: true, WantSold: int64(o.skus), Shows: shows}
	}
	life := lifeRow(o, lifeWriterKill, "the lifecycle sale on Galera; the first sweep to return lapsed units is stopped before "+
		"its COMMIT (the shopSweepStall failpoint) and the writer node is SIGKILLed under it: the transaction dies with the node, "+
		"HAProxy moves to a backup once the cluster has evicted the node, the units are returned once through the new writer, "+
		"and buyers and payers retry through the failover and the failback")
	life.DB, life.Retry, life.Stall = dbGalera, true, o.stall
	rows := []row{
		sellout(faultKillDBWriter, "MariaDB is three Galera nodes behind HAProxy, and the writer is SIGKILLed mid-sale: COMMITs in "+
			"flight lose their answer (503 outcome_unknown, retried under the same key), new orders wait or get 503 busy until the "+
			"cluster evicts the node and HAProxy sends to a backup, and when the node is back and Synced HAProxy fails back to it, "+
			"cutting the backup's sessions"),
		life,
		sellout(faultPartitionDB, "the same cluster, and the writer is cut off from the other two without being killed "+
			"(gmcast.isolate): it becomes non-Primary and refuses statements (ERROR 1047), HAProxy's agent marks it down, the other "+
			"two carry on; then the partition is healed mid-sale and HAProxy fails back"),
	}
	if !o.life {
		// The lifecycle row needs the lifecycle's settings and the
		// provider's secret, which -life=false goes without.
		rows = slices.Delete(rows, 1, 2)
	}
	if !o.faults {
		// The sellout rows are fault rows, which -faults=false skips.
		rows = slices.DeleteFunc(rows, func(r row) bool { return r.Fault != "" })
	}
	return rows
}

// dbTopology is the row's DB_TOPOLOGY for scripts/stack.sh: every row
// names its own, as the stack keeps the last one it was given.
func (r row) dbTopology() string {
	if r.DB == "" {
		return dbSingle
	}
	return r.DB
}

// failover is what a Galera row measured of its writer's failover.
type failover struct {
	What string // what was done: "killed", "partitioned"
	// Old is the writer before, New the node of the first COMMIT after,
	// both as stack.sh counts the nodes (from 0, its nodes n0, n1, n2);
	// Committed tells whether that COMMIT was seen at all.
	Old, New  int
	Committed bool
	// Lost is when the writer was lost, from the fault's start; Commit
	// how long after that the first COMMIT on another node was seen.
	Lost, Commit time.Duration
	// LostSeen tells whether the loss was seen (a failed ping of the
	// killed node, fewer group connections after a partition); when not,
	// Lost is 0: the fault's start stands for it.
	LostSeen bool
	// Took is how long the fault's commands took (the kill, the wait for
	// the new writer, the node's restart and its resync; or the
	// partition and its heal).
	Took time.Duration
}

// String says what the row's disruption column shows of the failover.
func (f *failover) String() string {
	if f == nil {
		return "no failover measured"
	}
	lost := "from the fault's start"
	if f.LostSeen {
		lost = fmt.Sprintf("%s after the fault's start", f.Lost.Round(10*time.Millisecond))
	}
	if !f.Committed {
		return fmt.Sprintf("writer n%d %s (%s), no COMMIT seen on another node", f.Old, f.What, lost)
	}
	return fmt.Sprintf("writer n%d %s (%s); first COMMIT on n%d %s later (wsrep_local_commits); fault done after %s",
		f.Old, f.What, lost, f.New, f.Commit.Round(10*time.Millisecond), f.Took.Round(100*time.Millisecond))
}

// nodeDSN is the DSN of a Galera node on port: root, no database, short
// timeouts, so that a poll of a dead or frozen node fails within one.
func nodeDSN(port string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", "127.0.0.1:"+port
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, time.Second, time.Second
	return cfg.FormatDSN()
}

// failoverWatch polls the Galera nodes through a fault: whether the writer
// is lost, and each other node's wsrep_local_commits.
type failoverWatch struct {
	f      *failover
	writer *sql.DB   // the old writer
	others []*sql.DB // the other nodes, in order
	index  []int     // their numbers (from 0)
	base   []int64   // their wsrep_local_commits before the fault
	start  time.Time // the fault's start
	// gcomm are the nodes' group (gcomm) ports, and links the established
	// connections between them before the fault; links is -1 when the
	// kernel's table cannot be read.
	gcomm map[int]bool
	links int
	done  chan struct{}
	mu    sync.Mutex
}

// watchFailover finds the writer (the node whose port HAProxy's
// connections reach) and reads the others' wsrep_local_commits, before the
// fault what (faultKillDBWriter or faultPartitionDB) begins.
func watchFailover(ctx context.Context, state, what string) (*failoverWatch, error) {
	path := filepath.Join(state, "ports.env")
	ports, err := readEnvFile(path)
	if err != nil {
		return nil, err
	}
	nodes := strings.Fields(ports["DB_NODE_PORTS"])
	if len(nodes) < 2 {
		return nil, fmt.Errorf("%s: DB_NODE_PORTS %q: not a Galera stack (DB_TOPOLOGY=galera scripts/stack.sh replicas 3)", path, ports["DB_NODE_PORTS"])
	}
	db, err := openStackDB(state)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var port string
	if err := db.QueryRowContext(ctx, "SELECT @@port").Scan(&port); err != nil {
		return nil, fmt.Errorf("the writer's port, through HAProxy: %w", err)
	}
	w := &failoverWatch{f: &failover{What: "killed"}, done: make(chan struct{}), gcomm: map[int]bool{}}
	if what == faultPartitionDB {
		w.f.What = "partitioned"
	}
	for _, p := range strings.Fields(ports["DB_GCOMM_PORTS"]) {
		if n, err := strconv.Atoi(p); err == nil {
			w.gcomm[n] = true
		}
	}
	w.links = gcommLinks(w.gcomm)
	for i, p := range nodes {
		node, err := sql.Open("mysql", nodeDSN(p))
		if err != nil {
			w.close()
			return nil, err
		}
		node.SetMaxOpenConns(1)
		if p == port {
			w.writer, w.f.Old = node, i
			continue
		}
		n, err := localCommits(ctx, node)
		if err != nil {
			node.Close()
			w.close()
			return nil, fmt.Errorf("node n%d: %w", i, err)
		}
		w.others, w.index, w.base = append(w.others, node), append(w.index, i), append(w.base, n)
	}
	if w.writer == nil {
		w.close()
		return nil, fmt.Errorf("HAProxy's connections reach port %s, none of DB_NODE_PORTS %q", port, ports["DB_NODE_PORTS"])
	}
	return w, nil
}

// localCommits reads a node's wsrep_local_commits.
func localCommits(ctx context.Context, db *sql.DB) (int64, error) {
	var name string
	var n int64
	err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'wsrep_local_commits'").Scan(&name, &n)
	return n, err
}

// run polls from now, the fault's start, until the first COMMIT on
// another node is seen or ctx ends.
func (w *failoverWatch) run(ctx context.Context) {
	defer close(w.done)
	w.start = time.Now()
	tick := time.NewTicker(failoverPoll)
	defer tick.Stop()
	for {
		w.mu.Lock()
		if !w.f.LostSeen && w.lost(ctx) {
			w.f.Lost, w.f.LostSeen = time.Since(w.start), true
		}
		w.mu.Unlock()
		for k, node := range w.others {
			pollCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			n, err := localCommits(pollCtx, node)
			cancel()
			if err == nil && n > w.base[k] {
				w.mu.Lock()
				w.f.New, w.f.Committed, w.f.Commit = w.index[k], true, time.Since(w.start)-w.f.Lost
				w.mu.Unlock()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// lost reports whether the writer is lost: a killed one no longer answers
// a ping; a partitioned one has closed its group connections
// (gmcast.isolate=1 closes them all and refuses new ones), so fewer are
// established between the nodes' gcomm ports than before. Nothing else
// shows the partition before the eviction: gmcast.isolate is not among the
// provider options a node prints, and its status does not change.
func (w *failoverWatch) lost(ctx context.Context) bool {
	if w.f.What != "killed" {
		n := gcommLinks(w.gcomm)
		return w.links > 0 && n >= 0 && n < w.links
	}
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	return w.writer.PingContext(ctx) != nil
}

// gcommLinks counts the established TCP connections on loopback with an
// end on one of ports, from the kernel's table (procDir/net/tcp; the
// nodes listen on 127.0.0.1); -1 when it cannot be read.
func gcommLinks(ports map[int]bool) int {
	data, err := os.ReadFile(filepath.Join(procDir, "net", "tcp"))
	if err != nil || len(ports) == 0 {
		return -1
	}
	return countLinks(string(data), ports)
}

// countLinks counts the lines of a /proc/net/tcp table that are
// established connections (st 01) with a local or remote port among
// ports. Each connection on loopback has two lines, one per end.
func countLinks(table string, ports map[int]bool) int {
	n := 0
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "01" {
			continue
		}
		if ports[hexPort(f[1])] || ports[hexPort(f[2])] {
			n++
		}
	}
	return n
}

// hexPort is the port of an address of /proc/net/tcp (0100007F:5B20);
// -1 if it has none.
func hexPort(addr string) int {
	_, p, ok := strings.Cut(addr, ":")
	if !ok {
		return -1
	}
	v, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return -1
	}
	return int(v)
}

// close closes the nodes' connections.
func (w *failoverWatch) close() {
	if w.writer != nil {
		w.writer.Close()
	}
	for _, db := range w.others {
		db.Close()
	}
}

// galeraFault runs a Galera row's fault with the failover watch beside it:
// the fault's command, and after a partition its heal. It returns the
// failover as measured. The watch ends once a COMMIT on another node is
// seen, or when the fault's commands are done and bound more has passed.
func galeraFault(ctx context.Context, o options, fault string, bound time.Duration, stderr io.Writer) (*failover, error) {
	w, err := watchFailover(ctx, o.state, fault)
	if err != nil {
		return nil, err
	}
	defer w.close()
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	go w.run(watchCtx)
	steps := [][]string{{fault}}
	if fault == faultPartitionDB {
		steps = append(steps, []string{faultHealPartition})
	}
	// The stack's commands run to their end even if ctx ends first: the
	// stack must be whole for the verify and the next row.
	for _, step := range steps {
		fmt.Fprintf(stderr, "demo: %s\n", step[0])
		if _, err := command(context.WithoutCancel(ctx), stderr, o.stack, step...); err != nil {
			return nil, fmt.Errorf("%s: %w", step[0], err)
		}
	}
	took := time.Since(w.start)
	select {
	case <-w.done:
	case <-time.After(bound):
		stop()
		<-w.done
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	f := *w.f
	f.Took = took
	fmt.Fprintf(stderr, "demo: %s\n", f.String())
	return &f, nil
}

// killWriterInSweep waits for a replica's sweep to stop at the
// shopSweepStall failpoint (its transaction open on the writer, its
// writes made, its COMMIT not sent) and SIGKILLs the writer node under it
// (stack.sh kill-db-writer, which waits for the new writer, starts the
// node again and waits until it is Synced), with the failover watch beside
// it. It says in l what it did and when (from start).
func killWriterInSweep(ctx context.Context, o options, l *lifeResult, offsets []int64, start time.Time, stderr io.Writer) error {
	i, _ := awaitLine(ctx, o.state, offsets, stallLine)
	if i == 0 {
		l.Fault = "no sweep stopped at the failpoint"
		return nil
	}
	stopped := time.Since(start).Round(100 * time.Millisecond)
	f, err := galeraFault(context.WithoutCancel(ctx), o, faultKillDBWriter, galeraFailoverTakes, stderr)
	if err != nil {
		return err
	}
	l.Killed, l.Failover = true, f
	l.Fault = fmt.Sprintf("replica %s's sweep stopped before its COMMIT at %s; %s", strconv.Itoa(i), stopped, f)
	return nil
}
