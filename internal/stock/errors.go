package stock

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"shop/internal/mysqldb"
)

// The errors of the domain, each declared here and nowhere else. Callers
// compare with errors.Is; the errors returned wrap these with detail.
//
// Most are rulings: the domain's final answer to a request, which the same
// request sent again gets again. ErrBusy, ErrStaleFence and
// ErrOutcomeUnknown (with the two kinds of it below) are not: the request
// could not be decided now, and may be sent again.
var (
	// ErrInvalid marks a request that breaks the rules of input. The
	// error returned is an *InvalidError, which says which rule, and names
	// the fields it is about so that the caller can name them in its own
	// words (InvalidError.Phrase).
	ErrInvalid error = &ruling{"invalid argument"}
	// ErrNotFound means there is no product with that id.
	ErrNotFound error = &ruling{"stock: not found"}
	// ErrSaleNotStarted means the order arrived before the product's sale
	// window opened.
	ErrSaleNotStarted error = &ruling{"stock: sale not started"}
	// ErrSaleEnded means the order arrived once the product's sale window
	// had closed.
	ErrSaleEnded error = &ruling{"stock: sale ended"}
	// ErrSoldOut means the product has no unit left.
	ErrSoldOut error = &ruling{"stock: sold out"}
	// ErrAlreadyOrdered means the user already holds an order for the product.
	ErrAlreadyOrdered error = &ruling{"stock: already ordered"}
	// ErrUserLimit means the user already holds as many orders, over all
	// products, as one user may (Settings.UserLimit).
	ErrUserLimit error = &ruling{"stock: user limit reached"}
	// ErrIdempotencyMismatch means an idempotency key was used before for a
	// different order.
	ErrIdempotencyMismatch error = &ruling{"stock: idempotency key reused for a different order"}
	// ErrOrderNotFound means the buyer has no order with that id: none
	// exists, or it is another buyer's, which is not told apart.
	ErrOrderNotFound error = &ruling{"stock: no such order"}
	// ErrOrderExpired means the order's payment window had ended: its unit
	// goes back to the sale, or has gone.
	ErrOrderExpired error = &ruling{"stock: order expired"}
	// ErrOrderPaid means the order is paid: it can no longer be cancelled.
	ErrOrderPaid error = &ruling{"stock: order paid"}
	// ErrOrderNotPayable means the order cannot be paid now: it is not
	// reserved, or its payment window has ended.
	ErrOrderNotPayable error = &ruling{"stock: order not payable"}
	// ErrRefundNotFound means there is no refund of that id (or of that
	// payment).
	ErrRefundNotFound error = &ruling{"stock: no such refund"}
	// ErrRefundSettled means the refund was settled with another
	// reference.
	ErrRefundSettled error = &ruling{"stock: refund settled otherwise"}
	// ErrRefundsUnsettled means a seed was refused because refunds are
	// still owed: a seed never deletes money owed silently.
	ErrRefundsUnsettled error = &ruling{"stock: refunds unsettled"}

	// ErrBusy means the request could not be served now and may succeed
	// later: the SKU lock was not obtained in time or was lost, or MySQL or
	// Redis did not answer. Nothing was written.
	ErrBusy = errors.New("stock: busy")
	// ErrStaleFence means MySQL refused a write because a newer lock holder
	// had written the row: this holder's lease had expired. It is wrapped
	// together with ErrBusy.
	ErrStaleFence = errors.New("stock: stale fencing token")
	// ErrOutcomeUnknown means the connection to MySQL was lost after COMMIT
	// was sent: the order may or may not have been placed. Only a retry
	// with the same idempotency key can tell.
	ErrOutcomeUnknown = errors.New("stock: outcome unknown")
	// ErrCancelOutcomeUnknown means the connection to MySQL was lost after
	// a cancellation's COMMIT was sent: the order may or may not have been
	// cancelled. Cancelling again is safe, and tells. It is an
	// ErrOutcomeUnknown.
	ErrCancelOutcomeUnknown = fmt.Errorf("%w: a cancellation", ErrOutcomeUnknown)
	// ErrChangeOutcomeUnknown means the connection to MySQL was lost after
	// a product change's COMMIT was sent: the change may or may not have
	// been made. It is an ErrOutcomeUnknown, and an error of its own because
	// a change, unlike an order, has no idempotency key to retry with: only
	// reading the product tells whether it was made, and a restock sent
	// again blindly may add its units twice.
	ErrChangeOutcomeUnknown = fmt.Errorf("%w: a product change", ErrOutcomeUnknown)
)

// ruling is an error that is the domain's final answer to a request.
type ruling struct{ text string }

func (r *ruling) Error() string { return r.text }

