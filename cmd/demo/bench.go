package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The order-path benchmark (make bench-orders, `bin/demo -bench`): the same
// sales under three ways of running the replicas, side by side in one run.
// The load goes straight to the three replicas, round robin, not through
// nginx. Each figure comes from the loadtest's JSON result, from deltas of
// MariaDB's statement counters and of the replicas' /metrics taken right
// before and after the phase, and stands beside `shop verify --acks`'s
// verdict on that phase.

// errVerifyFailed means `shop verify` found an invariant broken in some
// phase of the benchmark; the table says which.
var errVerifyFailed = errors.New("shop verify found an invariant broken")

type benchOptions struct {
	state     string // the stack's state directory
	stack     string // scripts/stack.sh
	loadtest  string // bin/loadtest
	out       string
	srcN      int // the load test's -src-n
	rounds    int
	hotUnits  int
	hotBuyers int
	skus      int
	buyers    int
	workers   int
	only      *regexp.Regexp // nil: every configuration
}

func parseBench(args []string) (benchOptions, error) {
	var o benchOptions
	fs := flag.NewFlagSet("demo -bench", flag.ContinueOnError)
	fs.StringVar(&o.state, "state", ".state/bench-orders", "state directory of the stack (scripts/stack.sh)")
	fs.StringVar(&o.stack, "stack", "scripts/stack.sh", "the stack script")
	fs.StringVar(&o.loadtest, "loadtest", "bin/loadtest", "the load test binary")
	fs.StringVar(&o.out, "out", "out/bench-orders", "directory for report.md and each phase's files")
	fs.IntVar(&o.srcN, "src-n", crowdSources, "the buyers' loopback source addresses (bin/loadtest -src-n)")
	fs.IntVar(&o.rounds, "rounds", 1, "how many times the configurations run, interleaved")
	fs.IntVar(&o.hotUnits, "hot-units", 5000, "hot SKU: units of the one product")
	fs.IntVar(&o.hotBuyers, "hot-buyers", 6000, "hot SKU: buyers, each a different user")
	fs.IntVar(&o.skus, "skus", 5000, "sellout: products, one unit each")
	fs.IntVar(&o.buyers, "buyers", 4, "sellout: buyers per product")
	fs.IntVar(&o.workers, "c", 200, "concurrent buyers")
	only := fs.String("configs", "", "run only the configurations whose names this regular expression matches (default: all)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			return o, fmt.Errorf("-configs: %w", err)
		}
		o.only = re
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.rounds <= 0 || o.hotUnits <= 0 || o.hotBuyers <= 0 || o.skus <= 0 || o.buyers <= 0 || o.workers <= 0 {
		return o, errors.New("-rounds, -hot-units, -hot-buyers, -skus, -buyers and -c must be positive")
	}
	return o, nil
}

// benchConfig is one way of running the replicas: a column of the
// comparison.
type benchConfig struct {
	Name     string
	Env      []string // the replicas' settings
	Load     []string // the load test's flags beyond the phase's own
	Baseline bool     // the configuration the others are divided by
	// Beside names the configuration this one differs from by one
	// setting: the two are also compared on their own (benchPairs).
	Beside string
	// Events runs the replicas with events on, delivering to the bench's
	// receiver (bin/eventsink) while the orders are placed.
	Events bool
	// DB is the stack's MariaDB (DB_TOPOLOGY): empty for the single
	// server, dbGalera for three Galera nodes behind HAProxy.
	DB string
}

// benchJWTSecret is the HS256 secret of the configuration with
// SHOP_AUTH=jwt, which the load test signs its buyers' tokens with.
const benchJWTSecret = "bench-orders-jwt-secret-of-32-bytes"

