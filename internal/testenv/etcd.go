package testenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdBinEnv names the etcd binary for tests that start their own cluster;
// default: etcd on PATH.
const EtcdBinEnv = "SHOP_TEST_ETCD_BIN"

// etcdMembers is how many members a private etcd cluster has: the smallest
// that survives the loss of one.
const etcdMembers = 3

// EtcdCluster is a private etcd cluster of three members on loopback, for a
// test that kills its leader or restarts it whole. Every member keeps its
// data directory across Kill and Start, as a machine that crashed and
// rebooted does.
type EtcdCluster struct {
	tb      testing.TB
	bin     string
	dir     string
	members []*etcdMember
}

// etcdMember is one etcd process and the flags it is started with, the
// same on every start.
type etcdMember struct {
	name   string
	client string // host:port
	args   []string
	log    string

	proc
	id atomic.Uint64 // the member's ID, once it has answered
}

// StartEtcdCluster starts three etcd members on free loopback ports, with
// their data in a temporary directory, and waits until they have elected a
// leader and serve a linearizable read. Heartbeats every 50 ms and a 500 ms
// election timeout make a failover take about a second, and make the
// smallest lease TTL the members grant 1 s (etcd raises a shorter one to
// 1.5 election timeouts, rounded up to whole seconds). The members are
// killed when the test ends, and die with the test binary if that ends
// first. The binary is etcd on PATH or SHOP_TEST_ETCD_BIN; a test that
// cannot find it fails. -short runs, which start no servers, skip it.
func StartEtcdCluster(tb testing.TB, opts ...Option) *EtcdCluster {
	tb.Helper()
	if testing.Short() {
		tb.Skip("an etcd cluster is a server; -short runs skip tests that need servers")
	}
	bin := os.Getenv(EtcdBinEnv)
	if bin == "" {
		bin = "etcd"
	}
	bin, err := exec.LookPath(bin)
	if err != nil {
		tb.Fatalf("etcd: %v (install etcd-server or set %s)", err, EtcdBinEnv)
	}
	c := &EtcdCluster{tb: tb, bin: bin, dir: dataDir(tb, opts)}
	peers := make([]string, etcdMembers)
	for i := range etcdMembers {
		m := &etcdMember{name: fmt.Sprintf("m%d", i), client: "127.0.0.1:" + freePort(tb)}
		peers[i] = "http://127.0.0.1:" + freePort(tb)
		m.log = filepath.Join(c.dir, m.name+".log")
		c.members = append(c.members, m)
	}
	initial := make([]string, etcdMembers)
	for i, m := range c.members {
		initial[i] = m.name + "=" + peers[i]
	}
	token := "shop-test-" + Name()
	for i, m := range c.members {
		// No metrics or pprof listener of its own: --listen-metrics-urls
		// is left empty and pprof off.
		m.args = []string{
			"--name", m.name,
			"--data-dir", filepath.Join(c.dir, m.name),
			"--listen-client-urls", "http://" + m.client,
			"--advertise-client-urls", "http://" + m.client,
			"--listen-peer-urls", peers[i],
			"--initial-advertise-peer-urls", peers[i],
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--heartbeat-interval", "50",
			"--election-timeout", "500",
			"--logger", "zap",
			"--log-outputs", m.log,
		}
	}
	tb.Cleanup(c.StopAll)
	c.StartAll()
	return c
}

// Endpoints returns the members' client addresses (host:port), in order.
func (c *EtcdCluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.client
	}
	return eps
}

// Endpoint returns member i's client address.
func (c *EtcdCluster) Endpoint(i int) string { return c.members[i].client }

// Client returns a client of the given endpoints (every member's when none
// is given), closed when the test ends. It logs nothing: a client whose
// member was killed would fill the test's output with its retries.
func (c *EtcdCluster) Client(tb testing.TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	if len(endpoints) == 0 {
		endpoints = c.Endpoints()
	}
	return EtcdClient(tb, endpoints...)
}

// EtcdClient returns a client of endpoints that logs nothing, closed when
// the test ends. Dial-timeout 2 s: a dead endpoint is given up quickly.
func EtcdClient(tb testing.TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	cl, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatalf("etcd client of %v: %v", endpoints, err)
	}
	tb.Cleanup(func() { cl.Close() })
	return cl
}

