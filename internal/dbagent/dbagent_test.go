package dbagent_test

import (
	"bufio"
	"context"
	"database/sql"
	"maps"
	"net"
	"strings"
	"testing"

	"shop/internal/dbagent"
	"shop/internal/mysqldb"
	"shop/internal/testenv"
)

// ask connects to an agent as HAProxy does and returns its one line.
func ask(t *testing.T, addr string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the agent's answer: %v (got %q)", err, line)
	}
	return line
}

// serve runs an agent for db on a port of its own until the test ends.
func serve(t *testing.T, db *sql.DB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dbagent.Serve(ctx, ln, db) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := mysqldb.OpenSQL(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// A server that is not a Galera node, or does not answer, is down: HAProxy
// must not send writes to what the agent cannot vouch for.
func TestAgentSaysDownForWhatIsNotASyncedNode(t *testing.T) {
	t.Parallel()
	if got := ask(t, serve(t, open(t, testenv.MySQL(t).DSN))); got != "down #not a Galera node (no wsrep_local_state)\n" {
		t.Errorf("a MariaDB without wsrep: %q", got)
	}
	// A port nothing listens on.
	dead := testenv.FreeAddr(t)
	if got := ask(t, serve(t, open(t, "root@tcp("+dead+")/"))); !strings.HasPrefix(got, "down #no answer: ") {
		t.Errorf("a node that does not answer: %q", got)
	}
}

// Each state a node reports maps to up only when it is Synced, in the
// Primary component and ready.
func TestHealthLines(t *testing.T) {
	t.Parallel()
	synced := map[string]string{"wsrep_local_state": "4", "wsrep_local_state_comment": "Synced",
		"wsrep_cluster_status": "Primary", "wsrep_ready": "ON"}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(synced)
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		name   string
		status map[string]string
		want   string
	}{
		{"synced", synced, "up ready\n"},
		{"donor", with("wsrep_local_state", "2", "wsrep_local_state_comment", "Donor/Desynced"), "down #local state 2 (Donor/Desynced)\n"},
		{"joiner", with("wsrep_local_state", "1", "wsrep_local_state_comment", "Joining"), "down #local state 1 (Joining)\n"},
		{"non-Primary", with("wsrep_cluster_status", "non-Primary"), "down #cluster status non-Primary\n"},
		{"not ready", with("wsrep_ready", "OFF"), "down #not ready (wsrep_ready OFF)\n"},
	} {
		if got := dbagent.Judge(c.status).Line(); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// On a real Galera node the agent answers from the node's own state: up
// while it is Synced, down while an operator has desynced it (it still
// applies the cluster's writes, but late), and down while it is cut off
// from the others, in a non-Primary component of its own; up again when
// each is undone.
func TestAgentOnAGaleraNode(t *testing.T) {
	t.Parallel()
	c := testenv.StartGalera(t, testenv.OnTmpfs())
	agent := serve(t, open(t, c.NodeDSN(0, "")))
	says := func(when, want string) {
		t.Helper()
		if got := ask(t, agent); got != want {
			t.Errorf("%s: the agent says %q, want %q", when, got, want)
		}
	}
	says("Synced", "up ready\n")
	c.Desync(0, true)
	says("desynced", "down #local state 2 (Donor/Desynced)\n")
	c.Desync(0, false)
	says("synced again", "up ready\n")
	c.Isolate(0)
	says("isolated", "down #cluster status non-Primary\n")
	c.Heal(0)
	says("healed", "up ready\n")
}