// benchConfigs are the lock-free baseline (the guarded UPDATE alone, one
// order per transaction), the Redis lock with one order per hold, the
// service's default (the Redis lock, a SKU's queued orders in one
// transaction), and the default with buyers authenticated by JWT (each
// order carries an HS256 token the replica verifies), beside the default:
// what verifying costs an order; the default with events on (each change
// writes its event in its transaction, and the replicas' relays deliver
// them to a receiver meanwhile), beside the default: what the outbox costs
// an order; then the default batch on each of the
// source articles' other lock families (the MySQL lock table, etcd, ZooKeeper), each
// beside the Redis lock; then the default on Galera (three nodes behind
// HAProxy, all writes on one), beside the default on the single MariaDB:
// what certification and a replication round trip per COMMIT cost; then
// the default with grouped commits (several SKUs' batches, one COMMIT),
// beside the default, and the same on Galera, beside it on the single
// MariaDB.
func benchConfigs() []benchConfig {
	return []benchConfig{
		{Name: "none, batch 1 (baseline)", Env: []string{"SHOP_LOCK_MODE=none", "SHOP_ORDER_BATCH=1"}, Baseline: true},
		{Name: "redis, batch 1", Env: []string{"SHOP_LOCK_MODE=redis", "SHOP_ORDER_BATCH=1"}},
		{Name: "redis, default batch", Env: []string{"SHOP_LOCK_MODE=redis"}},
		{Name: "redis, default batch, jwt", Env: []string{"SHOP_LOCK_MODE=redis", "SHOP_AUTH=jwt", "SHOP_JWT_SECRET=" + benchJWTSecret},
			Load: []string{"-jwt-secret", benchJWTSecret}, Beside: "redis, default batch"},
		{Name: benchEventsConfig, Env: []string{"SHOP_LOCK_MODE=redis"}, Events: true, Beside: "redis, default batch"},
		{Name: "mysql, default batch", Env: []string{"SHOP_LOCK_MODE=mysql"}, Beside: "redis, default batch"},
		{Name: "etcd, default batch", Env: []string{"SHOP_LOCK_MODE=etcd"}, Beside: "redis, default batch"},
		{Name: "zookeeper, default batch", Env: []string{"SHOP_LOCK_MODE=zookeeper"}, Beside: "redis, default batch"},
		{Name: benchGaleraConfig, Env: []string{"SHOP_LOCK_MODE=redis"}, DB: dbGalera, Beside: "redis, default batch"},
		{Name: benchGroupConfig, Env: []string{"SHOP_LOCK_MODE=redis", benchGroupSize}, Beside: "redis, default batch"},
		{Name: benchGaleraConfig + benchGroupSuffix, Env: []string{"SHOP_LOCK_MODE=redis", benchGroupSize}, DB: dbGalera, Beside: benchGroupConfig},
	}
}

// benchGroupConfig is the default with the batches of several SKUs in one
// transaction (SHOP_ORDER_GROUP, benchGroupSize), beside the default; the
// same on Galera is beside it, on the single MariaDB.
const (
	benchGroupSuffix = ", group 8"
	benchGroupConfig = "redis, default batch" + benchGroupSuffix
	benchGroupSize   = "SHOP_ORDER_GROUP=8"
)

// benchGaleraConfig is the default on Galera.
const benchGaleraConfig = "redis, default batch, galera"

// galeraGoal is the share of the single MariaDB's rate below which the
// hot SKU on Galera is profiled (wsrepCounters, the CPU of each process).
const galeraGoal = 0.7

// wsrepCounters are the writer's Galera counters a Galera phase reports
// (deltas over the phase, SHOW GLOBAL STATUS through HAProxy): writesets
// replicated and their bytes, certification failures, transactions
// aborted by a replicated one (brute force), and the time replication was
// paused by flow control.
var wsrepCounters = []string{"wsrep_replicated", "wsrep_replicated_bytes", "wsrep_local_cert_failures", "wsrep_local_bf_aborts",
	"wsrep_flow_control_paused_ns"}

// dbTopology is the configuration's DB_TOPOLOGY for scripts/stack.sh.
func (c benchConfig) dbTopology() string {
	if c.DB == "" {
		return dbSingle
	}
	return c.DB
}

// benchEventsConfig is the default with events on.
const benchEventsConfig = "redis, default batch, events"

// eventsGoal is the least share of the default's rate the order path
// keeps with events on (hot SKU and sellout).
const eventsGoal = 0.9

// The phases of the benchmark.
const (
	phaseHot     = "hot SKU"
	phaseSellout = "sellout"
	phaseAfter   = "after sell-out" // one more buyer per product once all are sold
)

// statementCounters are the MariaDB counters a phase's statements are
// counted by (SHOW GLOBAL STATUS), in the table's order.
var statementCounters = []string{"Com_select", "Com_update", "Com_insert", "Com_commit"}

// benchPhase is one phase of one configuration in one round: a line of the
// table.
type benchPhase struct {
	Round     int
	Phase     string
	Config    benchConfig
	Load      loadResult
	Stmts     map[string]int64 // statementCounters' deltas over the phase
	Txns      float64          // order transactions of the replicas (shop_order_transactions_total's delta)
	TxnOrders float64          // orders decided in them (shop_order_transaction_orders_total's delta)
	Delivered float64          // events the replicas' relays delivered (shop_events_deliveries_total{result="delivered"}'s delta)
	Sold      int64            // orders the phase added to MySQL
	Verify    verifyReport     // shop verify --acks after the phase
	Wsrep     map[string]int64 // on Galera, wsrepCounters' deltas over the phase on the writer
	CPU       cpuUse           // the CPU each of the stack's processes spent over the phase
}

// snapshot is what a phase's figures are deltas of.
type snapshot struct {
	stmts                      map[string]int64
	wsrep                      map[string]int64 // on Galera
	txns, txnOrders, delivered float64
	orders                     int64
}

// bench holds a benchmark run's connections and settings.
type bench struct {
	o   benchOptions
	env []string // of every stack.sh command
	db  *sql.DB  // the stack's MariaDB, for its counters
	// dbPort is the port db reaches (ports.env's MYSQL_PORT): a single
	// MariaDB's, or HAProxy's in front of Galera.
	dbPort string
	// adminPorts are the replicas' operators' listeners, where their
	// metrics are.
	adminPorts []string
	url        string // the load's -url: the replicas, comma-separated
	stderr     io.Writer
	prevSold   int64
	// events is the receiver of the configuration with events on, and
	// eventsSecret the secret its deliveries are signed with; nil when no
	// configuration has events on.
	events       *receiver
	eventsSecret string
}

