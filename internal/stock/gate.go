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

// gate bounds how many reads made for public requests reach MySQL at
// once. A read that finds no place within its wait is refused with
// ErrBusy, so that a flood of them costs MySQL at most the gate's width of
// connections, and its clients a fast 503, rather than a queue for a pool
// that the rest of the service waits behind too.
type gate struct {
	sem   *semaphore.Weighted
	width int
	wait  time.Duration
}

func newGate(width int, wait time.Duration) *gate {
	return &gate{sem: semaphore.NewWeighted(int64(width)), width: width, wait: wait}
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
		return fmt.Errorf("%w: %s: %d public reads at once already", ErrBusy, what, g.width)
	}
	defer g.sem.Release(1)
	return fn()
}
