package handler

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"shop/internal/payments"
	"shop/internal/stock"
)

// Payments is what the payment provider's events do; *stock.Service
// implements it.
type Payments interface {
	Receive(ctx context.Context, p stock.Payment) (stock.Receipt, error)
	Settle(ctx context.Context, s stock.Settlement) (stock.Refund, error)
}

// Checkouts creates the checkouts buyers pay at the provider;
// *stock.Service implements it.
type Checkouts interface {
	Checkout(ctx context.Context, user, id int64) (stock.Checkout, error)
}

// eventResponse is the answer to a provider's event: what it did.
type eventResponse struct {
	// Result is applied, owed or conflict for a payment; refunded or failed
	// for a refund; ignored for an event this service does not act on.
	Result   string `json:"result"`
	Reason   string `json:"reason,omitempty"`
	RefundID string `json:"refund_id,omitempty"`
	// Again says the event had been received before and changed nothing
	// now.
	Again bool `json:"again,omitempty"`
}

type checkoutResponse struct {
	OrderID       int64  `json:"order_id"`
	PaymentIntent string `json:"payment_intent"`
	ClientSecret  string `json:"client_secret"`
	AmountCents   int64  `json:"amount_cents"`
	Currency      string `json:"currency"`
}

// handlePaymentEvent answers the provider's signed events. The raw body is
// read up to payments.MaxBody, and the signature and its timestamp are
// checked before anything else is done: an unsigned request costs a read
// and an HMAC, never a query. The event's effect is committed before it is
// answered 200; a 503 means nothing was recorded and the provider's retry
// is safe.
func handlePaymentEvent(v payments.Verifier, pay Payments, m *metrics, log *slog.Logger) gin.HandlerFunc {
	provider := v.Provider()
	return func(c *gin.Context) {
		body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, payments.MaxBody))
		if err != nil {
			m.paymentEvents.WithLabelValues(provider, payments.TypeOther, "too_large").Inc()
			if maxBytes := (*http.MaxBytesError)(nil); errors.As(err, &maxBytes) {
				writeError(c, errTooLarge)
			} else {
				writeError(c, invalid("the body could not be read"))
			}
			return
		}
		ev, err := v.Verify(c.Request.Header, body, time.Now())
		if err != nil {
			m.paymentEvents.WithLabelValues(provider, payments.TypeOther, outcome(err, "")).Inc()
			writeError(c, err)
			return
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), lifecycleTimeout)
		defer cancel()
		res, err := applyEvent(ctx, provider, ev, pay, log)
		if err != nil {
			m.paymentEvents.WithLabelValues(provider, ev.Type, outcome(err, "")).Inc()
			writeError(c, err)
			return
		}
		m.paymentEvents.WithLabelValues(provider, ev.Type, res.Result).Inc()
		c.JSON(http.StatusOK, res)
	}
}

// applyEvent does what a verified event says.
func applyEvent(ctx context.Context, provider string, ev payments.Event, pay Payments, log *slog.Logger) (eventResponse, error) {
	switch {
	case ev.Payment != nil:
		r, err := pay.Receive(ctx, stock.Payment{Provider: provider, PaymentID: ev.Payment.PaymentID, OrderID: ev.Payment.OrderID,
			AmountCents: ev.Payment.AmountCents, Currency: ev.Payment.Currency, EventID: ev.ID})
		if err != nil {
			return eventResponse{}, err
		}
		return eventResponse{Result: r.Outcome, Reason: r.Reason, RefundID: r.RefundID, Again: r.Again}, nil
	case ev.Refund != nil:
		st := stock.Settlement{Provider: provider, RefundID: ev.Refund.RefundID, PaymentID: ev.Refund.PaymentID,
			ProviderRefundID: ev.Refund.ProviderRefundID, Failed: ev.Refund.Status == payments.RefundFailed}
		if st.Failed {
			st.Reason = "the provider reported the refund failed (" + ev.Refund.ProviderRefundID + ")"
		}
		r, err := pay.Settle(ctx, st)
		switch {
		case errors.Is(err, stock.ErrRefundNotFound):
			// Not a refund of ours: a provider retrying it would never
			// get another answer.
			log.WarnContext(ctx, "refund event for no refund of ours", "provider", provider, "event_id", ev.ID,
				"refund_id", st.RefundID, "payment_id", st.PaymentID, "provider_refund_id", st.ProviderRefundID)
			return eventResponse{Result: "ignored"}, nil
		case errors.Is(err, stock.ErrRefundSettled):
			log.ErrorContext(ctx, "refund event with another reference for a settled refund", "provider", provider,
				"event_id", ev.ID, "refund_id", r.RefundID, "provider_refund_id", st.ProviderRefundID, "err", err)
			return eventResponse{Result: "conflict", RefundID: st.RefundID}, nil
		case err != nil:
			return eventResponse{}, err
		}
		return eventResponse{Result: r.State, RefundID: r.RefundID}, nil
	}
	return eventResponse{Result: "ignored", Reason: ev.Ignored}, nil
}

// handleCheckout answers the checkout of a buyer's reservation: the
// provider's PaymentIntent, the same one every time.
func handleCheckout(checkouts Checkouts, lim *limiter) gin.HandlerFunc {
	return orderAction(lim, nil, "", func(ctx context.Context, user, id int64) (checkoutResponse, error) {
		co, err := checkouts.Checkout(ctx, user, id)
		return checkoutResponse{OrderID: co.OrderID, PaymentIntent: co.PaymentIntent, ClientSecret: co.ClientSecret,
			AmountCents: co.AmountCents, Currency: co.Currency}, err
	})
}