func runBench(ctx context.Context, argv []string, stdout, stderr io.Writer) error {
	o, err := parseBench(argv[2:])
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(o.out, "runs"), 0o755); err != nil {
		return err
	}
	portsFile := filepath.Join(o.state, "ports.env")
	ports, err := readEnvFile(portsFile)
	if err != nil {
		return fmt.Errorf("%w (is the stack up? SHOP_STATE=%s scripts/stack.sh up)", err, o.state)
	}
	replicaPorts, err := stackPorts(o.state, ports, "REPLICA_PORTS", 3)
	if err != nil {
		return err
	}
	adminPorts, err := stackPorts(o.state, ports, "ADMIN_PORTS", 3)
	if err != nil {
		return err
	}
	b := &bench{o: o, env: stackEnv(o.state), adminPorts: adminPorts, stderr: stderr}
	if err := b.openDB(); err != nil {
		return err
	}
	defer func() { b.db.Close() }()
	urls := make([]string, len(replicaPorts))
	for i, p := range replicaPorts {
		urls[i] = "http://127.0.0.1:" + p
	}
	b.url = strings.Join(urls, ",")

	configs := benchConfigs()
	if o.only != nil {
		configs = slices.DeleteFunc(configs, func(c benchConfig) bool { return !o.only.MatchString(c.Name) })
		if len(configs) == 0 {
			return fmt.Errorf("-configs %q matches no configuration", o.only)
		}
	}
	if slices.ContainsFunc(configs, func(c benchConfig) bool { return c.Events }) {
		b.eventsSecret = newEventsSecret()
		b.events, err = startReceiver(ctx, b.eventsSecret, filepath.Join(o.out, "runs", "events"), filepath.Join(o.out, "runs", "eventsink.log"))
		if err != nil {
			return err
		}
		defer b.events.stop()
	}
	var phases []benchPhase
	for round := 1; round <= o.rounds; round++ {
		for _, c := range configs {
			fmt.Fprintf(stderr, "\n== round %d/%d: %s\n", round, o.rounds, c.Name)
			got, err := b.runConfig(ctx, round, c)
			phases = append(phases, got...)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, c.Name, err)
			}
		}
	}

	command := strings.Join(argv, " ")
	cores := runtime.NumCPU()
	tbl := benchTable(phases, o.rounds)
	notes := benchNotes(o, phases)
	pairs := benchPairs(phases)
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, tbl)
	fmt.Fprint(stdout, notes)
	fmt.Fprint(stdout, pairs)
	fmt.Fprintf(stdout, "\n%d CPU cores (runtime.NumCPU). Command: %s\n", cores, command)
	if err := writeBenchReport(o, tbl, notes+pairs, cores, command); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "report: %s\n", filepath.Join(o.out, "report.md"))
	for _, p := range phases {
		if !p.Verify.OK {
			fmt.Fprintf(stdout, "FAILED: shop verify, %s, %s, run %d\n", p.Phase, p.Config.Name, p.Round)
			return errVerifyFailed
		}
	}
	return nil
}

// stackEnv is the environment of the stack script: this process's, with
// SHOP_STATE pointing at the bench's stack and no other SHOP_ setting, so
// that every configuration is exactly the settings it names on the
// service's defaults.
func stackEnv(state string) []string {
	env := []string{"SHOP_STATE=" + state}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHOP_") {
			env = append(env, kv)
		}
	}
	return env
}

// runConfig restarts the replicas with c's settings and runs the hot SKU,
// then the sellout and the round after it.
func (b *bench) runConfig(ctx context.Context, round int, c benchConfig) ([]benchPhase, error) {
	o := b.o
	if err := b.eventsOff(ctx); err != nil {
		return nil, err
	}
	env := c.Env
	if c.Events {
		env = append(slices.Clone(env), "SHOP_EVENTS_URL="+b.events.url, "SHOP_EVENTS_SECRET="+b.eventsSecret)
	}
	stackEnv := append(slices.Clone(b.env), "DB_TOPOLOGY="+c.dbTopology())
	if _, err := commandEnv(ctx, stackEnv, b.stderr, o.stack, append([]string{"replicas", "3"}, env...)...); err != nil {
		return nil, err
	}
	// The topology's MariaDB, for the counters: on Galera, HAProxy's
	// port, which reaches the writer.
	if err := b.openDB(); err != nil {
		return nil, err
	}
	var phases []benchPhase
	slug := func(phase string) string {
		name := strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "").Replace(c.Name + "-" + phase)
		return filepath.Join(o.out, "runs", fmt.Sprintf("%d-%s", round, name))
	}

	if err := b.seed(ctx, 1, o.hotUnits); err != nil {
		return nil, err
	}
	hot, err := b.runPhase(ctx, round, phaseHot, c, slug("hot"), nil,
		"-scenario", "hotsku", "-sku", "1", "-n", strconv.Itoa(o.hotBuyers))
	phases = append(phases, hot)
	if err != nil {
		return phases, err
	}

	if err := b.seed(ctx, o.skus, 1); err != nil {
		return phases, err
	}
	sale, err := b.runPhase(ctx, round, phaseSellout, c, slug("sellout"), nil,
		"-scenario", "sellout", "-skus", strconv.Itoa(o.skus), "-buyers", strconv.Itoa(o.buyers))
	phases = append(phases, sale)
	if err != nil {
		return phases, err
	}
	// One new buyer per product, every product sold out: what a refusal costs.
	after, err := b.runPhase(ctx, round, phaseAfter, c, slug("after"), []string{slug("sellout") + ".acks"},
		"-scenario", "sellout", "-skus", strconv.Itoa(o.skus), "-buyers", "1",
		"-first-user", strconv.Itoa(o.skus*o.buyers+1))
	return append(phases, after), err
}

