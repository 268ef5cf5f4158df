package handler

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"shop/internal/auth"
	"shop/internal/requestid"
	"shop/internal/stock"
)

// Errors of the HTTP layer itself; the domain's are in package stock.
var (
	errRouteNotFound    = errors.New("no such route")
	errMethodNotAllowed = errors.New("method not allowed")
	errTooLarge         = errors.New("request body too large")
	errUnsupportedMedia = errors.New("Content-Type must be application/json")
	errUnauthorized     = errors.New("missing or wrong bearer token")
	errUnavailable      = errors.New("a dependency does not answer")
	errAdminDisabled    = errors.New("the admin API is off")
	errStopping         = errors.New("the service is shutting down")
	errClientClosed     = errors.New("the client closed the request")
	errInternal         = errors.New("internal error")
)

// The buyer routes' refusals with SHOP_AUTH=jwt: errNoToken and errBadToken
// are 401s, no bearer token or one that was refused (the verifier's error
// wrapped in it says why, for the log); errForbidden is a user_id in the
// request that is not the token's subject.
var (
	errNoToken   = errors.New("this route needs Authorization: Bearer <token>")
	errBadToken  = errors.New("the bearer token is not valid")
	errForbidden = errors.New("user_id is not the buyer the bearer token names")
)

const (
	// retryAfterSeconds is what a 503 asks the client to wait.
	retryAfterSeconds = "1"
	// statusClientClosedRequest is nginx's status for a request whose client
	// went away before the answer; no client sees it, the metrics and the
	// log do.
	statusClientClosedRequest = 499
)

// status maps an error to its HTTP status, error code and client-facing
// message. It is the only place that does: every handler reports failures
// through writeError. Messages of unknown errors are never shown.
func status(err error) (int, string, string) {
	switch {
	case errors.Is(err, stock.ErrChangeOutcomeUnknown):
		// Before the order's case, which it is one of: a change has no
		// key to retry with, and a restock sent again blindly may add its
		// units twice.
		return http.StatusServiceUnavailable, "outcome_unknown",
			"the change may or may not have been made; read the product before sending it again"
	case errors.Is(err, stock.ErrCancelOutcomeUnknown):
		return http.StatusServiceUnavailable, "outcome_unknown",
			"the cancellation may or may not have been made; send it again"
	case errors.Is(err, stock.ErrOutcomeUnknown):
		// First: it may come wrapped with ErrBusy, and only a retry with
		// the same key is safe.
		return http.StatusServiceUnavailable, "outcome_unknown",
			"the order may or may not have been placed; retry with the same Idempotency-Key"
	case errors.Is(err, errClientClosed):
		return statusClientClosedRequest, "client_closed_request", err.Error()
	case errors.Is(err, stock.ErrInvalid):
		return http.StatusBadRequest, "invalid_argument", err.Error()
	case errors.Is(err, stock.ErrNotFound):
		return http.StatusNotFound, "not_found", "no such product"
	case errors.Is(err, stock.ErrOrderNotFound):
		return http.StatusNotFound, "not_found", "no such order"
	case errors.Is(err, stock.ErrOrderExpired):
		return http.StatusConflict, "order_expired", "the order's payment window ended; a payment for it is owed back"
	case errors.Is(err, stock.ErrOrderCancelled):
		return http.StatusConflict, "order_cancelled", "the order was cancelled; a payment for it is owed back"
	case errors.Is(err, stock.ErrOrderPaid):
		return http.StatusConflict, "order_paid", "the order is paid"
	case errors.Is(err, stock.ErrPaymentMismatch):
		return http.StatusConflict, "payment_mismatch", "the order was paid by another payment"
	case errors.Is(err, errRouteNotFound), errors.Is(err, errAdminDisabled):
		return http.StatusNotFound, "not_found", err.Error()
	case errors.Is(err, errMethodNotAllowed):
		return http.StatusMethodNotAllowed, "method_not_allowed", err.Error()
	case errors.Is(err, stock.ErrSoldOut):
		return http.StatusConflict, "sold_out", "the product is sold out"
	case errors.Is(err, stock.ErrAlreadyOrdered):
		return http.StatusConflict, "already_ordered", "this user already ordered this product"
	case errors.Is(err, stock.ErrUserLimit):
		return http.StatusConflict, "user_limit", "this user holds the most orders one user may"
	case errors.Is(err, stock.ErrSaleNotStarted):
		return http.StatusForbidden, "sale_not_started", "the sale of this product has not started"
	case errors.Is(err, stock.ErrSaleEnded):
		return http.StatusForbidden, "sale_ended", "the sale of this product has ended"
	case errors.Is(err, stock.ErrIdempotencyMismatch):
		return http.StatusUnprocessableEntity, "idempotency_mismatch", "the Idempotency-Key was used for a different order"
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge, "too_large", err.Error()
	case errors.Is(err, errUnsupportedMedia):
		return http.StatusUnsupportedMediaType, "unsupported_media_type", err.Error()
	case errors.Is(err, errUnauthorized):
		return http.StatusUnauthorized, "unauthorized", err.Error()
	case errors.Is(err, errNoToken):
		return http.StatusUnauthorized, "unauthorized", errNoToken.Error()
	case errors.Is(err, errBadToken) && errors.Is(err, auth.ErrExpired):
		return http.StatusUnauthorized, "unauthorized", "the bearer token has expired"
	case errors.Is(err, errBadToken):
		// Why the verifier refused it is for the log: a client learns
		// nothing from it that a forger could use.
		return http.StatusUnauthorized, "unauthorized",
			"the bearer token is not valid: malformed, not signed by a trusted key, or not for this service"
	case errors.Is(err, errForbidden):
		return http.StatusForbidden, "forbidden", errForbidden.Error()
	case errors.Is(err, errRateLimited):
		return http.StatusTooManyRequests, "rate_limited", errRateLimited.Error()
	case errors.Is(err, stock.ErrBusy):
		return http.StatusServiceUnavailable, "busy", "the service is busy, retry later"
	case errors.Is(err, errUnavailable):
		return http.StatusServiceUnavailable, "unavailable", errUnavailable.Error()
	case errors.Is(err, errStopping):
		return http.StatusServiceUnavailable, "unavailable", errStopping.Error()
	}
	return http.StatusInternalServerError, "internal", errInternal.Error()
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// RequestID is on 5xx answers only: a failure of the service, which a
	// client reports quoting it, and which the log lines carrying the same
	// id explain. A 4xx is the client's own doing and says why itself.
	RequestID string `json:"request_id,omitempty"`
}

