package handler

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"shop/internal/auth"
	"shop/internal/outbox"
	"shop/internal/payments"
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

// answer is what a client is told of an error: the HTTP status, the error
// code of the JSON error shape, and the message. An empty message is the
// error's own: for a broken rule of input, the domain's words with the
// API's field names (fieldName); otherwise err.Error(), which only the
// HTTP layer's own errors, written for clients, come with.
type answer struct {
	err     error
	status  int
	code    string
	message string
}

// answers is the one table of errors and what a client is told of them.
// The first row whose error is in the chain answers, so the order is the
// precedence:
//
//  1. an unknown outcome, first: it comes wrapped with ErrBusy, and only
//     the retry its message asks for is safe; a change and a cancellation
//     before an order's, which they are kinds of;
//  2. the client that went away, whatever the work ran into then;
//  3. the domain's rulings and the HTTP layer's refusals, which are final
//     (no request carries two of them);
//  4. an expired bearer token before the other bad tokens;
//  5. the failures that a retry may get past (busy, a dependency down,
//     the service stopping).
//
// Every other error is a 500 whose message says nothing of it. Every
// exported error of package stock has a row (TestEveryDomainErrorHasAnAnswer).
var answers = []answer{
	{stock.ErrChangeOutcomeUnknown, http.StatusServiceUnavailable, "outcome_unknown",
		"the change may or may not have been made; read the product before sending it again"},
	{stock.ErrCancelOutcomeUnknown, http.StatusServiceUnavailable, "outcome_unknown",
		"the cancellation may or may not have been made; send it again"},
	{stock.ErrOutcomeUnknown, http.StatusServiceUnavailable, "outcome_unknown",
		"the order may or may not have been placed; retry with the same Idempotency-Key"},
	// What the work ran into when its client left is for the log: the
	// chain names statements and addresses.
	{errClientClosed, statusClientClosedRequest, "client_closed_request", errClientClosed.Error()},

	{stock.ErrInvalid, http.StatusBadRequest, "invalid_argument", ""},
	{stock.ErrNotFound, http.StatusNotFound, "not_found", "no such product"},
	{stock.ErrOrderNotFound, http.StatusNotFound, "not_found", "no such order"},
	{stock.ErrOrderExpired, http.StatusConflict, "order_expired", "the order's payment window ended: its unit goes back to the sale"},
	{stock.ErrOrderPaid, http.StatusConflict, "order_paid", "the order is paid"},
	{stock.ErrOrderNotPayable, http.StatusConflict, "not_payable", "the order is not reserved, or its payment window has ended"},
	{stock.ErrRefundNotFound, http.StatusNotFound, "not_found", "no such refund"},
	{stock.ErrRefundSettled, http.StatusConflict, "refund_settled", "the refund was settled with another provider reference"},
	{stock.ErrRefundsUnsettled, http.StatusConflict, "refunds_unsettled", ""},
	{outbox.ErrNotFound, http.StatusNotFound, "not_found", "no such event"},
	{outbox.ErrDelivered, http.StatusConflict, "event_delivered",
		"the event was delivered: sent again now it would come after its order's later events"},
	{payments.ErrMalformed, http.StatusBadRequest, "invalid_argument", ""},
	{payments.ErrSignature, http.StatusUnauthorized, "unauthorized",
		"the event's signature is missing or not valid, or its timestamp is more than 5 minutes away"},
	{stock.ErrSoldOut, http.StatusConflict, "sold_out", "the product is sold out"},
	{stock.ErrAlreadyOrdered, http.StatusConflict, "already_ordered", "this user already ordered this product"},
	{stock.ErrUserLimit, http.StatusConflict, "user_limit", "this user holds the most orders one user may"},
	{stock.ErrSaleNotStarted, http.StatusForbidden, "sale_not_started", "the sale of this product has not started"},
	{stock.ErrSaleEnded, http.StatusForbidden, "sale_ended", "the sale of this product has ended"},
	{stock.ErrIdempotencyMismatch, http.StatusUnprocessableEntity, "idempotency_mismatch", "the Idempotency-Key was used for a different order"},
	{errRouteNotFound, http.StatusNotFound, "not_found", ""},
	{errAdminDisabled, http.StatusNotFound, "not_found", ""},
	{errMethodNotAllowed, http.StatusMethodNotAllowed, "method_not_allowed", ""},
	{errTooLarge, http.StatusRequestEntityTooLarge, "too_large", ""},
	{errUnsupportedMedia, http.StatusUnsupportedMediaType, "unsupported_media_type", ""},
	{errUnauthorized, http.StatusUnauthorized, "unauthorized", ""},
	{errNoToken, http.StatusUnauthorized, "unauthorized", errNoToken.Error()},
	{auth.ErrExpired, http.StatusUnauthorized, "unauthorized", "the bearer token has expired"},
	// Why the verifier refused a token is for the log: a client learns
	// nothing from it that a forger could use.
	{errBadToken, http.StatusUnauthorized, "unauthorized",
		"the bearer token is not valid: malformed, not signed by a trusted key, or not for this service"},
	{errForbidden, http.StatusForbidden, "forbidden", errForbidden.Error()},
	{errRateLimited, http.StatusTooManyRequests, "rate_limited", errRateLimited.Error()},

	{stock.ErrBusy, http.StatusServiceUnavailable, "busy", "the service is busy, retry later"},
	{stock.ErrStaleFence, http.StatusServiceUnavailable, "busy", "the service is busy, retry later"},
	// Wrapped with the names of the dependencies only (handleReadyz), which
	// an operator reading the answer wants to see.
	{errUnavailable, http.StatusServiceUnavailable, "unavailable", ""},
	{errStopping, http.StatusServiceUnavailable, "unavailable", errStopping.Error()},
}

