package handler

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/lock"
	"shop/internal/stock"
)

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	orders   *prometheus.CounterVec
	busy     *prometheus.CounterVec
	// paymentEvents counts the provider's events; cancellations /cancel
	// by outcome.
	paymentEvents *prometheus.CounterVec
	cancellations *prometheus.CounterVec
	// codes are the status codes' labels, formatted once rather than
	// for each request.
	codes [600]string
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_http_requests_total",
			Help: "HTTP requests by method (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS or other), route and status; 499 is a client that went away before the answer.",
		}, []string{"method", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shop_http_request_duration_seconds",
			Help:    "HTTP request latency by method and route.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
		}, []string{"method", "route"}),
		orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_orders_total",
			Help: "Order attempts by outcome: created, replayed or the error code (client_closed_request: the buyer went away first).",
		}, []string{"result"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_orders_busy_total",
			Help: "Orders answered 503 busy, by cause: lock_wait (the SKU lock was not obtained in time), " +
				"lease_lost (the lock's lease ran out during the order, which was rolled back), " +
				"stale_fence (MySQL refused the write of a holder whose token was no longer the newest), other.",
		}, []string{"cause"}),
	}
	m.paymentEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_payment_events_total",
		Help: "The payment provider's events (POST /api/v1/payments/...) by provider, type (a fixed list; other for the rest) and result: " +
			"applied, owed or conflict for a payment; refunded, failed or conflict for a refund; ignored; or the error code " +
			"(unauthorized: a bad signature; invalid_argument; busy).",
	}, []string{"provider", "type", "result"})
	m.cancellations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_cancellations_total",
		Help: "Cancellations (POST /api/v1/orders/{id}/cancel) by outcome: cancelled, or the error code.",
	}, []string{"result"})
	for code := range m.codes {
		m.codes[code] = strconv.Itoa(code)
	}
	reg.MustRegister(m.requests, m.duration, m.orders, m.busy, m.paymentEvents, m.cancellations)
	// Every cause is exported from the start, at 0, so that a dashboard's
	// rate of busy orders reads 0 rather than "no data" before the first.
	for _, cause := range busyCauses {
		m.busy.WithLabelValues(cause)
	}
	return m
}

// codeLabel is a status code as a metrics label.
func (m *metrics) codeLabel(code int) string {
	if code >= 0 && code < len(m.codes) {
		return m.codes[code]
	}
	return strconv.Itoa(code)
}

// busyCauses are the values busyCause gives.
var busyCauses = []string{"lock_wait", "lease_lost", "stale_fence", "other"}

// methodLabel is a request's method as a metrics label: one of the methods
// HTTP defines for resources, else "other". Any token is a valid method, and
// each label value is a series of its own: made-up methods must not grow
// them without bound.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return method
	}
	return "other"
}

// busyCause labels why an order was busy.
func busyCause(err error) string {
	switch {
	case errors.Is(err, stock.ErrStaleFence):
		return "stale_fence"
	case errors.Is(err, lock.ErrNotHeld):
		return "lease_lost"
	case errors.Is(err, lock.ErrNotObtained):
		return "lock_wait"
	}
	return "other"
}
