package handler

import (
	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// addRoutes is the whole API at a glance.
func addRoutes(r *gin.Engine, d Deps) {
	m := newMetrics(d.Registry)
	// observe outside recovery: a panic, answered 500 by recovery, is
	// logged and counted like any other request.
	r.Use(observe(d.Logger, m), recovery(d.Logger))
	r.NoRoute(func(c *gin.Context) { writeError(c, errRouteNotFound) })
	r.NoMethod(func(c *gin.Context) { writeError(c, errMethodNotAllowed) })

	r.GET("/healthz", handleHealthz())
	r.GET("/readyz", handleReadyz(d.Ready, d.Stopping))
	r.GET("/metrics", gin.WrapH(promhttp.HandlerFor(d.Registry, promhttp.HandlerOpts{})))
	r.GET("/openapi.json", handleOpenAPI())

	api := r.Group("/api/v1")
	// The buyer routes: authenticate comes first, before the body is
	// read, and handlers learn who the buyer is from buyer.
	buyers := api.Group("", authenticate(d.Auth))
	buyers.POST("/orders", jsonBody(), handlePlaceOrder(d.Orders, m))
	buyers.GET("/orders/:id", handleGetOrder(d.Lifecycle))
	buyers.POST("/orders/:id/pay", jsonBody(), handlePay(d.Lifecycle, m))
	buyers.POST("/orders/:id/cancel", jsonBody(), handleCancel(d.Lifecycle, m))
	api.GET("/products/:id", handleProduct(d.Products))
	api.GET("/products/:id/stock", handleStock(d.Stock))
	api.POST("/admin/seed", requireAdmin(d.AdminToken), jsonBody(), handleSeed(d.Seeder))
	api.PATCH("/admin/products/:id", requireAdmin(d.AdminToken), jsonBody(), handleChangeProduct(d.Admin))
	api.GET("/admin/refunds", requireAdmin(d.AdminToken), handleRefunds(d.Refunds))
}