// internal is the answer to every error without a row: nothing of it is
// shown.
var internal = answer{status: http.StatusInternalServerError, code: "internal", message: errInternal.Error()}

// status maps an error to its HTTP status, error code and client-facing
// message through answers. It is the only place that does: every handler
// reports failures through writeError.
func status(err error) (int, string, string) {
	a, _ := find(err)
	return a.status, a.code, a.message
}

// find is the row of answers that answers err, with its message filled in
// from err when the row has none, and the row's index; internal and -1
// when no row does.
func find(err error) (answer, int) {
	for i, a := range answers {
		if !errors.Is(err, a.err) {
			continue
		}
		if a.message == "" {
			a.message = ownMessage(err)
		}
		return a, i
	}
	return internal, -1
}

// encodedAnswers are the bodies of the rows of answers whose message is
// their own, encoded once rather than for each request (a crowd past a
// sellout is answered sold_out thousands of times a second): the whole
// body of a 4xx, and a 5xx's up to its request id, which closeRequestID
// ends. A row whose message comes from the error has none.
var encodedAnswers = encodeAnswers(answers)

// closeRequestID ends a 5xx's encoded body after its request id.
const closeRequestID = `"}}`

func encodeAnswers(rows []answer) [][]byte {
	bodies := make([][]byte, len(rows))
	for i, a := range rows {
		if a.message == "" {
			continue
		}
		detail := errorDetail{Code: a.code, Message: a.message}
		if a.status >= http.StatusInternalServerError {
			// Encoded with an id of one letter, cut off: the id a 5xx
			// names is the request's own.
			detail.RequestID = "x"
		}
		b, err := json.Marshal(errorBody{Error: detail})
		if err != nil {
			panic(fmt.Sprintf("handler: answer %s: %v", a.code, err)) // strings always encode
		}
		if detail.RequestID != "" {
			b = b[:len(b)-len("x"+closeRequestID)]
		}
		bodies[i] = b
	}
	return bodies
}

// errorJSON is the body of the answer a with the request id id (on a 5xx
// only), from encodedAnswers when row i has a body there and id needs no
// escaping (any id requestid.Choose gives), else encoded now.
func errorJSON(a answer, i int, id string) []byte {
	detail := errorDetail{Code: a.code, Message: a.message}
	if a.status >= http.StatusInternalServerError {
		detail.RequestID = id
	}
	if i >= 0 && encodedAnswers[i] != nil {
		switch {
		case a.status < http.StatusInternalServerError:
			return encodedAnswers[i]
		case requestid.Valid(id):
			return append(append(append(make([]byte, 0, len(encodedAnswers[i])+len(id)+len(closeRequestID)),
				encodedAnswers[i]...), id...), closeRequestID...)
		}
	}
	b, err := json.Marshal(errorBody{Error: detail})
	if err != nil {
		panic(fmt.Sprintf("handler: answer %s: %v", a.code, err)) // strings always encode
	}
	return b
}

// ownMessage is err's own message for a client: a broken rule of input
// phrased with the API's field names, or else err.Error().
func ownMessage(err error) string {
	var invalid *stock.InvalidError
	if errors.As(err, &invalid) {
		return invalid.Phrase(fieldName)
	}
	return err.Error()
}

// fieldName is what the API calls a field of the domain's rules of input:
// the JSON field or header a client sent it in.
func fieldName(f stock.Field) string {
	switch f {
	case stock.FieldSKU:
		return "sku_id"
	case stock.FieldUser:
		return "user_id"
	case stock.FieldProduct:
		return "id"
	case stock.FieldOrder:
		return "the order id"
	case stock.FieldIdempotencyKey:
		return "Idempotency-Key"
	case stock.FieldPaymentID:
		return "payment_id"
	case stock.FieldPrice:
		return "price_cents"
	case stock.FieldCurrency:
		return "currency"
	case stock.FieldRefund:
		return "refund_id"
	case stock.FieldRefundState:
		return "state"
	case stock.FieldProviderRefund:
		return "provider_refund_id"
	case stock.FieldLimit:
		return "limit"
	case stock.FieldAmount:
		return "amount_cents"
	case stock.FieldSaleStartsAt:
		return "sale_starts_at"
	case stock.FieldSaleEndsAt:
		return "sale_ends_at"
	case stock.FieldAddStock:
		return "add_stock"
	case stock.FieldInitialStock:
		return "initial_stock"
	}
	return string(f) // products, stock: the seed's own names
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
	a, i := find(err)
	switch a.status {
	case http.StatusServiceUnavailable:
		c.Header("Retry-After", retryAfterSeconds)
	case http.StatusTooManyRequests:
		c.Header("Retry-After", retryAfterHeader(err))
	}
	if h := challenge(err, a.message); h != "" {
		c.Header("WWW-Authenticate", h)
	}
	_ = c.Error(err)
	c.Abort()
	writeJSON(c, a.status, errorJSON(a, i, requestid.FromContext(c.Request.Context())))
}

// jsonContentType is what gin's c.JSON sends.
const jsonContentType = "application/json; charset=utf-8"

// jsonContentTypeValue is jsonContentType as a header's values, shared by
// every answer as gin shares its own: nothing changes a header's values
// in place.
var jsonContentTypeValue = []string{jsonContentType}

// writeJSON answers status with body, JSON already encoded, as gin's
// c.JSON does (the same Content-Type, unless one was set) without
// encoding it again.
func writeJSON(c *gin.Context, status int, body []byte) {
	if h := c.Writer.Header(); len(h["Content-Type"]) == 0 {
		h["Content-Type"] = jsonContentTypeValue
	}
	c.Status(status)
	_, _ = c.Writer.Write(body)
}
