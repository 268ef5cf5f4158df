package lock_test

import (
	"context"

	"shop/internal/lock"
)

// locker is what every lock family that the order path can be configured
// with offers (SHOP_LOCK_MODE): the order path uses these four methods and
// no other.
type locker interface {
	Obtain(ctx context.Context, key string) (*lock.Lease, error)
	ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*lock.Lease, error)
	RaiseFence(ctx context.Context, key string, atLeast int64) error
	Stats() lock.Stats
}

var (
	_ locker = (*lock.Redis)(nil)
	_ locker = (*lock.Redlock)(nil)
	_ locker = (*lock.MySQL)(nil)
	_ locker = (*lock.Etcd)(nil)
	_ locker = (*lock.ZooKeeper)(nil)
	_ locker = (*lock.Local)(nil)
	_ locker = lock.None{}
)
