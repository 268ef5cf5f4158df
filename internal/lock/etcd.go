package lock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EtcdOptions configures an etcd lock. Zero fields take the defaults.
type EtcdOptions struct {
	// Prefix is put before every key; default "/shop/lock/".
	Prefix string
	// TTL is the lease of the lock's session, default 5s, rounded up to
	// whole seconds: etcd's unit. The server raises a TTL below its minimum
	// — 1.5 election timeouts rounded up to whole seconds, 2s with etcd's
	// default 1000ms election timeout — to that minimum. A holder whose
	// process stops keeps its keys this long.
	TTL time.Duration
	// Wait bounds how long Obtain waits for a held key; default 2s.
	Wait time.Duration
}

func (opt EtcdOptions) withDefaults() EtcdOptions {
	if opt.Prefix == "" {
		opt.Prefix = "/shop/lock/"
	}
	if opt.TTL <= 0 {
		opt.TTL = 5 * time.Second
	}
	if opt.Wait <= 0 {
		opt.Wait = 2 * time.Second
	}
	return opt
}

// ttlSeconds is opt.TTL rounded up to whole seconds, at least one.
func (opt EtcdOptions) ttlSeconds() int64 {
	return max(1, int64((opt.TTL+time.Second-1)/time.Second))
}

// Etcd is a lock held in an etcd cluster, whose Raft log makes a holding
// survive the loss of a minority of the members — the leader included —
// without a second holder.
//
// A process's leases live in one concurrency.Session: an etcd lease of TTL
// that the client keeps alive while the process runs. It is the watchdog:
// when the session ends (the process cannot reach a quorum for a TTL, or
// the lease was revoked) every lease taken in it is lost, and its Context
// is cancelled with a cause wrapping ErrNotHeld; the next Obtain starts a
// new session. The client notices the end by its own reckoning, up to a
// second after the TTL has run out since the last keep-alive it was
// answered, which can be a moment after etcd deleted the keys: writes are
// kept safe by the fencing token, not by the Context.
//
// Each acquisition is a concurrency.Mutex: a key under Prefix+key named
// after the session's lease, created in one transaction. The holder is the
// key with the oldest create revision; a waiter watches the key just ahead
// of it and is woken when that one is deleted, without polling. Its create
// revision is the lease's fencing token: etcd's revision counts every
// write of the cluster and never goes back, across restarts and leader
// changes, so every later holder of a key has a larger one. (Only a
// cluster rebuilt without its data starts again from 1.)
//
// Because the mutex's key is named after the session, two callers of one
// process must never wait for the same key in etcd at once: they queue in
// process first (keyed), and only the first of them contends in etcd.
type Etcd struct {
	client *clientv3.Client
	opt    EtcdOptions
	ttl    int64

	line     keyed
	attempts atomic.Uint64
	wakeups  atomic.Uint64
	waiting  atomic.Int64 // callers inside a Lock in etcd

	// ctx lives as long as the lock: it carries the sessions' keep-alives
	// and their revocation at Close, then ends.
	ctx    context.Context
	cancel context.CancelFunc
	// sessionMu guards sess and closed; a channel, so that a caller waits
	// for it no longer than its context lasts.
	sessionMu chan struct{}
	sess      *concurrency.Session
	closed    bool
	// cleanups are the goroutines that delete a key an acquisition may
	// have left behind (see forget).
	cleanups sync.WaitGroup
}

// NewEtcd returns an etcd lock on client. Close it when done: that revokes
// its session. The client stays open.
func NewEtcd(client *clientv3.Client, opt EtcdOptions) *Etcd {
	opt = opt.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Etcd{client: client, opt: opt, ttl: opt.ttlSeconds(), ctx: ctx, cancel: cancel,
		sessionMu: make(chan struct{}, 1)}
}

// errEtcdClosed is the error of an Obtain on a closed lock.
var errEtcdClosed = errors.New("lock: etcd lock is closed")

// Key returns the etcd prefix under which key's holder and waiters queue,
// each as Key(key)+"/"+their session's lease ID in hex. A "/" in key is
// escaped, so that the prefix of a key is never a prefix of another's.
func (e *Etcd) Key(key string) string {
	return e.opt.Prefix + strings.NewReplacer("%", "%25", "/", "%2F").Replace(key)
}

