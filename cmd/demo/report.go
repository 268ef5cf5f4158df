package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"shop/internal/stripepay"
)

// row is one line of the experiment: a way of running the fleet.
type row struct {
	Lock     string // SHOP_LOCK_MODE: none, local, redis, redlock, mysql, etcd, zookeeper
	Update   string // SHOP_STOCK_UPDATE: naive, guarded
	Fencing  bool
	Replicas int
	TTL      time.Duration // SHOP_LOCK_TTL; zero leaves the default
	// Pause stops one order holder per replica between its read and its
	// write for longer than TTL (the shopStaleWrite failpoint).
	Pause bool
	Kill  bool   // Redis master 3 of the Redlock is killed during the load
	Fault string // a stack.sh fault command run during the load (fault rows)
	// Topology is the replicas' Redis (scripts/stack.sh's REDIS_TOPOLOGY):
	// empty for the single server, topologySentinel for a master and its
	// replica behind three Sentinels.
	Topology string
	// DB is the stack's MariaDB (scripts/stack.sh's DB_TOPOLOGY): empty
	// for the single server, dbGalera for three Galera nodes behind
	// HAProxy (galera.go).
	DB       string
	Hot      bool  // one product with many units (-hot-units) and more buyers (-hot-buyers)
	Batch    int   // SHOP_ORDER_BATCH; zero leaves the default
	Retry    bool  // buyers retry 502, 503, 504 and transport errors under their Idempotency-Key
	MustHold bool  // the invariants must hold; otherwise the row is expected to race
	MustRace bool  // the row must oversell: its race is made to happen on every run
	WantSold int64 // orders the row must sell, when above zero
	Shows    string

	// Life is the lifecycle rows' variant (lifeAsIs, lifeSweepKill,
	// lifeJWT, lifeStripe, lifeRefundKill; see life.go); empty for the
	// other rows.
	Life      string
	PayWindow time.Duration // SHOP_PAY_WINDOW
	Stall     time.Duration // the shopSweepStall failpoint's stop; zero: no failpoint
	Auth      string        // SHOP_AUTH; empty leaves the default
	JWTSecret string        // SHOP_JWT_SECRET with Auth jwt
	// Payments is SHOP_PAYMENTS (the Stripe rows' "stripe"); empty leaves
	// the default, webhook.
	Payments string
	// RefundStall is the shopRefundKill failpoint's stop, between a Refund
	// API call and its record; zero: no failpoint.
	RefundStall time.Duration
}

// The fault rows' faults: scripts/stack.sh commands.
const (
	faultKillReplica = "kill-replica"
	faultRolling     = "rolling-restart"
	faultRedis       = "restart-redis"
	faultMariaDB     = "restart-mariadb"
	faultFailover    = "failover-redis"
	faultKillMaster  = "kill-redis-master"
	faultEtcdLeader  = "kill-etcd-leader"
	faultZKLeader    = "kill-zk-leader"
)

// topologySentinel is stack.sh's REDIS_TOPOLOGY of a Sentinel-managed
// master; the Sentinel rows run on it.
const topologySentinel = "sentinel"

// experiment is article 002's experiment, then the pause that the
// articles' Redis lock alone does not survive, then the hot SKU (unless
// -hot-units is 0):
// one product, more buyers than units, with and without the lock and the
// coalescing of orders; then (unless -faults=false) the service's default
// under faults, with buyers who retry; then (unless -life=false) the order
// lifecycle: reservations paid or lapsing, their units returned and resold;
// then (unless -families=false) the source articles' other lock families;
// then (unless -life=false or -stripe=false) the lifecycle sale paid
// through Stripe, its refunds paid back through the Refund API, and again
// with a refunder killed between its call and its record; then (unless
// -life=false or -events=false) the lifecycle sale with events on; then
// (unless -galera=false) the Galera rows. The Stripe rows, the events row
// and the Galera rows come last so that the rows before keep their
// numbers. The events row is the last on the single MariaDB, as the events
// it turns on stay on in that database; the Galera rows run on the
// cluster's own databases, where no row turned events on, so they come
// after it.
func experiment(o options) []row {
	rows := []row{
		{Lock: "none", Update: "naive", Replicas: 3,
			Shows: "without a lock the buyers of one product all read stock 1 and all write 0"},
		{Lock: "local", Update: "naive", Replicas: 1, MustHold: true,
			Shows: "an in-process mutex per SKU serialises the buyers inside one process"},
		{Lock: "local", Update: "naive", Replicas: 3,
			Shows: "the same mutex does nothing for buyers on another replica"},
		{Lock: "redis", Update: "naive", Replicas: 3, MustHold: true,
			Shows: "one Redis lock per SKU serialises the buyers of all replicas"},
		{Lock: "redis", Update: "guarded", Fencing: true, Replicas: 3, MustHold: true,
			Shows: "the service's default: Redis lock, conditional fenced UPDATE"},
		{Lock: "redis", Update: "naive", Replicas: 3, TTL: o.ttl, Pause: true, MustRace: true,
			Shows: "a holder stopped between its read and its write past its TTL loses the lock; its write lands anyway and the unit sells twice"},
		{Lock: "redis", Update: "naive", Fencing: true, Replicas: 3, TTL: o.ttl, Pause: true, MustHold: true, WantSold: int64(o.skus),
			Shows: "the same stop with fencing: MySQL refuses the stopped holder's write, and the sale sells exactly its stock"},
		{Lock: "redlock", Update: "naive", Replicas: 3, MustHold: true,
			Shows: "the lock on a majority of three independent Redis masters serialises the buyers as one Redis does"},
		{Lock: "redlock", Update: "naive", Replicas: 3, Kill: true, MustHold: true,
			Shows: "one of the three masters dies during the sale: the two left are a majority, and the lock holds"},
	}
	if o.hotUnits > 0 {
		rows = append(rows, hotRows(o)...)
	}
	if o.faults {
		rows = append(rows, faultRows(o)...)
	}
	if o.life {
		rows = append(rows, lifeRows(o)...)
	}
	if o.families {
		rows = append(rows, familyRows(o)...)
	}
	if o.life && o.stripe {
		rows = append(rows, stripeRows(o)...)
	}
	if o.life && o.events {
		rows = append(rows, eventsRow(o))
	}
	if o.galera {
		rows = append(rows, galeraRows(o)...)
	}
	return rows
}

