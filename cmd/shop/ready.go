package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"shop/internal/depmetrics"
	"shop/internal/mysqldb"
	"shop/internal/readiness"
)

// readinessPoolSize is the MySQL readiness probe's own pool: one
// connection, which no request can take, so that a flood that holds every
// connection of the reads' pool does not make the replica look unready,
// and a probe never queues behind the requests it is meant to judge.
const readinessPoolSize = 1

// newReadiness starts the replica's readiness probes (see package
// readiness) of MySQL, on a pool of its own, and of Redis, through rdb (see
// redisReady), with cfg's grace, and returns what /readyz asks and what
// stops the probes and closes the pool. The metrics go to reg.
//
// The probes run on a context of their own, cancelled only by the returned
// function: a draining replica keeps its metrics current, and /readyz
// answers 503 then anyway.
func newReadiness(ctx context.Context, cfg config, rdb redis.UniversalClient, reg prometheus.Registerer, log *slog.Logger) (func() []string, func(), error) {
	db, err := mysqldb.Open(cfg.MySQL.DSN, readinessPoolSize, mysqldb.IOTimeout(cfg.MySQL.IOTimeout))
	if err != nil {
		return nil, nil, fmt.Errorf("serve: readiness: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, nil, fmt.Errorf("serve: readiness: %w", err)
	}
	tracker := readiness.New([]readiness.Dependency{
		{Name: depmetrics.MySQL, Check: func(ctx context.Context) error { return mysqldb.Ping(ctx, db) }},
		{Name: depmetrics.Redis, Check: redisReady(rdb)},
	}, readiness.Options{Grace: cfg.Stop.ReadyGrace, Registerer: reg, Logger: log})
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); tracker.Run(ctx) }()
	return tracker.Failing, func() {
		cancel()
		<-done
		sqlDB.Close()
	}, nil
}