// eventsOff turns events off and empties the outbox, before the replicas
// of the next configuration start: the service never turns events off
// (once on, every replica writes them), but the bench must run each
// configuration as it names it, and the one with events on from an empty
// outbox. The replicas of the configuration before, which may still be
// relaying, are stopped next; a mark of an event deleted here marks nothing.
func (b *bench) eventsOff(ctx context.Context) error {
	if _, err := b.db.ExecContext(ctx, "UPDATE outbox_switch SET enabled = FALSE, on_since = NULL WHERE id = 1"); err != nil {
		return fmt.Errorf("turn events off: %w", err)
	}
	if _, err := b.db.ExecContext(ctx, "DELETE FROM outbox"); err != nil {
		return fmt.Errorf("empty the outbox: %w", err)
	}
	return nil
}

// openDB opens the stack's MariaDB at ports.env's MYSQL_PORT, unless db
// already reaches it: a configuration on another topology moves it.
func (b *bench) openDB() error {
	ports, err := readEnvFile(filepath.Join(b.o.state, "ports.env"))
	if err != nil {
		return err
	}
	if b.db != nil && ports["MYSQL_PORT"] == b.dbPort {
		return nil
	}
	db, err := openStackDB(b.o.state)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	if b.db != nil {
		b.db.Close()
	}
	b.db, b.dbPort = db, ports["MYSQL_PORT"]
	return nil
}

// seed resets the catalog to products with units each.
func (b *bench) seed(ctx context.Context, products, units int) error {
	_, err := commandEnv(ctx, b.env, b.stderr, b.o.stack, "shop", "seed",
		"--products", strconv.Itoa(products), "--stock", strconv.Itoa(units))
	b.prevSold = 0
	return err
}

// runPhase runs the loadtest with args against the replicas between two
// snapshots, then shop verify with the phase's acks and earlier ones. Its
// files are base.{json,acks,log,verify.json}.
func (b *bench) runPhase(ctx context.Context, round int, phase string, c benchConfig, base string, earlierAcks []string, args ...string) (benchPhase, error) {
	p := benchPhase{Round: round, Phase: phase, Config: c}
	before, err := b.snapshot(ctx, c)
	if err != nil {
		return p, err
	}
	args = append(append(args, c.Load...), "-url", b.url, "-c", strconv.Itoa(b.o.workers), "-src-n", strconv.Itoa(b.o.srcN),
		"-json", base+".json", "-acks", base+".acks")
	p.CPU, err = measureCPU(b.o.state, func() (time.Duration, error) {
		return runLoadtest(ctx, b.o.loadtest, base+".log", b.stderr, args...)
	})
	if err != nil {
		return p, err
	}
	after, err := b.snapshot(ctx, c)
	if err != nil {
		return p, err
	}
	p.Stmts = counterDeltas(statementCounters, before.stmts, after.stmts)
	if c.DB == dbGalera {
		p.Wsrep = counterDeltas(wsrepCounters, before.wsrep, after.wsrep)
	}
	p.Txns, p.TxnOrders = after.txns-before.txns, after.txnOrders-before.txnOrders
	p.Delivered = after.delivered - before.delivered
	if err := readJSON(base+".json", &p.Load); err != nil {
		return p, err
	}

	acks := base + ".acks"
	if len(earlierAcks) > 0 {
		acks = base + ".all.acks"
		if err := concatFiles(acks, append(earlierAcks, base+".acks")...); err != nil {
			return p, err
		}
	}
	if p.Verify, err = verifySale(ctx, b.o.stack, acks, base+".verify.json", b.stderr, b.env...); err != nil {
		return p, err
	}
	p.Sold = p.Verify.Orders - b.prevSold
	b.prevSold = p.Verify.Orders
	fmt.Fprintf(b.stderr, "== %s, %s: %s, %.0f orders/s, verify %s\n", phase, c.Name, statuses(p.Load.Statuses), p.ordersPerSecond(), p.verdict())
	return p, nil
}

