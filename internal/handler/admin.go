package handler

import (
	"net/http"

	"github.com/gin-gonic/gin"
)

type seedRequest struct {
	Products *int64 `json:"products"`
	Stock    *int64 `json:"stock"`
}

type seedResponse struct {
	Products int64 `json:"products"`
	Stock    int64 `json:"stock"`
}

// seedLimit bounds the catalog the admin API may create in one call.
const seedLimit = 1_000_000

func handleSeed(seeder Seeder) gin.HandlerFunc {
	return func(c *gin.Context) {
		var req seedRequest
		if err := decode(c, &req); err != nil {
			writeError(c, err)
			return
		}
		switch {
		case req.Products == nil || req.Stock == nil:
			writeError(c, invalid("products and stock are required"))
			return
		case *req.Products < 0 || *req.Products > seedLimit:
			writeError(c, invalid("products must be between 0 and 1000000"))
			return
		case *req.Stock < 0 || *req.Stock > 1_000_000_000:
			writeError(c, invalid("stock must be between 0 and 1000000000"))
			return
		}
		if err := seeder.Seed(c.Request.Context(), int(*req.Products), int(*req.Stock)); err != nil {
			writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, seedResponse{Products: *req.Products, Stock: *req.Stock})
	}
}
