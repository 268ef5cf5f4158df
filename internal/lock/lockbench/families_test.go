package lockbench_test

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// families are the seeds' other lock families (SHOP_LOCK_MODE mysql, etcd,
// zookeeper), each on servers of its own started for the run, measured
// beside our Redis lock with the same TTL, wait and holders:
//   - the MySQL lock table on the test's MariaDB (one server, as the Redis
//     is one), its waiters polling with the same backoff as ours;
//   - etcd, a cluster of three members on loopback, its waiters woken by
//     etcd's watch;
//   - ZooKeeper, an ensemble of three servers on loopback, its waiters
//     woken by a watch on their predecessor.
//
// etcd and ZooKeeper commit every write on a majority of three, so a figure
// of theirs includes the replication that Redis and the MariaDB here do not
// do (and would pay for in their own replicas, see docs/lock-families.md).
//
// etcd and ZooKeeper sync every write to disk on each member before they
// answer it; the MariaDB here does not (innodb_flush_log_at_trx_commit=2,
// as scripts/test.sh starts it), nor does the Redis (no persistence). The
// rows "data on tmpfs" run the same clusters with their data in memory,
// where a sync costs nothing: the difference is what the disk costs, the
// rest what agreement among three costs.
var families = []contender{
	{name: "mysql lock table", family: mysqlFamily},
	{name: "etcd, 3 members", family: etcdFamily()},
	{name: "etcd, 3 members, data on tmpfs", family: etcdFamily(testenv.OnTmpfs())},
	{name: "zookeeper, 3 servers", family: zookeeperFamily()},
	{name: "zookeeper, 3 servers, data on tmpfs", family: zookeeperFamily(testenv.OnTmpfs())},
}

// leaseLocker drives a lock of shop/internal/lock, ours in Redis or one of
// the families: ErrNotObtained is a timeout.
type leaseLocker struct {
	l interface {
		Obtain(ctx context.Context, key string) (*lock.Lease, error)
	}
}

func (o leaseLocker) obtain(ctx context.Context, key string) (func(context.Context) error, error) {
	lease, err := o.l.Obtain(ctx, key)
	switch {
	case errors.Is(err, lock.ErrNotObtained):
		return nil, fmt.Errorf("%w: %w", errTimeout, err)
	case err != nil:
		return nil, err
	}
	return lease.Release, nil
}

// counts is a meter's tally of requests by name.
type counts struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *counts) add(name string) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[name]++
	c.mu.Unlock()
}

// since returns the tally less base, and the sum of it.
func (c *counts) since(base map[string]int64) (map[string]int64, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int64{}
	var sum int64
	for name, n := range c.n {
		if d := n - base[name]; d > 0 {
			out[name] = d
			sum += d
		}
	}
	return out, sum
}

func (c *counts) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.n))
	for name, n := range c.n {
		out[name] = n
	}
	return out
}

// clientMeter is the meter of a family whose requests are counted on the
// lock's own client as they are sent: each is a round trip, and what the
// server runs.
// riding names the requests that a lock sends together with another, in
// the same round trip, which are not counted as round trips of their own.
type clientMeter struct {
	c      *counts
	riding string
	base   map[string]int64
}

func (m *clientMeter) start() { m.base = m.c.snapshot() }

func (m *clientMeter) read() (int64, map[string]int64) {
	cmds, sum := m.c.since(m.base)
	return sum - cmds[m.riding], cmds
}

// mysqlFamily: the lock table in a database of its own on the test's
// MariaDB, on a pool of its own. Its parameters are interpolated by the
// driver, as the service's lock pool does, so that a statement is one
// round trip: every statement the pool sends is one of MariaDB's Questions.
func mysqlFamily(e *bench) (func(prefix string) locker, meter) {
	db := testenv.MySQL(e.b)
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		e.b.Fatalf("DSN: %v", err)
	}
	cfg.InterpolateParams = true
	pool, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		e.b.Fatalf("mysql: %v", err)
	}
	pool.SetMaxOpenConns(poolSize)
	pool.SetMaxIdleConns(poolSize)
	e.b.Cleanup(func() { pool.Close() })
	admin, err := sql.Open("mysql", db.DSN)
	if err != nil {
		e.b.Fatalf("mysql: %v", err)
	}
	admin.SetMaxOpenConns(1)
	e.b.Cleanup(func() { admin.Close() })
	var version string
	if err := admin.QueryRowContext(e.ctx, "SELECT VERSION()").Scan(&version); err != nil {
		e.b.Fatalf("mysql: %v", err)
	}
	fmt.Printf("mysql lock table: MariaDB %s (private, loopback), one server\n", version)
	return func(prefix string) locker {
		return leaseLocker{lock.NewMySQL(pool, lock.MySQLOptions{TTL: ttl, Wait: wait, MinBackoff: minBackoff, MaxBackoff: maxBackoff})}
	}, &mysqlMeter{e: e, admin: admin}
}

// mysqlMeter reads MariaDB's statement counters: the round trips are the
// Questions, less the meter's own SHOW; the commands, the Com_ counters of
// the statements a lock sends.
type mysqlMeter struct {
	e     *bench
	admin *sql.DB
	base  map[string]int64
}

var mysqlCounters = []string{"Questions", "Com_insert", "Com_update", "Com_select", "Com_delete"}

