package handler

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"shop/internal/stock"
)

type seedRequest struct {
	Products *int `json:"products"`
	Stock    *int `json:"stock"`
	// SaleStartsAt and SaleEndsAt, optional, are every product's sale
	// window: RFC 3339 or null (no bound).
	SaleStartsAt json.RawMessage `json:"sale_starts_at"`
	SaleEndsAt   json.RawMessage `json:"sale_ends_at"`
	// PriceCents and Currency, optional, are every product's price
	// (default: each its own) and currency (default: SHOP_CURRENCY).
	PriceCents *int64  `json:"price_cents"`
	Currency   *string `json:"currency"`
	// DiscardRefunds lets the seed delete the refunds not yet settled;
	// without it, a seed refuses while there are any (409
	// refunds_unsettled).
	DiscardRefunds bool `json:"discard_refunds"`
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
		starts, ends, err := windowFields(req.SaleStartsAt, req.SaleEndsAt)
		if err != nil {
			writeError(c, err)
			return
		}
		o := stock.SeedOptions{Window: stock.Window{StartsAt: starts.At, EndsAt: ends.At}, DiscardRefunds: req.DiscardRefunds}
		if req.PriceCents != nil {
			if *req.PriceCents < 1 {
				writeError(c, invalid("price_cents must be a positive integer"))
				return
			}
			o.PriceCents = *req.PriceCents
		}
		if req.Currency != nil {
			o.Currency = *req.Currency
			if err := stock.CheckCurrency(o.Currency); err != nil {
				writeError(c, err)
				return
			}
		}
		warnings, err := seeder.Seed(c.Request.Context(), *req.Products, *req.Stock, o)
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

// changeProductRequest is the body of PATCH /api/v1/admin/products/{id}.
// The times are kept raw, so that a key left out (nil: unchanged) differs
// from a key given as null (clear that bound).
type changeProductRequest struct {
	SaleStartsAt json.RawMessage `json:"sale_starts_at"`
	SaleEndsAt   json.RawMessage `json:"sale_ends_at"`
	AddStock     *int            `json:"add_stock"`
	// PriceCents is the product's new price; reservations placed before
	// keep what they owe.
	PriceCents *int64 `json:"price_cents"`
}

// adminProductResponse is a product as MySQL has it after an admin's
// change.
type adminProductResponse struct {
	productResponse
	InitialStock int `json:"initial_stock"`
	// Warnings say what did not follow the change, which stands all the
	// same; absent when everything did.
	Warnings []string `json:"warnings,omitempty"`
}

func handleChangeProduct(admin ProductAdmin) gin.HandlerFunc {
	return func(c *gin.Context) {
		id, err := pathID(c)
		if err != nil {
			writeError(c, err)
			return
		}
		change, err := readChange(c)
		if err != nil {
			writeError(c, err)
			return
		}
		p, warnings, err := admin.ChangeProduct(c.Request.Context(), id, change)
		if err != nil {
			writeError(c, err)
			return
		}
		// As with a seed: once committed, the change stands, and what did
		// not follow it is a warning, not a failure to retry (a second
		// add_stock would add the units again).
		c.JSON(http.StatusOK, adminProductResponse{productResponse: newProductResponse(p), InitialStock: p.InitialStock, Warnings: warnings})
	}
}

// readChange decodes a PATCH body into the change it asks for. What
// changes nothing, or adds units out of range, is the domain's to refuse.
func readChange(c *gin.Context) (stock.Change, error) {
	var req changeProductRequest
	if err := decode(c, &req); err != nil {
		return stock.Change{}, err
	}
	starts, ends, err := windowFields(req.SaleStartsAt, req.SaleEndsAt)
	if err != nil {
		return stock.Change{}, err
	}
	return stock.Change{SaleStartsAt: starts, SaleEndsAt: ends, AddStock: req.AddStock, PriceCents: req.PriceCents}, nil
}

// windowFields reads a body's optional sale_starts_at and sale_ends_at
// (see timeField).
func windowFields(startsAt, endsAt json.RawMessage) (starts, ends stock.Bound, err error) {
	if starts, err = timeField("sale_starts_at", startsAt); err != nil {
		return stock.Bound{}, stock.Bound{}, err
	}
	if ends, err = timeField("sale_ends_at", endsAt); err != nil {
		return stock.Bound{}, stock.Bound{}, err
	}
	return starts, ends, nil
}

// timeField reads the optional time field name from its raw JSON value:
// absent (unset), null (set, no time) or an RFC 3339 string.
func timeField(name string, raw json.RawMessage) (stock.Bound, error) {
	switch {
	case raw == nil:
		return stock.Bound{}, nil
	case bytes.Equal(raw, []byte("null")):
		return stock.Bound{Set: true}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return stock.Bound{}, invalid(name + " must be an RFC 3339 time or null")
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return stock.Bound{}, invalid(name + " must be an RFC 3339 time, such as 2030-01-02T15:04:05Z, or null")
	}
	return stock.Bound{Set: true, At: &t}, nil
}

// utc is t in UTC, as the API writes every time; nil stays nil.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