// mysqlStatus reads the named counters of MariaDB's SHOW GLOBAL STATUS.
func mysqlStatus(ctx context.Context, db *sql.DB, names []string) (map[string]int64, error) {
	got := map[string]int64{}
	query := "SHOW GLOBAL STATUS WHERE Variable_name IN ('" + strings.Join(names, "','") + "')"
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("mysql status: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			return nil, fmt.Errorf("mysql status: %w", err)
		}
		got[name] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysql status: %w", err)
	}
	for _, name := range names {
		if _, ok := got[name]; !ok {
			return nil, fmt.Errorf("mysql status: no %s", name)
		}
	}
	return got, nil
}

// counterDeltas is how much each named counter grew from before to after.
func counterDeltas(names []string, before, after map[string]int64) map[string]int64 {
	d := make(map[string]int64, len(names))
	for _, name := range names {
		d[name] = after[name] - before[name]
	}
	return d
}

// perRequest is a counter's delta over a load per request of it.
func perRequest(deltas map[string]int64, counter string, requests int) float64 {
	if requests == 0 {
		return 0
	}
	return float64(deltas[counter]) / float64(requests)
}

// snapshot reads MariaDB's statement counters (on Galera the writer's,
// and its wsrep counters) and sums the replicas' order transaction
// counters.
func (b *bench) snapshot(ctx context.Context, c benchConfig) (snapshot, error) {
	var s snapshot
	var err error
	if s.stmts, err = mysqlStatus(ctx, b.db, statementCounters); err != nil {
		return s, err
	}
	if c.DB == dbGalera {
		if s.wsrep, err = mysqlStatus(ctx, b.db, wsrepCounters); err != nil {
			return s, err
		}
	}
	err = scrapeMetrics(ctx, b.adminPorts, func(series string, v float64) {
		switch series {
		case "shop_order_transactions_total":
			s.txns += v
		case "shop_order_transaction_orders_total":
			s.txnOrders += v
		case `shop_events_deliveries_total{result="delivered"}`:
			s.delivered += v
		}
	})
	return s, err
}

// runLoadtest runs the load test with args to its end, its output in log,
// and returns the CPU time it took (user and system): on this machine the
// load generator competes with the stack for the same cores.
func runLoadtest(ctx context.Context, bin, log string, stderr io.Writer, args ...string) (time.Duration, error) {
	f, err := os.Create(log)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	load := exec.CommandContext(ctx, bin, args...)
	load.Stdout, load.Stderr = f, io.MultiWriter(f, stderr)
	if err := load.Run(); err != nil {
		return 0, fmt.Errorf("loadtest: %w (see %s)", err, log)
	}
	return load.ProcessState.UserTime() + load.ProcessState.SystemTime(), nil
}

// concatFiles writes the files' contents, one after the other, to path.
func concatFiles(path string, files ...string) error {
	var all []byte
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		all = append(all, data...)
	}
	return os.WriteFile(path, all, 0o644)
}

func (p benchPhase) ordersPerSecond() float64 {
	if p.Load.Seconds <= 0 {
		return 0
	}
	return float64(p.Load.Statuses["201"]) / p.Load.Seconds
}

// perRequest is the phase's count of a statement per request.
func (p benchPhase) perRequest(counter string) float64 {
	return perRequest(p.Stmts, counter, p.Load.Requests)
}

func (p benchPhase) statementsPerRequest() float64 {
	var sum float64
	for _, c := range statementCounters {
		sum += p.perRequest(c)
	}
	return sum
}

// rate is the figure compared with the baseline: orders/s in a sale,
// requests/s after the sell-out, where no order is placed.
func (p benchPhase) rate() float64 {
	if p.Phase == phaseAfter {
		return p.Load.RPS
	}
	return p.ordersPerSecond()
}

func (p benchPhase) verdict() string {
	if p.Verify.OK {
		return "ok"
	}
	var broken []string
	for _, c := range p.Verify.Checks {
		if c.Violations > 0 {
			broken = append(broken, c.Name)
		}
	}
	return "FAIL: " + strings.Join(broken, ", ")
}

// ordersPerTransaction is the phase's mean batch, or "-" when it ran no
// order transaction.
func (p benchPhase) ordersPerTransaction() string {
	if p.Txns <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", p.TxnOrders/p.Txns)
}

// selectPerRefused is the phase's SELECTs per 409, after the sell-out.
func (p benchPhase) selectPerRefused() string {
	refused := p.Load.Statuses["409"]
	if p.Phase != phaseAfter || refused == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", float64(p.Stmts["Com_select"])/float64(refused))
}

// benchColumns are the table's headings.
var benchColumns = []string{"phase", "configuration", "run", "requests", "statuses", "sold", "orders/s", "requests/s",
	"p50", "p99", "SELECT/req", "UPDATE/req", "INSERT/req", "COMMIT/req", "statements/req", "orders/transaction",
	"SELECT per refused order", "verify", "× baseline"}

