package handler

import (
	"log/slog"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
)

// OpenAPI is the embedded description, for the tests of package handler_test.
var OpenAPI = openAPI

// Routes returns the routes addRoutes registers, as gin has them.
func Routes() gin.RoutesInfo {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	addRoutes(r, Deps{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	return r.Routes()
}
