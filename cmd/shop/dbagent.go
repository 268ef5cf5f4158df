package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"

	"shop/internal/dbagent"
	"shop/internal/mysqldb"
)

// dbAgent serves HAProxy's agent-check for one Galera node (internal/dbagent)
// until ctx ends: -listen is the agent-port HAProxy's server line names,
// -dsn the node itself (never HAProxy), as a go-sql-driver DSN.
func dbAgent(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlags("db-agent")
	listen := fs.String("listen", "127.0.0.1:9200", "the address HAProxy's agent-check connects to")
	dsn := fs.String("dsn", "", "the Galera node's go-sql-driver DSN, e.g. root@tcp(127.0.0.1:3306)/")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dsn == "" {
		return usageError{"db-agent: -dsn is required: the node to answer for"}
	}
	db, err := mysqldb.OpenSQL(*dsn, 2)
	if err != nil {
		return err
	}
	defer db.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("db-agent: %w", err)
	}
	slog.New(slog.NewJSONHandler(stderr, nil)).Info("db-agent listening", "addr", ln.Addr().String())
	return dbagent.Serve(ctx, ln, db)
}
