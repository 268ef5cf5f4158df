// Command eventsink receives the service's outbox events, to test and
// demonstrate the relay against (package shop/internal/eventsink says what
// it checks, records and can be told to do).
//
//	eventsink [-addr A] [-control A] [-secret S] [-record FILE] [-fail-first N]
//
// listens until SIGINT or SIGTERM. It prints its two URLs first, one a
// line: "events URL" (for SHOP_EVENTS_URL) and "control URL".
//
//	eventsink -summary FILE
//
// prints the summary of a record file as JSON, and exits 1 when it shows
// deliveries out of order, gaps or concurrent deliveries, 0 otherwise.
// Errors of use or of reading are exit 2.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"shop/internal/eventsink"
)

// envSecret is the service's setting, read when -secret is not given, so
// that one variable configures both ends.
const envSecret = "SHOP_EVENTS_SECRET"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the command, until ctx is done; it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eventsink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o eventsink.Options
	fs.StringVar(&o.Addr, "addr", "127.0.0.1:0", "the events listener's address")
	fs.StringVar(&o.ControlAddr, "control", "127.0.0.1:0", "the control listener's address")
	fs.StringVar(&o.Secret, "secret", "", "the Standard Webhooks secret, whsec_ + base64 (default $"+envSecret+")")
	fs.StringVar(&o.RecordFile, "record", "", "append each delivery to this file as a JSON line")
	fs.IntVar(&o.FailFirst, "fail-first", 0, "answer 500 to the first N deliveries")
	summary := fs.String("summary", "", "print the summary of this record file and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventsink: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *summary != "" {
		return summarize(*summary, stdout, stderr)
	}
	if o.Secret == "" {
		o.Secret = getenv(envSecret)
	}
	if o.FailFirst < 0 {
		fmt.Fprintln(stderr, "eventsink: -fail-first must be at least 0")
		return 2
	}
	s, err := eventsink.Start(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "eventsink: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "events %s\ncontrol %s\n", s.URL(), s.ControlURL())
	<-ctx.Done()
	if err := s.Close(); err != nil {
		fmt.Fprintf(stderr, "eventsink: %v\n", err)
		return 1
	}
	return 0
}

// summarize prints the summary of the record file at path.
func summarize(path string, stdout, stderr io.Writer) int {
	record, err := eventsink.ReadRecordFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "eventsink: %v\n", err)
		return 2
	}
	sum := eventsink.Summarize(record)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(sum); err != nil {
		fmt.Fprintf(stderr, "eventsink: %v\n", err)
		return 2
	}
	if !sum.OK {
		fmt.Fprintf(stderr, "eventsink: out of order %d, gaps %d, concurrent %d\n", sum.OutOfOrder, sum.Gaps, sum.Concurrent)
		return 1
	}
	return 0
}