// Leader returns the index of the member that leads now, as the live
// members report it, waiting up to 15 s for one to be elected.
func (c *EtcdCluster) Leader(tb testing.TB) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	leader := -1
	waitUntil(ctx, tb, "the etcd cluster has a leader", func() bool {
		var lead uint64
		for i, m := range c.members {
			if m.pid() == 0 {
				continue
			}
			st, err := m.status(ctx)
			if err != nil {
				continue
			}
			m.id.Store(st.Header.MemberId)
			if st.Leader != 0 && st.Leader == st.Header.MemberId {
				leader = i
				return true
			}
			lead = st.Leader
		}
		for i, m := range c.members {
			if lead != 0 && m.pid() != 0 && m.id.Load() == lead {
				leader = i
				return true
			}
		}
		return false
	})
	return leader
}

// Kill stops member i at once (SIGKILL). Its data directory stays: Start
// brings it back with what it had written.
func (c *EtcdCluster) Kill(i int) { c.members[i].kill() }

// Pause freezes member i (SIGSTOP): its connections stay open and go
// unanswered, as behind a network that dropped every packet. Resume undoes
// it.
func (c *EtcdCluster) Pause(i int) { c.members[i].signal(syscall.SIGSTOP) }

// Resume lets a paused member run again.
func (c *EtcdCluster) Resume(i int) { c.members[i].signal(syscall.SIGCONT) }

// Start starts member i again on its data and waits until it serves
// clients, which an etcd member does once it has joined the cluster's
// quorum again.
func (c *EtcdCluster) Start(i int) {
	c.tb.Helper()
	c.start(i)
	c.waitServing(i)
}

// StopAll kills every member (SIGKILL), keeping their data.
func (c *EtcdCluster) StopAll() {
	for _, m := range c.members {
		m.kill()
	}
}

// StartAll starts every member that is not running, on its data, and waits
// until the cluster has a leader and every member serves clients. The
// members are started before any is waited for: none serves until a quorum
// runs.
func (c *EtcdCluster) StartAll() {
	c.tb.Helper()
	for i, m := range c.members {
		if m.pid() == 0 {
			c.start(i)
		}
	}
	for i := range c.members {
		c.waitServing(i)
	}
}

func (c *EtcdCluster) start(i int) {
	c.tb.Helper()
	m := c.members[i]
	if _, err := m.start(exec.Command(c.bin, m.args...)); err != nil {
		c.tb.Fatalf("start etcd member %s on %s: %v", m.name, m.client, err)
	}
}

// waitServing waits up to 20 s until member i answers a linearizable read,
// which needs a leader and a quorum behind it.
func (c *EtcdCluster) waitServing(i int) {
	c.tb.Helper()
	m := c.members[i]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Dialled before it serves, gRPC would wait out its reconnect backoff
	// (a second) before it tried again: plain HTTP on /health first, which
	// answers true once the member serves and sees a leader.
	hc := &http.Client{Timeout: 250 * time.Millisecond}
	waitUntil(ctx, c.tb, "etcd member "+m.name+" on "+m.client+" is healthy", func() bool {
		if m.pid() == 0 {
			return true // reported below
		}
		resp, err := hc.Get("http://" + m.client + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), `"health":"true"`)
	})
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{m.client}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.tb.Fatalf("etcd client of %s: %v", m.client, err)
	}
	defer cl.Close()
	for {
		if m.pid() == 0 {
			c.tb.Fatalf("etcd member %s exited; its log:\n%s", m.name, tail(m.log))
		}
		try, cancelTry := context.WithTimeout(ctx, time.Second)
		_, err := cl.Get(try, "health")
		var st *clientv3.StatusResponse
		if err == nil {
			st, err = cl.Status(try, m.client)
		}
		cancelTry()
		if err == nil {
			m.id.Store(st.Header.MemberId)
			return
		}
		if ctx.Err() != nil {
			c.tb.Fatalf("etcd member %s on %s does not serve: %v; its log:\n%s", m.name, m.client, err, tail(m.log))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tail returns the end of the file at path, for a failure's message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// status asks the member for its status on a client of its own.
func (m *etcdMember) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{m.client}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cl.Status(ctx, m.client)
}