// faultRows are the service's default under faults, through nginx, with
// buyers who retry: each must sell exactly its stock, lose no acknowledged
// order and answer every buyer. The last two run on a Sentinel-managed
// Redis whose master fails over mid-sale: once on request, once killed. Two
// rows rather than one that does both, so that each kind of failover has
// its own verdict and its own count of leases lost and stale writes
// refused — a graceful failover and a crash lose different things.
func faultRows(o options) []row {
	fault := func(f, shows string) row {
		return row{Lock: "redis", Update: "guarded", Fencing: true, Replicas: 3, Fault: f, Retry: true,
			MustHold: true, WantSold: int64(o.skus), Shows: shows}
	}
	sentinel := func(f, shows string) row {
		r := fault(f, shows)
		r.Topology = topologySentinel
		return r
	}
	return []row{
		fault(faultKillReplica, "a replica dies (SIGKILL) mid-sale: its locks lapse, nginx sends its buyers elsewhere, "+
			"and buyers whose answer was lost retry under their key"),
		fault(faultRolling, "every replica in turn drains on SIGTERM (it stops accepting and finishes what it has) "+
			"and starts again, while nginx keeps sending to it: no request is lost, so even a buyer who does not retry "+
			"gets an answer from a replica"),
		fault(faultRedis, "Redis (lock, cache, Bloom filter) is killed and comes back empty: leases are lost, "+
			"fencing tokens go on from the clock, the cache and the filter are rebuilt"),
		fault(faultMariaDB, "MariaDB is restarted mid-sale: orders in flight fail or end with an unknown outcome, "+
			"and their retries under the same key find what was committed"),
		sentinel(faultFailover, "the replicas' Redis is a master with a replica behind three Sentinels, and SENTINEL FAILOVER "+
			"promotes the replica mid-sale: leases taken on the old master may be missing on the new one, "+
			"fencing refuses the writes of a holder that lost its lease, and the SKUs keep selling"),
		sentinel(faultKillMaster, "the same set-up, and the master is killed (SIGKILL) mid-sale: the Sentinels promote the "+
			"replica, which may lack the latest leases and fencing counters (replication is asynchronous); the killed "+
			"master comes back empty as a replica, and the sale still sells exactly its stock"),
	}
}

// familyRows are the source articles' other lock families on three replicas, each
// with fencing: the sellout, the hot SKU (unless -hot-units is 0) and a
// fault — the etcd leader or the ZooKeeper leader killed mid-sale, with
// buyers who retry (unless -faults=false), and for the MySQL lock table a
// holder stopped past its lease, without fencing (the unit sells twice) and
// with it.
func familyRows(o options) []row {
	var rows []row
	for _, f := range []struct{ lock, fault, name string }{
		{"mysql", "", "the MySQL lock table"},
		{"etcd", faultEtcdLeader, "etcd"},
		{"zookeeper", faultZKLeader, "ZooKeeper"},
	} {
		rows = append(rows, row{Lock: f.lock, Update: "guarded", Fencing: true, Replicas: 3, MustHold: true, WantSold: int64(o.skus),
			Shows: f.name + ": the source articles' sellout under this family's lock"})
		if o.hotUnits > 0 {
			rows = append(rows, row{Lock: f.lock, Update: "guarded", Fencing: true, Replicas: 3, Hot: true, MustHold: true,
				WantSold: int64(min(o.hotUnits, o.hotBuyers)),
				Shows:    f.name + ": the hot SKU, each lock holder placing the SKU's queued orders in one transaction"})
		}
		if f.fault != "" {
			if !o.faults {
				continue
			}
			rows = append(rows, row{Lock: f.lock, Update: "guarded", Fencing: true, Replicas: 3, Fault: f.fault, Retry: true,
				MustHold: true, WantSold: int64(o.skus),
				Shows: f.name + ": its leader is killed (SIGKILL) mid-sale; the others elect a new one, the sessions and their locks survive, and the killed server rejoins"})
			continue
		}
		rows = append(rows,
			row{Lock: f.lock, Update: "naive", Replicas: 3, TTL: o.ttl, Pause: true, MustRace: true,
				Shows: f.name + ": a holder stopped past its lease's expiry; another takes the expired row, and the stopped holder's write lands anyway"},
			row{Lock: f.lock, Update: "naive", Fencing: true, Replicas: 3, TTL: o.ttl, Pause: true, MustHold: true, WantSold: int64(o.skus),
				Shows: f.name + ": the same stop with fencing: the table's counter gave the new holder a larger token, and MySQL refuses the stopped holder's write"})
	}
	return rows
}

