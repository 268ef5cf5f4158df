package handler

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"shop/internal/stock"
)

// productResponse is a product as its page shows it. The window's keys
// are always there: null is an open side.
type productResponse struct {
	SKUID        int64      `json:"sku_id"`
	Name         string     `json:"name"`
	PriceCents   int64      `json:"price_cents"`
	Stock        int        `json:"stock"`
	SaleStartsAt *time.Time `json:"sale_starts_at"`
	SaleEndsAt   *time.Time `json:"sale_ends_at"`
}

type stockResponse struct {
	SKUID int64 `json:"sku_id"`
	Stock int   `json:"stock"`
}

func handleProduct(products Products) gin.HandlerFunc {
	return func(c *gin.Context) {
		id, err := pathID(c)
		if err != nil {
			writeError(c, err)
			return
		}
		p, err := products.Product(c.Request.Context(), id)
		if err != nil {
			writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, newProductResponse(p))
	}
}

// newProductResponse is p as its page shows it, times in UTC.
func newProductResponse(p stock.Product) productResponse {
	return productResponse{SKUID: p.ID, Name: p.Name, PriceCents: p.PriceCents, Stock: p.Stock,
		SaleStartsAt: utc(p.SaleStartsAt), SaleEndsAt: utc(p.SaleEndsAt)}
}

// handleStock answers the stock as MySQL has it now, but for an id filter
// rules out (a Bloom filter of the products): that is 404 without a read
// of MySQL, so that a flood of made-up ids costs MySQL nothing.
func handleStock(stock Stock, filter Filter) gin.HandlerFunc {
	return func(c *gin.Context) {
		id, err := pathID(c)
		if err != nil {
			writeError(c, err)
			return
		}
		if filter != nil {
			if err := filter.RuleOut(c.Request.Context(), id); err != nil {
				writeError(c, err)
				return
			}
		}
		n, err := stock.Stock(c.Request.Context(), id)
		if err != nil {
			writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, stockResponse{SKUID: id, Stock: n})
	}
}
