package stock

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/semaphore"
)

// DefaultGateWait is how long a public read waits for a place under its
// gate before it is refused: long enough to ride out a burst of honest
// readers, short enough that a flood is answered 503 at once rather than
// queued.
const DefaultGateWait = 20 * time.Millisecond

// DefaultLookupWait is how long a lifecycle look-up (Catalog.Lookups)
// waits for a place under its gate: longer than a public read, since
// those who send them are buyers acting on their own orders, each bounded
// by the API's per-buyer limit, and a burst of them near pay_by is honest
// and should be served in turn rather than refused.
const DefaultLookupWait = 250 * time.Millisecond

// gate bounds how many reads of one kind reach MySQL at once: those made
// for public requests, or the lifecycle's look-ups. A read that finds no
// place within its wait is refused with ErrBusy, so that a flood of them
// costs MySQL at most the gate's width of connections, and its clients a
// fast 503, rather than a queue for a pool that the rest of the service
// waits behind too.
type gate struct {
	sem   *semaphore.Weighted
	width int
	wait  time.Duration
	// reads names the gate's reads in its refusals.
	reads string
}

func newGate(width int, wait time.Duration, reads string) *gate {
	return &gate{sem: semaphore.NewWeighted(int64(width)), width: width, wait: wait, reads: reads}
}

// pass runs fn if a place frees within the gate's wait; a nil gate runs
// every fn.
func (g *gate) pass(ctx context.Context, what string, fn func() error) error {
	if g == nil {
		return fn()
	}
	wait, cancel := context.WithTimeout(ctx, g.wait)
	err := g.sem.Acquire(wait, 1)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %s: %w", ErrBusy, what, context.Cause(ctx))
		}
		return fmt.Errorf("%w: %s: %d %s at once already", ErrBusy, what, g.width, g.reads)
	}
	defer g.sem.Release(1)
	return fn()
}
