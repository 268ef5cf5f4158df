package handler

import (
	"net/http"

	"github.com/gin-gonic/gin"
)

type seedRequest struct {
	Products *int `json:"products"`
	Stock    *int `json:"stock"`
}

type seedResponse struct {
	Products int `json:"products"`
	Stock    int `json:"stock"`
	// Warnings say what did not follow the seed, which stands all the
	// same; absent when everything did.
	Warnings []string `json:"warnings,omitempty"`
}

func handleSeed(seeder Seeder) gin.HandlerFunc {
	return func(c *gin.Context) {
		var req seedRequest
		if err := decode(c, &req); err != nil {
			writeError(c, err)
			return
		}
		if req.Products == nil || req.Stock == nil {
			writeError(c, invalid("products and stock are required"))
			return
		}
		warnings, err := seeder.Seed(c.Request.Context(), *req.Products, *req.Stock)
		if err != nil {
			writeError(c, err)
			return
		}
		// A seed that committed is a success even if what follows it failed:
		// a 503 would invite a retry, and a second seed deletes the orders
		// placed since the first.
		c.JSON(http.StatusOK, seedResponse{Products: *req.Products, Stock: *req.Stock, Warnings: warnings})
	}
}
