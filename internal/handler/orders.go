package handler

import (
	"context"
	"errors"
	"net/http"

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
	// Status is reserved (until paid or PayBy), paid, cancelled or
	// expired.
	Status string `json:"status"`
	// PayBy is when a reservation expires unless paid (RFC 3339, UTC),
	// null for an order paid when placed.
	PayBy *string `json:"pay_by"`
	// PaymentID is the payment that paid the order, absent when none did.
	PaymentID *string `json:"payment_id,omitempty"`
	// Amount and Currency are what the order owes (its product's price
	// when it was placed); null on orders from before amounts.
	Amount   *int64  `json:"amount_cents"`
	Currency *string `json:"currency"`
}

// OrderBudget is the longest POST /api/v1/orders takes to be answered: the
// longest an order takes (stock.OrderBudget). A proxy in front of the
// service must wait longer for an answer (deploy/nginx.conf's
// proxy_read_timeout), or it answers 504 for an order that was placed.
const OrderBudget = stock.OrderBudget

// handlePlaceOrder answers 201 only after the order has been committed. The
// buyer is the body's user_id, or the bearer token's subject with
// authentication on (see buyer). The order rules (positive ids, the key's
// format) are the domain's to check.
//
// A well-formed order for a product the filter rules out (the product
// cache's Bloom filter, as GET /products/{id}/stock has it) is answered
// 404 at once: it costs no rate limit, no order slot and no MySQL read.
// Any other is counted against its buyer's rate limit before anything else
// is done for it. One over the limit is answered 429, unless its
// Idempotency-Key placed an order already: a buyer retrying an order that
// committed gets it back, not "too many requests", as long as the look-up
// fits the buyer's allowance of actions (see replayOver).
func handlePlaceOrder(orders Orders, replays Replays, filter Filter, lim *limiter, m *metrics) gin.HandlerFunc {
	return func(c *gin.Context) {
		fail := func(err error) {
			err = clientGone(c, err)
			_, code, _ := status(err)
			m.orders.WithLabelValues(code).Inc()
			if code == "busy" {
				m.busy.WithLabelValues(busyCause(err)).Inc()
			}
			writeError(c, err)
		}
		sku, user, key, err := readOrder(c)
		if err != nil {
			fail(err)
			return
		}
		// The order's context bounds it up to the moment its COMMIT is
		// sent: its transaction ends, at the latest, then.
		ctx, cancel := context.WithTimeout(c.Request.Context(), stock.TurnTimeout)
		defer cancel()
		if filter != nil {
			if err := filter.RuleOut(ctx, sku); err != nil {
				fail(err)
				return
			}
		}
		var o stock.Order
		if key == "" && orders.KnownSoldOut(sku) {
			// Refused from memory: it costs nothing the limit guards, not
			// even the limit's own round trip. (With a key the order may
			// replay one, which takes a read: that one waits for the limit.)
			o, err = orders.PlaceOrder(ctx, sku, user, key)
		} else if err = lim.perUser(c, user); err != nil {
			o, err = replayOver(ctx, c, replays, lim, sku, user, key, err)
		} else {
			o, err = orders.PlaceOrder(ctx, sku, user, key)
		}
		if err != nil {
			fail(err)
			return
		}
		if o.Replayed {
			m.orders.WithLabelValues("replayed").Inc()
			c.Header("Idempotent-Replayed", "true")
		} else {
			m.orders.WithLabelValues("created").Inc()
		}
		writeOrder(c, http.StatusCreated, o)
	}
}

// replayOver answers an order refused by its rate limit with limited: the
// order its key placed before, if any, and limited otherwise. An error of
// the look-up itself (busy, or the key used for another SKU) is the
// answer then, since the order may exist. The look-up is one of the
// buyer's actions (perAction): a buyer sending keyed orders past the limit
// reads MySQL at that limit's rate, and is answered limited without a read
// beyond it.
func replayOver(ctx context.Context, c *gin.Context, replays Replays, lim *limiter, sku, user int64, key string, limited error) (stock.Order, error) {
	if key == "" || replays == nil || lim.perAction(c, user) != nil {
		return stock.Order{}, limited
	}
	o, err := replays.Replay(ctx, sku, user, key)
	if errors.Is(err, stock.ErrOrderNotFound) {
		return stock.Order{}, limited
	}
	return o, err
}

func readOrder(c *gin.Context) (sku, user int64, key string, err error) {
	keys := c.Request.Header.Values("Idempotency-Key")
	switch {
	case len(keys) > 1:
		return 0, 0, "", invalid("send at most one Idempotency-Key")
	case len(keys) == 1:
		// Sent but empty is an error, not "no key".
		if key = keys[0]; key == "" {
			return 0, 0, "", stock.CheckIdempotencyKey(key)
		}
	}
	o, err := readOrderBody(c)
	if err != nil {
		return 0, 0, "", err
	}
	// Who buys before what: a body naming another buyer is refused
	// whatever else it holds.
	var claimed *int64
	if o.hasUser {
		claimed = &o.user
	}
	if user, err = buyer(c, claimed); err != nil {
		return 0, 0, "", err
	}
	if !o.hasSKU {
		return 0, 0, "", invalid("sku_id is required")
	}
	// Judged here, before the rate limit: a malformed order costs no
	// Redis call.
	if err := stock.CheckOrder(o.sku, user, key); err != nil {
		return 0, 0, "", err
	}
	return o.sku, user, key, nil
}

// readOrderBody reads an order's body: by parseOrderBody when it is the
// body buyers send, else by decode, which is the judge of every other.
func readOrderBody(c *gin.Context) (orderBody, error) {
	b, err := readBody(c)
	if err != nil {
		return orderBody{}, err
	}
	defer b.release()
	if o, ok := parseOrderBody(b.b); ok {
		return o, nil
	}
	return decodeOrderBody(b.b)
}

// decodeOrderBody is decode of an order's body.
func decodeOrderBody(body []byte) (orderBody, error) {
	var req placeOrderRequest
	if err := decodeBytes(body, &req); err != nil {
		return orderBody{}, err
	}
	var o orderBody
	if req.SKUID != nil {
		o.sku, o.hasSKU = *req.SKUID, true
	}
	if req.UserID != nil {
		o.user, o.hasUser = *req.UserID, true
	}
	return o, nil
}
