package handler

import (
	"context"
	"encoding/json"
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
	Currency     string     `json:"currency"`
	Stock        int        `json:"stock"`
	SaleStartsAt *time.Time `json:"sale_starts_at"`
	SaleEndsAt   *time.Time `json:"sale_ends_at"`
}

type stockResponse struct {
	SKUID int64 `json:"sku_id"`
	Stock int   `json:"stock"`
}

// handleProduct answers a product's page as bytes encoded once per change
// of the product: from pages when there are (a replica's own copy), else
// from products, encoded for this request.
func handleProduct(products Products, pages Pages) gin.HandlerFunc {
	return func(c *gin.Context) {
		id, err := pathID(c)
		if err != nil {
			writeError(c, err)
			return
		}
		load := func(ctx context.Context) ([]byte, error) {
			p, err := products.Product(ctx, id)
			if err != nil {
				return nil, err
			}
			return json.Marshal(newProductResponse(p))
		}
		var page []byte
		if pages != nil {
			page, err = pages.Page(c.Request.Context(), id, load)
		} else {
			page, err = load(c.Request.Context())
		}
		if err != nil {
			writeError(c, err)
			return
		}
		c.Data(http.StatusOK, jsonContentType, page)
	}
}

// newProductResponse is p as its page shows it, times in UTC.
func newProductResponse(p stock.Product) productResponse {
	return productResponse{SKUID: p.ID, Name: p.Name, PriceCents: p.PriceCents, Currency: p.Currency, Stock: p.Stock,
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