// ownKey is the key that the session sess queues with for key.
func (e *Etcd) ownKey(sess *concurrency.Session, key string) string {
	return fmt.Sprintf("%s/%x", e.Key(key), sess.Lease())
}

// Stats reports what the lock's callers have done so far: Attempts counts
// the mutex's Lock and TryLock calls, Wakeups the locks obtained after
// waiting in etcd, Waiting the callers waiting now, in process or in etcd.
func (e *Etcd) Stats() Stats {
	return Stats{Attempts: e.attempts.Load(), Wakeups: e.wakeups.Load(),
		Waiting: e.line.waiting() + int(e.waiting.Load())}
}

// RaiseFence does nothing and returns nil. An etcd lease's fencing token is
// its key's create revision, which counts every write of the cluster: there
// is no counter of the lock's own to raise, and the revision goes back only
// in a cluster rebuilt without its data. A row fenced above the revision
// (by a lock of another family, or before such a rebuild) stays refused
// until the cluster's writes pass it.
func (e *Etcd) RaiseFence(context.Context, string, int64) error { return nil }

// Close revokes the lock's session, which frees every key it holds or
// waits for (their leases are lost), and waits for its clean-ups. It does
// not close the client.
func (e *Etcd) Close() error {
	e.sessionMu <- struct{}{}
	e.closed = true
	sess := e.sess
	<-e.sessionMu
	var err error
	if sess != nil {
		// Revoked under e.ctx, for at most the TTL (concurrency.Session).
		if err = sess.Close(); err != nil {
			err = fmt.Errorf("lock: revoke the etcd session: %w", err)
		}
	}
	e.cancel()
	e.cleanups.Wait()
	return err
}

// session returns the lock's session, starting a new one when there is
// none or the last has ended. The lease is granted under ctx; its
// keep-alives live as long as the lock.
func (e *Etcd) session(ctx context.Context) (*concurrency.Session, error) {
	select {
	case e.sessionMu <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-e.sessionMu }()
	if e.closed {
		return nil, errEtcdClosed
	}
	if e.sess != nil {
		select {
		case <-e.sess.Done():
		default:
			return e.sess, nil
		}
	}
	grant, err := e.client.Grant(ctx, e.ttl)
	if err != nil {
		return nil, fmt.Errorf("lock: grant an etcd lease: %w", err)
	}
	sess, err := concurrency.NewSession(e.client, concurrency.WithTTL(int(grant.TTL)),
		concurrency.WithLease(grant.ID), concurrency.WithContext(e.ctx))
	if err != nil {
		return nil, fmt.Errorf("lock: keep the etcd lease alive: %w", err)
	}
	e.sess = sess
	return sess, nil
}

// Obtain takes the lock on key. While the key is held it waits — in line
// behind the callers of this process, then in etcd's queue, woken when the
// key ahead of it is deleted — for at most the configured wait and never
// past ctx; then it returns an error wrapping ErrNotObtained and the
// context's cause, and leaves no key of its own queued. An etcd error that
// says the cluster is electing a leader is retried within the wait; any
// other ends it at once.
//
// The lease lasts until Release, or until the session it was taken in
// ends: then its Context is cancelled with a cause wrapping ErrNotHeld.
func (e *Etcd) Obtain(ctx context.Context, key string) (*Lease, error) {
	return e.ObtainWhile(ctx, key, nil)
}

