package handler

import (
	"log/slog"

	"shop/internal/payments"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// addRoutes is the public API at a glance: what buyers, product pages and
// balancers reach. The operators' routes are not here, and answer 404.
func addRoutes(r *gin.Engine, d Deps, m *metrics, lim *limiter) {
	// observe outside recovery: a panic, answered 500 by recovery, is
	// logged and counted like any other request.
	r.Use(observe(d.Logger, m, slog.LevelDebug), recovery(d.Logger))
	r.NoRoute(func(c *gin.Context) { writeError(c, errRouteNotFound) })
	r.NoMethod(func(c *gin.Context) { writeError(c, errMethodNotAllowed) })

	r.GET("/healthz", handleHealthz())
	r.GET("/readyz", handleReadyz(d.Ready, d.Stopping))
	r.GET("/openapi.json", handleOpenAPI())

	// The payment provider's events: signed, not a buyer's, and sent in
	// bursts from few addresses exactly at pay_by, so no per-client limit
	// applies; the signature, checked first, and the body's bound do.
	if d.Verifier != nil && d.Payments != nil {
		r.POST(paymentsPath(d.Verifier.Provider()), handlePaymentEvent(d.Verifier, d.Payments, m, d.Logger))
	}

	// Everything below is limited per client address (SHOP_RATE_IP); the
	// balancers' probes above are not.
	api := r.Group("/api/v1", lim.perClient())
	// The buyer routes: authenticate comes first, before the body is
	// read, and handlers learn who the buyer is from buyer.
	buyers := api.Group("", authenticate(d.Auth, d.Logger))
	buyers.POST("/orders", jsonBody(), handlePlaceOrder(d.Orders, d.Replays, d.Filter, lim, m))
	buyers.GET("/orders/:id", handleGetOrder(d.Lifecycle, d.Auth != nil, lim))
	if d.Checkouts != nil {
		buyers.POST("/orders/:id/checkout", jsonBody(), handleCheckout(d.Checkouts, lim))
	}
	buyers.POST("/orders/:id/cancel", jsonBody(), handleCancel(d.Lifecycle, lim, m))
	api.GET("/products/:id", handleProduct(d.Products, d.Pages))
	api.GET("/products/:id/stock", handleStock(d.Stock, d.Filter))
}

// addAdminRoutes is the operators' API: the admin routes, behind the
// token, and the metrics, on a listener of their own (SHOP_ADMIN_ADDR).
// Every request is logged at info, with its request id.
func addAdminRoutes(r *gin.Engine, d Deps, token string, m *metrics, lim *limiter) {
	r.Use(observe(d.Logger, m, slog.LevelInfo), recovery(d.Logger))
	r.NoRoute(func(c *gin.Context) { writeError(c, errRouteNotFound) })
	r.NoMethod(func(c *gin.Context) { writeError(c, errMethodNotAllowed) })

	r.GET("/metrics", gin.WrapH(promhttp.HandlerFor(d.Registry, promhttp.HandlerOpts{})))
	admin := r.Group("/api/v1/admin", requireAdmin(token, lim, d.Logger))
	admin.POST("/seed", jsonBody(), handleSeed(d.Seeder))
	admin.PATCH("/products/:id", jsonBody(), handleChangeProduct(d.Admin))
	admin.GET("/refunds", handleRefunds(d.Refunds))
	if d.Events != nil {
		admin.GET("/events", handleEvents(d.Events))
		admin.POST("/events/:event_id/redeliver", handleRedeliver(d.Events))
	}
	if d.Payments != nil {
		provider := ""
		if d.Verifier != nil {
			provider = d.Verifier.Provider()
		}
		admin.POST("/refunds/:refund_id/settle", jsonBody(), handleSettle(d.Payments, provider))
	}
}

// paymentsPath is the route of provider's events.
func paymentsPath(provider string) string {
	if provider == payments.ProviderStripe {
		return "/api/v1/payments/stripe"
	}
	return "/api/v1/payments/events"
}
