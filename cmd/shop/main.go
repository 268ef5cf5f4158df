// Command shop is the flash-sale inventory service and its tools:
//
//	shop serve                            the HTTP service
//	shop migrate [--events]               apply the schema [and turn events on]
//	shop seed --products N --stock S      reset the catalog
//	     [--starts-at T] [--ends-at T]    with every product's sale window
//	shop seed --if-empty …                seed only a catalog without products
//	shop verify [--acks FILE] [--json]    check the sale's invariants
//	shop healthcheck                      exit 0 when this host's shop serve is ready
//	shop db-agent -listen A -dsn D        HAProxy's agent-check for one Galera node
//
// Configuration comes from SHOP_* environment variables; see README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	// go-redis logs through one process-wide logger; make it JSON like ours.
	redis.SetLogger(redisLog{log})
	ctx, cancel := context.WithCancel(context.Background())
	// Registered before anything runs: a SIGTERM from then on drains.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go onSignals(log, sigs, cancel)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	cancel()
	os.Exit(exitCode(err, os.Stderr))
}

// onSignals cancels the program's context on the first SIGTERM or SIGINT,
// which stops `shop serve` gracefully, and exits at once, with status 1, on
// the second: an operator who will not wait for the drain and the in-flight
// requests must not have to reach for SIGKILL. Signals are queued on the
// channel, so a second one that comes right after the first is not lost.
func onSignals(log *slog.Logger, sigs <-chan os.Signal, cancel context.CancelFunc) {
	<-sigs
	cancel()
	sig := <-sigs
	log.Error("second signal: exiting at once, without waiting for in-flight requests", "signal", sig.String())
	os.Exit(1)
}

// errViolations means verify found broken invariants (exit 1).
var errViolations = errors.New("invariants broken")

// usageError is a bad command line (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

const usage = `usage: shop <command> [flags]

commands:
  serve                             run the HTTP service
  migrate [--events]                apply the database migrations [and turn events on for every replica]
  seed --products N --stock S       reset the catalog to products 1..N with S units each
       [--starts-at T] [--ends-at T]  and every product's sale window (RFC 3339)
       [--if-empty]                 only if the catalog has no products (exit 0 either way)
  verify [--acks FILE] [--json]     check the invariants; exit 1 if any is broken
  healthcheck                       GET /readyz on this host's SHOP_HTTP_ADDR port; exit 0 if ready, else 1
  db-agent -listen ADDR -dsn DSN    answer HAProxy's agent-check for the Galera node at DSN: up only when Synced`

// run is the whole program; main only supplies the process's environment.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{usage}
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stderr)
	case "migrate":
		return migrate(ctx, args, getenv, stdout)
	case "seed":
		return seed(ctx, args, getenv, stdout)
	case "verify":
		return verifySale(ctx, args, getenv, stdout)
	case "healthcheck":
		return healthcheck(ctx, args, getenv, stdout)
	case "db-agent":
		return dbAgent(ctx, args, stderr)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return usageError{fmt.Sprintf("unknown command %q\n%s", cmd, usage)}
}

func exitCode(err error, stderr io.Writer) int {
	var (
		ue usageError
		ce configError
	)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errViolations):
		return 1
	case errors.Is(err, errUnhealthy):
		// Before the usage and configuration errors it may wrap: a
		// healthcheck's exit is 0 or 1.
		fmt.Fprintln(stderr, "shop: healthcheck:", err)
		return 1
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "shop:", ue.msg)
		return 2
	case errors.As(err, &ce):
		fmt.Fprintln(stderr, "shop: bad configuration:\n"+ce.Error())
		return 2
	}
	fmt.Fprintln(stderr, "shop:", err)
	return 1
}

// newFlags returns a flag set for a subcommand whose errors come back to run.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("shop "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags parses args, turning a bad flag into a usage error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{fmt.Sprintf("%s: %v", fs.Name(), err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	return nil
}
