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
		if err := seeder.Seed(c.Request.Context(), *req.Products, *req.Stock); err != nil {
			writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, seedResponse{Products: *req.Products, Stock: *req.Stock})
	}
}
