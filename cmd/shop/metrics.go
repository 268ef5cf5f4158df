package main

import (
	"strings"
	"time"

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

// registerSweepStats exports how far the sweep of lapsed reservations is
// behind (stock.Service.OldestLapsed).
func registerSweepStats(reg prometheus.Registerer, oldest func() time.Duration) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "shop_oldest_lapsed_reservation_seconds",
		Help: "Age past its pay_by of the oldest reservation whose unit is not back in the sale yet, as this replica's last sweep left it; 0 when there was none.",
	}, func() float64 { return oldest().Seconds() }))
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

// registerTransitions registers the counters of orders by the status they
// reached and of refunds by the state they reached, exported at 0 from the
// start, and returns stock.Deps.Transitions, which counts in them.
func registerTransitions(reg prometheus.Registerer) func(status string, n int) {
	orders := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_order_status_total",
		Help: "Orders as they reach a status: reserved or paid when placed, paid by a payment, cancelled, expired (their units back in the sale); refund_owed counts payments owed back.",
	}, []string{"status"})
	refunds := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_refunds_total",
		Help: "Refunds as they reach a state: owed (a payment recorded as owed back), refunded (settled by the provider or an operator), failed (the provider refused it: an operator must act).",
	}, []string{"state"})
	reg.MustRegister(orders, refunds)
	for _, s := range []string{stock.StatusReserved, stock.StatusPaid, stock.StatusCancelled, stock.StatusExpired, "refund_owed"} {
		orders.WithLabelValues(s)
	}
	for _, s := range []string{stock.RefundOwed, stock.RefundRefunded, stock.RefundFailed} {
		refunds.WithLabelValues(s)
	}
	return func(status string, n int) {
		if state, ok := strings.CutPrefix(status, "refund_"); ok {
			refunds.WithLabelValues(state).Add(float64(n))
			if state != stock.RefundOwed {
				return
			}
		}
		orders.WithLabelValues(status).Add(float64(n))
	}
}