// ObtainWhile is Obtain for a caller whose reason to wait may go away while
// the key is held: after waiting — in line behind a holder of this process,
// before it contends in etcd, and in etcd, once it holds the key — it calls
// still, and gives up with its error if it returns one (releasing the key
// it has just taken). still may be nil.
func (e *Etcd) ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*Lease, error) {
	waitCtx, cancel := context.WithTimeout(ctx, e.opt.Wait)
	defer cancel()
	// In line behind the callers of this process; still is called if it
	// waited there.
	if err := e.line.lockWhile(waitCtx, key, still); err != nil {
		return nil, err
	}
	// In line from here on: the key's turn in process passes on when the
	// lease is released, or when what this attempt may have left in etcd
	// is gone.
	var failed error // the last error of a session that ended meanwhile
	for {
		sess, err := e.session(waitCtx)
		if err != nil {
			e.line.unlock(key)
			if ended(waitCtx) {
				return nil, errors.Join(notObtained(waitCtx), failed)
			}
			return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
		}
		l, contended, err := e.lock(ctx, waitCtx, sess, key)
		switch {
		case errors.Is(err, errSessionEnded):
			// The keys went with the session: start a new one.
			failed = err
			continue
		case err != nil && ended(waitCtx):
			return nil, errors.Join(notObtained(waitCtx), unlessContext(err))
		case err != nil:
			return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
		}
		if contended && still != nil {
			if err := still(waitCtx); err != nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
				defer cancel()
				l.Release(rctx)
				return nil, err
			}
		}
		return l, nil
	}
}

// errSessionEnded is lock's error when the session ended while it waited,
// with the wait still on: the caller is still in line and tries again in
// a new session.
var errSessionEnded = errors.New("lock: the etcd session ended while waiting")

// lock waits in etcd for key under sess, within waitCtx, and returns the
// lease on ctx and whether it had to wait. The caller is first in line for
// key in process; when lock fails it passes the turn on, once what the
// attempt may have left in etcd is deleted (see forget), except on
// errSessionEnded. The mutex runs on a goroutine of its own: when the wait
// ends first, lock returns at once, and forget gives back whatever the
// mutex takes and stays in line until it has. (A mutex that gives up
// deletes its key on the client's context, which waits for as long as etcd
// cannot be reached.)
func (e *Etcd) lock(ctx, waitCtx context.Context, sess *concurrency.Session, key string) (*Lease, bool, error) {
	m := concurrency.NewMutex(sess, e.Key(key))
	done := make(chan error, 1)
	e.waiting.Add(1)
	go func() {
		defer e.waiting.Add(-1)
		done <- e.acquire(waitCtx, sess, m)
	}()
	var err error
	select {
	case err = <-done:
	case <-waitCtx.Done():
		select {
		case err = <-done:
		default:
			e.forget(sess, key, done)
			return nil, false, notObtained(waitCtx)
		}
	}
	switch {
	case err != nil && sessionEnded(sess) && !ended(waitCtx):
		// Its keys are gone with it.
		return nil, false, fmt.Errorf("%w: %w", errSessionEnded, err)
	case err != nil:
		e.forget(sess, key, nil)
		return nil, false, err
	}
	fence := ownRevision(m)
	// Uncontended, the mutex's header is its transaction's, whose
	// revision created the key; after a wait it is a later read's.
	contended := m.Header().Revision != fence
	if contended {
		e.wakeups.Add(1)
	}
	return e.lease(ctx, sess, m, key, fence), contended, nil
}

// leaderChangeBackoff is the pause before a Lock is retried after an etcd
// error that says the cluster has no leader for a moment.
const leaderChangeBackoff = 50 * time.Millisecond

// acquire runs m.Lock until it holds the key or fails for good, within
// ctx: an error that says the cluster is electing a leader is retried —
// the retry finds the key it queued with, if it was created, and keeps
// its place.
func (e *Etcd) acquire(ctx context.Context, sess *concurrency.Session, m *concurrency.Mutex) error {
	for backoff := leaderChangeBackoff; ; backoff = min(2*backoff, time.Second) {
		e.attempts.Add(1)
		err := m.Lock(ctx)
		if err == nil || !electing(err) || sessionEnded(sess) || !sleep(ctx, backoff) {
			return err
		}
	}
}

