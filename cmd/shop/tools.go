package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"shop/internal/admin"
	"shop/internal/mysqldb"
	"shop/internal/notify"
	"shop/internal/outbox"
	"shop/internal/stock"
	"shop/internal/verify"
	"shop/migrations"
)

// openDB connects to MySQL for a one-shot command; close releases the pool.
func openDB(dsn string) (db *gorm.DB, close func(), err error) {
	db, err = mysqldb.Open(dsn, 4)
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
	fs := newFlags("migrate")
	events := fs.Bool("events", false, "turn events on (docs/events.md): from then on every change writes its event to the outbox, on every replica")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	if err := createDatabase(ctx, cfg.MySQL.DSN); err != nil {
		return err
	}
	db, closeDB, err := openDB(cfg.MySQL.DSN)
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
	n, err := stock.NewCatalog(db).PriceUnpriced(ctx, cfg.Payments.Currency)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "migrations applied")
	if n > 0 {
		fmt.Fprintf(stdout, "%d products without a currency now in %s\n", n, cfg.Payments.Currency)
	}
	if *events {
		turned, err := outbox.NewStore(db).Enable(ctx)
		if err != nil {
			return err
		}
		if turned {
			fmt.Fprintln(stdout, "events turned on")
		} else {
			fmt.Fprintln(stdout, "events were on already")
		}
	}
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
	ifEmpty := fs.Bool("if-empty", false, "seed only a catalog without products; leave one that has some, and its orders, as they are")
	price := fs.Int64("price-cents", 0, "every product's price, in the currency's minor unit (default: each its own, 1.00 to 99.99)")
	currency := fs.String("currency", "", "the products' currency, three upper-case letters (default: SHOP_CURRENCY)")
	discard := fs.Bool("discard-refunds", false, "delete the refunds not yet settled; without it, a seed refuses while there are any")
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
	db, closeDB, err := openDB(cfg.MySQL.DSN)
	if err != nil {
		return err
	}
	defer closeDB()
	rdb := newRedis(cfg.Redis)
	defer rdb.Close()
	catalog := stock.NewCatalog(db)
	cached, closeCache := newCache(cfg, rdb, catalog, nil, nil, nil, nil, nil)
	defer closeCache()
	adm := &admin.Admin{Catalog: catalog, Cache: cached, Restocks: notify.New(rdb, cfg.Redis.Prefix)}
	if *ifEmpty {
		adm.Catalog = admin.IfEmpty{Catalog: catalog}
	}
	if *price < 0 {
		return usageError{fmt.Sprintf("seed: -price-cents %d: must be positive (or 0 for each product its own)", *price)}
	}
	adm.Currency = cfg.Payments.Currency
	s, err := adm.SeedCatalog(ctx, *products, *units, stock.SeedOptions{Window: sale, PriceCents: *price, Currency: *currency, DiscardRefunds: *discard})
	var notEmpty *stock.NotEmptyError
	if errors.As(err, &notEmpty) {
		fmt.Fprintf(stdout, "catalog has %d products: not seeded\n", notEmpty.Products)
		return nil
	}
	if errors.Is(err, stock.ErrRefundsUnsettled) {
		return fmt.Errorf("seed: %w: settle them first (docs/payments.md), or pass -discard-refunds to delete them", err)
	}
	if err != nil {
		return err
	}
	if len(s.Warnings) > 0 {
		fmt.Fprintf(stdout, "seeded %d products with %d units each\n", *products, *units)
		for _, w := range s.Warnings {
			fmt.Fprintf(stdout, "warning: %s (%v)\n", w.Msg, w.Err)
		}
		return errSeededWithWarnings
	}
	fmt.Fprintf(stdout, "seeded %d products with %d units each; product cache reset (%d entries dropped), Bloom filter rebuilt\n", *products, *units, s.Dropped)
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
	var invalid *stock.InvalidError
	if errors.As(err, &invalid) {
		return stock.Window{}, usageError{"seed: " + invalid.Phrase(seedFlag)}
	}
	return w, err
}

// seedFlag names a field of the catalog's rules as shop seed's flags do:
// --starts-at and --ends-at for the window's bounds, --products, --stock.
func seedFlag(f stock.Field) string {
	flags := map[stock.Field]string{stock.FieldSaleStartsAt: "starts-at", stock.FieldSaleEndsAt: "ends-at"}
	return "--" + cmp.Or(flags[f], string(f))
}

// errSeededWithWarnings ends a seed that committed but was not followed by
// everything that should follow it (exit 1).
var errSeededWithWarnings = errors.New("seed: the catalog WAS seeded, but not everything after it was done (see the warnings); " +
	"do not seed again to fix it: that would delete every order placed since")

func verifySale(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := newFlags("verify")
	acksPath := fs.String("acks", "", "file of acknowledged orders, one per line: \"order_id\" or \"order_id sku_id user_id\"")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var acks []verify.Ack
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
	db, closeDB, err := openDB(cfg.MySQL.DSN)
	if err != nil {
		return err
	}
	defer closeDB()
	report, err := verify.Sale(ctx, db, acks)
	if err != nil {
		return err
	}
	if cfg.Orders.UserLimit > 0 {
		c, err := verify.UserLimit(ctx, db, cfg.Orders.UserLimit)
		if err != nil {
			return err
		}
		report.Checks = append(report.Checks, c)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			verify.Report
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
func readAcks(path string) ([]verify.Ack, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	defer f.Close()
	acks, err := verify.ReadAcks(f)
	if err != nil {
		return nil, fmt.Errorf("verify: %s: %w", path, err)
	}
	return acks, nil
}

// healthcheckTimeout bounds shop healthcheck's request: below the image's
// HEALTHCHECK --timeout, so that a replica that does not answer is reported
// by shop, with the reason, rather than cut off by the engine.
const healthcheckTimeout = 2 * time.Second

// errUnhealthy ends a healthcheck that found the replica not ready (exit 1,
// whatever the cause: container engines reserve exit 2).
var errUnhealthy = errors.New("not ready")

// healthcheck is the image's HEALTHCHECK: it asks the shop serve of this
// host, on the port SHOP_HTTP_ADDR names, whether it is ready (GET /readyz),
// and ends with exit 0 when it answers 200, 1 otherwise. No shell or wget is
// needed in the image.
func healthcheck(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	answer, err := askReady(ctx, args, getenv)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnhealthy, err)
	}
	fmt.Fprintln(stdout, answer)
	return nil
}

// askReady GETs /readyz of this host's shop serve, within
// healthcheckTimeout, and returns its answer: an error unless it is 200.
func askReady(ctx context.Context, args []string, getenv func(string) string) (string, error) {
	if err := parseFlags(newFlags("healthcheck"), args); err != nil {
		return "", err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return "", err
	}
	url, err := readyURL(cfg.Listen.HTTP)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	// A transport of its own: no proxy from the environment, no connection
	// kept.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return "", fmt.Errorf("%s answered %s: %s", url, res.Status, bytes.TrimSpace(body))
	}
	return fmt.Sprintf("%s answered %s", url, res.Status), nil
}

// readyURL returns the URL of /readyz of a server listening on addr, as a
// process on the same host reaches it: an address that listens on every
// interface (":8080", "0.0.0.0:8080", "[::]:8080") on the loopback.
func readyURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("SHOP_HTTP_ADDR=%q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}
