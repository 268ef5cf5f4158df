package handler

import (
	_ "embed"
	"net/http"

	"github.com/gin-gonic/gin"
)

// openAPI is the OpenAPI 3.1 description of every route, written by hand in
// openapi.json. It is served as the bytes it is: the binary carries no
// OpenAPI library. The tests keep it true: every route registered is in it
// and every operation in it is registered, and every response the handler
// tests see is checked against it (openapi_test.go).
//
//go:embed openapi.json
var openAPI []byte

func handleOpenAPI() gin.HandlerFunc {
	return func(c *gin.Context) {
		c.Data(http.StatusOK, "application/json", openAPI)
	}
}
