package lock

import (
	"context"
	"sync"
	"time"
)

// Local is a mutex per key that lives in one process. It is what a
// "synchronized" block gives a single replica, and exactly as weak across
// several.
type Local struct {
	wait time.Duration
	keys keyed
}

// NewLocal returns a Local lock whose Obtain waits at most wait.
func NewLocal(wait time.Duration) *Local {
	return &Local{wait: wait}
}

// Obtain locks key, waiting at most the configured wait and never past ctx.
func (l *Local) Obtain(ctx context.Context, key string) (*Lease, error) {
	waitCtx, cancel := context.WithTimeout(ctx, l.wait)
	defer cancel()
	if !l.keys.lock(waitCtx, key) {
		return nil, notObtained(waitCtx)
	}
	return newLease(ctx, key, 0, func(context.Context) error {
		l.keys.unlock(key)
		return nil
	}), nil
}

// Len reports how many keys are held or waited for.
func (l *Local) Len() int { return l.keys.len() }

// keyed is a mutex per key; waiters are served in the order they came. A
// key's entry exists only while someone holds or waits for it, so the map
// does not grow with the number of keys ever locked. The zero value is
// ready to use.
type keyed struct {
	mu   sync.Mutex
	keys map[string]*keyedEntry
}

type keyedEntry struct {
	sem  chan struct{} // holds one token while the key is locked
	refs int           // holders plus waiters
}

// lock takes key's mutex, waiting until ctx ends; it reports whether it did.
func (k *keyed) lock(ctx context.Context, key string) bool {
	e := k.ref(key)
	select {
	case e.sem <- struct{}{}:
		return true
	default:
	}
	select {
	case e.sem <- struct{}{}:
		return true
	case <-ctx.Done():
		k.unref(key, e)
		return false
	}
}

// tryLock takes key's mutex if nobody holds or waits for it.
func (k *keyed) tryLock(key string) bool {
	e := k.ref(key)
	select {
	case e.sem <- struct{}{}:
		return true
	default:
		k.unref(key, e)
		return false
	}
}

// unlock frees key's mutex for its next waiter.
func (k *keyed) unlock(key string) {
	k.mu.Lock()
	e := k.keys[key]
	k.mu.Unlock()
	<-e.sem
	k.unref(key, e)
}

// waiting counts the waiters, holders not included.
func (k *keyed) waiting() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, e := range k.keys {
		n += e.refs - len(e.sem)
	}
	return n
}

func (k *keyed) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

func (k *keyed) ref(key string) *keyedEntry {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys == nil {
		k.keys = make(map[string]*keyedEntry)
	}
	e, ok := k.keys[key]
	if !ok {
		e = &keyedEntry{sem: make(chan struct{}, 1)}
		k.keys[key] = e
	}
	e.refs++
	return e
}

func (k *keyed) unref(key string, e *keyedEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(k.keys, key)
	}
}

// None is no lock at all: Obtain always succeeds at once. It exists so the
// order path can be run unguarded, to show what the lock is for.
type None struct{}

// Obtain returns a lease that excludes nobody.
func (None) Obtain(ctx context.Context, key string) (*Lease, error) {
	return newLease(ctx, key, 0, func(context.Context) error { return nil }), nil
}