// clientGone marks err as the client's doing when the request's context has
// ended: the client closed its connection, and the work gave up because of
// it. Counted and logged as the 503 busy it comes back as, it would look
// like a fault of the service.
func clientGone(c *gin.Context, err error) error {
	if c.Request.Context().Err() == nil || errors.Is(err, errClientClosed) {
		return err
	}
	return fmt.Errorf("%w: %w", errClientClosed, err)
}

// challenge is the WWW-Authenticate header of a buyer route's 401 (RFC
// 6750 section 3): the scheme alone when no token came, with
// error="invalid_token" and the message when one came and was refused.
// Empty for every other error.
func challenge(err error, msg string) string {
	switch {
	case errors.Is(err, errNoToken):
		return `Bearer realm="shop"`
	case errors.Is(err, errBadToken):
		// The messages of status hold no quote or backslash.
		return `Bearer realm="shop", error="invalid_token", error_description="` + msg + `"`
	}
	return ""
}

// writeError answers with err's status and the JSON error shape, and keeps
// err on the context for the access log.
func writeError(c *gin.Context, err error) {
	err = clientGone(c, err)
	code, name, msg := status(err)
	switch code {
	case http.StatusServiceUnavailable:
		c.Header("Retry-After", retryAfterSeconds)
	case http.StatusTooManyRequests:
		c.Header("Retry-After", retryAfterHeader(err))
	}
	if h := challenge(err, msg); h != "" {
		c.Header("WWW-Authenticate", h)
	}
	detail := errorDetail{Code: name, Message: msg}
	if code >= http.StatusInternalServerError {
		detail.RequestID = requestid.FromContext(c.Request.Context())
	}
	_ = c.Error(err)
	c.AbortWithStatusJSON(code, errorBody{Error: detail})
}
