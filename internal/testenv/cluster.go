package testenv

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is how many hash slots a Redis Cluster has.
const clusterSlots = 16384

// RedisCluster is a private Redis Cluster, for a test that kills, pauses or
// fails over one of its nodes (the shared Cluster of RedisClusterEnv must
// not be).
type RedisCluster struct {
	// Masters serve the slots in equal ranges, in order, as started; a
	// failover hands a master's range to one of its replicas (see Shard).
	Masters []*RedisProc
	// Replicas[i] are the replicas started for Masters[i].
	Replicas [][]*RedisProc
}

// Shard is a range of slots and the nodes that serve it now.
type Shard struct {
	Master   *RedisProc
	Replicas []*RedisProc
}

// StartRedisCluster starts masters redis-servers in cluster mode, gives
// each an equal range of the slots, and replicas more of them for each
// master as its replicas; it joins them (CLUSTER ADDSLOTSRANGE, CLUSTER
// MEET and CLUSTER REPLICATE: no redis-cli needed) and waits until every
// node reports the cluster ok, knows every node and serves each range from
// its master and replicas, and every replica is in sync. Nodes declare a
// failed master after a second (cluster-node-timeout 1000): a Cluster
// without replicas then stops serving its keys, one with replicas promotes
// one of them.
func StartRedisCluster(tb testing.TB, masters, replicas int) *RedisCluster {
	tb.Helper()
	c := &RedisCluster{Replicas: make([][]*RedisProc, masters)}
	buses := map[*RedisProc]string{}
	start := func() *RedisProc {
		// The bus port is chosen too: the default, port+10000, may be
		// taken or beyond 65535. A replica's full sync starts at once, not
		// after the default 5 s; and the Cluster lists a replica only once
		// its replication offset is above zero, which on a master without
		// writes takes its first PING to the replicas: every second, not
		// every 10.
		bus := freePort(tb)
		p := StartRedis(tb, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-port", bus, "--repl-diskless-sync-delay", "0",
			"--repl-ping-replica-period", "1")
		buses[p] = bus
		return p
	}
	for i := range masters {
		c.Masters = append(c.Masters, start())
		for range replicas {
			c.Replicas[i] = append(c.Replicas[i], start())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := RedisAt(tb, c.Masters[0].Addr)
	for i, m := range c.Masters {
		lo, hi := i*clusterSlots/masters, (i+1)*clusterSlots/masters-1
		if err := RedisAt(tb, m.Addr).Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			tb.Fatalf("cluster node %s: ADDSLOTSRANGE %d %d: %v", m.Addr, lo, hi, err)
		}
	}
	for _, n := range c.Nodes()[1:] {
		if err := first.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.port, buses[n]).Err(); err != nil {
			tb.Fatalf("cluster node %s: MEET %s: %v", c.Masters[0].Addr, n.Addr, err)
		}
	}
	for i, m := range c.Masters {
		id, err := RedisAt(tb, m.Addr).ClusterMyID(ctx).Result()
		if err != nil {
			tb.Fatalf("cluster node %s: MYID: %v", m.Addr, err)
		}
		for _, r := range c.Replicas[i] {
			node := RedisAt(tb, r.Addr)
			// A node can follow a master only once it has heard of it.
			waitUntil(ctx, tb, r.Addr+" knows its master "+m.Addr, func() bool {
				return strings.Contains(node.ClusterNodes(ctx).Val(), id)
			})
			if err := node.Do(ctx, "CLUSTER", "REPLICATE", id).Err(); err != nil {
				tb.Fatalf("cluster node %s: REPLICATE %s: %v", r.Addr, m.Addr, err)
			}
		}
	}
	for _, n := range c.Nodes() {
		node := RedisAt(tb, n.Addr)
		waitUntil(ctx, tb, "the private Redis Cluster is ok on "+n.Addr, func() bool { return c.ready(ctx, node, replicas) })
	}
	return c
}