func (m *mysqlMeter) status() map[string]int64 {
	rows, err := m.admin.QueryContext(m.e.ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('"+strings.Join(mysqlCounters, "','")+"')")
	if err != nil {
		m.e.b.Fatalf("SHOW GLOBAL STATUS: %v", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			m.e.b.Fatalf("SHOW GLOBAL STATUS: %v", err)
		}
		out[name] = n
	}
	return out
}

func (m *mysqlMeter) start() { m.base = m.status() }

func (m *mysqlMeter) read() (int64, map[string]int64) {
	now := m.status()
	cmds := map[string]int64{}
	for _, name := range mysqlCounters[1:] {
		if d := now[name] - m.base[name]; d > 0 {
			cmds[strings.ToUpper(strings.TrimPrefix(name, "Com_"))] = d
		}
	}
	return now["Questions"] - m.base["Questions"] - 1, cmds // the second SHOW counts itself
}

// etcdFamily: a private cluster of three members, and a client of the
// lock's own whose every unary call and stream message sent is counted by
// gRPC interceptors: the session's keep-alives and the watches included.
func etcdFamily(opts ...testenv.Option) func(e *bench) (func(prefix string) locker, meter) {
	return func(e *bench) (func(prefix string) locker, meter) { return etcdRig(e, opts) }
}

func etcdRig(e *bench, opts []testenv.Option) (func(prefix string) locker, meter) {
	cluster := testenv.StartEtcdCluster(e.b, opts...)
	c := &counts{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cluster.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				c.add(rpcName(method))
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				s, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil {
					return nil, err
				}
				return countedStream{s, c, rpcName(method)}, nil
			}),
		},
	})
	if err != nil {
		e.b.Fatalf("etcd: %v", err)
	}
	e.b.Cleanup(func() { cli.Close() })
	status, err := cli.Status(e.ctx, cluster.Endpoints()[0])
	if err != nil {
		e.b.Fatalf("etcd: %v", err)
	}
	fmt.Printf("etcd: %s, 3 members (private, loopback)\n", status.Version)
	var locks []*lock.Etcd
	e.b.Cleanup(func() {
		for _, l := range locks {
			l.Close()
		}
	})
	return func(prefix string) locker {
		l := lock.NewEtcd(cli, lock.EtcdOptions{Prefix: "/" + prefix, TTL: ttl, Wait: wait})
		locks = append(locks, l)
		return leaseLocker{l}
	}, &clientMeter{c: c}
}

// rpcName is the method of a gRPC full name: "/etcdserverpb.KV/Txn" is Txn.
func rpcName(method string) string { return method[strings.LastIndexByte(method, '/')+1:] }

// countedStream counts the messages sent on a stream (a watch's create
// and cancel requests, a lease's keep-alives) under its method's name.
type countedStream struct {
	grpc.ClientStream
	c    *counts
	name string
}

func (s countedStream) SendMsg(m any) error {
	s.c.add(s.name)
	return s.ClientStream.SendMsg(m)
}

// zookeeperFamily: a private ensemble of three servers, and a connection
// of the lock's own whose every request is counted by its opcode as the
// client writes it (a request is one write: length, xid, opcode, body).
func zookeeperFamily(opts ...testenv.Option) func(e *bench) (func(prefix string) locker, meter) {
	return func(e *bench) (func(prefix string) locker, meter) { return zookeeperRig(e, opts) }
}

func zookeeperRig(e *bench, opts []testenv.Option) (func(prefix string) locker, meter) {
	ensemble := testenv.StartZooKeeper(e.b, opts...)
	c := &counts{}
	dialer := func(network, address string, timeout time.Duration) (net.Conn, error) {
		conn, err := net.DialTimeout(network, address, timeout)
		if err != nil {
			return nil, err
		}
		return &countedConn{Conn: conn, c: c}, nil
	}
	version := zkVersion(ensemble.Servers()[0])
	fmt.Printf("zookeeper: %s, 3 servers (private, loopback)\n", version)
	var locks []*lock.ZooKeeper
	e.b.Cleanup(func() {
		for _, l := range locks {
			l.Close()
		}
	})
	return func(prefix string) locker {
		l, err := lock.DialZooKeeper(ensemble.Servers(), lock.ZooKeeperOptions{Root: "/" + strings.TrimSuffix(prefix, ":"), TTL: ttl, Wait: wait},
			zk.WithDialer(dialer))
		if err != nil {
			e.b.Fatalf("zookeeper: %v", err)
		}
		locks = append(locks, l)
		return leaseLocker{l}
	}, &clientMeter{c: c, riding: "exists"} // sent with the children list, for the znode's czxid
}

// zkVersion asks the ZooKeeper server at addr its version (srvr).
func zkVersion(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "?"
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return "?"
	}
	out, _ := io.ReadAll(c)
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
			v, _, _ = strings.Cut(v, ",")
			v, _, _ = strings.Cut(v, "-") // Debian's build names no commit: 3.8.0-${mvngit.commit.id}
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// countedConn counts the ZooKeeper requests written on it by opcode; the
// first write of a connection is its handshake.
type countedConn struct {
	net.Conn
	c      *counts
	opened bool
}

// zkOps names the opcodes of the requests a lock sends.
var zkOps = map[int32]string{
	1: "create", 2: "delete", 3: "exists", 4: "getData", 8: "getChildren", 9: "sync", 11: "ping", 12: "getChildren2",
	13: "check", 14: "multi", 15: "create2", 19: "createContainer", 101: "setWatches", -11: "close",
}

func (c *countedConn) Write(b []byte) (int, error) {
	switch {
	case !c.opened:
		c.opened = true
		c.c.add("connect")
	case len(b) >= 12:
		op := int32(binary.BigEndian.Uint32(b[8:12]))
		name, ok := zkOps[op]
		if !ok {
			name = fmt.Sprintf("op%d", op)
		}
		c.c.add(name)
	}
	return c.Conn.Write(b)
}
