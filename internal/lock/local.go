package lock

import (
	"context"
	"sync"
	"time"
)

// Local is a mutex per key that lives in one process. It is what a
// "synchronized" block gives a single replica, and exactly as weak across
// several. A key's entry exists only while someone holds or waits for it, so
// the map does not grow with the number of keys ever locked.
type Local struct {
	wait time.Duration

	mu   sync.Mutex
	keys map[string]*localKey
}

type localKey struct {
	sem  chan struct{} // holds one token while the key is locked
	refs int           // holders plus waiters
}

// NewLocal returns a Local lock whose Obtain waits at most wait.
func NewLocal(wait time.Duration) *Local {
	return &Local{wait: wait, keys: make(map[string]*localKey)}
}

// Obtain locks key, waiting at most the configured wait and never past ctx.
func (l *Local) Obtain(ctx context.Context, key string) (*Lease, error) {
	k := l.ref(key)
	waitCtx, cancel := context.WithTimeout(ctx, l.wait)
	defer cancel()
	select {
	case k.sem <- struct{}{}:
	case <-waitCtx.Done():
		l.unref(key, k)
		return nil, notObtained(waitCtx)
	}
	return newLease(ctx, key, 0, func(context.Context) error {
		<-k.sem
		l.unref(key, k)
		return nil
	}), nil
}

// Len reports how many keys are held or waited for.
func (l *Local) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

func (l *Local) ref(key string) *localKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	k, ok := l.keys[key]
	if !ok {
		k = &localKey{sem: make(chan struct{}, 1)}
		l.keys[key] = k
	}
	k.refs++
	return k
}

func (l *Local) unref(key string, k *localKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k.refs--; k.refs == 0 {
		delete(l.keys, key)
	}
}

// None is no lock at all: Obtain always succeeds at once. It exists so the
// order path can be run unguarded, to show what the lock is for.
type None struct{}

// Obtain returns a lease that excludes nobody.
func (None) Obtain(ctx context.Context, key string) (*Lease, error) {
	return newLease(ctx, key, 0, func(context.Context) error { return nil }), nil
}