// hotRows are the hot SKU: one product, more buyers than units.
func hotRows(o options) []row {
	sold := int64(min(o.hotUnits, o.hotBuyers))
	return []row{
		{Lock: "none", Update: "guarded", Fencing: true, Replicas: 3, Hot: true, Batch: 1, MustHold: true, WantSold: sold,
			Shows: "no lock, one order per transaction: the conditional UPDATE alone sells each unit once"},
		{Lock: "redis", Update: "guarded", Fencing: true, Replicas: 3, Hot: true, Batch: 1, MustHold: true, WantSold: sold,
			Shows: "the Redis lock, one order per lock hold: every buyer of the SKU waits for the lock in turn"},
		{Lock: "redis", Update: "guarded", Fencing: true, Replicas: 3, Hot: true, MustHold: true, WantSold: sold,
			Shows: "the service's default: each lock holder places the SKU's queued orders in one transaction"},
	}
}

// KilledMaster is the Redis master a kill row kills, counted from 1: not
// the first, which also holds the product cache.
func (r row) KilledMaster() int { return 3 }

// tokens reports whether the row's lock gives fencing tokens: all but the
// in-process mutex and none.
func (r row) tokens() bool { return r.Lock != "none" && r.Lock != "local" }

func (r row) fencing() string {
	if !r.tokens() {
		return "-" // no tokens to check
	}
	if r.Fencing {
		return "on"
	}
	return "off"
}

// sale names the row's catalog and buyers.
func (r row) sale() string {
	if r.Hot {
		return "hot SKU"
	}
	return "sellout"
}

// batch renders SHOP_ORDER_BATCH.
func (r row) batch() string {
	if r.Batch == 0 {
		return "default"
	}
	return strconv.Itoa(r.Batch)
}

func (r row) label() string {
	s := fmt.Sprintf("%s/%s ×%d", r.Lock, r.Update, r.Replicas)
	if r.Life != "" {
		s = "lifecycle, " + s
	}
	if r.Hot {
		s = "hot SKU, " + s
	}
	if r.tokens() {
		s += ", fencing " + r.fencing()
	}
	switch {
	case r.Hot && r.Batch == 0:
		s += ", default batch"
	case r.Hot:
		s += ", batch " + r.batch()
	}
	if r.Pause {
		s += fmt.Sprintf(", TTL %s, a holder stopped between read and write", r.TTL)
	}
	if r.Kill {
		s += fmt.Sprintf(", Redis master %d killed", r.KilledMaster())
	}
	if r.Fault != "" {
		s += ", " + r.faultName() + ", buyers retry"
	}
	if r.Topology != "" {
		s += ", Redis via " + r.Topology
	}
	if r.DB == dbGalera {
		s += ", MariaDB: Galera ×3 behind HAProxy"
	}
	if r.Life != "" {
		s += ", SHOP_PAY_WINDOW=" + r.PayWindow.String()
	}
	if r.Life == lifeSweepKill {
		s += ", a replica killed in its sweep, MariaDB restarted, buyers and payers retry"
	}
	if r.Life == lifeWriterKill {
		s += ", the writer node killed in a sweep, buyers and payers retry"
	}
	if r.Auth != "" {
		s += ", SHOP_AUTH=" + r.Auth
	}
	if r.stripe() {
		s += ", SHOP_PAYMENTS=stripe on stripe-mock"
	}
	if r.RefundStall > 0 {
		s += ", a replica killed between a Refund API call and its record, buyers and payers retry"
	}
	if r.Life == lifeEvents {
		s += fmt.Sprintf(", events on, the receiver down %s, a relay killed between a POST and its mark, buyers and payers retry", eventsDown)
	}
	return s
}

// stripe reports whether the row's replicas take payments from Stripe
// (the Stripe rows, on stripe-mock).
func (r row) stripe() bool { return r.Payments == payStripe }

// payStripe is SHOP_PAYMENTS of the Stripe rows.
const payStripe = "stripe"

// topology is the row's REDIS_TOPOLOGY for scripts/stack.sh: every row
// names its own, as the stack keeps the last one it was given.
func (r row) topology() string {
	if r.Topology == "" {
		return "single"
	}
	return r.Topology
}

// faultName says what a fault row does to the stack.
func (r row) faultName() string {
	switch r.Fault {
	case faultKillReplica:
		return fmt.Sprintf("replica %d killed", r.KilledReplica())
	case faultRolling:
		return "rolling restart"
	case faultRedis:
		return "Redis restarted empty"
	case faultMariaDB:
		return "MariaDB restarted"
	case faultFailover:
		return "Redis master failed over"
	case faultKillMaster:
		return "Redis master killed"
	case faultEtcdLeader:
		return "etcd leader killed"
	case faultZKLeader:
		return "ZooKeeper leader killed"
	case faultKillDBWriter:
		return "Galera writer killed"
	case faultPartitionDB:
		return "Galera writer partitioned, then healed"
	}
	return r.Fault
}

// faultArgs are the stack.sh arguments of a fault row's fault.
func (r row) faultArgs() []string {
	if r.Fault == faultKillReplica {
		return []string{r.Fault, strconv.Itoa(r.KilledReplica())}
	}
	return []string{r.Fault}
}

// KilledReplica is the replica the kill-replica row kills.
func (r row) KilledReplica() int { return 2 }

