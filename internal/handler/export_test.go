package handler

import (
	"context"
	"log/slog"

	"shop/internal/stock"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
)

// OpenAPI is the embedded description, for the tests of package handler_test.
var OpenAPI = openAPI

// Routes returns the routes of both listeners, as gin has them: the
// public's (addRoutes) and the operators' (addAdminRoutes).
func Routes() (public, admin gin.RoutesInfo) {
	gin.SetMode(gin.ReleaseMode)
	d := Deps{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()}
	m := newMetrics(d.Registry)
	lim := newLimiter(nil, Limits{}, d.Logger, d.Registry)
	pr, ar := gin.New(), gin.New()
	addRoutes(pr, d, m, lim)
	addAdminRoutes(ar, d, "", m, lim)
	return pr.Routes(), ar.Routes()
}

// SeedFunc is a function that is a Seeder.
type SeedFunc func(ctx context.Context, products, units int, o stock.SeedOptions) ([]string, error)

// Seed calls f.
func (f SeedFunc) Seed(ctx context.Context, products, units int, o stock.SeedOptions) ([]string, error) {
	return f(ctx, products, units, o)
}

// ChangeProductFunc is a function that is a ProductAdmin.
type ChangeProductFunc func(ctx context.Context, id int64, c stock.Change) (stock.Product, []string, error)

// ChangeProduct calls f.
func (f ChangeProductFunc) ChangeProduct(ctx context.Context, id int64, c stock.Change) (stock.Product, []string, error) {
	return f(ctx, id, c)
}
