package testenv

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisSentinel is a private Sentinel set-up — a master, its replica and
// one Sentinel watching them — for a test that fails the master over (the
// shared set-up of RedisSentinelEnv must not be).
type RedisSentinel struct {
	// MasterName is the name the Sentinel knows the master by.
	MasterName string
	// Sentinel is the Sentinel's address.
	Sentinel string
	// Nodes are the master and the replica as started; a failover swaps
	// their roles (see Master).
	Nodes [2]*RedisProc

	sentinel *redis.SentinelClient
}

// StartRedisSentinel starts a master, a replica of it and a Sentinel
// (quorum 1, a master down after a second), and waits until the replica is
// in sync and the Sentinel answers.
func StartRedisSentinel(tb testing.TB) *RedisSentinel {
	tb.Helper()
	s := &RedisSentinel{MasterName: "shop"}
	// A replica's full sync starts at once, not after the default 5 s.
	for i := range s.Nodes {
		s.Nodes[i] = StartRedis(tb, "--repl-diskless-sync-delay", "0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	host, port, _ := net.SplitHostPort(s.Nodes[0].Addr)
	replica := RedisAt(tb, s.Nodes[1].Addr)
	if err := replica.ReplicaOf(ctx, host, port).Err(); err != nil {
		tb.Fatalf("REPLICAOF on %s: %v", s.Nodes[1].Addr, err)
	}
	waitUntil(ctx, tb, "the replica is in sync", func() bool { return linkUp(ctx, replica) })

	s.Sentinel = "127.0.0.1:" + freePort(tb)
	dir := tb.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	_, sport, _ := net.SplitHostPort(s.Sentinel)
	// Sentinel rewrites its file as it learns the set-up.
	lines := []string{"port " + sport, "bind 127.0.0.1", "dir " + dir,
		"sentinel monitor " + s.MasterName + " " + host + " " + port + " 1",
		"sentinel down-after-milliseconds " + s.MasterName + " 1000",
		"sentinel failover-timeout " + s.MasterName + " 5000"}
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(s.Nodes[0].bin, conf, "--sentinel")
	exited, err := startTied(cmd)
	if err != nil {
		tb.Fatalf("start redis-sentinel: %v", err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	s.sentinel = redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel})
	tb.Cleanup(func() { s.sentinel.Close() })
	waitUntil(ctx, tb, "the Sentinel answers", func() bool { return s.sentinel.Ping(ctx).Err() == nil })
	return s
}

// Master returns the address of the master as the Sentinel reports it.
func (s *RedisSentinel) Master(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, err := s.sentinel.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		tb.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v", err)
	}
	return net.JoinHostPort(addr[0], addr[1])
}

// Failover has the Sentinel promote the replica (SENTINEL FAILOVER) and
// waits until it reports the new master, which answers as one, and the old
// master follows it in sync. It returns the new master's address.
func (s *RedisSentinel) Failover(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := s.Master(tb)
	// Sentinel learns of the replica from the master's INFO, and will
	// promote it only once it has had the replica's own INFO, which it asks
	// for on its own schedule: until then SENTINEL FAILOVER is refused
	// with NOGOODSLAVE, and asked again.
	waitUntil(ctx, tb, "the Sentinel fails the master over", func() bool {
		err := s.sentinel.Failover(ctx, s.MasterName).Err()
		if err != nil && !strings.HasPrefix(err.Error(), "NOGOODSLAVE") {
			tb.Fatalf("SENTINEL FAILOVER: %v", err)
		}
		return err == nil
	})
	var now string
	waitUntil(ctx, tb, "the Sentinel reports a new master", func() bool {
		now = s.Master(tb)
		return now != old
	})
	master := RedisAt(tb, now)
	waitUntil(ctx, tb, "the new master answers as one", func() bool {
		role, err := master.Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "master"
	})
	replica := RedisAt(tb, old)
	// What the Sentinel does once it sees the old master still acting as
	// one (on its INFO, every 10 s), done now.
	host, port, _ := net.SplitHostPort(now)
	if err := replica.ReplicaOf(ctx, host, port).Err(); err != nil {
		tb.Fatalf("REPLICAOF on %s: %v", old, err)
	}
	waitUntil(ctx, tb, "the old master follows the new one", func() bool { return linkUp(ctx, replica) })
	return now
}

// linkUp reports whether the replica c is in sync with its master.
func linkUp(ctx context.Context, c *redis.Client) bool {
	info, err := c.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "master_link_status:up")
}

// waitUntil polls cond until it holds, failing the test when ctx ends.
func waitUntil(ctx context.Context, tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for !cond() {
		if ctx.Err() != nil {
			tb.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
