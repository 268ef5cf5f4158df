// Package failpoint holds the service's fault-injection hooks, for the demo
// and the tests that must make a race happen on every run rather than by
// chance.
//
// They exist only in a binary built with the build tag "failpoints"
// (`go build -tags failpoints`; make demo builds bin/shop-failpoints so). In
// a default build New returns Hooks whose fields are all nil, nothing of
// go.etcd.io/gofail is linked, and no environment variable or request can
// reach a failpoint: a default `shop serve` has none.
//
// In a failpoints build the hooks are etcd's gofail failpoints, set as
// gofail sets them: GOFAIL_FAILPOINTS in the environment at start-up
// ("name=terms;name=terms"), or GOFAIL_HTTP=host:port for gofail's HTTP
// endpoint. The failpoints:
//
//	shopStaleWrite=1*return(2000)
//	    the first order holder to reach it (after it read the product, before
//	    it writes the stock) stops for 2000 ms, as a process stopped by a GC
//	    pause or a frozen VM would: the watchdogs of every lease in the process
//	    stop with it and stay stopped until that holder's transaction has
//	    ended, so its lease runs out in Redis and its write reaches MySQL
//	    before it can learn so. This is the one interleaving fencing tokens
//	    exist for (docs/experiment.md, "Failpoints", rows 6 and 7).
//	shopSweepStall=1*return(5000)
//	    the first transaction to reach it that gives units back (a sweep of
//	    lapsed reservations, or a cancellation), after its writes and before
//	    its COMMIT, prints a line to stderr and stops for 5000 ms, so that the
//	    demo can kill the process with the transaction open.
//	shopRefundKill=1*return(5000)
//	    the first refund the refunder has called Stripe's Refund API for
//	    prints a line to stderr and stops for 5000 ms before its answer is
//	    recorded, so that the demo can kill the process between the call and
//	    the record: the refund stays owed, and once its lease runs out the
//	    call is made again with the same Idempotency-Key.
//	shopEventKill=1*return(5000)
//	    the first event the relay delivered (answered 2xx) prints a line to
//	    stderr and stops for 5000 ms before it is marked delivered, so that
//	    the demo can kill the process between the POST and the mark: once
//	    the claim's lease runs out the event is sent again, with the same
//	    webhook-id.
package failpoint

import (
	"context"
	"time"
)

// Hooks are the places a failpoints build can stop or fail. Every field is
// nil in a default build, and nil means "no hook" to whoever takes it.
type Hooks struct {
	// BeforeWrite is stock.Options.BeforeWrite: it runs under the SKU's
	// lease between the read of the product and the write of its stock; the
	// function it returns runs when the order transaction has ended.
	BeforeWrite func(ctx context.Context, sku int64) (after func())
	// BeforeReturn is stock.Options.BeforeReturn: it runs in the
	// transaction that gives units back, before its COMMIT.
	BeforeReturn func(ctx context.Context, sku int64)
	// After is lock.RedisOptions.After, the timer lease watchdogs sleep on.
	After func(time.Duration) <-chan time.Time
	// BetweenRefundCallAndRecord is stripepay.Hooks.BetweenCallAndRecord:
	// it runs after the refunder's call to the Refund API and before the
	// transaction that records its answer.
	BetweenRefundCallAndRecord func(ctx context.Context, refundID string)
	// BetweenEventPostAndMark is outbox.Hooks.BetweenPostAndMark: it runs
	// after an event's POST was answered 2xx and before it is marked
	// delivered.
	BetweenEventPostAndMark func(ctx context.Context, eventID string)
}
