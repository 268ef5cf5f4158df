// Package notify tells every replica what changed of a product, so that
// what each remembers in its own memory follows MySQL:
//
//   - its stock went up (Raised: the catalog was reseeded, a product
//     restocked, units returned), so that none goes on refusing orders from
//     what it remembered as sold out;
//   - an order committed (Changed), so that each drops its copy of the
//     product's page;
//   - it sold out (SoldOut), so that the others refuse its orders from
//     memory too, without a read of their own.
//
// It is a Redis pub/sub channel. A message can be lost (a replica's
// connection drops); each time a subscription is (re)established the
// listener is told that everything may have changed, and the memories it
// clears lapse by themselves after a short while in any case.
//
// Redis delivers one server's messages in the order it ran the PUBLISHes,
// but a publisher may run its PUBLISH late: a "sold out" could follow the
// "raised" of units returned after it. So SoldOut and Raised carry the
// SKU's fencing token of the hold that made the change, which only grows,
// and a listener drops a SoldOut older than a Raised it heard.
package notify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is what Restocks needs of go-redis; every redis.UniversalClient
// has it. On a Redis Cluster the channel is classic pub/sub, which the
// cluster bus carries to every node: an announcement made through any node
// reaches a subscription on any other.
type Client interface {
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	Pipeline() redis.Pipeliner
}

// Restocks is the channel on which changes of products are announced.
type Restocks struct {
	client  Client
	channel string

	// HealthCheck is how long a subscription may stay silent before Listen
	// pings it, and how long the answer may take before the connection is
	// given up for dead and the subscription made again. Set it before
	// Listen; zero means DefaultHealthCheck.
	HealthCheck time.Duration
}

// DefaultHealthCheck is Restocks.HealthCheck's default: a subscription
// whose connection silently died (a peer gone from the network without a
// reset, a NAT that forgot it) is noticed within twice this, where TCP's
// keepalive would take minutes.
const DefaultHealthCheck = 5 * time.Second

// New returns the channel prefix+"stock:raised" on client (named for the
// first of its announcements).
func New(client Client, prefix string) *Restocks {
	return &Restocks{client: client, channel: prefix + "stock:raised"}
}

// All stands for every product in a Raised event.
const All int64 = 0

// Kind is what an Event says of its product.
type Kind int

const (
	// Raised: the product's stock went up (All: every product's may
	// have). Its page changed too.
	Raised Kind = iota
	// Changed: the product's page changed, as an order's commit changes
	// its stock.
	Changed
	// SoldOut: the product sold out, as of Fence. Its page changed too.
	SoldOut
)

// Event is one announcement.
type Event struct {
	Kind Kind
	SKU  int64
	// Fence is the fencing token of the SKU's lock under which the change
	// was made: 0 when unknown (a change made without a fenced lock).
	Fence int64
}

// Payloads: a Raised without a fence is the SKU alone, as replicas before
// the other kinds announced it (they ignore the rest); the others are a
// letter, the SKU and, but for Changed, ":" and the fence.
func (e Event) payload() string {
	switch {
	case e.Kind == Changed:
		return "c" + strconv.FormatInt(e.SKU, 10)
	case e.Kind == SoldOut:
		return "s" + strconv.FormatInt(e.SKU, 10) + ":" + strconv.FormatInt(e.Fence, 10)
	case e.Fence > 0:
		return "r" + strconv.FormatInt(e.SKU, 10) + ":" + strconv.FormatInt(e.Fence, 10)
	}
	return strconv.FormatInt(e.SKU, 10)
}

// parse reads a payload; ok is false for one this code does not know.
func parse(payload string) (e Event, ok bool) {
	if payload == "" {
		return Event{}, false
	}
	e.Kind = Raised
	rest, fenced := payload, false
	switch payload[0] {
	case 'c':
		e.Kind, rest = Changed, payload[1:]
	case 's':
		e.Kind, rest, fenced = SoldOut, payload[1:], true
	case 'r':
		rest, fenced = payload[1:], true
	}
	sku, fence, hasFence := strings.Cut(rest, ":")
	if hasFence != fenced {
		return Event{}, false
	}
	id, err := strconv.ParseInt(sku, 10, 64)
	if err != nil || id < 0 || id == All && e.Kind != Raised {
		return Event{}, false
	}
	e.SKU = id
	if fenced {
		if e.Fence, err = strconv.ParseInt(fence, 10, 64); err != nil || e.Fence <= 0 {
			return Event{}, false
		}
	}
	return e, true
}

