package lock

import (
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"
)

// Subscriber opens a pub/sub subscription; *redis.Client implements it.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Stats counts what a lock's waiters did.
type Stats struct {
	// Attempts is how many times an acquisition was tried in Redis.
	Attempts uint64
	// Wakeups is how many waiters were woken by a release (their own
	// process's, or one announced on the release channel) rather than by
	// their backoff timer.
	Wakeups uint64
	// Waiting is how many waiters are in line for a wakeup now.
	Waiting int
}

// waiter is the retry loop the Redis locks share: try, and while the key is
// held, sleep with exponential backoff and full jitter — unless a release of
// the key wakes the waiter first.
type waiter struct {
	wait, minBackoff, maxBackoff time.Duration
	// wake is nil when releases are not announced: backoff only.
	wake     *wakeups
	attempts atomic.Uint64
}

func newWaiter(opt RedisOptions) *waiter {
	w := &waiter{wait: opt.Wait, minBackoff: opt.MinBackoff, maxBackoff: opt.MaxBackoff}
	if opt.Subscriber != nil {
		w.wake = newWakeups(opt.Subscriber, opt.Prefix+"released")
	}
	return w
}

// attemptFunc tries to take the lock once, under tryCtx, for a lease that
// lives on ctx. A key held by someone else is ErrNotObtained.
type attemptFunc func(ctx, tryCtx context.Context) (*Lease, error)

// obtain runs attempt until it returns anything but ErrNotObtained, for at
// most the wait and never past ctx.
func (w *waiter) obtain(ctx context.Context, key string, attempt attemptFunc) (*Lease, error) {
	waitCtx, cancel := context.WithTimeout(ctx, w.wait)
	defer cancel()

	b := &backoff.ExponentialBackOff{
		InitialInterval: w.minBackoff,
		// Full jitter: each sleep is drawn uniformly from [0, 2×interval].
		RandomizationFactor: 1,
		Multiplier:          2,
		MaxInterval:         w.maxBackoff,
	}
	b.Reset()
	var (
		timer *time.Timer
		woken <-chan struct{}
	)
	for {
		l, err := w.try(ctx, waitCtx, attempt)
		if !errors.Is(err, ErrNotObtained) {
			return l, err
		}
		if waitCtx.Err() != nil {
			return nil, notObtained(waitCtx)
		}
		if woken == nil && w.wake != nil {
			// Registered after the first failure, so the uncontended path
			// pays nothing; a release in between is caught by the backoff.
			ch, done := w.wake.add(key)
			defer done()
			woken = ch
		}
		d := b.NextBackOff()
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-waitCtx.Done():
			return nil, notObtained(waitCtx)
		case <-timer.C:
		case <-woken:
			w.wake.woken.Add(1)
		}
	}
}

// try makes one attempt and counts it.
func (w *waiter) try(ctx, tryCtx context.Context, attempt attemptFunc) (*Lease, error) {
	w.attempts.Add(1)
	return attempt(ctx, tryCtx)
}

// released wakes a waiter of this process after the key was released here.
// Other processes learn of it from the release channel.
func (w *waiter) released(key string) {
	if w.wake != nil {
		w.wake.one(key)
	}
}

// channel returns the script arguments that make a release announce itself:
// the channel and the message, or nothing when releases are not announced.
func (w *waiter) channel(key string) []any {
	if w.wake == nil {
		return nil
	}
	return []any{w.wake.channel, w.wake.id + key}
}

func (w *waiter) stats() Stats {
	s := Stats{Attempts: w.attempts.Load()}
	if w.wake != nil {
		s.Wakeups = w.wake.woken.Load()
		s.Waiting = w.wake.len()
	}
	return s
}

func (w *waiter) close() error {
	if w.wake == nil {
		return nil
	}
	return w.wake.close()
}

// wakeups is a process's one subscription to a lock's release channel,
// fanned out to the waiters by key. Each release wakes one waiter of the key
// in each process, the longest waiting first: one retry per release instead
// of a herd. A waiter that is woken and loses the race stays first in line.
// A message lost (the subscription reconnecting, say) costs the waiters no
// more than their backoff.
type wakeups struct {
	sub     Subscriber
	channel string
	// id prefixes this process's messages, so it can skip them: its own
	// releases wake its waiters directly.
	id    string
	woken atomic.Uint64

	mu      sync.Mutex
	waiting map[string][]chan struct{}
	ps      *redis.PubSub
	closed  bool
	done    chan struct{} // closed when the receiving goroutine ends
}

func newWakeups(sub Subscriber, channel string) *wakeups {
	return &wakeups{sub: sub, channel: channel, id: rand.Text(), waiting: make(map[string][]chan struct{})}
}

// add puts a waiter for key in line and returns the channel that wakes it
// and the function that takes it out of line. The first waiter opens the
// subscription.
func (w *wakeups) add(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ps == nil && !w.closed {
		w.subscribe()
	}
	w.waiting[key] = append(w.waiting[key], ch)
	return ch, func() { w.remove(key, ch) }
}

func (w *wakeups) remove(key string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	line := w.waiting[key]
	for i, c := range line {
		if c == ch {
			line = append(line[:i], line[i+1:]...)
			break
		}
	}
	if len(line) == 0 {
		delete(w.waiting, key)
	} else {
		w.waiting[key] = line
	}
}

func (w *wakeups) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, line := range w.waiting {
		n += len(line)
	}
	return n
}

// one wakes the first waiter of key that is not already woken.
func (w *wakeups) one(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.waiting[key] {
		select {
		case ch <- struct{}{}:
			return
		default:
		}
	}
}

// subscribe starts the receiving goroutine; w.mu is held. go-redis
// resubscribes by itself after a lost connection.
func (w *wakeups) subscribe() {
	w.ps = w.sub.Subscribe(context.Background(), w.channel)
	w.done = make(chan struct{})
	msgs := w.ps.Channel()
	go func() {
		defer close(w.done)
		for m := range msgs {
			if len(m.Payload) >= len(w.id) && m.Payload[:len(w.id)] != w.id {
				w.one(m.Payload[len(w.id):])
			}
		}
	}()
}

func (w *wakeups) close() error {
	w.mu.Lock()
	w.closed = true
	ps, done := w.ps, w.done
	w.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	return err
}
