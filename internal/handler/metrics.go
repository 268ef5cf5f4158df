package handler

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	orders   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_http_requests_total",
			Help: "HTTP requests by method, route and status.",
		}, []string{"method", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shop_http_request_duration_seconds",
			Help:    "HTTP request latency by method and route.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
		}, []string{"method", "route"}),
		orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_orders_total",
			Help: "Order attempts by outcome: created, replayed or the error code.",
		}, []string{"result"}),
	}
	reg.MustRegister(m.requests, m.duration, m.orders)
	return m
}
