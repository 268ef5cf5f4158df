package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/stock"
)

// Lifecycle is what a buyer does with an order after it was placed:
// cancel it, and read it back; *stock.Service implements it. Payments come
// from the provider (Payments), never from the buyer. Order is a read that
// anyone may have sent (SHOP_AUTH=none), under the public reads' bound;
// BuyerOrder one by a buyer a bearer token names, under the lifecycle's own
// bound, which cancellations take too.
type Lifecycle interface {
	Order(ctx context.Context, user, id int64) (stock.Order, error)
	BuyerOrder(ctx context.Context, user, id int64) (stock.Order, error)
	Cancel(ctx context.Context, user, id int64) (stock.Order, error)
}

// buyerRequest is the body of a buyer's action on one of its orders
// (cancel, checkout): the buyer, when SHOP_AUTH does not name it.
type buyerRequest struct {
	UserID *int64 `json:"user_id"`
}

// lifecycleTimeout bounds a payment event, a checkout or a cancellation,
// lock wait included.
const lifecycleTimeout = stock.TurnTimeout

// newOrderResponse is o as its buyer sees it.
func newOrderResponse(o stock.Order) orderResponse {
	r := orderResponse{
		OrderID:   o.ID,
		SKUID:     o.SKUID,
		UserID:    o.UserID,
		CreatedAt: o.CreatedAt.UTC().Format(time.RFC3339Nano),
		Status:    o.Status,
		PaymentID: o.PaymentID,
		Amount:    o.AmountCents,
		Currency:  o.Currency,
	}
	if o.PayBy != nil {
		t := o.PayBy.UTC().Format(time.RFC3339Nano)
		r.PayBy = &t
	}
	return r
}

// writeOrder answers status with o, encoded straight into the body
// rather than through gin's renderer, which costs two values more on the
// heap for each order.
func writeOrder(c *gin.Context, status int, o stock.Order) {
	body, err := json.Marshal(newOrderResponse(o))
	if err != nil { // strings and numbers always encode
		writeError(c, fmt.Errorf("encoding order %d: %w", o.ID, err))
		return
	}
	writeJSON(c, status, body)
}

// handleGetOrder answers the buyer's order with its status; another
// buyer's is 404, as one that does not exist. With authentication on
// (authenticated), the buyer is the token's subject: the read is one of
// their actions (perAction), through the lifecycle's bound, so that a
// buyer watching an order near pay_by is answered whatever anonymous reads
// do. Without it anyone may send it, and it is a public read.
func handleGetOrder(orders Lifecycle, authenticated bool, lim *limiter) gin.HandlerFunc {
	return func(c *gin.Context) {
		id, err := pathID(c)
		if err != nil {
			writeError(c, err)
			return
		}
		var claimed *int64
		if v, ok := c.GetQuery("user_id"); ok {
			u, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeError(c, invalid("user_id must be a positive integer"))
				return
			}
			claimed = &u
		}
		user, err := buyer(c, claimed)
		if err != nil {
			writeError(c, err)
			return
		}
		read := orders.Order
		if authenticated {
			if err := lim.perAction(c, user); err != nil {
				writeError(c, err)
				return
			}
			read = orders.BuyerOrder
		}
		o, err := read(c.Request.Context(), user, id)
		if err != nil {
			writeError(c, err)
			return
		}
		writeOrder(c, http.StatusOK, o)
	}
}

// handleCancel cancels a reservation; its unit goes back to the sale.
func handleCancel(orders Lifecycle, lim *limiter, m *metrics) gin.HandlerFunc {
	return orderAction(lim, m.cancellations, "cancelled", func(ctx context.Context, user, id int64) (orderResponse, error) {
		o, err := orders.Cancel(ctx, user, id)
		return newOrderResponse(o), err
	})
}

// orderAction is the handler of a buyer's action on one of its orders: it
// reads the order's id and the body (buyerRequest), finds the buyer, takes
// the action from the buyer's allowance (perAction), runs act within
// lifecycleTimeout, counts its outcome in results (done when it succeeded;
// nil results count nothing), and answers 200 with what act returned.
func orderAction[T any](lim *limiter, results *prometheus.CounterVec, done string, act func(ctx context.Context, user, id int64) (T, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		id, err := pathID(c)
		if err != nil {
			writeError(c, err)
			return
		}
		var req buyerRequest
		if err := decode(c, &req); err != nil {
			writeError(c, err)
			return
		}
		user, err := buyer(c, req.UserID)
		if err == nil {
			// Counted in shop_rate_limit_total, not in results.
			err = lim.perAction(c, user)
		}
		if err != nil {
			writeError(c, err)
			return
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), lifecycleTimeout)
		defer cancel()
		res, err := act(ctx, user, id)
		if results != nil {
			results.WithLabelValues(outcome(err, done)).Inc()
		}
		if err != nil {
			writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, res)
	}
}

// outcome is the metrics label of a request that ended with err: its error
// code, or ok when it succeeded.
func outcome(err error, ok string) string {
	if err == nil {
		return ok
	}
	_, code, _ := status(err)
	return code
}
