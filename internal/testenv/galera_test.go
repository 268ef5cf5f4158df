package testenv

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The Galera tests share one cluster, as the tests of a package that uses
// one do: each runs in turn on it, through For, which brings the cluster
// back as it started (every node Synced, HAProxy sending to node 0) when
// the test ends, however it ends.
func TestGalera(t *testing.T) {
	c := StartGalera(t, OnTmpfs())
	db := galeraDatabase(t, c)
	for _, test := range []struct {
		name string
		run  func(*testing.T, *GaleraCluster, string)
	}{
		{"Started", testGaleraStarted},
		{"KillWriter", testGaleraKillWriter},
		{"DesyncedNodeGetsNoTraffic", testGaleraDesynced},
		{"IsolatedWriter", testGaleraIsolated},
	} {
		t.Run(test.name, func(t *testing.T) { test.run(t, c.For(t), db) })
	}
}

// galeraDatabase creates a database through HAProxy with a table whose
// rows say which node committed them.
func galeraDatabase(t *testing.T, c *GaleraCluster) string {
	t.Helper()
	name := "galera_" + Name()
	db := openAt(t, c.Addr, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, stmt := range []string{"CREATE DATABASE " + name,
		"CREATE TABLE " + name + ".commits (id BIGINT AUTO_INCREMENT PRIMARY KEY, node VARCHAR(8) NOT NULL)"} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

// commit inserts a row on a new connection through HAProxy and returns its
// id and the node that committed it (the node's own name, written by the
// statement itself).
func commit(c *GaleraCluster, db string) (id int64, node string, err error) {
	cfg, err := mysql.ParseDSN(c.DSN(db))
	if err != nil {
		return 0, "", err
	}
	cfg.Timeout = 2 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return 0, "", err
	}
	pool := sql.OpenDB(conn)
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := pool.ExecContext(ctx, "INSERT INTO commits (node) VALUES (@@wsrep_node_name)")
	if err != nil {
		return 0, "", err
	}
	if id, err = res.LastInsertId(); err != nil {
		return 0, "", err
	}
	err = pool.QueryRowContext(ctx, "SELECT node FROM commits WHERE id = ?", id).Scan(&node)
	return id, node, err
}

// commitSomewhere commits a row through HAProxy, trying again on new
// connections until one commits, for at most galeraWait: while a failover
// is in progress HAProxy refuses or drops them, and a node that is no
// longer in the Primary component refuses statements (1047) or gives up
// on them (1180 from a write-set it could not replicate, 1213 from one
// the cluster aborted). Any other error fails the test at once.
func commitSomewhere(t *testing.T, c *GaleraCluster, db string) (int64, string) {
	t.Helper()
	deadline := time.Now().Add(galeraWait)
	last := ""
	for {
		id, node, err := commit(c, db)
		if err == nil {
			return id, node
		}
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number != 1047 && me.Number != 1180 && me.Number != 1213 {
			t.Fatalf("commit through HAProxy: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no row committed through HAProxy within %v: %v", galeraWait, err)
		}
		if err.Error() != last {
			t.Logf("commit through HAProxy: %v", err)
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hold opens a connection through HAProxy and checks that it reached node
// want.
func hold(t *testing.T, c *GaleraCluster, want int) *sql.Conn {
	t.Helper()
	pool := openAt(t, c.Addr, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pool.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if got := nodeOf(ctx, conn); got != fmt.Sprintf("n%d", want) {
		t.Fatalf("a connection through HAProxy reached %q, want n%d", got, want)
	}
	return conn
}

func nodeOf(ctx context.Context, conn *sql.Conn) string {
	var name string
	if err := conn.QueryRowContext(ctx, "SELECT @@wsrep_node_name").Scan(&name); err != nil {
		return "error: " + err.Error()
	}
	return name
}

// waitCut waits until HAProxy has closed the connection: a statement on it
// fails. HAProxy closes it as it changes the server's state, so the wait
// is short; a connection still answering after it is a failure.
func waitCut(t *testing.T, conn *sql.Conn, why string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if err := conn.PingContext(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatalf("%s: the connection still answered after 10 s", why)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agentSays asks node i's agent as HAProxy does.
func agentSays(t *testing.T, c *GaleraCluster, i int) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", c.AgentAddr(i), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("node %d's agent: %v (got %q)", i, err, line)
	}
	return line
}

// The cluster starts with three Synced nodes in one Primary component,
// HAProxy sends to node 0, and Galera spreads AUTO_INCREMENT over the
// nodes: an increment of 3, each node with an offset of its own.
func testGaleraStarted(t *testing.T, c *GaleraCluster, db string) {
	offsets := map[int64]bool{}
	for i, n := range c.nodes {
		st, err := n.status()
		if err != nil {
			t.Fatal(err)
		}
		if st["wsrep_local_state_comment"] != "Synced" || st["wsrep_cluster_size"] != "3" || st["wsrep_cluster_status"] != "Primary" {
			t.Errorf("n%d: %s, cluster size %s, %s", i, st["wsrep_local_state_comment"], st["wsrep_cluster_size"], st["wsrep_cluster_status"])
		}
		var inc, off int64
		if err := n.admin.QueryRow("SELECT @@auto_increment_increment, @@auto_increment_offset").Scan(&inc, &off); err != nil {
			t.Fatal(err)
		}
		if inc != 3 {
			t.Errorf("n%d: auto_increment_increment %d, want 3", i, inc)
		}
		offsets[off] = true
		if got := agentSays(t, c, i); got != "up ready\n" {
			t.Errorf("n%d's agent: %q", i, got)
		}
	}
	if len(offsets) != 3 {
		t.Errorf("auto_increment_offset of the three nodes: %v, want three different", offsets)
	}
	if w := c.Writer(t); w != 0 {
		t.Errorf("HAProxy sends to n%d, want n0", w)
	}
	first, node := commitSomewhere(t, c, db)
	second, _ := commitSomewhere(t, c, db)
	if node != "n0" || second-first != 3 {
		t.Errorf("two rows through HAProxy: ids %d, %d on %s; want consecutive ids 3 apart, on n0", first, second, node)
	}
	// Replicated: node 2 has the row, read on its own.
	var got string
	if err := openAt(t, c.NodeAddr(2), db).QueryRow("SELECT node FROM commits WHERE id = ?", second).Scan(&got); err != nil {
		t.Errorf("row %d on n2: %v", second, err)
	}
}

// The writer is killed: new connections through HAProxy reach another
// node and commit there. Started again, the node rejoins by IST with the
// rows it missed, HAProxy sends to it again, and cuts the sessions still
// on the backup, so that there are never two writers.
func testGaleraKillWriter(t *testing.T, c *GaleraCluster, db string) {
	w := c.Writer(t)
	killed := time.Now()
	c.Kill(w)
	id, node := commitSomewhere(t, c, db)
	t.Logf("first commit %v after the kill, on %s", time.Since(killed).Round(time.Millisecond), node)
	if node == fmt.Sprintf("n%d", w) {
		t.Fatalf("a row committed on n%d, which was killed", w)
	}
	backup := c.Writer(t)
	onBackup := hold(t, c, backup)

	started := time.Now()
	c.Start(w)
	t.Logf("n%d Synced %v after its start", w, time.Since(started).Round(time.Millisecond))
	// What the node logged since this start: the write-sets it missed
	// came by IST, and no data directory by SST.
	log, err := os.ReadFile(filepath.Join(c.nodes[w].dir, "mysqld.log"))
	if err != nil {
		t.Fatal(err)
	}
	restart := string(log[strings.LastIndex(string(log), "Starting MariaDB"):])
	if !strings.Contains(restart, "IST received") || strings.Contains(restart, "SST completed on joiner") {
		t.Errorf("n%d did not rejoin by IST alone; its log since the start:\n%s", w, restart)
	}
	// Fed by the node that is not the writer: a donor is desynced while it
	// sends, and HAProxy would move the writes away from it.
	if donor := regexp.MustCompile(`Selected \S+ \((n\d)\)\S* as donor`).FindStringSubmatch(restart); donor == nil || donor[1] == fmt.Sprintf("n%d", backup) {
		t.Errorf("n%d's donor: %v, want one that is not the writer, n%d", w, donor, backup)
	}
	var got string
	if err := c.nodes[w].admin.QueryRow("SELECT node FROM "+db+".commits WHERE id = ?", id).Scan(&got); err != nil || got != node {
		t.Errorf("row %d, committed while n%d was down, on n%d: %q, %v", id, w, w, got, err)
	}
	c.waitWriter(t, w)
	waitCut(t, onBackup, "the session on the backup, once the writer was back")
	if _, node := commitSomewhere(t, c, db); node != fmt.Sprintf("n%d", w) {
		t.Errorf("after the failback a row committed on %s, want n%d", node, w)
	}
}

// A desynced node is up but behind (Donor/Desynced): its agent says down,
// HAProxy sends new connections to a backup and cuts the open ones, and
// when the node is Synced again HAProxy sends to it again.
func testGaleraDesynced(t *testing.T, c *GaleraCluster, db string) {
	onWriter := hold(t, c, 0)
	c.Desync(0, true)
	if got := agentSays(t, c, 0); got != "down #local state 2 (Donor/Desynced)\n" {
		t.Errorf("the desynced node's agent: %q", got)
	}
	waitCut(t, onWriter, "the session on the desynced node")
	c.waitWriter(t, 1)
	if _, node := commitSomewhere(t, c, db); node != "n1" {
		t.Errorf("with n0 desynced a row committed on %s, want n1", node)
	}
	c.Desync(0, false)
	c.waitWriter(t, 0)
}

// An isolated writer (cut off from the others, not stopped) is a
// non-Primary component of its own: it refuses statements with ERROR
// 1047, its agent says down, and HAProxy sends to a backup, where rows
// commit once the others have evicted it. Healed, it is Synced again.
func testGaleraIsolated(t *testing.T, c *GaleraCluster, db string) {
	isolated := time.Now()
	c.Isolate(0)
	_, err := c.nodes[0].admin.Exec("INSERT INTO " + db + ".commits (node) VALUES ('n0')")
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1047 {
		t.Errorf("a statement on the isolated node: %v, want ERROR 1047", err)
	}
	if got := agentSays(t, c, 0); got != "down #cluster status non-Primary\n" {
		t.Errorf("the isolated node's agent: %q", got)
	}
	_, node := commitSomewhere(t, c, db)
	t.Logf("first commit %v after the isolation, on %s", time.Since(isolated).Round(time.Millisecond), node)
	if node == "n0" {
		t.Errorf("a row committed on the isolated node")
	}
	c.Heal(0)
	c.waitWriter(t, 0)
}

// A node that runs as another user reaches its data through every directory
// above it, and a test's temporary directory (…/001) sits in a closed one.
func TestTraversableDirOpensEveryClosedAncestor(t *testing.T) {
	dir := traversableDir(t, nil)
	for d := dir; d != filepath.Clean(os.TempDir()) && d != filepath.Dir(d); d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			t.Errorf("%s is %v: others cannot traverse it to reach %s", d, st.Mode().Perm(), dir)
		}
	}
}
