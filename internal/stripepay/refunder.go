package stripepay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Claim is an owed refund that a refunder holds by a lease.
type Claim struct {
	RefundID string
	// PaymentID is the payment's id: its PaymentIntent's.
	PaymentID   string
	AmountCents int64
	Currency    string
	// Attempts is how many times the refund was claimed before this
	// claim. The Store counts claims, not answers, so that a call whose
	// record never came (a crash between the two) counts too.
	Attempts int
}

// Store is where refunds owed are kept (MySQL's refunds table). Each method
// is a short transaction of its own; the call to Stripe is made between
// them, outside any.
type Store interface {
	// Claim leases up to n refunds that are owed, not leased by another
	// refunder (or whose lease has run out) and not waiting out a Retry,
	// for lease: until then no other Claim returns them.
	Claim(ctx context.Context, lease time.Duration, n int) ([]Claim, error)
	// Record writes what Stripe answered for the refund: its Refund's id
	// and status. succeeded is settled; pending and requires_action are
	// requested, to be settled by Stripe's refund.updated event (or failed
	// by refund.failed). It ends the claim.
	Record(ctx context.Context, refundID, providerRefundID, status string) error
	// Retry ends the claim with the error met, and keeps the refund owed
	// but unclaimable for after.
	Retry(ctx context.Context, refundID, msg string, after time.Duration) error
	// Fail marks the refund failed, for operators, with the error met.
	Fail(ctx context.Context, refundID, msg string) error
}

// Metrics are the refunder's counts; a nil func counts nothing.
type Metrics struct {
	// Call counts each call of the Refund API (the list that may follow
	// a charge_already_refunded is part of the call).
	Call func()
	// Error counts each call's error, by Kind.
	Error func(kind Kind)
	// Outcome counts what each claim ended in: "recorded", "retry",
	// "failed", or "left" (a claim whose lease ran short before its call,
	// left to run out).
	Outcome func(outcome string)
}

// Hooks are where a test or the demo can stop the refunder; nil means no
// hook.
type Hooks struct {
	// BetweenCallAndRecord runs after a refund's call to Stripe, before
	// its answer is recorded: failpoint.Hooks.BetweenRefundCallAndRecord,
	// where the demo SIGKILLs the process.
	BetweenCallAndRecord func(ctx context.Context, refundID string)
}

// The refunder's defaults, for its zero fields.
const (
	// DefaultLease is a claim's lease: several call timeouts, so that a
	// claim outlasts its call and record with room to spare.
	DefaultLease = 6 * DefaultTimeout
	// DefaultBatch is how many refunds one claim takes, and so how many
	// calls run at once.
	DefaultBatch = 8
	// DefaultMinBackoff and DefaultMaxBackoff bound the wait before a
	// refund whose call failed is tried again.
	DefaultMinBackoff = 5 * time.Second
	DefaultMaxBackoff = 30 * time.Minute
	// DefaultInterval is Run's interval when it is given none.
	DefaultInterval = 5 * time.Second
	// recordTimeout bounds each record, which runs even while the
	// refunder is being stopped: an answer from Stripe is recorded if it
	// can be.
	recordTimeout = 5 * time.Second
)

// Refunder pays refunds owed back through Stripe's Refund API. Every
// replica runs one; the leases keep them off each other's refunds.
//
// Each refund is paid back in three steps: a claim (a short transaction
// that leases it), the call to Stripe outside any transaction, with
// Idempotency-Key: <refund_id>, and a record of the answer in another
// transaction. A crash between the call and the record leaves the refund
// owed and claimed; once the lease runs out a refunder claims it again and
// repeats the call with the same key, which Stripe answers with the first
// call's Refund (or, after 24 hours, charge_already_refunded: see
// Client.Refund). Two refunders do not call for one refund at once: a
// claim's lease is longer than a call and its record together, and a claim
// whose lease runs short before its call is left alone. Only a process
// stopped for longer than a lease (a frozen VM) could still be calling when
// another claims; the key makes the two calls one refund even then.
type Refunder struct {
	Store   Store
	Client  *Client
	Logger  *slog.Logger // nil: logs nothing
	Metrics Metrics
	Hooks   Hooks

	// Lease is a claim's lease; zero means DefaultLease. It must be
	// longer than the client's Timeout and a record's together.
	Lease time.Duration
	// Batch is how many refunds a claim takes at most; zero means
	// DefaultBatch.
	Batch int
	// MinBackoff and MaxBackoff bound the wait before a failed call is
	// tried again; zero means DefaultMinBackoff, DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
}

