package main

import (
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-sql-driver/mysql"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"shop/internal/lock"
	"shop/internal/stock"
)

// fencedMode reports whether SHOP_LOCK_MODE mode hands out fencing tokens:
// every lock but the in-process mutex and none.
func fencedMode(mode string) bool { return mode != "local" && mode != "none" }

// lockPoolSize is how many MySQL connections the mysql lock of a replica
// holds, beside the orders' own (see openDB): the lock's statements are
// short, and its waiters poll one per key and process.
const lockPoolSize = 8

// newMySQLLocker is the seeds' lock table, on a pool of its own: a lock
// whose waiters poll must never take the connections the orders commit on.
// The driver puts the parameters into the statement itself, so that each of
// the lock's statements is one round trip rather than a prepare, an execute
// and a close.
func newMySQLLocker(cfg config, after func(time.Duration) <-chan time.Time) (stock.Locker, func(), error) {
	dsn, err := mysql.ParseDSN(cfg.MySQLDSN)
	if err != nil {
		return nil, nil, fmt.Errorf("serve: lock pool: %w", err)
	}
	dsn.InterpolateParams = true
	db, err := sql.Open("mysql", dsn.FormatDSN())
	if err != nil {
		return nil, nil, fmt.Errorf("serve: lock pool: %w", err)
	}
	db.SetMaxOpenConns(lockPoolSize)
	db.SetMaxIdleConns(lockPoolSize)
	db.SetConnMaxLifetime(time.Hour)
	l := lock.NewMySQL(db, lock.MySQLOptions{TTL: cfg.LockTTL, Wait: cfg.LockWait, After: after})
	return l, func() {
		l.Close()
		db.Close()
	}, nil
}

// etcdDialTimeout bounds the first connection to the etcd cluster.
const etcdDialTimeout = 5 * time.Second

// newEtcdLocker is the etcd lock, on a client of its own.
func newEtcdLocker(cfg config) (stock.Locker, func(), error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.EtcdEndpoints,
		DialTimeout: etcdDialTimeout,
		Logger:      zap.NewNop(), // the client's errors reach the lock's callers
	})
	if err != nil {
		return nil, nil, fmt.Errorf("serve: etcd: %w", err)
	}
	l := lock.NewEtcd(cli, lock.EtcdOptions{Prefix: "/" + cfg.RedisPrefix + "lock/", TTL: cfg.LockTTL, Wait: cfg.LockWait})
	return l, func() {
		l.Close()
		cli.Close()
	}, nil
}

// newZooKeeperLocker is the ZooKeeper lock, on a session of its own; the
// client's messages go to log at debug level.
func newZooKeeperLocker(cfg config, log *slog.Logger) (stock.Locker, func(), error) {
	l, err := lock.DialZooKeeper(cfg.ZKServers, lock.ZooKeeperOptions{
		Root: "/" + cfg.RedisPrefix + "lock", TTL: cfg.LockTTL, Wait: cfg.LockWait, Logger: log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("serve: zookeeper: %w", err)
	}
	return l, func() { l.Close() }, nil
}