// Nodes returns every node as started, masters first.
func (c *RedisCluster) Nodes() []*RedisProc {
	return append(slices.Clone(c.Masters), slices.Concat(c.Replicas...)...)
}

// ready reports whether node sees the cluster ok, with every node, and
// each range served by a master and replicas replicas, and whether node,
// if it is a replica, is in sync.
func (c *RedisCluster) ready(ctx context.Context, node *redis.Client, replicas int) bool {
	info, err := node.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") ||
		!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.Nodes()))+"\r\n") {
		return false
	}
	slots, err := node.ClusterSlots(ctx).Result()
	if err != nil || len(slots) != len(c.Masters) {
		return false
	}
	for _, s := range slots {
		if len(s.Nodes) != 1+replicas {
			return false
		}
	}
	role, err := node.Do(ctx, "ROLE").Slice()
	return err == nil && len(role) > 0 && (role[0] == "master" || linkUp(ctx, node))
}

// Addrs returns the masters' addresses as started: seed nodes for a
// ClusterClient.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		addrs[i] = m.Addr
	}
	return addrs
}

// Shard returns the nodes that serve key's slot now, as a live node sees
// them.
func (c *RedisCluster) Shard(tb testing.TB, key string) Shard {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	node := redis.NewClient(&redis.Options{Addr: c.live(tb)})
	defer node.Close()
	slot, err := node.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		tb.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
	}
	slots, err := node.ClusterSlots(ctx).Result()
	if err != nil {
		tb.Fatalf("CLUSTER SLOTS: %v", err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			var shard Shard
			for i, n := range s.Nodes {
				p := c.node(tb, n.Addr)
				if i == 0 {
					shard.Master = p
				} else {
					shard.Replicas = append(shard.Replicas, p)
				}
			}
			return shard
		}
	}
	tb.Fatalf("no node serves slot %d of %s", slot, key)
	return Shard{}
}

// Failover has replica take its master's slots over (CLUSTER FAILOVER,
// with the master's agreement) and waits until every node sees it as their
// master and its old master follows it in sync.
func (c *RedisCluster) Failover(tb testing.TB, replica *RedisProc) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := RedisAt(tb, replica.Addr).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		tb.Fatalf("CLUSTER FAILOVER on %s: %v", replica.Addr, err)
	}
	c.WaitMaster(tb, replica)
}

// WaitMaster waits until every live node sees node as a master and the
// cluster ok (after its master failed, or a failover), and every live
// replica is in sync: until the Cluster serves every slot again.
func (c *RedisCluster) WaitMaster(tb testing.TB, node *RedisProc) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range c.Nodes() {
		if n.Pid() == 0 {
			continue
		}
		client := RedisAt(tb, n.Addr)
		waitUntil(ctx, tb, n.Addr+" sees "+node.Addr+" as a master of a Cluster that is ok", func() bool {
			info, err := client.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			slots, err := client.ClusterSlots(ctx).Result()
			if err != nil {
				return false
			}
			served := false
			for _, s := range slots {
				served = served || s.Nodes[0].Addr == node.Addr
			}
			role, err := client.Do(ctx, "ROLE").Slice()
			return served && err == nil && len(role) > 0 && (role[0] == "master" || linkUp(ctx, client))
		})
	}
}

// live returns the address of a node that runs.
func (c *RedisCluster) live(tb testing.TB) string {
	tb.Helper()
	for _, n := range c.Nodes() {
		if n.Pid() != 0 {
			return n.Addr
		}
	}
	tb.Fatal("every node of the private Redis Cluster is down")
	return ""
}

// node returns the node at addr.
func (c *RedisCluster) node(tb testing.TB, addr string) *RedisProc {
	tb.Helper()
	for _, n := range c.Nodes() {
		if n.Addr == addr {
			return n
		}
	}
	tb.Fatalf("the Cluster names a node %s it was not started with", addr)
	return nil
}
