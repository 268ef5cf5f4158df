package main

import (
	"fmt"
	"log/slog"
	"time"

	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/stock"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// The order lock of each SHOP_LOCK_MODE, on clients and pools of its own.

// orderLock is the order path's lock: a stock.Locker whose waiters' work is
// exported (registerLockStats). Every family of package lock is one.
type orderLock interface {
	stock.Locker
	Stats() lock.Stats
}

// newLocker returns the order path's lock and what closes it, its clients
// included. The Redis locks wake their waiters on release. after, when not
// nil, is the timer their lease watchdogs sleep on (a failpoint's); hook,
// when not nil, is added to each of their clients (the dependency errors'
// count).
func newLocker(cfg config, after func(time.Duration) <-chan time.Time, hook redis.Hook, log *slog.Logger) (orderLock, func(), error) {
	opt := lock.RedisOptions{Prefix: cfg.Redis.Prefix + "lock:", TTL: cfg.Lock.TTL, Wait: cfg.Lock.Wait, After: after}
	switch cfg.Lock.Mode {
	case "local":
		return lock.NewLocal(cfg.Lock.Wait), func() {}, nil
	case "none":
		return lock.None{}, func() {}, nil
	case "mysql":
		return newMySQLLocker(cfg, after)
	case "etcd":
		return newEtcdLocker(cfg)
	case "zookeeper":
		return newZooKeeperLocker(cfg, log)
	case "redlock":
		nodes := make([]redis.Scripter, len(cfg.Lock.RedlockAddrs))
		clients := make([]redis.UniversalClient, len(cfg.Lock.RedlockAddrs))
		for i, addr := range cfg.Lock.RedlockAddrs {
			clients[i] = withHook(newRedlockNode(addr), hook)
			nodes[i] = clients[i]
		}
		opt.Subscriber = clients[0]
		l, err := lock.NewRedlock(nodes, opt)
		if err != nil {
			return nil, nil, fmt.Errorf("serve: %w", err)
		}
		return l, func() {
			l.Close()
			for _, c := range clients {
				c.Close()
			}
		}, nil
	}
	rdb := withHook(newLockRedis(cfg.Redis, cfg.Lock.TTL), hook)
	opt.Subscriber = rdb
	l := lock.NewRedis(rdb, opt)
	return l, func() {
		l.Close()
		rdb.Close()
	}, nil
}

// warnLock logs what in c may not be what the operator meant.
func warnLock(c lockConfig, log *slog.Logger) {
	if n := len(c.RedlockAddrs); c.Mode == "redlock" && n < 3 {
		log.Warn("SHOP_REDLOCK_ADDRS has fewer than three masters: a majority of them survives no failure", "masters", n)
	}
	if c.Fencing && !fencedMode(c.Mode) {
		log.Warn("SHOP_FENCING=on has no effect: this lock mode gives no fencing tokens", "lock_mode", c.Mode)
	}
}

// fencedMode reports whether SHOP_LOCK_MODE mode hands out fencing tokens:
// every lock but the in-process mutex and none.
func fencedMode(mode string) bool { return mode != "local" && mode != "none" }

// lockPoolSize is how many MySQL connections the mysql lock of a replica
// holds, beside the orders' own (see build): the lock's statements are
// short, and its waiters poll one per key and process.
const lockPoolSize = 8

// newMySQLLocker is the source articles' lock table, on a pool of its own:
// a lock whose waiters poll must never take the connections the orders
// commit on. The driver puts the parameters into the statement itself
// (mysqldb's pools do), so that each of the lock's statements is one round
// trip rather than a prepare, an execute and a close.
func newMySQLLocker(cfg config, after func(time.Duration) <-chan time.Time) (orderLock, func(), error) {
	db, err := mysqldb.OpenSQL(cfg.MySQL.DSN, lockPoolSize, mysqldb.IOTimeout(cfg.MySQL.IOTimeout))
	if err != nil {
		return nil, nil, fmt.Errorf("serve: lock pool: %w", err)
	}
	l := lock.NewMySQL(db, lock.MySQLOptions{TTL: cfg.Lock.TTL, Wait: cfg.Lock.Wait, After: after})
	return l, func() {
		l.Close()
		db.Close()
	}, nil
}

// etcdDialTimeout bounds the first connection to the etcd cluster.
const etcdDialTimeout = 5 * time.Second

// newEtcdLocker is the etcd lock, on a client of its own.
func newEtcdLocker(cfg config) (orderLock, func(), error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Lock.EtcdEndpoints,
		DialTimeout: etcdDialTimeout,
		Logger:      zap.NewNop(), // the client's errors reach the lock's callers
	})
	if err != nil {
		return nil, nil, fmt.Errorf("serve: etcd: %w", err)
	}
	l := lock.NewEtcd(cli, lock.EtcdOptions{Prefix: "/" + cfg.Redis.Prefix + "lock/", TTL: cfg.Lock.TTL, Wait: cfg.Lock.Wait})
	return l, func() {
		l.Close()
		cli.Close()
	}, nil
}

// newZooKeeperLocker is the ZooKeeper lock, on a session of its own; the
// client's messages go to log at debug level.
func newZooKeeperLocker(cfg config, log *slog.Logger) (orderLock, func(), error) {
	l, err := lock.DialZooKeeper(cfg.Lock.ZKServers, lock.ZooKeeperOptions{
		Root: "/" + cfg.Redis.Prefix + "lock", TTL: cfg.Lock.TTL, Wait: cfg.Lock.Wait, Logger: log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("serve: zookeeper: %w", err)
	}
	return l, func() { l.Close() }, nil
}
