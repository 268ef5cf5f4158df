package handler

import (
	"context"
	"log/slog"

	"shop/internal/outbox"
	"shop/internal/payments"
	"shop/internal/stock"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
)

// OpenAPI is the embedded description, for the tests of package handler_test.
var OpenAPI = openAPI

// Routes returns the routes of both listeners, as gin has them: the
// public's (addRoutes) and the operators' (addAdminRoutes). Some routes
// exist only with a dependency, and the payment events' route depends on
// the provider, so the routes are those of every dependency set, with each
// provider in turn. The dependencies are only registered, never called.
func Routes() (public, admin gin.RoutesInfo) {
	gin.SetMode(gin.ReleaseMode)
	for _, v := range []payments.Verifier{&payments.Standard{}, &payments.Stripe{}} {
		d := Deps{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(),
			Verifier: v, Payments: (*stock.Service)(nil), Checkouts: (*stock.Service)(nil), Events: (*outbox.Store)(nil)}
		m := newMetrics(d.Registry)
		lim := newLimiter(nil, Limits{}, d.Logger, d.Registry)
		pr, ar := gin.New(), gin.New()
		addRoutes(pr, d, m, lim)
		addAdminRoutes(ar, d, "", m, lim)
		public, admin = append(public, pr.Routes()...), append(admin, ar.Routes()...)
	}
	return public, admin
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