// TryObtain takes the lock on key if it is free and otherwise returns
// ErrNotObtained at once, as it does when a caller of this process holds
// or waits for the key. The lease is watched as Obtain's is.
func (e *Etcd) TryObtain(ctx context.Context, key string) (*Lease, error) {
	if !e.line.tryLock(key) {
		return nil, ErrNotObtained
	}
	sess, err := e.session(ctx)
	if err != nil {
		e.line.unlock(key)
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	}
	m := concurrency.NewMutex(sess, e.Key(key))
	e.attempts.Add(1)
	switch err := m.TryLock(ctx); {
	case err == nil:
		return e.lease(ctx, sess, m, key, ownRevision(m)), nil
	case errors.Is(err, concurrency.ErrLocked):
		// TryLock has deleted the key it queued with.
		e.line.unlock(key)
		return nil, ErrNotObtained
	default:
		e.forget(sess, key, nil)
		if ended(ctx) {
			return nil, errors.Join(notObtained(ctx), unlessContext(err))
		}
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	}
}

// ownRevision returns the create revision of the key m holds the lock
// with. The mutex keeps it, and hands it out in IsOwner's comparison: no
// round trip is needed.
func ownRevision(m *concurrency.Mutex) int64 {
	cmp := m.IsOwner()
	return cmp.GetCompare().GetCreateRevision()
}

// lease is the lease of the mutex m, which holds key in sess. Its Context
// is cancelled with ErrNotHeld when the session ends; its release deletes
// the mutex's key if it is still the one that m created.
func (e *Etcd) lease(ctx context.Context, sess *concurrency.Session, m *concurrency.Mutex, key string, fence int64) *Lease {
	var stop func() bool
	l := newLease(ctx, key, fence, func(ctx context.Context) error {
		stop()
		resp, err := e.client.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpDelete(m.Key())).Commit()
		switch {
		case err != nil && sessionEnded(sess):
			e.line.unlock(key)
			return fmt.Errorf("lock: release %q: %w: its etcd session ended (%w)", key, ErrNotHeld, err)
		case err != nil:
			// It may have been deleted or not: forget makes sure.
			e.forget(sess, key, nil)
			return fmt.Errorf("lock: release %q: %w", key, err)
		}
		e.line.unlock(key)
		if !resp.Succeeded {
			return fmt.Errorf("lock: release %q: %w", key, ErrNotHeld)
		}
		return nil
	})
	stop = context.AfterFunc(sess.Ctx(), func() {
		l.cancel(fmt.Errorf("%w: the etcd session of the lease on %q ended", ErrNotHeld, key))
	})
	return l
}

// forgetBackoff bounds the pause between forget's deletes.
const forgetBackoff = time.Second

// forget deletes, in the background, the key that an acquisition of key in
// sess may have left queued in etcd — a Lock whose reply was lost, a
// release that failed — and then passes key's turn in process on. A key
// left behind would be kept alive with the session and block every other
// holder for good. If pending is not nil, the acquisition still runs: its
// outcome is awaited first, and a lock it took is given back. It retries
// until the key is deleted or the session ends, which deletes it too.
func (e *Etcd) forget(sess *concurrency.Session, key string, pending <-chan error) {
	own := e.ownKey(sess, key)
	e.cleanups.Go(func() {
		defer e.line.unlock(key)
		if pending != nil {
			select {
			case <-pending:
			case <-sess.Done():
				return
			}
		}
		for backoff := leaderChangeBackoff; ; backoff = min(2*backoff, forgetBackoff) {
			ctx, cancel := context.WithTimeout(sess.Ctx(), cleanupTimeout)
			_, err := e.client.Delete(ctx, own)
			cancel()
			if err == nil || !sleep(sess.Ctx(), backoff) {
				return
			}
		}
	})
}

// sessionEnded reports whether sess has ended.
func sessionEnded(sess *concurrency.Session) bool {
	select {
	case <-sess.Done():
		return true
	default:
		return false
	}
}

// electing reports whether err is etcd's answer that it cannot serve the
// request for a moment — no leader, a leader change, a proposal timed out
// — or a member that cannot be reached while the client fails over to
// another: gRPC's Unavailable.
func electing(err error) bool {
	var etcdErr rpctypes.EtcdError
	if errors.As(err, &etcdErr) {
		return etcdErr.Code() == codes.Unavailable
	}
	return status.Code(err) == codes.Unavailable
}

// unlessContext returns err unless it is only a context's error, which
// notObtained reports already.
func unlessContext(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}
