package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// defaultDrain is SHOP_DRAIN's default: how long a stopping replica, which
// accepts no new connection, keeps serving those it has before Shutdown. It
// must stay above the idle timeout of the balancer's keep-alive connections
// to the replica (nginx's upstream keepalive_timeout, 2s in
// deploy/nginx.conf): by then the balancer has closed every connection it
// was not using.
const defaultDrain = 5 * time.Second

// drainer takes a replica out of service without dropping a request a
// balancer has written to it.
//
// http.Server.Shutdown closes idle connections at once; a balancer that picked
// one of them for a request a moment earlier gets its request refused with a
// reset, and may not retry it elsewhere (nginx retries no POST that was sent).
// So before Shutdown the replica drains:
//
//   - it stops accepting at once: a connection refused is one the balancer
//     never sent a request on, so it tries another replica, POST included
//     (nginx's proxy_next_upstream error), and leaves this one out. This is
//     done first, while the balancer still reuses its keep-alive
//     connections rather than opening new ones: a connection that reaches
//     the listener's queue in the instant it closes is reset after its
//     request was written, the one loss no replica can undo, and waiting
//     would only make new connections more frequent (below);
//   - /readyz answers 503 on the connections still open;
//   - every response carries "Connection: close", and the server closes the
//     connection after it;
//   - it keeps serving until no connection is open or the drain period
//     ends. A connection in use is closed after its next response; an idle
//     one by the balancer, whose idle timeout is shorter than the period.
//     No idle connection is closed under a request.
//
// A readiness-checking balancer (Kubernetes) must have stopped routing to
// the replica before the signal (a preStop delay), since the listener closes
// with it.
type drainer struct {
	draining atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// closed is signalled when a connection closes.
	closed chan struct{}
}

func newDrainer() *drainer {
	return &drainer{conns: map[net.Conn]struct{}{}, closed: make(chan struct{}, 1)}
}

// Draining reports whether the drain has begun; /readyz answers 503 then.
func (d *drainer) Draining() bool { return d.draining.Load() }

// track is the server's ConnState hook: it keeps the set of open
// connections.
func (d *drainer) track(c net.Conn, state http.ConnState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch state {
	case http.StateNew:
		d.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(d.conns, c)
		select {
		case d.closed <- struct{}{}:
		default:
		}
	}
}

// open returns how many connections are open.
func (d *drainer) open() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns)
}

// handler wraps h: every response whose header is written once the drain has
// begun asks the client to close its connection, and the server closes it
// after the response — a request that began before the drain included, or
// its connection would go back to idle for Shutdown to close.
// SetKeepAlivesEnabled(false) is not used for this: it also closes every
// idle connection at once, which is the race the drain avoids.
func (d *drainer) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&closingWriter{ResponseWriter: w, d: d}, r)
	})
}

// closingWriter adds "Connection: close" to a response whose header is
// written during the drain.
type closingWriter struct {
	http.ResponseWriter
	d     *drainer
	wrote bool
}

func (w *closingWriter) header() {
	if !w.wrote {
		w.wrote = true
		if w.d.draining.Load() {
			w.Header().Set("Connection", "close")
		}
	}
}

func (w *closingWriter) WriteHeader(code int) {
	w.header()
	w.ResponseWriter.WriteHeader(code)
}

func (w *closingWriter) Write(p []byte) (int, error) {
	w.header()
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// drain begins the drain, closing ln, and returns when no connection is
// open or period has passed, whichever comes first.
func (d *drainer) drain(log *slog.Logger, ln net.Listener, period time.Duration) {
	d.draining.Store(true)
	if err := ln.Close(); err != nil {
		log.Warn("draining: close the listener", "err", err)
	}
	log.Info("draining: no new connections; /readyz answers 503 and every response closes its connection",
		"open_connections", d.open(), "period", period.String())
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), period)
	defer cancel()
	for d.open() > 0 {
		select {
		case <-d.closed:
		case <-ctx.Done():
			log.Info("drain period over", "open_connections", d.open(), "waited", time.Since(start).String())
			return
		}
	}
	log.Info("drained: no connection open", "waited", time.Since(start).String())
}
