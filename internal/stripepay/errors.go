package stripepay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/stripe/stripe-go/v82"
)

// Kind is what went wrong with a call, for logs and for the refunder's
// error counts.
type Kind string

// The kinds of error a call has.
const (
	// KindNetwork: no answer came (a transport error or the timeout). The
	// call may have been carried out.
	KindNetwork Kind = "network"
	// KindRateLimited: 429, Stripe's rate limit.
	KindRateLimited Kind = "rate_limited"
	// KindLockTimeout: 429 lock_timeout, the object was busy with another
	// request.
	KindLockTimeout Kind = "lock_timeout"
	// KindConflict: 409, another request with the same Idempotency-Key is
	// in flight.
	KindConflict Kind = "conflict"
	// KindServer: 5xx, or an answer that is not Stripe's (a proxy's error
	// page).
	KindServer Kind = "server"
	// KindAuth: 401 or 403, the secret key was refused. The operator's to
	// fix; the refund itself is fine.
	KindAuth Kind = "auth"
	// KindPending: charge_already_refunded, and the charge's refunds are
	// still pending: they have not yet succeeded or failed.
	KindPending Kind = "pending"
	// KindInvalid: any other 4xx, such as a PaymentIntent that does not
	// exist or a key reused with other parameters. Permanent.
	KindInvalid Kind = "invalid"
)

// Error is a call's error.
type Error struct {
	// Op is what the call was doing.
	Op   string
	Kind Kind
	// Retryable says that the same call may succeed later.
	Retryable bool
	Err       error
}

func (e *Error) Error() string { return fmt.Sprintf("stripe: %s: %s: %v", e.Op, e.Kind, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// Retryable reports whether err is an *Error that may not recur.
func Retryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

// KindOf is err's Kind, KindInvalid for an error that is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInvalid
}

// invalid is the error of a call that was not made: its arguments are
// wrong.
func invalid(op, format string, args ...any) *Error {
	return &Error{Op: op, Kind: KindInvalid, Err: fmt.Errorf(format, args...)}
}

// classify wraps a call's error as an *Error.
func classify(op string, err error) *Error {
	kind, retryable := kindOf(err)
	return &Error{Op: op, Kind: kind, Retryable: retryable, Err: err}
}

func kindOf(err error) (Kind, bool) {
	var se *stripe.Error
	if !errors.As(err, &se) {
		var ne net.Error
		if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return KindNetwork, true
		}
		// stripe-go's error for an answer whose body is not Stripe's JSON.
		return KindServer, true
	}
	switch s := se.HTTPStatusCode; {
	case s == http.StatusTooManyRequests && se.Code == stripe.ErrorCodeLockTimeout:
		return KindLockTimeout, true
	case s == http.StatusTooManyRequests:
		return KindRateLimited, true
	case s == http.StatusConflict:
		return KindConflict, true
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return KindAuth, true
	case s >= 500 || s < 400:
		return KindServer, true
	}
	return KindInvalid, false
}
