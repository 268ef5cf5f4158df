package testenv

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is how many hash slots a Redis Cluster has.
const clusterSlots = 16384

// RedisCluster is a private Redis Cluster of masters without replicas, for
// a test that kills or pauses one of them (the shared Cluster of
// RedisClusterEnv must not be).
type RedisCluster struct {
	// Masters serve the slots in equal ranges, in order.
	Masters []*RedisProc
}

// StartRedisCluster starts n redis-servers in cluster mode, gives each an
// equal range of the slots and joins them (CLUSTER ADDSLOTSRANGE and
// CLUSTER MEET: no redis-cli needed), and waits until every node reports
// the cluster ok and knows every master. Nodes declare a failed master
// after a second; a Cluster without replicas then stops serving keys.
func StartRedisCluster(tb testing.TB, n int) *RedisCluster {
	tb.Helper()
	c := &RedisCluster{}
	buses := make([]string, n)
	for i := range n {
		// The bus port is chosen too: the default, port+10000, may be
		// taken or beyond 65535.
		buses[i] = freePort(tb)
		c.Masters = append(c.Masters, StartRedis(tb, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-port", buses[i]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := RedisAt(tb, c.Masters[0].Addr)
	for i, m := range c.Masters {
		node := RedisAt(tb, m.Addr)
		lo, hi := i*clusterSlots/n, (i+1)*clusterSlots/n-1
		if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			tb.Fatalf("cluster node %s: ADDSLOTSRANGE %d %d: %v", m.Addr, lo, hi, err)
		}
		if i > 0 {
			if err := first.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", m.Addr[strings.LastIndexByte(m.Addr, ':')+1:], buses[i]).Err(); err != nil {
				tb.Fatalf("cluster node %s: MEET %s: %v", c.Masters[0].Addr, m.Addr, err)
			}
		}
	}
	for _, m := range c.Masters {
		node := RedisAt(tb, m.Addr)
		waitUntil(ctx, tb, "the private Redis Cluster is ok on "+m.Addr, func() bool { return c.ready(ctx, node) })
	}
	return c
}

// ready reports whether node sees the cluster ok, with every master.
func (c *RedisCluster) ready(ctx context.Context, node *redis.Client) bool {
	info, err := node.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") ||
		!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.Masters))+"\r\n") {
		return false
	}
	slots, err := node.ClusterSlots(ctx).Result()
	return err == nil && len(slots) == len(c.Masters)
}

// Addrs returns the masters' addresses: seed nodes for a ClusterClient.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		addrs[i] = m.Addr
	}
	return addrs
}
