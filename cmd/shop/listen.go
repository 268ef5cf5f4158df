package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

const (
	// shutdownTimeout is how long in-flight requests get to finish once the
	// drain is over.
	shutdownTimeout = 30 * time.Second
	// writeTimeout bounds a request from the end of its headers to the end
	// of its response: above handler.OrderBudget, so that an order is never
	// cut off by the server itself.
	writeTimeout = 30 * time.Second
	// maxHeaderBytes bounds a request's line and headers on the public and
	// the admin listener (net/http's default is 1 MiB, which every
	// connection may make a replica read and hold): twice nginx's largest
	// header buffer by default, room for any bearer token a gateway
	// issues. Beyond it the server answers 431. net/http reads up to 4 KiB
	// more before it tells.
	maxHeaderBytes = 16 << 10
)

// listen serves r on cfg's listeners until ctx ends, then takes it out of
// service: first the drain (no new connections, /readyz answers 503 and
// connections close after their next response; see drainer), then
// Shutdown, which closes the connections left idle and waits for in-flight
// requests; their contexts are not cancelled, so orders under way commit or
// roll back and are answered. main turns a second signal into an immediate
// exit.
func listen(ctx context.Context, cfg config, r *app, log *slog.Logger) error {
	ln, err := net.Listen("tcp", cfg.Listen.HTTP)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := &http.Server{
		Handler:           r.drain.handler(r.handlers.Public),
		ConnState:         r.drain.track,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	adminSrv, adminAddr, err := serveAdmin(cfg.Listen.Admin, r.handlers.Admin, log)
	if err != nil {
		ln.Close()
		return err
	}
	defer adminSrv.Close()
	log.Info("admin listener", "addr", adminAddr)
	logSettings(log, ln.Addr().String(), cfg)
	warnSettings(log, cfg)
	if cfg.Listen.Debug != "" {
		dbg, addr, err := serveDebug(cfg.Listen.Debug)
		if err != nil {
			ln.Close()
			return err
		}
		defer dbg.Close()
		log.Info("debug listener", "addr", addr)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	log.Info("stopping: a second signal exits at once")
	r.drain.drain(log, ln, cfg.Stop.Drain)
	log.Info("shutting down: closing idle connections, waiting for in-flight requests", "timeout", shutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	// The drain closed the listener already; Shutdown may find it closed.
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve: shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("stopped")
	return nil
}

// logSettings logs, as a replica starts listening on addr, the settings it
// serves with.
func logSettings(log *slog.Logger, addr string, cfg config) {
	log.Info("listening", "addr", addr, "drain", cfg.Stop.Drain.String(), "redis", cfg.Redis.topology(),
		"lock_mode", cfg.Lock.Mode, "lock_ttl", cfg.Lock.TTL.String(), "lock_wait", cfg.Lock.Wait.String(),
		"stock_update", cfg.Orders.StockUpdate, "fencing", cfg.Lock.Fencing, "order_batch", cfg.Orders.Batch, "order_group", cfg.Orders.Group,
		"cache_ttl", cfg.Cache.TTL.String(), "cache_jitter", cfg.Cache.Jitter, "null_ttl", cfg.Cache.NullTTL.String(), "bloom", cfg.Cache.Bloom,
		"user_limit", cfg.Orders.UserLimit, "pay_window", cfg.Orders.PayWindow.String(), "sweep_interval", cfg.Orders.SweepInterval.String(),
		"auth", cfg.Buyers.Auth, "rate_user", cfg.Buyers.RateUser, "rate_user_burst", cfg.Buyers.RateUserBurst, "rate_ip", cfg.Buyers.RateIP,
		"trusted_proxies", cfg.Buyers.TrustedProxies, "ready_grace", cfg.Stop.ReadyGrace.String())
}

// warnSettings warns, as a replica starts, of settings that it serves
// with but that are unsafe where clients other than the host's own reach
// it; each line names the variables to change.
func warnSettings(log *slog.Logger, cfg config) {
	public := !loopback(cfg.Listen.HTTP)
	if public && cfg.Buyers.Auth == "none" {
		log.Warn("SHOP_AUTH=none on a listener that is not loopback: any client can place, read and cancel orders as any user_id; "+
			"set SHOP_AUTH=jwt (docs/auth.md)", "addr", cfg.Listen.HTTP)
	}
	if n := len(cfg.Listen.AdminToken); n > 0 && n < goodAdminToken {
		log.Warn("SHOP_ADMIN_TOKEN is short: use at least 32 random characters, it can reset the catalog", "characters", n, "advised", goodAdminToken)
	}
	if public && cfg.Buyers.RateIP > 0 && onlyLoopback(cfg.Buyers.TrustedProxies) {
		log.Warn("SHOP_RATE_IP is on, and SHOP_TRUSTED_PROXIES trusts only loopback on a listener that is not loopback: "+
			"a proxy in front of the replica on another host is taken for the client, and every buyer behind it shares one limit; "+
			"set SHOP_TRUSTED_PROXIES to the proxies' addresses", "addr", cfg.Listen.HTTP, "trusted_proxies", cfg.Buyers.TrustedProxies)
	}
}

// onlyLoopback reports whether proxies, addresses and CIDR ranges as
// trustedProxies reads them, are some and all of them loopback: a range's
// first and last address both are.
func onlyLoopback(proxies []string) bool {
	for _, p := range proxies {
		first, last := net.ParseIP(p), net.ParseIP(p)
		if _, n, err := net.ParseCIDR(p); err == nil {
			first, last = n.IP, make(net.IP, len(n.IP))
			for i := range n.IP {
				last[i] = n.IP[i] | ^n.Mask[i]
			}
		}
		if first == nil || !first.IsLoopback() || !last.IsLoopback() {
			return false
		}
	}
	return len(proxies) > 0
}

// serveDebug serves net/http/pprof on addr, apart from the public API, and
// returns the server and the address it listens on: addr's port 0 becomes
// the port the system chose.
func serveDebug(addr string) (*http.Server, string, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("serve: debug listener: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}

// serveAdmin serves the operators' API on addr, apart from the public
// listener, and returns the server and the address it listens on: addr's
// port 0 becomes the port the system chose, which the caller logs, so that
// several replicas on one host never collide. It is closed, not drained,
// when the replica stops: nothing on it is a buyer's.
func serveAdmin(addr string, h http.Handler, log *slog.Logger) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("serve: admin listener: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		// A seed rebuilds the Bloom filter before it answers
		// (seedFollowUpTimeout).
		WriteTimeout:   time.Minute,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: maxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}
