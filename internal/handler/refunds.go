package handler

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
)

// refundResponse is one refund owed in GET /api/v1/admin/refunds.
type refundResponse struct {
	OrderID   int64  `json:"order_id"`
	UserID    int64  `json:"user_id"`
	SKUID     int64  `json:"sku_id"`
	PaymentID string `json:"payment_id"`
	// ReceivedAt is RFC 3339 in UTC, with as many fractional digits as
	// the time has.
	ReceivedAt string `json:"received_at"`
	Reason     string `json:"reason"`
}

type refundsResponse struct {
	Refunds []refundResponse `json:"refunds"`
}

func handleRefunds(refunds Refunds) gin.HandlerFunc {
	return func(c *gin.Context) {
		list, err := refunds.Refunds(c.Request.Context())
		if err != nil {
			writeError(c, err)
			return
		}
		res := refundsResponse{Refunds: make([]refundResponse, 0, len(list))}
		for _, r := range list {
			res.Refunds = append(res.Refunds, refundResponse{
				OrderID:    r.OrderID,
				UserID:     r.UserID,
				SKUID:      r.SKUID,
				PaymentID:  r.PaymentID,
				ReceivedAt: r.ReceivedAt.UTC().Format(time.RFC3339Nano),
				Reason:     r.Reason,
			})
		}
		c.JSON(http.StatusOK, res)
	}
}
