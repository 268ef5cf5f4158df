package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/dbagent"
)

const (
	// HAProxyEnv names the haproxy binary for tests that start a Galera
	// cluster; default: haproxy on PATH or in an sbin.
	HAProxyEnv = "SHOP_TEST_HAPROXY"
	// GaleraProviderEnv names Galera's library (wsrep_provider); default:
	// the first of galeraProviders that exists.
	GaleraProviderEnv = "SHOP_TEST_GALERA_PROVIDER"
)

// galeraProviders are where distributions put Galera 4's library.
var galeraProviders = []string{
	"/usr/lib/galera/libgalera_smm.so",
	"/usr/lib/galera-4/libgalera_smm.so",
	"/usr/lib64/galera-4/libgalera_smm.so",
	"/usr/lib64/galera/libgalera_smm.so",
	"/usr/local/lib/libgalera_smm.so",
	"/opt/homebrew/lib/libgalera_smm.so",
}

// galeraNodes is how many nodes a private Galera cluster has: the smallest
// that keeps a Primary component when one is lost.
const galeraNodes = 3

// GaleraCluster is a private Galera cluster of three MariaDB nodes on
// loopback behind HAProxy, as scripts/stack.sh's DB_TOPOLOGY=galera runs
// one: HAProxy sends every new connection to one writer (node 0, the
// others are backups, in order), marks a node down on the word of its
// agent (internal/dbagent, served here in process) and cuts the sessions
// of a node it marks down, and those of a backup when the writer comes
// back. Every node keeps its data directory across Kill and Start, as a
// machine that crashed and rebooted does, and rejoins by IST.
type GaleraCluster struct {
	// Addr is HAProxy's address, the one the service is given.
	Addr string
	// StatsAddr is HAProxy's stats page (HTTP; "/;csv" for CSV).
	StatsAddr string

	*galera
	tb testing.TB // the test that faults and waits report to
}

// galera is what the views of one cluster (For) share.
type galera struct {
	bin     string
	dir     string
	nodes   []*galeraNode
	haproxy proc
}

// galeraNode is one mariadbd with its ports, the flags it is started with
// after the first start, its agent, and a pool of its own for the status
// it is asked for.
type galeraNode struct {
	name  string
	dir   string
	port  string
	args  []string
	agent string // the agent's address
	admin *sql.DB

	proc
}