func (r row) slug() string {
	s := fmt.Sprintf("%s-%s-x%d", r.Lock, r.Update, r.Replicas)
	if r.Hot {
		s = "hot-" + s
	}
	if r.tokens() {
		s += "-fencing-" + r.fencing()
	}
	if r.Hot {
		s += "-batch-" + r.batch()
	}
	if r.Pause {
		s += "-pause"
	}
	if r.Kill {
		s += "-kill"
	}
	if r.Fault != "" {
		s += "-" + r.Fault
	}
	if r.Life != "" {
		s += "-life-" + r.Life
	}
	if r.DB != "" {
		s += "-" + r.DB
	}
	return s
}

// env is the replicas' settings for the row.
func (r row) env() []string {
	env := []string{"SHOP_LOCK_MODE=" + r.Lock, "SHOP_STOCK_UPDATE=" + r.Update, "SHOP_FENCING=off"}
	if r.Fencing {
		env[2] = "SHOP_FENCING=on"
	}
	if r.TTL > 0 {
		env = append(env, "SHOP_LOCK_TTL="+r.TTL.String())
	}
	if r.Batch > 0 {
		env = append(env, "SHOP_ORDER_BATCH="+strconv.Itoa(r.Batch))
	}
	if r.Life != "" {
		env = append(env, "SHOP_PAY_WINDOW="+r.PayWindow.String(), "SHOP_SWEEP_INTERVAL=1s")
	}
	if r.Auth != "" {
		env = append(env, "SHOP_AUTH="+r.Auth)
	}
	if r.Auth == "jwt" {
		env = append(env, "SHOP_JWT_SECRET="+r.JWTSecret)
	}
	if r.Payments != "" {
		env = append(env, "SHOP_PAYMENTS="+r.Payments)
	}
	return env
}

// stopFor is the failpoint that stops one order holder per replica between
// its read and its write for d (see internal/failpoint), and the binary
// built with it.
func stopFor(d time.Duration) []string {
	return []string{"SHOP_BINARY=" + failpointBinary, fmt.Sprintf("GOFAIL_FAILPOINTS=shopStaleWrite=1*return(%d)", d.Milliseconds())}
}

// failpointBinary is bin/shop built with -tags failpoints (scripts/demo.sh).
const failpointBinary = "bin/shop-failpoints"

// loadResult is what bin/loadtest -json writes.
type loadResult struct {
	Requests int            `json:"requests"`
	Seconds  float64        `json:"seconds"`
	RPS      float64        `json:"rps"`
	P50Ms    float64        `json:"p50_ms"`
	P99Ms    float64        `json:"p99_ms"`
	Statuses map[string]int `json:"statuses"` // every attempt's answer
	Errors   map[string]int `json:"errors"`   // every attempt's transport error
	Acks     int            `json:"acks"`

	Buyers        int            `json:"buyers"`
	Answered      int            `json:"answered"`   // final answer 2xx or 4xx
	Unanswered    int            `json:"unanswered"` // still 5xx or a transport error at the end
	Retries       int            `json:"retries"`
	FinalStatuses map[string]int `json:"final_statuses"`

	Reserved int           `json:"reserved"` // acks whose order was reserved
	Payments *payResult    `json:"payments"` // the payers' counts, in the lifecycle rows and the edge's sales
	Cancels  *cancelResult `json:"cancels"`  // the buyers' cancels, in the edge's sales
	Until    int           `json:"until"`    // the units a second wave set out to buy
	Rebuys   int           `json:"rebuys"`   // purchase attempts after a sold_out
}

// verifyReport is what `shop verify --json` prints.
type verifyReport struct {
	Products     int64   `json:"products"`
	InitialStock int64   `json:"initial_stock"`
	Stock        int64   `json:"stock"`
	Orders       int64   `json:"orders"`
	Acks         int     `json:"acks"`
	Oversold     int64   `json:"oversold_units"`
	Checks       []check `json:"checks"`
	OK           bool    `json:"ok"`
}

type check struct {
	Name       string   `json:"name"`
	Violations int64    `json:"violations"`
	Examples   []string `json:"examples"`
}

// oversellChecks are the invariants an oversold sale breaks. A row that is
// expected to race may break these and no other.
var oversellChecks = []string{"stock >= 0", "initial_stock == stock + active orders"}

type result struct {
	Row    row
	Num    int // the row's number in the experiment (0: its place in the results)
	Load   loadResult
	Verify verifyReport
	Paused time.Duration  // how long a holder was stopped (the failpoint's setting)
	Killed time.Duration  // how far into the load the master was killed, or the fault began
	Busy   map[string]int // the replicas' 503 busy answers by cause
	Life   *lifeResult    // a lifecycle row's figures
	// Failover is a Galera fault row's writer failover (galera.go).
	Failover *failover
}

// staleHolders renders how many holders lost their lease during the order
// and how many stale writes MySQL refused.
func (r result) staleHolders() string {
	if !r.Row.tokens() {
		return "-"
	}
	return fmt.Sprintf("%d / %d", r.Busy["lease_lost"], r.Busy["stale_fence"])
}

// broken lists the invariants verify found broken; with beyondOversell,
// only those that an oversold sale does not explain.
func (r result) broken(beyondOversell bool) []string {
	var names []string
	for _, c := range r.Verify.Checks {
		if c.Violations > 0 && !(beyondOversell && slices.Contains(oversellChecks, c.Name)) {
			names = append(names, c.Name)
		}
	}
	return names
}

// lost counts the attempts that never got an answer from a replica: nginx's
// 502 and 504, and transport errors.
func (r result) lost() int {
	n := r.Load.Statuses["502"] + r.Load.Statuses["504"]
	for _, v := range r.Load.Errors {
		n += v
	}
	return n
}

