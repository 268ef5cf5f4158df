package handler

import (
	"context"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"shop/internal/stock"
)

type placeOrderRequest struct {
	SKUID  *int64 `json:"sku_id"`
	UserID *int64 `json:"user_id"`
}

type orderResponse struct {
	OrderID   int64  `json:"order_id"`
	SKUID     int64  `json:"sku_id"`
	UserID    int64  `json:"user_id"`
	CreatedAt string `json:"created_at"`
}

// orderTimeout bounds one order, lock wait included.
const orderTimeout = 15 * time.Second

// handlePlaceOrder answers 201 only after the order has been committed.
func handlePlaceOrder(orders Orders, m *metrics) gin.HandlerFunc {
	return func(c *gin.Context) {
		sku, user, key, err := readOrder(c)
		if err != nil {
			m.orders.WithLabelValues("rejected").Inc()
			writeError(c, err)
			return
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), orderTimeout)
		defer cancel()
		o, err := orders.PlaceOrder(ctx, sku, user, key)
		if err != nil {
			_, code, _ := status(err)
			m.orders.WithLabelValues(code).Inc()
			writeError(c, err)
			return
		}
		if o.Replayed {
			m.orders.WithLabelValues("replayed").Inc()
			c.Header("Idempotent-Replayed", "true")
		} else {
			m.orders.WithLabelValues("created").Inc()
		}
		c.JSON(http.StatusCreated, orderResponse{
			OrderID:   o.ID,
			SKUID:     o.SKUID,
			UserID:    o.UserID,
			CreatedAt: o.CreatedAt.UTC().Format(time.RFC3339Nano),
		})
	}
}

func readOrder(c *gin.Context) (sku, user int64, key string, err error) {
	keys := c.Request.Header.Values("Idempotency-Key")
	switch {
	case len(keys) > 1:
		return 0, 0, "", invalid("send at most one Idempotency-Key")
	case len(keys) == 1:
		if key = keys[0]; !stock.ValidIdempotencyKey(key) {
			return 0, 0, "", invalid("Idempotency-Key must be 1-64 characters of A-Z a-z 0-9 _ -")
		}
	}
	var req placeOrderRequest
	if err := decode(c, &req); err != nil {
		return 0, 0, "", err
	}
	if sku, err = positive("sku_id", req.SKUID); err != nil {
		return 0, 0, "", err
	}
	if user, err = positive("user_id", req.UserID); err != nil {
		return 0, 0, "", err
	}
	return sku, user, key, nil
}