// benchOrder sorts the phases for the table: by phase, configuration and
// round.
func benchOrder(phases []benchPhase) []benchPhase {
	rank := func(p benchPhase) (int, int) {
		phase := slices.Index([]string{phaseHot, phaseSellout, phaseAfter}, p.Phase)
		config := slices.IndexFunc(benchConfigs(), func(c benchConfig) bool { return c.Name == p.Config.Name })
		return phase, config
	}
	sorted := slices.Clone(phases)
	slices.SortStableFunc(sorted, func(a, b benchPhase) int {
		pa, ca := rank(a)
		pb, cb := rank(b)
		if pa != pb {
			return pa - pb
		}
		if ca != cb {
			return ca - cb
		}
		return a.Round - b.Round
	})
	return sorted
}

// baselineOf returns the baseline's phase of the same phase and round.
func baselineOf(phases []benchPhase, p benchPhase) (benchPhase, bool) {
	i := slices.IndexFunc(phases, func(q benchPhase) bool {
		return q.Config.Baseline && q.Phase == p.Phase && q.Round == p.Round
	})
	if i < 0 {
		return benchPhase{}, false
	}
	return phases[i], true
}

func ratio(v, base float64) string {
	if base <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", v/base)
}

func (p benchPhase) cells(phases []benchPhase) []string {
	st := statuses(p.Load.Statuses)
	if n := sumCounts(p.Load.Errors); n > 0 {
		st += fmt.Sprintf(" errors×%d", n)
	}
	vs := "-"
	if base, ok := baselineOf(phases, p); ok {
		vs = ratio(p.rate(), base.rate())
	}
	return []string{p.Phase, p.Config.Name, strconv.Itoa(p.Round), strconv.Itoa(p.Load.Requests), st,
		strconv.FormatInt(p.Sold, 10), fmt.Sprintf("%.0f", p.ordersPerSecond()), fmt.Sprintf("%.0f", p.Load.RPS),
		ms(p.Load.P50Ms), ms(p.Load.P99Ms),
		fmt.Sprintf("%.2f", p.perRequest("Com_select")), fmt.Sprintf("%.2f", p.perRequest("Com_update")),
		fmt.Sprintf("%.2f", p.perRequest("Com_insert")), fmt.Sprintf("%.2f", p.perRequest("Com_commit")),
		fmt.Sprintf("%.2f", p.statementsPerRequest()), p.ordersPerTransaction(), p.selectPerRefused(),
		p.verdict(), vs}
}

