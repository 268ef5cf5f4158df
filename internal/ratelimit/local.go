package ratelimit

import (
	"context"
	"sync"
	"time"
)

// Local keeps allowances in this process's memory, by the same GCRA as
// Limiter: for a limit that must hold while Redis does not answer (the
// admin token's guesses), at the cost of each replica keeping its own.
// Its zero value is ready to use.
type Local struct {
	mu sync.Mutex
	// tats are the keys' theoretical arrival times: a key may take a
	// request while its time is less than a burst ahead of now.
	tats map[string]time.Time
	// pruneAt is the number of keys at which those whose time has passed
	// (a full allowance, the same as no key) are dropped, so that
	// addresses seen once do not stay for ever.
	pruneAt int
}

// minPrune is the fewest keys at which Local drops those of full
// allowance.
const minPrune = 1024

// Take takes one request from key's allowance under lim, as
// Limiter.Take does; it never fails.
func (l *Local) Take(_ context.Context, key string, lim Limit) (time.Duration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	interval := emission(lim)
	tat := now
	if t := l.tats[key]; t.After(now) {
		tat = t
	}
	next := tat.Add(interval)
	if allowAt := next.Add(-interval * time.Duration(lim.Burst)); allowAt.After(now) {
		return allowAt.Sub(now), nil
	}
	if l.tats == nil {
		l.tats = map[string]time.Time{}
	}
	l.tats[key] = next
	if len(l.tats) >= max(l.pruneAt, minPrune) {
		for k, t := range l.tats {
			if !t.After(now) {
				delete(l.tats, k)
			}
		}
		l.pruneAt = 2 * len(l.tats)
	}
	return 0, nil
}

// Give gives back one request taken from key's allowance, as
// Limiter.Give does; it never fails.
func (l *Local) Give(_ context.Context, key string, lim Limit) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	tat, ok := l.tats[key]
	if !ok {
		return nil
	}
	if tat = tat.Add(-emission(lim)); tat.After(time.Now()) {
		l.tats[key] = tat
	} else {
		delete(l.tats, key)
	}
	return nil
}

// emission is the time one request of lim stands for.
func emission(lim Limit) time.Duration {
	return lim.Period / time.Duration(lim.Rate)
}
