package testenv

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/keyspace"
)

const (
	// RedisClusterEnv names the seed nodes of the test Redis Cluster
	// (three masters), comma-separated.
	RedisClusterEnv = "SHOP_TEST_REDIS_CLUSTER_ADDRS"
	// RedisSentinelEnv names the Sentinels of the test's Sentinel-managed
	// Redis (a master and a replica, three Sentinels), comma-separated,
	// and RedisMasterNameEnv the master they watch.
	RedisSentinelEnv   = "SHOP_TEST_REDIS_SENTINEL_ADDRS"
	RedisMasterNameEnv = "SHOP_TEST_REDIS_MASTER_NAME"
)

// Topology is a Redis deployment that `make test` starts: one server, a
// Redis Cluster, or a master managed by Sentinels.
type Topology struct {
	// Name is "single", "cluster" or "sentinel".
	Name string
	// Addrs and MasterName are go-redis's UniversalOptions fields, and the
	// service's SHOP_REDIS_ADDR and SHOP_REDIS_MASTER_NAME.
	Addrs      []string
	MasterName string
}

// Topologies returns the three Redis deployments of `make test`, for a
// test that runs on each (as subtests named after them).
func Topologies(tb testing.TB) []Topology {
	tb.Helper()
	return []Topology{
		{Name: "single", Addrs: []string{lookup(tb, RedisEnv)}},
		{Name: "cluster", Addrs: strings.Split(lookup(tb, RedisClusterEnv), ",")},
		{Name: "sentinel", Addrs: strings.Split(lookup(tb, RedisSentinelEnv), ","), MasterName: lookup(tb, RedisMasterNameEnv)},
	}
}

// TopologyNamed returns the one of Topologies called name: "single",
// "cluster" or "sentinel".
func TopologyNamed(tb testing.TB, name string) Topology {
	tb.Helper()
	for _, topo := range Topologies(tb) {
		if topo.Name == name {
			return topo
		}
	}
	tb.Fatalf("no Redis topology %q", name)
	return Topology{}
}

// EachTopology runs f as a subtest on each of Topologies.
func EachTopology(t *testing.T, f func(t *testing.T, topo Topology)) {
	t.Helper()
	for _, topo := range Topologies(t) {
		t.Run(topo.Name, func(t *testing.T) { f(t, topo) })
	}
}

// Env returns the service's settings for the deployment.
func (topo Topology) Env() map[string]string {
	env := map[string]string{"SHOP_REDIS_ADDR": strings.Join(topo.Addrs, ",")}
	if topo.MasterName != "" {
		env["SHOP_REDIS_MASTER_NAME"] = topo.MasterName
	}
	return env
}

// Options returns go-redis options for a client of the deployment.
func (topo Topology) Options() *redis.UniversalOptions {
	return &redis.UniversalOptions{Addrs: topo.Addrs, MasterName: topo.MasterName, PoolSize: 200}
}

// Client returns a client of the deployment made with opt (default
// Options), closed when the test ends.
func (topo Topology) Client(tb testing.TB, opt *redis.UniversalOptions) redis.UniversalClient {
	tb.Helper()
	if opt == nil {
		opt = topo.Options()
	}
	c := redis.NewUniversalClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		tb.Fatalf("redis (%s) at %v: %v", topo.Name, topo.Addrs, err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// RedisOn is Redis on the deployment: a client and a key prefix of the
// test's own, whose keys are deleted from every master when the test ends.
func RedisOn(tb testing.TB, topo Topology) (redis.UniversalClient, string) {
	tb.Helper()
	c := topo.Client(tb, nil)
	prefix := "test:" + Name() + ":"
	tb.Cleanup(func() { deleteKeys(tb, c, prefix) })
	return c, prefix
}

// deleteKeys deletes every key under prefix, on every master, a pipeline of
// them at a time: a test that leaves tens of thousands of keys is not kept
// waiting for a round trip per key.
func deleteKeys(tb testing.TB, c redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var keys []string
	if err := keyspace.Scan(ctx, c, prefix+"*", func(key string) { keys = append(keys, key) }); err != nil {
		tb.Errorf("clean redis keys %s*: %v", prefix, err)
	}
	for batch := range slices.Chunk(keys, 1000) {
		pipe := c.Pipeline()
		for _, k := range batch {
			pipe.Del(ctx, k)
		}
		pipe.Exec(ctx)
	}
}
