package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"shop/internal/failpoint"
	"shop/internal/outbox"
	"shop/internal/payments"
)

// eventsConfig is where a replica's relay delivers the outbox's events
// (docs/events.md). Whether events are written is the database's word
// (outbox_switch), not this: a replica without a URL writes them once they
// are on, and only does not relay.
type eventsConfig struct {
	// URL is SHOP_EVENTS_URL; empty for no relay.
	URL string
	// Signer signs each attempt with SHOP_EVENTS_SECRET.
	Signer *standardwebhooks.Webhook
	// Timeout, MaxBackoff, Concurrency, MaxAge and Retain are the relay's
	// (outbox.Relay).
	Timeout     time.Duration
	MaxBackoff  time.Duration
	Concurrency int
	MaxAge      time.Duration
	Retain      time.Duration
}

// The bounds of the SHOP_EVENTS_* settings.
const (
	maxEventsTimeout     = time.Minute
	maxEventsConcurrency = 256
	maxEventsAge         = 30 * 24 * time.Hour
	maxEventsRetain      = 365 * 24 * time.Hour
)

// events reads the SHOP_EVENTS_* settings.
func (e *environ) events() eventsConfig {
	c := eventsConfig{
		URL:         e.getenv("SHOP_EVENTS_URL"),
		Timeout:     e.between("SHOP_EVENTS_TIMEOUT", "5s", 100*time.Millisecond, maxEventsTimeout),
		MaxBackoff:  e.between("SHOP_EVENTS_MAX_BACKOFF", "5m", time.Second, 24*time.Hour),
		Concurrency: e.count("SHOP_EVENTS_CONCURRENCY", "16", maxEventsConcurrency, "the default, 16"),
		MaxAge:      e.days("SHOP_EVENTS_MAX_AGE", "24h", time.Minute, maxEventsAge),
		Retain:      e.days("SHOP_EVENTS_RETAIN", "7d", time.Minute, maxEventsRetain),
	}
	secret := e.getenv("SHOP_EVENTS_SECRET")
	switch {
	case c.URL == "" && secret != "":
		e.bad("SHOP_EVENTS_SECRET: set without SHOP_EVENTS_URL, where the events would go")
	case c.URL == "":
	case secret == "":
		e.bad("SHOP_EVENTS_SECRET: not set, and SHOP_EVENTS_URL is: every event is signed (Standard Webhooks, whsec_ + base64)")
	default:
		if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			e.bad("SHOP_EVENTS_URL: must be an http or https URL")
		}
		signer, err := eventSigner(secret)
		if err != nil {
			e.bad("SHOP_EVENTS_SECRET: %w", err)
		}
		c.Signer = signer
	}
	return c
}

// eventSigner is the signer of secret: one whsec_ secret, of the length
// incoming events' secrets must have.
func eventSigner(secret string) (*standardwebhooks.Webhook, error) {
	if strings.Contains(secret, ",") {
		return nil, fmt.Errorf("one secret signs; a list is for verifying")
	}
	key, err := payments.DecodeSecret(secret)
	if err != nil {
		return nil, err
	}
	return standardwebhooks.NewWebhookRaw(key)
}

// days is name's duration from min to max, written as Go writes one
// ("36h") or in days ("7d").
func (e *environ) days(name, def string, min, max time.Duration) time.Duration {
	v := e.get(name, def)
	d, err := time.ParseDuration(v)
	if n, ok := strings.CutSuffix(v, "d"); ok {
		var days int
		days, err = strconv.Atoi(n)
		d = time.Duration(days) * 24 * time.Hour
	}
	if err != nil || d < min || d > max {
		e.bad("%s=%q: must be a duration from %s to %s, like %s or 7d", name, v, min, max, def)
	}
	return d
}

// runRelay turns events on and starts the replica's relay on its events
// pool, when SHOP_EVENTS_URL is set, and returns what stops it. Its
// metrics are registered either way, so that dashboards find them.
func runRelay(ctx context.Context, cfg eventsConfig, store *outbox.Store, hooks failpoint.Hooks, reg prometheus.Registerer,
	log *slog.Logger) func() {
	deliveries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_events_deliveries_total",
		Help: "This replica's attempts at delivering events, by result: delivered, rejected (an answer other than 2xx), failed (no answer), dead (undelivered past SHOP_EVENTS_MAX_AGE).",
	}, []string{"result"})
	pending := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "shop_events_pending",
		Help: "Events in the outbox not delivered yet (as this replica's relay last measured).",
	})
	oldest := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "shop_events_oldest_pending_seconds",
		Help: "Age of the oldest pending event whose age counts (not held behind a dead event of its order).",
	})
	dead := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "shop_events_dead",
		Help: "Events marked dead: undelivered past SHOP_EVENTS_MAX_AGE, kept until an operator redelivers them.",
	})
	reg.MustRegister(deliveries, pending, oldest, dead)
	if cfg.URL == "" {
		return func() {}
	}
	r := &outbox.Relay{
		Store: store, URL: cfg.URL, Signer: cfg.Signer, Logger: log,
		Timeout: cfg.Timeout, MaxBackoff: cfg.MaxBackoff, Concurrency: cfg.Concurrency, MaxAge: cfg.MaxAge, Retain: cfg.Retain,
		Metrics: outbox.Metrics{
			Delivery: func(result string) { deliveries.WithLabelValues(result).Inc() },
			Figures: func(f outbox.Figures) {
				pending.Set(float64(f.Pending))
				oldest.Set(f.Oldest.Seconds())
				dead.Set(float64(f.Dead))
			},
		},
		Hooks: outbox.Hooks{BetweenPostAndMark: hooks.BetweenEventPostAndMark},
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if enableEvents(runCtx, store, log) {
			r.Run(runCtx)
		}
	}()
	return func() { stop(); <-done }
}

// enableEvents turns events on, trying again until it can or ctx ends,
// and reports whether they are on.
func enableEvents(ctx context.Context, store *outbox.Store, log *slog.Logger) bool {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		turned, err := store.Enable(ctx)
		if err == nil {
			if turned {
				log.InfoContext(ctx, "events turned on: every replica writes them from now on")
			}
			return true
		}
		log.WarnContext(ctx, "events: turn them on", "err", err, "again_in", wait)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}