func (r result) verdict() string {
	switch {
	case r.Verify.OK:
		return "correct"
	case len(r.broken(true)) > 0:
		return "BROKEN"
	}
	return "OVERSOLD"
}

// failed reports whether the row disproves what it must show: a row that
// must hold broke an invariant, sold nothing or sold other than the units it
// must, or any row lost an acknowledged order or sold one SKU twice to a
// user.
func (r result) failed() bool {
	switch {
	case r.Row.Life != "":
		return !r.Verify.OK || r.Verify.Orders == 0 || len(r.lifeProblems()) > 0
	case r.Row.MustHold:
		return !r.Verify.OK || r.Verify.Orders == 0 || r.soldShort() || r.unanswered() || r.lostOnRestart() || r.noFailover()
	case r.Row.MustRace && r.Verify.OK:
		return true
	}
	return len(r.broken(true)) > 0
}

// unanswered reports whether a row whose buyers retry left one without an
// answer.
func (r result) unanswered() bool { return r.Row.Retry && r.Load.Unanswered > 0 }

// lostOnRestart reports whether a rolling restart lost a request: one that
// got no answer from a replica, as a buyer who does not retry would.
func (r result) lostOnRestart() bool { return r.Row.Fault == faultRolling && r.lost() > 0 }

// noFailover reports whether a Galera fault row saw no COMMIT on another
// node than the writer it lost: the failover it must show did not happen,
// or was not measured.
func (r result) noFailover() bool {
	return r.Row.DB == dbGalera && r.Row.Fault != "" && (r.Failover == nil || !r.Failover.Committed)
}

// soldShort reports whether a row that must sell a number of units sold
// another number.
func (r result) soldShort() bool {
	return r.Row.WantSold > 0 && r.Verify.Orders != r.Row.WantSold
}

func (r result) outcome() string {
	switch {
	case r.Row.Life != "" && r.failed() && !r.Verify.OK:
		return "FAILED: " + strings.Join(append(r.broken(false), r.lifeProblems()...), ", ")
	case r.Row.Life != "" && r.failed():
		return "FAILED: " + strings.Join(r.lifeProblems(), ", ")
	case r.failed() && r.Verify.Orders == 0:
		return "FAILED: nothing sold"
	case r.failed() && r.Verify.OK && r.soldShort():
		return fmt.Sprintf("FAILED: sold %d, must sell %d", r.Verify.Orders, r.Row.WantSold)
	case r.failed() && r.Verify.OK && r.unanswered():
		return fmt.Sprintf("FAILED: %d buyers unanswered", r.Load.Unanswered)
	case r.failed() && r.Verify.OK && r.lostOnRestart():
		return fmt.Sprintf("FAILED: %d requests lost in the restart", r.lost())
	case r.failed() && r.Verify.OK && r.noFailover():
		return "FAILED: no COMMIT seen on another node after the writer was lost"
	case r.failed() && r.Verify.OK:
		return "FAILED: did not race"
	case r.failed():
		return "FAILED: " + strings.Join(r.broken(!r.Row.MustHold), ", ")
	case r.Row.MustHold:
		return "holds, as it must"
	case r.Verify.OK:
		return "expected to race; did not race this run"
	case r.Row.MustRace:
		return "oversold, as it must"
	}
	return "oversold, as expected"
}

// answered renders how many buyers got a final answer (2xx or 4xx).
func (r result) answered() string {
	if r.Load.Buyers == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d", r.Load.Answered, r.Load.Buyers)
}

// retries renders the extra attempts of a row whose buyers retry.
func (r result) retries() string {
	if !r.Row.Retry {
		return "-"
	}
	return strconv.Itoa(r.Load.Retries)
}

func (r result) created() int { return r.Load.Statuses["201"] }

func (r result) ordersPerSecond() float64 {
	if r.Load.Seconds <= 0 {
		return 0
	}
	return float64(r.created()) / r.Load.Seconds
}

// columns are the table's headings; cells gives a row's values.
var columns = []string{"#", "sale", "lock", "update", "fencing", "batch", "replicas", "disruption", "leases lost / stale writes refused",
	"requests", "201s", "buyers answered", "retries", "orders in MySQL", "oversold units", "verify", "orders/s", "p50", "p99", "outcome"}

func (r result) cells(n int) []string {
	return []string{strconv.Itoa(n), r.Row.sale(), r.Row.Lock, r.Row.Update, r.Row.fencing(), r.Row.batch(), strconv.Itoa(r.Row.Replicas),
		r.disruption(), r.staleHolders(), strconv.Itoa(r.Load.Requests), strconv.Itoa(r.created()), r.answered(), r.retries(),
		strconv.FormatInt(r.Verify.Orders, 10), strconv.FormatInt(r.Verify.Oversold, 10), r.verdict(),
		fmt.Sprintf("%.0f", r.ordersPerSecond()), ms(r.Load.P50Ms), ms(r.Load.P99Ms), r.outcome()}
}

// number is the row's number in the table, the result being the i-th (from
// 0) of those run: its number in the experiment, which -rows may skip some
// of.
func (r result) number(i int) int {
	if r.Num > 0 {
		return r.Num
	}
	return i + 1
}

// table renders the results of the rows other than the lifecycle rows for
// a terminal.
func table(results []result) string {
	return terminalTable(results, notLife, columns, result.cells)
}

// lifeTable renders the lifecycle rows' results for a terminal, or "" when
// there are none.
func lifeTable(results []result) string {
	return terminalTable(results, isLife, lifeColumns, result.lifeCells)
}

