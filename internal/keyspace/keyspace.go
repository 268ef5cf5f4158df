// Package keyspace walks a Redis key space whatever the deployment: one
// server, a Sentinel-managed master, or a Redis Cluster, whose keys are
// spread over its masters.
package keyspace

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Scan calls fn with every key matching match, on every master of a Redis
// Cluster (a SCAN of one node sees only that node's slots) and on the one
// server otherwise. The masters are scanned at once, but fn is called by one
// of them at a time; it may see a key twice, as SCAN may.
func Scan(ctx context.Context, c redis.Cmdable, match string, fn func(key string)) error {
	cluster, ok := c.(*redis.ClusterClient)
	if !ok {
		return scan(ctx, c, match, fn)
	}
	var mu sync.Mutex
	return cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return scan(ctx, node, match, func(key string) {
			mu.Lock()
			defer mu.Unlock()
			fn(key)
		})
	})
}

func scan(ctx context.Context, c redis.Cmdable, match string, fn func(key string)) error {
	iter := c.Scan(ctx, 0, match, 1000).Iterator()
	for iter.Next(ctx) {
		fn(iter.Val())
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("keyspace: scan %s: %w", match, err)
	}
	return nil
}