// Announce tells every listener that product sku (All: every product) has
// more stock than before. Call it after the change has committed.
func (r *Restocks) Announce(ctx context.Context, sku int64) error {
	return r.Tell(ctx, Event{Kind: Raised, SKU: sku})
}

// Raise announces that product sku's stock went up under the SKU's lock
// with fencing token fence (0: without one): a Raised with the fence and,
// for replicas that know only a bare SKU, the bare SKU too, in one round
// trip. Call it after the change has committed.
func (r *Restocks) Raise(ctx context.Context, sku, fence int64) error {
	if fence <= 0 {
		return r.Announce(ctx, sku)
	}
	pipe := r.client.Pipeline()
	r.Queue(ctx, pipe, Event{Kind: Raised, SKU: sku, Fence: fence})
	r.Queue(ctx, pipe, Event{Kind: Raised, SKU: sku})
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("notify: announce restock of %d under token %d: %w", sku, fence, err)
	}
	return nil
}

// Tell announces e. Call it after the change has committed.
func (r *Restocks) Tell(ctx context.Context, e Event) error {
	if err := r.client.Publish(ctx, r.channel, e.payload()).Err(); err != nil {
		return fmt.Errorf("notify: announce %s: %w", e.payload(), err)
	}
	return nil
}

// Queue adds e's announcement to pipe, so that it travels with the
// pipeline's other commands (the cache's invalidation of the product):
// one round trip for both.
func (r *Restocks) Queue(ctx context.Context, pipe redis.Pipeliner, e Event) {
	pipe.Publish(ctx, r.channel, e.payload())
}

// retryDelay is how long Listen waits after a failed receive before it
// tries again (go-redis reconnects and resubscribes).
const retryDelay = 100 * time.Millisecond

// Listen calls fn with each announcement, and with a Raised of All
// whenever the subscription starts or starts again after a lost
// connection, when announcements may have been missed. ready is closed once
// the first subscription is confirmed. Listening ends when stop is called;
// stop waits for fn's last call.
//
// A subscription that has heard nothing for HealthCheck is pinged; if
// nothing comes back within HealthCheck more, its connection is closed and
// the subscription made again on a new one, and fn is told All, as after
// any lost connection.
func (r *Restocks) Listen(fn func(Event)) (ready <-chan struct{}, stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	every := r.HealthCheck
	if every <= 0 {
		every = DefaultHealthCheck
	}
	l := &listener{ps: r.client.Subscribe(ctx, r.channel)}
	done := make(chan struct{})
	subscribed := make(chan struct{})
	go func() {
		defer close(done)
		first, pinged := true, false
		for {
			ps := l.current()
			if ps == nil {
				return
			}
			msg, err := ps.ReceiveTimeout(ctx, every)
			switch m := msg.(type) {
			case *redis.Subscription:
				fn(Event{Kind: Raised, SKU: All})
				if first {
					first = false
					close(subscribed)
				}
			case *redis.Message:
				if e, ok := parse(m.Payload); ok {
					fn(e)
				}
			}
			if err == nil {
				pinged = false // the connection answers
				continue
			}
			if ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			var netErr net.Error
			if errors.As(err, &netErr) && netErr.Timeout() {
				if !pinged {
					pinged = true
					if ps.Ping(ctx) == nil {
						continue
					}
				}
				// No answer to the ping: the connection is gone, though
				// nothing said so. A new subscription, on a new connection.
				pinged = false
				if !l.renew(func() *redis.PubSub { return r.client.Subscribe(ctx, r.channel) }) {
					return
				}
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(retryDelay):
			}
		}
	}()
	return subscribed, func() error {
		cancel()
		err := l.close()
		<-done
		return err
	}
}

// listener holds Listen's subscription, which the health check may replace
// while stop closes it.
type listener struct {
	mu     sync.Mutex
	ps     *redis.PubSub
	closed bool
}

// current returns the subscription, or nil once closed.
func (l *listener) current() *redis.PubSub {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	return l.ps
}

// renew closes the subscription and replaces it with subscribe's, unless
// listening has stopped; it reports whether it did.
func (l *listener) renew(subscribe func() *redis.PubSub) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	_ = l.ps.Close() // a dead connection: its error says nothing new
	l.ps = subscribe()
	return true
}

// close closes the subscription for good.
func (l *listener) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return l.ps.Close()
}