// StartGalera starts a Galera cluster of three MariaDB nodes on free
// loopback ports, in a temporary directory (opts: OnTmpfs), with HAProxy in
// front and an agent per node, and waits until the three are Synced and
// HAProxy sends new connections to node 0. The nodes run as the mysql user
// when the test runs as root: Galera's rsync state transfer fails as root.
//
// It is quick because no node needs a state transfer (rsync, one joiner
// at a time, seconds each) to join: node 0 bootstraps a cluster on a new
// data directory and stops cleanly, which leaves the cluster's state (its
// UUID and seqno) in the directory, in grastate.dat and in InnoDB alike;
// copies of the directory are the other nodes', and each is given the
// Primary component of the three as a member saves it (gvwstate.dat).
// Started together, the three form that component again, as a cluster
// does after a power failure (pc.recovery), all at the same state.
//
// The nodes are small (a 32 MB buffer pool) and write their redo log at
// every commit but sync it once a second (innodb_flush_log_at_trx_commit
// =2): a killed node loses nothing the kernel has, and a node that rejoins
// gets what it missed from the others. Everything is killed when the test ends, and dies with the test
// binary if that ends first.
//
// The binaries are mariadbd, mariadb-install-db, haproxy and Galera's
// library (SHOP_TEST_MARIADBD, SHOP_TEST_MARIADB_INSTALL_DB,
// SHOP_TEST_HAPROXY, SHOP_TEST_GALERA_PROVIDER, or where distributions put
// them). A -short run without them skips the test; any other run fails.
func StartGalera(tb testing.TB, opts ...Option) *GaleraCluster {
	tb.Helper()
	bins, err := galeraBins()
	if err != nil {
		if testing.Short() {
			tb.Skipf("Galera: %v; -short runs skip tests whose servers are missing", err)
		}
		tb.Fatalf("Galera: %v", err)
	}
	began := time.Now()
	g := &galera{bin: bins.mariadbd, dir: traversableDir(tb, opts)}
	c := &GaleraCluster{galera: g, tb: tb}
	uid, gid, asUser := nodeUser(tb)

	gcomm := make([]string, galeraNodes)
	for i := range gcomm {
		gcomm[i] = "127.0.0.1:" + freePort(tb)
	}
	ctx, stopAgents := context.WithCancel(context.Background())
	var agents sync.WaitGroup
	tb.Cleanup(func() {
		stopAgents()
		agents.Wait()
	})
	for i := range galeraNodes {
		n := &galeraNode{name: fmt.Sprintf("n%d", i), dir: filepath.Join(g.dir, fmt.Sprintf("n%d", i)), port: freePort(tb)}
		if err := os.Mkdir(n.dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		n.args = append([]string{"--no-defaults", "--datadir=" + filepath.Join(n.dir, "data"),
			"--bind-address=127.0.0.1", "--port=" + n.port, "--socket=" + filepath.Join(n.dir, "mysqld.sock"),
			"--pid-file=" + filepath.Join(n.dir, "mysqld.pid"), "--log-error=" + filepath.Join(n.dir, "mysqld.log"),
			"--skip-log-bin", "--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
			"--skip-name-resolve", "--max-connections=200", "--innodb-buffer-pool-size=32M",
			"--innodb-log-file-size=16M", "--innodb-flush-log-at-trx-commit=2",
			"--wsrep-on=ON", "--wsrep-provider=" + bins.provider, "--wsrep-cluster-name=shop",
			"--wsrep-cluster-address=gcomm://" + strings.Join(gcomm, ","),
			"--wsrep-node-address=127.0.0.1", "--wsrep-node-name=" + n.name,
			"--wsrep-provider-options=gmcast.listen_addr=tcp://" + gcomm[i] +
				";ist.recv_addr=127.0.0.1:" + freePort(tb) + ";gcache.size=32M",
			"--wsrep-sst-method=rsync", "--wsrep-sst-receive-address=127.0.0.1:" + freePort(tb)}, asUser...)
		n.admin = openAt(tb, "127.0.0.1:"+n.port, "")
		agentDB := openAt(tb, "127.0.0.1:"+n.port, "")
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		n.agent = ln.Addr().String()
		agents.Go(func() { dbagent.Serve(ctx, ln, agentDB) })
		g.nodes = append(g.nodes, n)
	}
	tb.Cleanup(g.killAll)

	n0 := g.nodes[0]
	install := exec.Command(bins.install, append([]string{"--no-defaults", "--datadir=" + filepath.Join(n0.dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db", "--innodb-log-file-size=16M"}, asUser...)...)
	if out, err := install.CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v\n%s", bins.install, err, out)
	}
	installed := time.Now()
	if err := chownTree(n0.dir, uid, gid); err != nil {
		tb.Fatal(err)
	}
	c.start(0, "--wsrep-new-cluster")
	c.WaitSynced(tb, 0)
	n0.end(syscall.SIGTERM, time.Minute)
	booted := time.Now()
	view := galeraView()
	for i, n := range g.nodes {
		if i > 0 {
			if err := copyTree(filepath.Join(n0.dir, "data"), filepath.Join(n.dir, "data")); err != nil {
				tb.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(n.dir, "data", "gvwstate.dat"), []byte(view.state(i)), 0o660); err != nil {
			tb.Fatal(err)
		}
		if err := chownTree(n.dir, uid, gid); err != nil {
			tb.Fatal(err)
		}
	}
	// Together: a node waits for the others of its saved component.
	for i := range g.nodes {
		c.start(i)
	}
	for i := range g.nodes {
		c.WaitSynced(tb, i)
	}
	joined := time.Now()

	c.Addr = "127.0.0.1:" + freePort(tb)
	c.StatsAddr = "127.0.0.1:" + freePort(tb)
	cfg := filepath.Join(g.dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(c.haproxyConfig()), 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(g.haproxy.kill)
	hout, err := os.Create(filepath.Join(g.dir, "haproxy.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer hout.Close()
	cmd := exec.Command(bins.haproxy, "-db", "-f", cfg)
	cmd.Stdout, cmd.Stderr = hout, hout
	if _, err := g.haproxy.start(cmd); err != nil {
		tb.Fatalf("start haproxy: %v", err)
	}
	if w := c.Writer(tb); w != 0 {
		tb.Fatalf("HAProxy sends new connections to n%d, want n0", w)
	}
	tb.Logf("Galera cluster started in %v: data directory made in %v, node 0 bootstrapped and stopped in %v, the three Synced in %v, HAProxy in %v",
		time.Since(began).Round(time.Millisecond), installed.Sub(began).Round(time.Millisecond), booted.Sub(installed).Round(time.Millisecond),
		joined.Sub(booted).Round(time.Millisecond), time.Since(joined).Round(time.Millisecond))
	return c
}

// galeraBinaries are the programs and the library a cluster needs.
type galeraBinaries struct{ mariadbd, install, haproxy, provider string }

func galeraBins() (galeraBinaries, error) {
	var b galeraBinaries
	var errs []error
	var err error
	b.mariadbd, err = whichBin(MariaDBServerEnv, "mariadbd", "mysqld")
	errs = append(errs, err)
	b.install, err = whichBin(MariaDBInstallEnv, "mariadb-install-db", "mysql_install_db")
	errs = append(errs, err)
	b.haproxy, err = whichBin(HAProxyEnv, "haproxy")
	errs = append(errs, err)
	b.provider = os.Getenv(GaleraProviderEnv)
	for _, p := range galeraProviders {
		if b.provider != "" {
			break
		}
		if _, err := os.Stat(p); err == nil {
			b.provider = p
		}
	}
	if b.provider == "" {
		errs = append(errs, fmt.Errorf("Galera's libgalera_smm.so not found (install galera-4 or set %s)", GaleraProviderEnv))
	}
	return b, errors.Join(errs...)
}

// galeraPrimary is a Primary component of the three nodes, as each node
// saves it (gvwstate.dat) while it is a member: a node that starts with
// it takes the node id it names, and waits for the other members to form
// the component again (pc.recovery), as a whole cluster does after a
// power failure.
type galeraPrimary struct {
	view    string
	members [galeraNodes]string
}

func galeraView() galeraPrimary {
	var p galeraPrimary
	p.view = newUUID()
	for i := range p.members {
		p.members[i] = newUUID()
	}
	return p
}

// state is node i's gvwstate.dat.
func (p galeraPrimary) state(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "my_uuid: %s\n#vwbeg\nview_id: 3 %s 1\nbootstrap: 0\n", p.members[i], p.members[0])
	for _, m := range p.members {
		fmt.Fprintf(&b, "member: %s 0\n", m)
	}
	b.WriteString("#vwend\n")
	return b.String()
}

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// nodeUser returns the user the nodes run as — mysql when the test runs as
// root, else the test's own — and, for root, the flag that says so.
func nodeUser(tb testing.TB) (uid, gid int, flag []string) {
	tb.Helper()
	if os.Getuid() != 0 {
		return os.Getuid(), os.Getgid(), nil
	}
	u, err := user.Lookup("mysql")
	if err != nil {
		tb.Fatalf("Galera nodes run as the mysql user when the tests run as root: %v", err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, []string{"--user=mysql"}
}

// traversableDir is dataDir, made traversable by a node that runs as
// another user: the directory and every one above it, up to the temporary
// directories' root, that is closed to others is opened to them. A test's
// temporary directory is an open one (…/001) inside a closed one
// (/tmp/TestX…, 0700), so the walk does not stop at the first open one.
func traversableDir(tb testing.TB, opts []Option) string {
	tb.Helper()
	dir := dataDir(tb, opts)
	for d := dir; ; d = filepath.Dir(d) {
		if d == filepath.Dir(d) || d == filepath.Clean(os.TempDir()) || d == "/dev/shm" {
			break
		}
		st, err := os.Stat(d)
		if err != nil {
			tb.Fatal(err)
		}
		if st.Mode().Perm()&0o001 != 0 {
			continue
		}
		if err := os.Chmod(d, st.Mode().Perm()|0o055); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

// copyTree copies the directory src to dst, which must not exist.
func copyTree(src, dst string) error {
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// chownTree gives dir and everything in it to uid:gid.
func chownTree(dir string, uid, gid int) error {
	if uid == os.Getuid() && gid == os.Getgid() {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// openAt returns a small pool on database db at addr, as root, closed
// when the test ends. Its connections give up within seconds on a server
// that does not answer, so that a frozen node does not hold up whoever
// asks.
func openAt(tb testing.TB, addr, db string) *sql.DB {
	tb.Helper()
	cfg := nodeConfig(addr, db)
	cfg.Timeout = 2 * time.Second
	cfg.ReadTimeout = 5 * time.Second
	cfg.WriteTimeout = 5 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	pool := sql.OpenDB(conn)
	pool.SetMaxOpenConns(2)
	tb.Cleanup(func() { pool.Close() })
	return pool
}

func nodeConfig(addr, db string) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = addr
	cfg.DBName = db
	cfg.ParseTime = true
	return cfg
}

// haproxyConfig is HAProxy's configuration: node 0 the writer, the others
// backups (the first that is up takes the traffic), each marked down by a
// failed TCP check or by its agent's word; a node marked down has its
// sessions cut, and so do the backups when the writer comes back, so that
// there are never two writers.
func (c *GaleraCluster) haproxyConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
  maxconn 2000
  nbthread 1
defaults
  mode tcp
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  timeout check 2s
listen mysql
  bind %s
  default-server check inter 500ms fall 2 rise 2 agent-check agent-inter 500ms on-marked-down shutdown-sessions on-marked-up shutdown-backup-sessions
`, c.Addr)
	for i, n := range c.nodes {
		_, agentPort, _ := net.SplitHostPort(n.agent)
		backup := ""
		if i > 0 {
			backup = " backup"
		}
		fmt.Fprintf(&b, "  server %s 127.0.0.1:%s agent-port %s%s\n", n.name, n.port, agentPort, backup)
	}
	fmt.Fprintf(&b, `listen stats
  bind %s
  mode http
  stats enable
  stats uri /
`, c.StatsAddr)
	return b.String()
}

// For returns the cluster for tb, which its faults and waits report to,
// and brings the cluster back as it started when tb ends: every node
// running, healed, not desynced and Synced, and HAProxy sending to node 0.
// It is how the tests of a package share one cluster (see Shared): each
// test that uses it calls For, and the tests that fault it do not run in
// parallel with the others that use it.
func (c *GaleraCluster) For(tb testing.TB) *GaleraCluster {
	tb.Helper()
	v := &GaleraCluster{Addr: c.Addr, StatsAddr: c.StatsAddr, galera: c.galera, tb: tb}
	tb.Cleanup(v.restore)
	return v
}

// restore brings the cluster back as StartGalera left it. The faults are
// undone before any wait: a node still desynced is never Synced.
func (c *GaleraCluster) restore() {
	c.tb.Helper()
	for i, n := range c.nodes {
		if n.pid() == 0 {
			c.Start(i)
			continue
		}
		n.signal(syscall.SIGCONT)
		c.exec(i, "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
		c.exec(i, "SET GLOBAL wsrep_desync = OFF")
	}
	for i := range c.nodes {
		c.WaitSynced(c.tb, i)
	}
	c.waitWriter(c.tb, 0)
}

// DSN returns a DSN of root for database db ("" for none) through HAProxy,
// with parseTime, as MySQLEnv's.
func (c *GaleraCluster) DSN(db string) string { return nodeConfig(c.Addr, db).FormatDSN() }

// NodeDSN returns node i's own DSN for database db, past HAProxy.
func (c *GaleraCluster) NodeDSN(i int, db string) string {
	return nodeConfig("127.0.0.1:"+c.nodes[i].port, db).FormatDSN()
}

// NodeAddr returns node i's address.
func (c *GaleraCluster) NodeAddr(i int) string { return "127.0.0.1:" + c.nodes[i].port }

// AgentAddr returns the address of node i's agent, HAProxy's agent-port.
func (c *GaleraCluster) AgentAddr(i int) string { return c.nodes[i].agent }

// Database creates a database with the schema of migrations/ through
// HAProxy and returns its DSN there. It is not dropped: it goes with the
// cluster.
func (c *GaleraCluster) Database(tb testing.TB) string {
	tb.Helper()
	return createDatabase(tb, c.DSN)
}

// Pid is node i's process id, 0 while it is stopped.
func (c *GaleraCluster) Pid(i int) int { return c.nodes[i].pid() }

// Kill stops node i at once (SIGKILL), as a crash does. Its data directory
// stays: Start brings it back.
func (c *GaleraCluster) Kill(i int) { c.nodes[i].kill() }

// Pause freezes node i (SIGSTOP): its connections stay open and go
// unanswered, and the others evict it once it has been silent for their
// suspect timeout. Resume undoes it.
func (c *GaleraCluster) Pause(i int) { c.nodes[i].signal(syscall.SIGSTOP) }

// Resume lets a paused node run again.
func (c *GaleraCluster) Resume(i int) { c.nodes[i].signal(syscall.SIGCONT) }

// Start starts node i again on its data after Kill, and waits until it has
// rejoined the cluster and is Synced: it gets what it missed by IST from
// another node's write-set cache. As mysqld_safe and the service units do,
// it first asks the node where its data stop (--wsrep-recover: a node
// that crashed has no position in grastate.dat), and starts it from
// there; started without it, the node would ask for its whole data
// again (SST).
func (c *GaleraCluster) Start(i int) {
	c.tb.Helper()
	c.start(i, "--wsrep-start-position="+c.recover(i), "--wsrep-sst-donor="+c.spareDonor(i))
	c.WaitSynced(c.tb, i)
}

// spareDonor is the wsrep_sst_donor for node i's rejoin: the node that is
// neither i nor the one HAProxy sends to, then any (the trailing comma).
// A donor is Donor/Desynced while it sends, even the write-sets of an
// IST, and its agent says down: were it the writer, HAProxy would move
// the writes away from it for the transfer, and back again after it, two
// failovers for one rejoin.
func (c *GaleraCluster) spareDonor(i int) string {
	w, err := c.reached()
	if err != nil {
		w = -1
	}
	for j, n := range c.nodes {
		if j != i && j != w {
			return n.name + ","
		}
	}
	return ""
}

// recover runs node i with --wsrep-recover, which recovers InnoDB, logs
// the last position it committed and exits, and returns that position.
func (c *GaleraCluster) recover(i int) string {
	c.tb.Helper()
	n := c.nodes[i]
	log := filepath.Join(n.dir, "recover.log")
	os.Remove(log)
	cmd := exec.Command(c.bin, append(append([]string(nil), n.args...), "--wsrep-recover", "--log-error="+log)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.tb.Fatalf("Galera node %s, --wsrep-recover: %v\n%s\n%s", n.name, err, out, tail(log))
	}
	b, err := os.ReadFile(log)
	if err != nil {
		c.tb.Fatal(err)
	}
	const mark = "WSREP: Recovered position: "
	at := strings.LastIndex(string(b), mark)
	if at < 0 {
		c.tb.Fatalf("Galera node %s, --wsrep-recover logged no position:\n%s", n.name, tail(log))
	}
	pos, _, _ := strings.Cut(string(b[at+len(mark):]), "\n")
	return strings.TrimSpace(pos)
}

func (c *GaleraCluster) start(i int, extra ...string) {
	c.tb.Helper()
	n := c.nodes[i]
	if _, err := n.start(exec.Command(c.bin, append(append([]string(nil), n.args...), extra...)...)); err != nil {
		c.tb.Fatalf("start Galera node %s: %v", n.name, err)
	}
}

func (g *galera) killAll() {
	var wg sync.WaitGroup
	for _, n := range g.nodes {
		wg.Go(n.kill)
	}
	wg.Go(g.haproxy.kill)
	wg.Wait()
}

// Isolate cuts node i off from the others without stopping it
// (gmcast.isolate=1): it becomes a non-Primary component of its own,
// which answers statements with ERROR 1047, and the others go on as the
// Primary component without it. It returns once node i says it is
// non-Primary.
func (c *GaleraCluster) Isolate(i int) {
	c.tb.Helper()
	c.exec(i, "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'")
	c.waitStatus(c.tb, i, "non-Primary", func(st map[string]string) bool {
		return st["wsrep_cluster_status"] == "non-Primary"
	})
}

// Heal undoes Isolate (gmcast.isolate=0) and waits until node i is Synced
// in a cluster of every running node. On a node that is not isolated it
// only waits.
func (c *GaleraCluster) Heal(i int) {
	c.tb.Helper()
	c.exec(i, "SET GLOBAL wsrep_sst_donor = '"+c.spareDonor(i)+"'")
	c.exec(i, "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
	c.WaitSynced(c.tb, i)
}

// Desync sets wsrep_desync on node i, and waits until its local state says
// so: 2 (Donor/Desynced) when on, 4 (Synced) when off. A desynced node
// still applies what the cluster commits, but no longer holds the others
// back, and its agent says it is down.
func (c *GaleraCluster) Desync(i int, on bool) {
	c.tb.Helper()
	c.exec(i, "SET GLOBAL wsrep_desync = "+map[bool]string{true: "ON", false: "OFF"}[on])
	want := map[bool]string{true: "2", false: dbagent.Synced}[on]
	c.waitStatus(c.tb, i, "local state "+want, func(st map[string]string) bool {
		return st["wsrep_local_state"] == want
	})
}

func (c *GaleraCluster) exec(i int, stmt string) {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.nodes[i].admin.ExecContext(ctx, stmt); err != nil {
		c.tb.Fatalf("%s on Galera node n%d: %v", stmt, i, err)
	}
}

// WaitSynced waits until node i is Synced, in the Primary component,
// ready, and in a cluster of as many nodes as are running.
func (c *GaleraCluster) WaitSynced(tb testing.TB, i int) {
	tb.Helper()
	c.waitStatus(tb, i, "Synced", func(st map[string]string) bool {
		running := 0
		for _, n := range c.nodes {
			if n.pid() != 0 {
				running++
			}
		}
		return st["wsrep_local_state"] == dbagent.Synced && st["wsrep_cluster_status"] == "Primary" &&
			st["wsrep_ready"] == "ON" && st["wsrep_cluster_size"] == strconv.Itoa(running)
	})
}

// galeraWait bounds a wait for a node's state: a join by IST, or an
// eviction, takes seconds, and a loaded machine makes them longer.
const galeraWait = 90 * time.Second

// waitStatus waits until node i's wsrep status satisfies ok, failing tb if
// the node exits first or the wait runs out.
func (c *GaleraCluster) waitStatus(tb testing.TB, i int, what string, ok func(map[string]string) bool) {
	tb.Helper()
	n := c.nodes[i]
	deadline := time.Now().Add(galeraWait)
	var last map[string]string
	var lastErr error
	for {
		if n.pid() == 0 {
			tb.Fatalf("Galera node %s is not running (waiting until it is %s); its log:\n%s", n.name, what, tail(filepath.Join(n.dir, "mysqld.log")))
		}
		last, lastErr = n.status()
		if lastErr == nil && ok(last) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("Galera node %s is not %s after %v: %v %v; its log:\n%s", n.name, what, galeraWait, last, lastErr, tail(filepath.Join(n.dir, "mysqld.log")))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// status returns the node's wsrep status variables, lower-cased.
func (n *galeraNode) status() (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := n.admin.QueryContext(ctx, "SHOW GLOBAL STATUS LIKE 'wsrep%'")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	st := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		st[strings.ToLower(k)] = v
	}
	return st, rows.Err()
}

// Writer returns the index of the node that a new connection through
// HAProxy reaches now, asking its @@wsrep_node_name, waiting up to
// galeraWait until a connection goes through.
func (c *GaleraCluster) Writer(tb testing.TB) int {
	tb.Helper()
	return c.waitWriter(tb, -1)
}

// waitWriter waits until new connections through HAProxy reach node want
// (any node: -1), and returns the node's index.
func (c *GaleraCluster) waitWriter(tb testing.TB, want int) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), galeraWait)
	defer cancel()
	what := "a connection through HAProxy reaches a Galera node"
	if want >= 0 {
		what = fmt.Sprintf("HAProxy sends new connections to n%d", want)
	}
	w := -1
	waitUntil(ctx, tb, what, func() bool {
		if c.haproxy.pid() == 0 {
			tb.Fatalf("HAProxy is not running; its log:\n%s", tail(filepath.Join(c.dir, "haproxy.log")))
		}
		var err error
		w, err = c.reached()
		return err == nil && (want < 0 || w == want)
	})
	return w
}

// reached opens a connection through HAProxy and returns the index of the
// node it reached.
func (c *GaleraCluster) reached() (int, error) {
	cfg := nodeConfig(c.Addr, "")
	cfg.Timeout = 2 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return -1, err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var name string
	if err := db.QueryRowContext(ctx, "SELECT @@wsrep_node_name").Scan(&name); err != nil {
		return -1, err
	}
	for i, n := range c.nodes {
		if n.name == name {
			return i, nil
		}
	}
	return -1, fmt.Errorf("a node named %q", name)
}
