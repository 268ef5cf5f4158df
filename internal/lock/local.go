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
	return l.ObtainWhile(ctx, key, nil)
}

// ObtainWhile is Obtain for a caller whose reason to wait may go away while
// the key is held. A Local waiter does not retry: the holder's release
// hands it the key. So still is called once, when the key has been handed
// over after a wait, and if it returns an error the key passes on to the
// next waiter and ObtainWhile returns that error. A key that is free at
// once is taken without calling still. still may be nil.
func (l *Local) ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*Lease, error) {
	waitCtx, cancel := context.WithTimeout(ctx, l.wait)
	defer cancel()
	if err := l.keys.lockWhile(waitCtx, key, still); err != nil {
		return nil, err
	}
	return newLease(ctx, key, 0, func(context.Context) error {
		l.keys.unlock(key)
		return nil
	}), nil
}

// RaiseFence does nothing and returns nil: a Local lock gives no fencing
// tokens, so it keeps no counter to raise.
func (l *Local) RaiseFence(context.Context, string, int64) error { return nil }

// Stats reports the callers waiting for a key now (Waiting). A Local lock
// tries nothing at a server and wakes nobody but by handing the key over:
// Attempts and Wakeups stay 0.
func (l *Local) Stats() Stats { return Stats{Waiting: l.keys.waiting()} }

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

// lockWhile takes key's mutex, waiting until ctx ends; then it returns an
// error wrapping ErrNotObtained and ctx's cause. After a wait — a holder
// handed the key on — it calls still, if not nil, and if that fails it
// passes the key on and returns still's error.
func (k *keyed) lockWhile(ctx context.Context, key string, still func(context.Context) error) error {
	if k.tryLock(key) {
		return nil
	}
	if !k.lock(ctx, key) {
		return notObtained(ctx)
	}
	if still != nil {
		if err := still(ctx); err != nil {
			k.unlock(key)
			return err
		}
	}
	return nil
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

// ObtainWhile is Obtain: nothing is ever held, so nothing is waited for,
// and still is never called.
func (n None) ObtainWhile(ctx context.Context, key string, _ func(context.Context) error) (*Lease, error) {
	return n.Obtain(ctx, key)
}

// RaiseFence does nothing and returns nil: None gives no fencing tokens.
func (None) RaiseFence(context.Context, string, int64) error { return nil }

// Stats is zero: None tries nothing, and nobody waits for it.
func (None) Stats() Stats { return Stats{} }
