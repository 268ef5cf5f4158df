package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"shop/internal/notify"
	"shop/internal/stock"
	"shop/migrations"
)

// openDB connects to MySQL for a one-shot command; close releases the pool.
func openDB(dsn string) (db *gorm.DB, close func(), err error) {
	db, err = stock.Open(dsn, 4)
	if err != nil {
		return nil, nil, err
	}
	return db, func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	}, nil
}

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if err := parseFlags(newFlags("migrate"), args); err != nil {
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	if err := createDatabase(ctx, cfg.MySQLDSN); err != nil {
		return err
	}
	db, closeDB, err := openDB(cfg.MySQLDSN)
	if err != nil {
		return err
	}
	defer closeDB()
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	if err := migrations.Up(ctx, sqlDB); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "migrations applied")
	return nil
}

// createDatabase creates the DSN's database if it does not exist, so that
// migrate works on a fresh server.
func createDatabase(ctx context.Context, dsn string) error {
	c, err := mysql.ParseDSN(dsn)
	if err != nil || c.DBName == "" {
		return err
	}
	name := c.DBName
	c.DBName = ""
	db, closeDB, err := openDB(c.FormatDSN())
	if err != nil {
		return err
	}
	defer closeDB()
	quoted := "`" + strings.ReplaceAll(name, "`", "``") + "`"
	if err := db.WithContext(ctx).Exec("CREATE DATABASE IF NOT EXISTS " + quoted + " CHARACTER SET utf8mb4").Error; err != nil {
		return fmt.Errorf("migrate: create database %s: %w", quoted, err)
	}
	return nil
}

func seed(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := newFlags("seed")
	products := fs.Int("products", 5000, "number of products")
	units := fs.Int("stock", 1, "units of each product")
	startsAt := fs.String("starts-at", "", "when every product's sale starts, RFC 3339 (default: no start)")
	endsAt := fs.String("ends-at", "", "when every product's sale ends, RFC 3339 (default: no end)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sale, err := saleWindow(*startsAt, *endsAt)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	db, closeDB, err := openDB(cfg.MySQLDSN)
	if err != nil {
		return err
	}
	defer closeDB()
	rdb := newRedis(cfg)
	defer rdb.Close()
	catalog := stock.NewCatalog(db)
	cached, closeCache := newCache(cfg, rdb, catalog, nil, nil, nil)
	defer closeCache()
	s, err := seedCatalog(ctx, catalog, cached, notify.New(rdb, cfg.RedisPrefix), slog.New(slog.DiscardHandler), *products, *units, sale)
	if err != nil {
		return err
	}
	if len(s.warnings) > 0 {
		fmt.Fprintf(stdout, "seeded %d products with %d units each\n", *products, *units)
		for _, w := range s.warnings {
			fmt.Fprintf(stdout, "warning: %s (%v)\n", w.msg, w.err)
		}
		return errSeededWithWarnings
	}
	fmt.Fprintf(stdout, "seeded %d products with %d units each; product cache reset (%d entries dropped), Bloom filter rebuilt\n", *products, *units, s.dropped)
	return nil
}

// saleWindow reads the sale window of shop seed's --starts-at and
// --ends-at: RFC 3339 times, empty for no bound. A bad one is a usage
// error (exit 2).
func saleWindow(startsAt, endsAt string) (stock.Window, error) {
	var w stock.Window
	for _, f := range []struct {
		flag, value string
		t           **time.Time
	}{{"--starts-at", startsAt, &w.StartsAt}, {"--ends-at", endsAt, &w.EndsAt}} {
		if f.value == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, f.value)
		if err != nil {
			return stock.Window{}, usageError{fmt.Sprintf("seed: %s must be an RFC 3339 time, such as 2030-01-02T15:04:05Z: %q", f.flag, f.value)}
		}
		*f.t = &t
	}
	w, err := w.Normalize()
	if err != nil {
		return stock.Window{}, usageError{"seed: " + err.Error()}
	}
	return w, nil
}

// errSeededWithWarnings ends a seed that committed but was not followed by
// everything that should follow it (exit 1).
var errSeededWithWarnings = errors.New("seed: the catalog WAS seeded, but not everything after it was done (see the warnings); " +
	"do not seed again to fix it: that would delete every order placed since")

func verify(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := newFlags("verify")
	acksPath := fs.String("acks", "", "file of acknowledged orders, one per line: \"order_id\" or \"order_id sku_id user_id\"")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var acks []stock.Ack
	if *acksPath != "" {
		var err error
		if acks, err = readAcks(*acksPath); err != nil {
			return err
		}
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	db, closeDB, err := openDB(cfg.MySQLDSN)
	if err != nil {
		return err
	}
	defer closeDB()
	report, err := stock.Verify(ctx, db, acks)
	if err != nil {
		return err
	}
	if cfg.UserLimit > 0 {
		c, err := stock.VerifyUserLimit(ctx, db, cfg.UserLimit)
		if err != nil {
			return err
		}
		report.Checks = append(report.Checks, c)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			stock.Report
			OK bool `json:"ok"`
		}{report, report.OK()}); err != nil {
			return err
		}
	} else {
		fmt.Fprint(stdout, report)
	}
	if !report.OK() {
		return errViolations
	}
	return nil
}

// readAcks reads the acks file at path: one acknowledged order per line,
// `order_id` or `order_id sku_id user_id`; blank lines are skipped.
func readAcks(path string) ([]stock.Ack, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	defer f.Close()
	acks, err := stock.ReadAcks(f)
	if err != nil {
		return nil, fmt.Errorf("verify: %s: %w", path, err)
	}
	return acks, nil
}
