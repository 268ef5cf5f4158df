package main

import (
	"shop/internal/lock"
	"shop/internal/stock"

	"github.com/prometheus/client_golang/prometheus"
)

// What a replica exports of its order path beyond what its parts register
// themselves.

// registerOrderStats exports how orders are grouped into transactions.
func registerOrderStats(reg prometheus.Registerer, stats func() stock.Stats) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shop_order_transactions_total",
			Help: "Order transactions run; each places one batch of a SKU's orders.",
		}, func() float64 { return float64(stats().Batches) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shop_order_transaction_orders_total",
			Help: "Orders decided in those transactions (sold, refused or replayed); divided by the transactions, the mean batch.",
		}, func() float64 { return float64(stats().Orders) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_orders_queued",
			Help: "Orders waiting to be taken into a batch of their SKU.",
		}, func() float64 { return float64(stats().Queued) }),
	)
}

// registerLockStats exports what the order lock's waiters do.
func registerLockStats(reg prometheus.Registerer, stats func() lock.Stats) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shop_lock_attempts_total",
			Help: "Tries to take an order lock in Redis.",
		}, func() float64 { return float64(stats().Attempts) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shop_lock_wakeups_total",
			Help: "Retries of a waiter woken by an announced release rather than by its backoff.",
		}, func() float64 { return float64(stats().Wakeups) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_lock_waiting",
			Help: "Orders waiting for their SKU lock now.",
		}, func() float64 { return float64(stats().Waiting) }),
	)
}

// registerTransitions registers the counter of orders by the status they
// reached, and of refunds owed, exported at 0 from the start.
func registerTransitions(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_order_status_total",
		Help: "Orders as they reach a status: reserved or paid when placed, paid by a payment, cancelled, expired (their units back in the sale); refund_owed counts payments that came too late and are owed back.",
	}, []string{"status"})
	reg.MustRegister(c)
	for _, s := range []string{stock.StatusReserved, stock.StatusPaid, stock.StatusCancelled, stock.StatusExpired, "refund_owed"} {
		c.WithLabelValues(s)
	}
	return c
}