// Once claims a batch of refunds and calls for each, at once, recording
// each answer. It returns how many it claimed, and the errors of claiming
// and of recording (an error of Stripe's is recorded, not returned).
func (r *Refunder) Once(ctx context.Context) (int, error) {
	lease := r.lease()
	if need := r.Client.Timeout() + recordTimeout; lease <= need {
		return 0, fmt.Errorf("refunder: lease %s is not longer than a call and its record (%s)", lease, need)
	}
	start := time.Now()
	claims, err := r.Store.Claim(ctx, lease, r.batch())
	if err != nil {
		return 0, fmt.Errorf("refunder: claim: %w", err)
	}
	// The lease was written after start, so it runs at least until
	// leaseEnds (give or take the database's clock against ours).
	leaseEnds := start.Add(lease)
	errs := make([]error, len(claims))
	var wg sync.WaitGroup
	for i, c := range claims {
		wg.Go(func() { errs[i] = r.pay(ctx, c, leaseEnds) })
	}
	wg.Wait()
	return len(claims), errors.Join(errs...)
}

// pay calls for one claimed refund and records the answer.
func (r *Refunder) pay(ctx context.Context, c Claim, leaseEnds time.Time) error {
	log := r.logger().With("refund_id", c.RefundID, "payment_id", c.PaymentID, "attempts", c.Attempts)
	if left := time.Until(leaseEnds); left <= r.Client.Timeout()+recordTimeout {
		log.WarnContext(ctx, "refund claim left to run out: its lease is too short for a call", "lease_left", left)
		r.outcome("left")
		return nil
	}
	if f := r.Metrics.Call; f != nil {
		f()
	}
	s, err := r.Client.Refund(ctx, RefundRequest{RefundID: c.RefundID, PaymentIntent: c.PaymentID, AmountCents: c.AmountCents})
	if h := r.Hooks.BetweenCallAndRecord; h != nil {
		h(ctx, c.RefundID)
	}
	if err != nil && ctx.Err() != nil {
		// Stopped: the lease runs out and the call is made again.
		return nil
	}
	// The answer is recorded even while the refunder is being stopped.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	switch {
	case err == nil && (s.Status == "failed" || s.Status == "canceled"):
		msg := fmt.Sprintf("stripe refund %s is %s", s.ProviderRefundID, s.Status)
		log.ErrorContext(ctx, "refund failed", "provider_refund_id", s.ProviderRefundID, "status", s.Status)
		return r.fail(rctx, c, msg)
	case err == nil:
		if err := r.Store.Record(rctx, c.RefundID, s.ProviderRefundID, s.Status); err != nil {
			return fmt.Errorf("refunder: record refund %s as %s (%s): %w", c.RefundID, s.ProviderRefundID, s.Status, err)
		}
		log.InfoContext(ctx, "refund recorded", "provider_refund_id", s.ProviderRefundID, "status", s.Status, "listed", s.Listed,
			"amount_cents", c.AmountCents, "currency", c.Currency)
		r.outcome("recorded")
		return nil
	}
	if f := r.Metrics.Error; f != nil {
		f(KindOf(err))
	}
	if !Retryable(err) {
		log.ErrorContext(ctx, "refund failed", "err", err)
		return r.fail(rctx, c, err.Error())
	}
	after := r.backoff(c.Attempts)
	log.WarnContext(ctx, "refund call failed; it is tried again", "err", err, "after", after)
	if err := r.Store.Retry(rctx, c.RefundID, err.Error(), after); err != nil {
		return fmt.Errorf("refunder: retry refund %s: %w", c.RefundID, err)
	}
	r.outcome("retry")
	return nil
}

func (r *Refunder) fail(ctx context.Context, c Claim, msg string) error {
	if err := r.Store.Fail(ctx, c.RefundID, msg); err != nil {
		return fmt.Errorf("refunder: fail refund %s: %w", c.RefundID, err)
	}
	r.outcome("failed")
	return nil
}

// Run calls Once every interval (DefaultInterval if it is not positive),
// give or take half of it at random so that replicas started together do
// not claim together, and at once again after a full batch, until ctx
// ends.
func (r *Refunder) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := r.Once(ctx)
		if err != nil && ctx.Err() == nil {
			r.logger().ErrorContext(ctx, "refunder", "err", err)
		}
		wait := interval/2 + rand.N(interval+1)
		if err == nil && n == r.batch() {
			wait = 0
		}
		t.Reset(wait)
	}
}

// backoff is the wait before a refund claimed attempts times before is
// tried again: drawn at random from [interval/2, 3×interval/2], where the
// interval doubles with each attempt from MinBackoff up to MaxBackoff.
func (r *Refunder) backoff(attempts int) time.Duration {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     r.MinBackoff,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         r.MaxBackoff,
	}
	if b.InitialInterval == 0 {
		b.InitialInterval = DefaultMinBackoff
	}
	if b.MaxInterval == 0 {
		b.MaxInterval = DefaultMaxBackoff
	}
	b.Reset()
	// The interval stops growing at MaxInterval, 64 doublings at most.
	for range min(attempts, 64) {
		b.NextBackOff()
	}
	return b.NextBackOff()
}

func (r *Refunder) lease() time.Duration {
	if r.Lease == 0 {
		return DefaultLease
	}
	return r.Lease
}

func (r *Refunder) batch() int {
	if r.Batch <= 0 {
		return DefaultBatch
	}
	return r.Batch
}

func (r *Refunder) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}

func (r *Refunder) outcome(o string) {
	if f := r.Metrics.Outcome; f != nil {
		f(o)
	}
}
