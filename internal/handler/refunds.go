package handler

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"shop/internal/stock"
)

// Refunds lists the refunds and settles them by hand (the operators'
// routes); *stock.Catalog lists, *stock.Service settles.
type Refunds interface {
	Refunds(ctx context.Context, q stock.RefundQuery) ([]stock.Refund, bool, error)
}

// refundResponse is one refund in GET /api/v1/admin/refunds and the answer
// of a settlement.
type refundResponse struct {
	RefundID  string `json:"refund_id"`
	OrderID   int64  `json:"order_id"`
	UserID    *int64 `json:"user_id"`
	SKUID     *int64 `json:"sku_id"`
	PaymentID string `json:"payment_id"`
	// AmountCents and Currency are what was received; null on refunds
	// from before amounts.
	AmountCents *int64  `json:"amount_cents"`
	Currency    *string `json:"currency"`
	// ReceivedAt and SettledAt are RFC 3339 in UTC, with as many
	// fractional digits as the time has.
	ReceivedAt       string  `json:"received_at"`
	Reason           string  `json:"reason"`
	State            string  `json:"state"`
	ProviderRefundID *string `json:"provider_refund_id"`
	SettledAt        *string `json:"settled_at"`
}

type refundsResponse struct {
	Refunds []refundResponse `json:"refunds"`
	// Next is the after= of the next page; null on the last.
	Next *string `json:"next"`
}

type settleRequest struct {
	ProviderRefundID *string `json:"provider_refund_id"`
}

func newRefundResponse(r stock.Refund) refundResponse {
	res := refundResponse{
		RefundID:         r.RefundID,
		OrderID:          r.OrderID,
		UserID:           r.UserID,
		SKUID:            r.SKUID,
		PaymentID:        r.PaymentID,
		AmountCents:      r.AmountCents,
		Currency:         r.Currency,
		ReceivedAt:       r.ReceivedAt.UTC().Format(time.RFC3339Nano),
		Reason:           r.Reason,
		State:            r.State,
		ProviderRefundID: r.ProviderRefundID,
	}
	if r.SettledAt != nil {
		t := r.SettledAt.UTC().Format(time.RFC3339Nano)
		res.SettledAt = &t
	}
	return res
}

// handleRefunds lists a page of refunds: ?state=owed|requested|refunded|
// failed (none: all), ?after=<refund_id>, ?limit=1..1000 (default 100).
func handleRefunds(refunds Refunds) gin.HandlerFunc {
	return func(c *gin.Context) {
		q := stock.RefundQuery{State: c.Query("state"), After: c.Query("after"), Limit: 100}
		if v, ok := c.GetQuery("limit"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				writeError(c, invalid("limit must be an integer between 1 and 1000"))
				return
			}
			q.Limit = n
		}
		page, more, err := refunds.Refunds(c.Request.Context(), q)
		if err != nil {
			writeError(c, err)
			return
		}
		res := refundsResponse{Refunds: make([]refundResponse, 0, len(page))}
		for _, r := range page {
			res.Refunds = append(res.Refunds, newRefundResponse(r))
		}
		if more {
			res.Next = &page[len(page)-1].RefundID
		}
		c.JSON(http.StatusOK, res)
	}
}

// handleSettle settles a refund by hand: an operator says the provider
// paid it back, with the provider's reference. Again with the same
// reference is 200; with another, 409.
func handleSettle(pay Payments, provider string) gin.HandlerFunc {
	return func(c *gin.Context) {
		var req settleRequest
		if err := decode(c, &req); err != nil {
			writeError(c, err)
			return
		}
		if req.ProviderRefundID == nil {
			writeError(c, invalid("provider_refund_id is required"))
			return
		}
		r, err := pay.Settle(c.Request.Context(), stock.Settlement{Provider: provider, RefundID: c.Param("refund_id"),
			ProviderRefundID: *req.ProviderRefundID})
		if err != nil {
			writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, newRefundResponse(r))
	}
}