// isRuling reports whether err carries one of the domain's rulings on a
// request (input, product, buyer, order) rather than a failure.
func isRuling(err error) bool {
	var r *ruling
	return errors.As(err, &r)
}

// Field is what a rule of input is about, in the domain's words. A caller
// that shows an *InvalidError to a client names each field in its own words
// (Phrase): the HTTP API says sku_id where the domain says sku.
type Field string

// The fields the rules of input are about.
const (
	FieldSKU            Field = "sku"
	FieldUser           Field = "user"
	FieldProduct        Field = "product id"
	FieldOrder          Field = "order id"
	FieldIdempotencyKey Field = "idempotency key"
	FieldPaymentID      Field = "payment id"
	FieldProvider       Field = "provider"
	FieldAmount         Field = "amount"
	FieldCurrency       Field = "currency"
	FieldPrice          Field = "price"
	FieldEventID        Field = "event id"
	FieldRefund         Field = "refund id"
	FieldRefundState    Field = "refund state"
	FieldProviderRefund Field = "provider refund id"
	FieldLimit          Field = "limit"
	FieldSaleStartsAt   Field = "sale start"
	FieldSaleEndsAt     Field = "sale end"
	FieldAddStock       Field = "units to add"
	FieldInitialStock   Field = "initial stock"
	FieldProducts       Field = "products"
	FieldStock          Field = "stock"
)

// InvalidError is a request that breaks a rule of input. It is ErrInvalid.
type InvalidError struct {
	format string
	args   []any // the Fields among them are named by Phrase
}

// invalidf is an *InvalidError whose rule is format with args, in which
// every Field is a field the rule is about.
func invalidf(format string, args ...any) error { return &InvalidError{format: format, args: args} }

// Error says which rule was broken, naming fields in the domain's words.
func (e *InvalidError) Error() string { return e.Phrase(func(f Field) string { return string(f) }) }

// Phrase says which rule was broken, naming each field with name.
func (e *InvalidError) Phrase(name func(Field) string) string {
	args := slices.Clone(e.args)
	for i, a := range args {
		if f, ok := a.(Field); ok {
			args[i] = name(f)
		}
	}
	return ErrInvalid.Error() + ": " + fmt.Sprintf(e.format, args...)
}

// Unwrap makes an *InvalidError ErrInvalid.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// staleFence is a fenced write that MySQL refused because the row's fence
// was at or above the holder's token: ErrBusy and ErrStaleFence.
type staleFence struct {
	sku, token, row int64
}

func (e *staleFence) Error() string {
	return fmt.Sprintf("%v: %v: sku %d: token %d, row has %d", ErrBusy, ErrStaleFence, e.sku, e.token, e.row)
}

func (e *staleFence) Unwrap() []error { return []error{ErrBusy, ErrStaleFence} }

// classify wraps database failures that may pass with ErrBusy and leaves
// the domain's rulings and failures as they are.
func classify(ctx context.Context, op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrBusy), errors.Is(err, ErrOutcomeUnknown), isRuling(err):
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrBusy, context.Cause(ctx))
	case mysqldb.Transient(err):
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return fmt.Errorf("stock: %s: %w", op, err)
}

// classifyTx is classify for the error of a transaction run under a lease,
// on ctx, the transaction's: work cut short because the lease was lost or
// the batch's earliest deadline came is ErrBusy with that cause.
func classifyTx(ctx context.Context, err error) error {
	if errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrStaleFence) || errors.Is(err, ErrBusy) {
		// MySQL's own verdict: a stale write refused says more than the
		// lease lost that a watchdog may report a moment later.
		return err
	}
	if cause := context.Cause(ctx); cause != nil && !isRuling(err) {
		return fmt.Errorf("%w: %w", ErrBusy, cause)
	}
	return classify(ctx, "place order", err)
}

// mayHaveCommitted reports whether a transaction that ended with err may
// have changed the product: it committed, or its outcome is unknown.
func mayHaveCommitted(err error) bool { return err == nil || errors.Is(err, ErrOutcomeUnknown) }

// repairFence tells the lock, when err is a write refused for a stale fence,
// how far the row's fence has gone, so that a counter that fell behind the
// rows is raised and the next holder's token is above the fence (see
// Locker.RaiseFence). It runs once the transaction has ended, bounded and
// detached from the buyer; a failure is logged and changes nothing else:
// the order has failed anyway, and the next refusal tries again.
func (s *Service) repairFence(ctx context.Context, err error) {
	var stale *staleFence
	if !errors.As(err, &stale) {
		return
	}
	key := LockKey(stale.sku)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), raiseFenceTimeout)
	defer cancel()
	if err := s.locks.RaiseFence(ctx, key, stale.row); err != nil {
		s.log.WarnContext(ctx, "raise fencing counter", "key", key, "at_least", stale.row, "err", err)
	}
}
