package lock_test

import (
	"database/sql"
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"

	"shop/internal/testenv"
)

// What the tests share: the etcd cluster of the tests that neither kill,
// pause nor restart a member, and a database on the test MariaDB (many
// creating theirs at once wait seconds for each other's DDL). Each test
// keeps to a prefix, keys and tables of its own. (The ZooKeeper tests
// share an ensemble too: see TestZooKeeper.)
var (
	sharedEtcd  testenv.Shared[*testenv.EtcdCluster]
	sharedMySQL testenv.Shared[*testenv.DB]
)

// mysqlDB is the shared database, with the schema of migrations/.
func mysqlDB(t *testing.T) *testenv.DB {
	t.Helper()
	return sharedMySQL.Get(t, testenv.MySQL)
}

func etcdCluster(t *testing.T) *testenv.EtcdCluster {
	t.Helper()
	return sharedEtcd.Get(t, func(tb testing.TB) *testenv.EtcdCluster { return testenv.StartEtcdCluster(tb) })
}

// parallelTests is how many tests run at once unless -parallel says
// otherwise. The tests here spend their time waiting — for leases to run
// out, for servers to start and answer — far more than computing, and
// -parallel's default, GOMAXPROCS (two on the CI machine), would keep
// all but two of them idle.
const parallelTests = 8

// TestMain runs the tests, with parallelTests at once unless -parallel was
// given, and ends the servers they shared.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", strconv.Itoa(max(parallelTests, runtime.GOMAXPROCS(0))))
	}
	code := m.Run()
	sharedEtcd.Close()
	sharedMySQL.Close()
	os.Exit(code)
}

// fencedRow is a row of a table of the test's own in the shared database,
// written as the order path writes a product's row: each write carries
// its writer's fencing token, and MySQL refuses it unless the row's fence
// is below the token.
type fencedRow struct {
	t     *testing.T
	db    *sql.DB
	table string
}

func newFencedRow(t *testing.T) fencedRow {
	t.Helper()
	r := fencedRow{t: t, db: mysqlPool(t, mysqlDB(t).DSN), table: "fenced_" + testenv.Name()}
	if _, err := r.db.Exec("CREATE TABLE " + r.table + " (id INT PRIMARY KEY, v VARCHAR(32) NOT NULL, fence BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.db.Exec("INSERT INTO " + r.table + " VALUES (1, 'initial', 0)"); err != nil {
		t.Fatal(err)
	}
	return r
}

// write sets the row to v under token, unless its fence is at or above
// token, and returns how many rows it changed.
func (r fencedRow) write(v string, token int64) int64 {
	r.t.Helper()
	res, err := r.db.Exec("UPDATE "+r.table+" SET v = ?, fence = ? WHERE id = 1 AND fence < ?", v, token, token)
	if err != nil {
		r.t.Fatalf("fenced write of %q: %v", v, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

// holds fails the test unless the row holds v, written under token.
func (r fencedRow) holds(v string, token int64) {
	r.t.Helper()
	var (
		got   string
		fence int64
	)
	if err := r.db.QueryRow("SELECT v, fence FROM "+r.table+" WHERE id = 1").Scan(&got, &fence); err != nil {
		r.t.Fatal(err)
	}
	if got != v || fence != token {
		r.t.Errorf("row = (%q, %d), want (%q, %d)", got, fence, v, token)
	}
}