// stripeTable renders the Stripe rows' refunds and calls of Stripe's API
// for a terminal, or "" when there are none.
func stripeTable(results []result) string {
	return terminalTable(results, isStripe, stripeColumns, result.stripeCells)
}

// Which rows a table shows: the lifecycle rows, the others, the Stripe
// rows (lifecycle rows too).
func isLife(r result) bool   { return r.Row.Life != "" }
func notLife(r result) bool  { return r.Row.Life == "" }
func isStripe(r result) bool { return r.Row.stripe() }

// terminalTable renders the results of the rows that keep says with the
// columns and cells given; "" when there are none.
func terminalTable(results []result, keep func(result) bool, cols []string, cells func(result, int) []string) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	n := 0
	for i, r := range results {
		if !keep(r) {
			continue
		}
		if n == 0 {
			fmt.Fprintln(w, strings.Join(cols, "\t"))
		}
		n++
		fmt.Fprintln(w, strings.Join(cells(r, r.number(i)), "\t"))
	}
	w.Flush()
	return b.String()
}

// markdownTable renders the results of the rows other than the lifecycle
// rows as a Markdown table.
func markdownTable(results []result) string {
	return mdTable(results, notLife, columns, result.cells)
}

// mdTable renders the results of the rows that keep says as a Markdown
// table; "" when there are none.
func mdTable(results []result, keep func(result) bool, cols []string, cells func(result, int) []string) string {
	var b strings.Builder
	n := 0
	for i, r := range results {
		if !keep(r) {
			continue
		}
		if n == 0 {
			fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
		}
		n++
		fmt.Fprintf(&b, "| %s |\n", strings.Join(cells(r, r.number(i)), " | "))
	}
	return b.String()
}

// lifeColumns are the lifecycle table's headings; lifeCells gives a row's
// values.
var lifeColumns = []string{"#", "row", "buyers", "winners", "paid in time", "paid late (owed back)", "expired",
	"units returned", "resold to wave 2", "paid", "refunds owed", "pay_by → returned p50 / max", "pay_by → resold p50 / max",
	"retries (buy / pay)", "verify", "outcome"}

func (r result) lifeCells(n int) []string {
	l := r.Life
	if l == nil {
		l = &lifeResult{}
	}
	w1, w2 := l.Wave1.Payments, l.Wave2.Payments
	if w1 == nil {
		w1 = &payResult{}
	}
	if w2 == nil {
		w2 = &payResult{}
	}
	name := r.Row.lifeName()
	if r.Row.Life != lifeAsIs && r.Row.Life != lifeJWT && r.Row.Life != lifeStripe && l.Fault != "" {
		name += ": " + l.Fault
	}
	return []string{strconv.Itoa(n), name, fmt.Sprintf("%d + %d", l.Wave1.Buyers, l.Wave2.Buyers), strconv.Itoa(l.Wave1.Acks),
		strconv.Itoa(w1.InTime.Paid), fmt.Sprintf("%d (%d)", w1.Late.Sent, w1.Late.Refused), strconv.FormatInt(l.Orders["expired"], 10),
		strconv.FormatInt(l.Back["expired"]+l.Back["cancelled"], 10), fmt.Sprintf("%d of %d", l.Wave2.Acks, l.Resold),
		strconv.FormatInt(l.Orders["paid"], 10), strconv.Itoa(len(l.Refunds)), l.ReturnLag.String(), l.ResaleLag.String(),
		fmt.Sprintf("%d / %d", l.Wave1.Retries+l.Wave2.Retries, w1.Retries+w2.Retries), r.verdict(), r.outcome()}
}

// lifeName names a lifecycle row in the lifecycle and Stripe tables.
func (r row) lifeName() string {
	return map[string]string{lifeAsIs: "as is", lifeSweepKill: "sweep killed", lifeJWT: "SHOP_AUTH=jwt",
		lifeStripe: "Stripe", lifeRefundKill: "Stripe, refunder killed", lifeEvents: "events on, relay killed",
		lifeWriterKill: "Galera, writer killed in a sweep"}[r.Life]
}

// stripeColumns are the Stripe table's headings; stripeCells gives a
// row's values.
var stripeColumns = []string{"#", "row", "refunds owed", "refunded", "Refund API calls", "calls per refund (max)",
	"distinct keys per refund", "in flight when killed", "PaymentIntents created (keys) / orders with one",
	"cancelled / lapsed with one", "all refunded after the sale", "outcome"}

func (r result) stripeCells(n int) []string {
	s := &stripeResult{}
	if r.Life != nil && r.Life.Stripe != nil {
		s = r.Life.Stripe
	}
	calls := 0
	for _, c := range s.Refunds {
		calls += c.Calls
	}
	after := s.Waited.Round(100 * time.Millisecond).String()
	if s.refunded() < len(s.Refunds) {
		after = "not within " + s.Bound.String()
	}
	return []string{strconv.Itoa(n), r.Row.lifeName(), strconv.Itoa(len(s.Refunds)), strconv.Itoa(s.refunded()),
		strconv.Itoa(calls + s.Unnamed), strconv.Itoa(s.maxCalls()), s.keysPerRefund(), s.inFlight(),
		fmt.Sprintf("%d (%d) / %d", s.Created, s.CreateKeys, s.CheckedOut), fmt.Sprintf("%d / %d", s.Cancelled, s.Lapsed),
		after, r.outcome()}
}

