// Package notify tells every replica that stock went up — the catalog was
// reseeded or a product restocked — so that none goes on refusing orders
// from what it remembered as sold out.
//
// It is a Redis pub/sub channel. A message can be lost (a replica's
// connection drops); each time a subscription is (re)established the
// listener is told that everything may have changed, and the memory it
// clears lapses by itself after a short while in any case.
package notify

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
}

// Restocks is the channel on which stock increases are announced.
type Restocks struct {
	client  Client
	channel string
}

// New returns the restock channel prefix+"stock:raised" on client.
func New(client Client, prefix string) *Restocks {
	return &Restocks{client: client, channel: prefix + "stock:raised"}
}

// All stands for every product in Announce and in what Listen reports.
const All int64 = 0

// Announce tells every listener that product sku (All: every product) has
// more stock than before. Call it after the change has committed.
func (r *Restocks) Announce(ctx context.Context, sku int64) error {
	if err := r.client.Publish(ctx, r.channel, strconv.FormatInt(sku, 10)).Err(); err != nil {
		return fmt.Errorf("notify: announce restock of %d: %w", sku, err)
	}
	return nil
}

// retryDelay is how long Listen waits after a failed receive before it
// tries again (go-redis reconnects and resubscribes).
const retryDelay = 100 * time.Millisecond

// Listen calls fn with each announced SKU, and with All whenever the
// subscription starts or starts again after a lost connection, when
// announcements may have been missed. ready is closed once the first
// subscription is confirmed. Listening ends when stop is called; stop
// waits for fn's last call.
func (r *Restocks) Listen(fn func(sku int64)) (ready <-chan struct{}, stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	ps := r.client.Subscribe(ctx, r.channel)
	done := make(chan struct{})
	subscribed := make(chan struct{})
	go func() {
		defer close(done)
		first := true
		for {
			msg, err := ps.Receive(ctx)
			switch m := msg.(type) {
			case *redis.Subscription:
				fn(All)
				if first {
					first = false
					close(subscribed)
				}
			case *redis.Message:
				if sku, err := strconv.ParseInt(m.Payload, 10, 64); err == nil {
					fn(sku)
				}
			}
			if err == nil {
				continue
			}
			if ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
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
		err := ps.Close()
		<-done
		return err
	}
}
