// Command stripe-recorder is the recording proxy the demo puts in front of
// stripe-mock (see internal/striperec): every call it forwards is one JSON
// line in the log.
//
//	go run ./scripts/stripe-recorder -listen 127.0.0.1:0 -target http://127.0.0.1:12111 -log stripe-calls.jsonl
//
// Once it listens it prints "listening on http://HOST:PORT" on stdout. It
// stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"shop/internal/striperec"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the address to listen on (port 0: a free one)")
	target := flag.String("target", "", "stripe-mock's URL")
	logPath := flag.String("log", "", "the file the calls are appended to")
	flag.Parse()
	if *target == "" || *logPath == "" {
		fmt.Fprintln(os.Stderr, "stripe-recorder: -target and -log are required")
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*listen, *target, *logPath); err != nil {
		fmt.Fprintln(os.Stderr, "stripe-recorder:", err)
		os.Exit(1)
	}
}

func run(listen, target, logPath string) error {
	rec, err := striperec.New(target, logPath)
	if err != nil {
		return err
	}
	defer rec.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := &http.Server{Handler: rec, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Printf("listening on http://%s\n", ln.Addr())
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
