package handler

import (
	"log/slog"

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