// medianCells summarises the rounds of one phase and configuration: the
// median of each rate, latency and ratio; verify is ok only if every run's
// was.
func medianCells(runs, phases []benchPhase) []string {
	pick := func(f func(benchPhase) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	verdict := "ok"
	for _, r := range runs {
		if !r.Verify.OK {
			verdict = "FAIL"
		}
	}
	vs := "-"
	if _, ok := baselineOf(phases, runs[0]); ok {
		vs = fmt.Sprintf("%.2f×", pick(func(p benchPhase) float64 {
			base, _ := baselineOf(phases, p)
			if base.rate() <= 0 {
				return 0
			}
			return p.rate() / base.rate()
		}))
	}
	first := runs[0]
	return []string{first.Phase, first.Config.Name, fmt.Sprintf("median of %d", len(runs)), "", "", "",
		fmt.Sprintf("%.0f", pick(benchPhase.ordersPerSecond)), fmt.Sprintf("%.0f", pick(func(p benchPhase) float64 { return p.Load.RPS })),
		ms(pick(func(p benchPhase) float64 { return p.Load.P50Ms })), ms(pick(func(p benchPhase) float64 { return p.Load.P99Ms })),
		"", "", "", "", fmt.Sprintf("%.2f", pick(benchPhase.statementsPerRequest)), "", "", verdict, vs}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// benchTable renders the phases as one Markdown table; with several
// rounds, each phase and configuration ends with a median line.
func benchTable(phases []benchPhase, rounds int) string {
	var b strings.Builder
	line := func(cells []string) { fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | ")) }
	line(benchColumns)
	fmt.Fprintf(&b, "|%s\n", strings.Repeat("---|", len(benchColumns)))
	sorted := benchOrder(phases)
	for i, p := range sorted {
		line(p.cells(phases))
		last := i == len(sorted)-1 || sorted[i+1].Phase != p.Phase || sorted[i+1].Config.Name != p.Config.Name
		if rounds > 1 && last {
			runs := slices.DeleteFunc(slices.Clone(sorted), func(q benchPhase) bool {
				return q.Phase != p.Phase || q.Config.Name != p.Config.Name
			})
			line(medianCells(runs, phases))
		}
	}
	return b.String()
}

// benchNotes points out what the table's verdicts do not: a sale that sold
// fewer units than it could have.
func benchNotes(o benchOptions, phases []benchPhase) string {
	var b strings.Builder
	for _, p := range benchOrder(phases) {
		want := int64(0)
		switch p.Phase {
		case phaseHot:
			want = int64(min(o.hotUnits, o.hotBuyers))
		case phaseSellout:
			want = int64(o.skus)
		}
		if p.Sold != want {
			fmt.Fprintf(&b, "\nnote: %s, %s, run %d sold %d units, not %d (statuses %s).", p.Phase, p.Config.Name, p.Round,
				p.Sold, want, statuses(p.Load.Statuses))
		}
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}

// benchPairs sets each configuration with a Beside beside that one, phase
// by phase and run by run: the rates, their ratio and the latencies, in a
// table of their own. Empty when no such pair ran.
func benchPairs(phases []benchPhase) string {
	var b strings.Builder
	line := func(cells ...string) { fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | ")) }
	for _, p := range benchOrder(phases) {
		if p.Config.Beside == "" {
			continue
		}
		i := slices.IndexFunc(phases, func(q benchPhase) bool {
			return q.Config.Name == p.Config.Beside && q.Phase == p.Phase && q.Round == p.Round
		})
		if i < 0 {
			continue
		}
		off := phases[i]
		if b.Len() == 0 {
			b.WriteString("\n")
			line("phase", "run", "compared", "rate off", "rate on", "on / off", "p50 off", "p50 on", "p99 off", "p99 on")
			line("---", "---", "---", "---", "---", "---", "---", "---", "---", "---")
		}
		line(p.Phase, strconv.Itoa(p.Round), p.Config.Name+" vs "+off.Config.Name,
			fmt.Sprintf("%.0f", off.rate()), fmt.Sprintf("%.0f", p.rate()), ratio(p.rate(), off.rate()),
			ms(off.Load.P50Ms), ms(p.Load.P50Ms), ms(off.Load.P99Ms), ms(p.Load.P99Ms))
	}
	if b.Len() > 0 {
		b.WriteString("\nRate: orders/s, after the sell-out requests/s; on / off below 1.00× is what the one setting costs.\n")
	}
	b.WriteString(eventsGoals(phases))
	b.WriteString(galeraNotes(phases))
	return b.String()
}

// galeraNotes says, for the hot SKU and the sellout on Galera, the median
// over the rounds of its rate over the single MariaDB's in the same round
// (against galeraGoal in the hot SKU), and per run what the writer's wsrep
// counters and the stack's processes' CPU show: writesets replicated per
// order, certification failures, brute-force aborts, the time paused by
// flow control, the CPU per request of each process group. Each Galera
// configuration has lines of its own, named after what it adds to the
// default on Galera ("Galera, group 8").
// Empty when Galera did not run.
func galeraNotes(phases []benchPhase) string {
	var b strings.Builder
	for _, c := range benchConfigs() {
		if c.DB != dbGalera {
			continue
		}
		label := "Galera" + strings.TrimPrefix(c.Name, benchGaleraConfig)
		for _, phase := range []string{phaseHot, phaseSellout} {
			var ratios []float64
			for _, p := range benchOrder(phases) {
				if p.Config.Name != c.Name || p.Phase != phase {
					continue
				}
				i := slices.IndexFunc(phases, func(q benchPhase) bool {
					return q.Config.Name == p.Config.Beside && q.Phase == p.Phase && q.Round == p.Round
				})
				if i >= 0 && phases[i].rate() > 0 {
					ratios = append(ratios, p.rate()/phases[i].rate())
				}
				fmt.Fprintf(&b, "\n%s, %s, run %d: %s", label, phase, p.Round, p.wsrepSummary())
			}
			if len(ratios) == 0 {
				continue
			}
			m := median(ratios)
			fmt.Fprintf(&b, "\n%s ÷ single MariaDB, %s: %.2f× (median of %d runs)", label, phase, m, len(ratios))
			if phase == phaseHot {
				verdict := "at or above"
				if m < galeraGoal {
					verdict = "BELOW"
				}
				fmt.Fprintf(&b, ", %s %.2f×", verdict, galeraGoal)
			}
			b.WriteString(".")
		}
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}

// wsrepSummary renders a Galera phase's wsrep counters per order and its
// CPU per request.
func (p benchPhase) wsrepSummary() string {
	orders := float64(max(1, p.Load.Statuses["201"]))
	s := fmt.Sprintf("%.2f writesets per order (%.0f B each), %d certification failures, %d brute-force aborts, "+
		"flow control paused %.2fs",
		float64(p.Wsrep["wsrep_replicated"])/orders,
		float64(p.Wsrep["wsrep_replicated_bytes"])/float64(max(1, p.Wsrep["wsrep_replicated"])),
		p.Wsrep["wsrep_local_cert_failures"], p.Wsrep["wsrep_local_bf_aborts"],
		float64(p.Wsrep["wsrep_flow_control_paused_ns"])/1e9)
	var cpu []string
	for _, g := range append(slices.Clone(cpuGroups), cpuHAProxy) {
		if _, ok := p.CPU.Seconds[g]; ok {
			cpu = append(cpu, fmt.Sprintf("%s %.0f", g, p.CPU.perRequest(g, p.Load.Requests)))
		}
	}
	if len(cpu) > 0 {
		s += "; CPU µs per request: " + strings.Join(cpu, ", ")
	}
	if p.CPU.Machine {
		s += fmt.Sprintf("; machine busy %.0f%%", 100*p.CPU.Busy)
	}
	return s
}

// eventsGoals says, for each run of the configuration with events on, its
// rate over the default's in the hot SKU and the sellout against
// eventsGoal, and how many events the relays delivered during the phase.
// Empty when it did not run.
func eventsGoals(phases []benchPhase) string {
	var b strings.Builder
	for _, p := range benchOrder(phases) {
		if !p.Config.Events || p.Phase == phaseAfter {
			continue
		}
		i := slices.IndexFunc(phases, func(q benchPhase) bool {
			return q.Config.Name == p.Config.Beside && q.Phase == p.Phase && q.Round == p.Round
		})
		if i < 0 {
			continue
		}
		verdict := "meets"
		if phases[i].rate() <= 0 || p.rate()/phases[i].rate() < eventsGoal {
			verdict = "BELOW"
		}
		fmt.Fprintf(&b, "\nevents on ÷ default, %s, run %d: %s (%s the goal of %.2f×); %.0f events delivered during the phase.",
			p.Phase, p.Round, ratio(p.rate(), phases[i].rate()), verdict, eventsGoal, p.Delivered)
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}

// writeBenchReport writes report.md to o.out.
func writeBenchReport(o benchOptions, tbl, notes string, cores int, command string) error {
	var b strings.Builder
	b.WriteString("# The order path side by side\n\n")
	fmt.Fprintf(&b, "Three replicas on one MariaDB and one Redis; the load goes straight to the replicas, round robin "+
		"(not through nginx), %d buyers at once, sent by hey. Hot SKU: one product with %d units, %d buyers, each a "+
		"different user. Sellout: %d products with one unit each, %d buyers per product. After sell-out: right after "+
		"the sellout, one new buyer per product. Each configuration restarts the replicas; %d round(s), "+
		"configurations interleaved. Machine: %d CPU cores. Run %s.\n\n",
		o.workers, o.hotUnits, o.hotBuyers, o.skus, o.buyers, o.rounds, cores, time.Now().UTC().Format(time.RFC3339))
	b.WriteString(tbl)
	b.WriteString(notes)
	b.WriteString(`
- **orders/s**: 201s per second of the phase; **requests/s** all answers per second; p50 and p99 of every request
  (hey's timings).
- **SELECT/req** … **COMMIT/req**: deltas of MariaDB's ` + "`Com_select`, `Com_update`, `Com_insert`, `Com_commit`" + `
  (` + "`SHOW GLOBAL STATUS`" + `) from right before to right after the phase, divided by its requests;
  **statements/req** is their sum (BEGIN is not counted).
- **orders/transaction**: the replicas' ` + "`shop_order_transaction_orders_total` over `shop_order_transactions_total`" + `
  (deltas over the phase): the mean batch.
- **SELECT per refused order**: after the sell-out, the phase's SELECTs over its 409s.
- **verify**: ` + "`shop verify --acks`" + ` right after the phase, with every order acknowledged since the reseed.
- **× baseline**: orders/s over the baseline's in the same phase and run (after sell-out: requests/s).
- **redis, default batch, jwt**: the default with ` + "`SHOP_AUTH=jwt`" + ` (HS256); every buyer sends a token minted once by
  the load test (` + "`-jwt-secret`" + `), which the replica verifies before the order. The second table sets it beside the
  default, phase by phase: what verifying costs.
- **redis, default batch, events**: the default with events on: every order writes its ` + "`order.reserved`" + ` in its
  transaction, and the replicas' relays (` + "`SHOP_EVENTS_URL`" + `) deliver to a receiver (bin/eventsink) while the orders
  are placed. Beside the default in the second table, and its ratio to it against the goal of 0.90× under it. The
  bench turns events off and empties the outbox before each configuration (the service itself never turns them off).
- **redis, default batch, galera**: the default with MariaDB as three Galera nodes behind HAProxy
  (` + "`DB_TOPOLOGY=galera`" + `), every connection on one node, the writer: each COMMIT is certified and its writeset
  sent to the other two before it returns. Its statement counters are the writer's. Beside the default on the single
  MariaDB in the second table; under it, per run, the writer's wsrep counters over the phase (writesets per order and
  their size, certification failures, brute-force aborts, time paused by flow control) and the CPU per request of
  each group of the stack's processes, and the median over the runs of Galera's rate over the single MariaDB's
  (the hot SKU against 0.70×).
- **redis, default batch, group 8**: the default with ` + "`SHOP_ORDER_GROUP=8`" + `: the batches of up to 8 SKUs whose locks a
  replica holds at once commit in one transaction, each fenced by its own token (docs/order-path.md, "Groups"). Beside
  the default in the second table: what one COMMIT for many products changes; **…, galera, group 8** is the same on
  Galera, beside it on the single MariaDB, with its own Galera lines.
`)
	fmt.Fprintf(&b, "\nCommand: `%s`\n", command)
	return os.WriteFile(filepath.Join(o.out, "report.md"), []byte(b.String()), 0o644)
}