// disruption says what was done to the fleet during the load.
func (r result) disruption() string {
	switch {
	case r.Row.Pause:
		return fmt.Sprintf("holder stopped %s > TTL %s", r.Paused, r.Row.TTL)
	case r.Row.Kill:
		return fmt.Sprintf("master %d killed at %s", r.Row.KilledMaster(), r.Killed.Round(100*time.Millisecond))
	case r.Row.DB == dbGalera && r.Row.Fault != "":
		return fmt.Sprintf("%s at %s: %s", r.Row.faultName(), r.Killed.Round(100*time.Millisecond), r.Failover)
	case r.Row.Fault != "":
		return fmt.Sprintf("%s at %s", r.Row.faultName(), r.Killed.Round(100*time.Millisecond))
	case r.Life != nil && r.Life.Fault != "":
		return r.Life.Fault
	}
	return "-"
}

func ms(v float64) string { return fmt.Sprintf("%.0fms", v) }

// writeReport writes report.md and report.png to o.out.
func writeReport(o options, results []result, cores int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# The lock experiment\n\n")
	fmt.Fprintf(&b, "%d products with one unit each, %d buyers per product arriving together (%d requests, %d at once), "+
		"sent by hey through nginx to the replicas; every verdict is `shop verify --json --acks` against MariaDB. "+
		"Machine: %d CPU cores. Run %s.\n\n", o.skus, o.buyers, o.skus*o.buyers, min(o.workers, o.skus*o.buyers),
		cores, time.Now().UTC().Format(time.RFC3339))
	if o.hotUnits > 0 {
		fmt.Fprintf(&b, "The hot-SKU rows sell one product with %d units to %d buyers, each a different user (%d at once), "+
			"through the same nginx; each must hold and sell exactly %d units.\n\n",
			o.hotUnits, o.hotBuyers, min(o.hotWorkers, o.hotBuyers), min(o.hotUnits, o.hotBuyers))
	}
	b.WriteString("![oversold units and orders per second per row](report.png)\n\n")
	b.WriteString(markdownTable(results))
	if life := mdTable(results, isLife, lifeColumns, result.lifeCells); life != "" {
		fmt.Fprintf(&b, "\n### The order lifecycle\n\nOne product with %d units and %d buyers, each a different user (%d at once), "+
			"every order a reservation to be paid within SHOP_PAY_WINDOW=%s. Payments are the payment provider's events, "+
			"signed (Standard Webhooks) and carrying what the order owes: %.0f%% of the orders are paid at once, "+
			"another %.0f%% a second after their pay_by (too late on purpose: each must be answered owed, and be a refund "+
			"owed in MySQL, order_expired, of what its order owes; no other refund may appear), the rest never. Once the first wave's "+
			"orders and payments in time are done, %d new buyers wait for the returned units (retrying sold_out with a "+
			"backoff of up to 1 s), buy exactly as many as were not paid, and pay them all. Before each seed the demo "+
			"settles the refunds the rows left, with a signed refund.succeeded each, as `shop seed` refuses while any is "+
			"unsettled. \"pay_by → returned\" spreads each lapsed order's returned_at − pay_by; \"pay_by → resold\" pairs "+
			"the k-th lapsed order by pay_by with the second wave's k-th order by created_at and spreads created_at − pay_by "+
			"(MySQL's clock and the replicas', one machine). Nothing in the tests asserts a time.\n\n",
			o.lifeUnits, o.lifeBuyers, o.lifeWorkers, o.payWindow, 100*o.payFrac, 100*o.lateFrac, o.resaleBuyers)
		b.WriteString(life)
	}
	if events := mdTable(results, isEvents, eventsColumns, result.eventsCells); events != "" {
		fmt.Fprintf(&b, "\n### Events\n\nThe events row runs the lifecycle sale with events on: the replicas deliver to a receiver of "+
			"the demo's own (bin/eventsink, SHOP_EVENTS_URL, a fresh SHOP_EVENTS_SECRET), which verifies each delivery's "+
			"signature and records it; %.0f%% of the first wave's reservations are also cancelled by their buyers. Replica 1 "+
			"runs the failpoints build: its relay's first delivery answered 2xx stops before its mark (shopEventKill), and the "+
			"demo kills the replica there (SIGKILL) and starts it again; once the claim's lease runs out a relay sends the "+
			"event again, under the same webhook-id. Once the first wave's orders and payments in time are done the receiver "+
			"refuses connections for %s. After the sale the demo waits, up to %s, until the outbox has no pending event, then "+
			"reads the receiver's record (eventsink.Summarize). \"Changes in MySQL\" counts the sale's orders, those no longer "+
			"reserved, its refunds and those settled: one event each. The row must have every event written acknowledged, "+
			"none out of order on its stream, no gap, no event delivered twice at once, and the killed event acknowledged "+
			"again; deliveries of one event more than once are allowed and counted. The lag is from occurred_at (MySQL's "+
			"clock) to the first acknowledged delivery's arrival (the receiver's; one machine).\n\n",
			100*eventsCancelFrac, eventsDown, eventsDrain)
		b.WriteString(events)
	}
	if money := mdTable(results, isStripe, stripeColumns, result.stripeCells); money != "" {
		fmt.Fprintf(&b, "\n### Refunds through Stripe's API\n\nThe Stripe rows run the same sale with SHOP_PAYMENTS=stripe "+
			"on stripe-mock, behind the recording proxy that logs every call of Stripe's API: each payment is the buyer's "+
			"checkout, a PaymentIntent, and then Stripe's payment_intent.succeeded, signed with the endpoint's secret. The late "+
			"ones are owed back, and the replicas' refunders pay them back through the Refund API, each call with "+
			"Idempotency-Key: the refund's refund_id. Once the sale is over the row waits until MySQL has every refund its "+
			"payments made refunded, then counts, from the proxy's log, the Refund API calls per refund and their distinct "+
			"keys: every refund must end refunded, called for under exactly one key, its refund_id. In the refund-kill row "+
			"the first replica whose refunder stops at the shopRefundKill failpoint, after its call and before its record, "+
			"is killed there (SIGKILL) and started again; the refund it had in flight is called for again under the same key "+
			"once its claim's lease (%s) runs out. PaymentIntents are counted against the orders MySQL has with one (one "+
			"key each), and their cancellations against the lapsed orders that had one (a cancellation is tried once, "+
			"after the order's end commits, and only logged if it fails).\n\n", stripepay.DefaultLease)
		b.WriteString(money)
	}
	b.WriteString("\n## Rows\n\n")
	for i, r := range results {
		fmt.Fprintf(&b, "%d. **%s**: %s. ", r.number(i), r.Row.label(), r.Row.Shows)
		fmt.Fprintf(&b, "Statuses %s", statuses(r.Load.Statuses))
		if len(r.Load.Errors) > 0 {
			fmt.Fprintf(&b, "; transport errors %s", statuses(r.Load.Errors))
		}
		fmt.Fprintf(&b, "; %d units left unsold.", r.Verify.Stock)
		for _, c := range r.Verify.Checks {
			if c.Violations > 0 {
				fmt.Fprintf(&b, " Broken: %s (%d, first: %s).", c.Name, c.Violations, strings.Join(c.Examples, "; "))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString(`
A row that must hold fails the demo if any invariant breaks, or if it sold nothing; a hot-SKU row also if it
sold other than min(units, buyers). A row expected to race is reported, not failed, when it happens not to race;
it fails only if it breaks an invariant other than the stock count (a lost acknowledged order, two orders of one
user, an acknowledged order that is another buyer's).

In the pause rows one order holder per replica is stopped (the shopStaleWrite failpoint of a binary built with
-tags failpoints) after it read the product and before it writes the stock, for longer than the lease, with its
process's lease watchdogs stopped too, as in a GC pause or a frozen VM: its lease runs out in Redis, another
replica's buyer takes the lock and sells the unit, and then the stopped holder writes what it read. Without fencing
that write lands and the unit sells twice, on every run (the row must oversell); with fencing MySQL refuses it.
"leases lost" counts orders whose holder found its lease gone, "stale writes refused" the writes MySQL turned down
because a newer token had written the row.

The fault rows run the service's default settings with buyers who retry 502, 503, 504 and transport errors under
their own Idempotency-Key (bin/loadtest -retry, Retry-After honoured), while the stack is disrupted mid-sale. Each
must sell exactly its stock, lose no acknowledged order, create no duplicate, and leave no buyer without an answer;
the rolling restart must also lose no request at all (no 502, 504 or transport error), so that buyers who do not
retry lose nothing either.

The last two fault rows run the replicas on a Redis master with one replica, watched by three Sentinels (the
service follows the master through them: SHOP_REDIS_MASTER_NAME). Mid-sale the master is failed over — by
SENTINEL FAILOVER, then in the next row by SIGKILL, after which the killed master starts again empty and rejoins as
a replica. Replication is asynchronous, so the promoted replica may lack the latest leases and fencing counters:
two holders may then both believe they hold a SKU, and fencing refuses the older one's write ("stale writes
refused"); fencing tokens are max(counter + 1, Redis's clock in µs), and a refused write raises the counter, so no
SKU is left unsellable ("exactly its stock sold"). The replicas live through these rows, so their counts are whole.
`)
	if slices.ContainsFunc(results, func(r result) bool { return r.Row.DB == dbGalera }) {
		fmt.Fprintf(&b, `
The Galera rows run MariaDB as three Galera nodes behind HAProxy (scripts/stack.sh's DB_TOPOLOGY=galera): HAProxy sends
every connection to one node, the writer, and to a backup only once its agent (shop db-agent) or its check marks the
writer down. The writer is lost mid-sale, %s into the sellout: SIGKILLed (stack.sh kill-db-writer, which starts the
node again once another node writes, and returns once it is Synced: HAProxy then fails back to it and cuts the
backup's sessions), or cut off from the other two without being killed and then healed (partition-db-writer,
heal-db-partition). In the lifecycle row the first sweep to return lapsed units is stopped before its COMMIT (the
shopSweepStall failpoint, %s) and the writer is SIGKILLed under it. Buyers and payers retry. The failover time is
from the writer's loss (the killed node's first failed ping, polled every %s directly on the nodes' ports; for the
partition the first poll with fewer TCP connections between the nodes' gcomm ports in /proc/net/tcp, as nothing on
the nodes shows the isolation until the eviction) to the first rise of another node's
wsrep_local_commits, which counts only the transactions a node committed as their origin: the first COMMIT through
HAProxy on the new writer (possibly the stack's own probe, a write through HAProxy every 0.1 s until one commits on
another node). Expect at least the ~6 s the cluster takes to evict a node. A Galera row fails if an
invariant breaks, a buyer is left unanswered, or no COMMIT is seen on another node.
`, o.galeraAfter, o.stall, failoverPoll)
	}
	if err := os.WriteFile(filepath.Join(o.out, "report.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(o.out, "report.png"))
	if err != nil {
		return err
	}
	if err := drawChart(f, results); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// statuses renders a count map in key order: "201×5000 409×15000".
func statuses(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s×%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
