package cache_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/cache"
	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// marker is the SKU of the Raised that ends what a test reads of the
// channel: no fixture has a product of it.
const marker = 999_999

// wire is the announcements' channel as any replica reads it, payload by
// payload: replicas of every age subscribe to it.
type wire struct {
	rdb     redis.UniversalClient
	ps      *redis.PubSub
	channel string
}

// listenOn subscribes to the channel that notify.New(rdb, prefix) announces
// on.
func listenOn(t *testing.T, rdb redis.UniversalClient, prefix string) *wire {
	t.Helper()
	w := &wire{rdb: rdb, channel: prefix + "stock:raised"}
	w.ps = rdb.Subscribe(context.Background(), w.channel)
	t.Cleanup(func() { w.ps.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	return w
}

// published returns the payloads published on the channel since the last
// call, in order, up to a marker it publishes itself: Redis delivers one
// server's messages in the order it ran the PUBLISHes.
func (w *wire) published(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	end := strconv.Itoa(marker)
	if err := w.rdb.Publish(ctx, w.channel, end).Err(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		msg, err := w.ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("the channel, after %q: %v", got, err)
		}
		if msg.Payload == end {
			return got
		}
		got = append(got, msg.Payload)
	}
}

// announcing is a fixture of two products of 5 units, the channel its
// replicas announce on, a look at the channel as any replica has, and a
// copy of the pages for the replica under test.
type announcing struct {
	f        *fixture
	restocks *notify.Restocks
	w        *wire
	mine     *pageLoads
}

func announcements(t *testing.T) announcing {
	t.Helper()
	f := newFixture(t, 2, 5)
	return announcing{f, notify.New(f.rdb, f.prefix), listenOn(t, f.rdb, f.prefix), newPageLoads(t)}
}

// replicaTold is a replica on a client of its own that announces with
// announcer and keeps pages, either of which may be nil.
func (f *fixture) replicaTold(t *testing.T, announcer cache.Announcer, pages *cache.Pages, s cache.Settings) replica {
	t.Helper()
	rdb := f.topo.Client(t, nil)
	return f.replicaOn(t, cache.Deps{Redis: rdb, Announcer: announcer, Pages: pages}, rdb, s, lock.RedisOptions{})
}

// hearing has r hear every announcement on restocks, as serve's listener
// has its replica, and returns each event once r has heard it, from after
// the subscription's Raised of All.
func hearing(t *testing.T, restocks *notify.Restocks, r replica) <-chan notify.Event {
	t.Helper()
	events := make(chan notify.Event, 16)
	ready, stop := restocks.Listen(func(e notify.Event) {
		r.Hear(e)
		events <- e
	})
	t.Cleanup(func() { stop() })
	<-ready
	<-events
	return events
}

// heard returns what a listener sent to ch up to the marker's Raised (see
// published, which sends it).
func heard(t *testing.T, ch <-chan notify.Event) []notify.Event {
	t.Helper()
	var got []notify.Event
	for {
		select {
		case e := <-ch:
			if e.SKU == marker {
				return got
			}
			got = append(got, e)
		case <-time.After(10 * time.Second):
			t.Fatalf("the listener heard %+v and then nothing for 10s", got)
		}
	}
}

// pageLoads is a replica's copy of the pages of products 1 and 2, and
// what loads each.
type pageLoads struct {
	pages   *cache.Pages
	loaders map[int64]*loader
}

func newPageLoads(t *testing.T) *pageLoads {
	t.Helper()
	p, err := cache.NewPages(time.Minute, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &pageLoads{pages: p, loaders: map[int64]*loader{1: {}, 2: {}}}
}

// loads returns how many times each page has been loaded, having asked for
// both: a page that was kept is not loaded again.
func (p *pageLoads) loads(t *testing.T) [2]int64 {
	t.Helper()
	var n [2]int64
	for i, id := range []int64{1, 2} {
		page(t, p.pages, id, p.loaders[id].load)
		n[i] = p.loaders[id].calls.Load()
	}
	return n
}

// Announce of a change of one product bumps its generation, drops its
// entry and publishes the event, in one round trip, and drops the
// product's page from this replica's copy before it returns; every replica
// hears the event, and drops its own copy of the page. What goes on the
// wire is what notify's own senders send: older replicas read it.
func TestAnnounceOneProduct(t *testing.T) {
	t.Parallel()
	a := announcements(t)
	f, restocks, w, mine := a.f, a.restocks, a.w, a.mine
	ctx := context.Background()

	rdb := f.topo.Client(t, nil)
	var sent testenv.RoundTrips
	rdb.AddHook(&sent)
	theirs := newPageLoads(t)
	r := f.replicaOn(t, cache.Deps{Redis: rdb, Announcer: restocks, Pages: mine.pages}, rdb, cache.Settings{}, lock.RedisOptions{})
	other := f.replicaTold(t, nil, theirs.pages, cache.Settings{})
	events := hearing(t, restocks, other)

	entry, generation := f.prefix+"cache:product:{1}", f.prefix+"cache:product:{1}:gen"
	cases := []struct {
		name  string
		e     notify.Event
		wire  []string
		heard []notify.Event
		// sends is the same announcement made by notify's own sender.
		sends func(context.Context) error
	}{
		{"changed", notify.Event{Kind: notify.Changed, SKU: 1}, []string{"c1"}, nil,
			func(ctx context.Context) error { return restocks.Tell(ctx, notify.Event{Kind: notify.Changed, SKU: 1}) }},
		{"sold out", notify.Event{Kind: notify.SoldOut, SKU: 1, Fence: 7}, []string{"s1:7"}, nil,
			func(ctx context.Context) error {
				return restocks.Tell(ctx, notify.Event{Kind: notify.SoldOut, SKU: 1, Fence: 7})
			}},
		{"raised", notify.Event{Kind: notify.Raised, SKU: 1}, []string{"1"}, nil,
			func(ctx context.Context) error { return restocks.Raise(ctx, 1, 0) }},
		// Fenced, and bare for the replicas from before fences.
		{"raised with a fence", notify.Event{Kind: notify.Raised, SKU: 1, Fence: 8}, []string{"r1:8", "1"},
			[]notify.Event{{Kind: notify.Raised, SKU: 1, Fence: 8}, {Kind: notify.Raised, SKU: 1}},
			func(ctx context.Context) error { return restocks.Raise(ctx, 1, 8) }},
	}
	for _, c := range cases {
		if c.heard == nil {
			c.heard = []notify.Event{c.e}
		}
		t.Run(c.name, func(t *testing.T) {
			if err := c.sends(ctx); err != nil {
				t.Fatal(err)
			}
			if got := w.published(t); !slices.Equal(got, c.wire) {
				t.Fatalf("notify sent %q, want %q", got, c.wire)
			}
			heard(t, events)

			// Product 1 cached, read by another replica too; both pages
			// in both copies.
			if _, err := other.Product(ctx, 1); err != nil {
				t.Fatal(err)
			}
			gen, err := f.rdb.Get(ctx, generation).Int64()
			if err != nil {
				t.Fatal(err)
			}
			mineBefore, theirsBefore := mine.loads(t), theirs.loads(t)
			// A connection in the pool of pipelines: none is dialed below.
			if _, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error { return pipe.Ping(ctx).Err() }); err != nil {
				t.Fatal(err)
			}
			before := sent.N()

			if err := r.Announce(ctx, c.e); err != nil {
				t.Fatal(err)
			}
			if n := sent.N() - before; n != 1 {
				t.Errorf("Announce sent %d commands or pipelines, want one pipeline", n)
			}
			if got := mine.loads(t); got != [2]int64{mineBefore[0] + 1, mineBefore[1]} {
				t.Errorf("right after Announce, this replica's pages were loaded %v times, want %v: product 1's page forgotten, product 2's kept",
					got, [2]int64{mineBefore[0] + 1, mineBefore[1]})
			}
			if n := f.rdb.Exists(ctx, entry).Val(); n != 0 {
				t.Errorf("product 1's entry is still cached after Announce")
			}
			if got, err := f.rdb.Get(ctx, generation).Int64(); err != nil || got != gen+1 {
				t.Errorf("product 1's generation is %d (%v) after Announce, want %d", got, err, gen+1)
			}
			if got := w.published(t); !slices.Equal(got, c.wire) {
				t.Errorf("Announce published %q, want %q, as notify sends it", got, c.wire)
			}
			if got := heard(t, events); !slices.Equal(got, c.heard) {
				t.Errorf("the other replica heard %+v, want %+v", got, c.heard)
			}
			if got := theirs.loads(t); got != [2]int64{theirsBefore[0] + 1, theirsBefore[1]} {
				t.Errorf("once it heard, the other replica's pages were loaded %v times, want %v: product 1's page forgotten, product 2's kept",
					got, [2]int64{theirsBefore[0] + 1, theirsBefore[1]})
			}
			if p, err := other.Product(ctx, 1); err != nil || p.ID != 1 {
				t.Errorf("product 1 after Announce: %+v, %v", p, err)
			}
		})
	}

	// No replica reads these: nothing is published or dropped.
	if _, err := other.Product(ctx, 1); err != nil {
		t.Fatal(err)
	}
	mineBefore := mine.loads(t)
	for _, e := range []notify.Event{
		{Kind: notify.Changed, SKU: notify.All},
		{Kind: notify.SoldOut, SKU: notify.All, Fence: 3},
		{Kind: notify.Raised, SKU: -1},
	} {
		if err := r.Announce(ctx, e); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("Announce(%+v) = %v, want ErrInvalid", e, err)
		}
	}
	if got := w.published(t); len(got) != 0 {
		t.Errorf("events no replica reads were published: %q", got)
	}
	if n := f.rdb.Exists(ctx, entry).Val(); n != 1 {
		t.Errorf("events no replica reads dropped product 1's entry")
	}
	if got := mine.loads(t); got != mineBefore {
		t.Errorf("events no replica reads dropped pages: loaded %v times, then %v", mineBefore, got)
	}
}

// Announce of a change of every product (a seed) only publishes it, as
// notify does: the seed's Reset drops the entries, and each replica's
// pages go when it hears the announcement, this one's too.
func TestAnnounceEveryProduct(t *testing.T) {
	t.Parallel()
	a := announcements(t)
	f, restocks, w, mine := a.f, a.restocks, a.w, a.mine
	ctx := context.Background()
	r := f.replicaTold(t, restocks, mine.pages, cache.Settings{})
	events := hearing(t, restocks, r)

	if err := restocks.Announce(ctx, notify.All); err != nil {
		t.Fatal(err)
	}
	want := w.published(t)
	if !slices.Equal(want, []string{"0"}) {
		t.Fatalf("notify announced every product as %q, want %q", want, "0")
	}
	heard(t, events)

	if _, err := r.Product(ctx, 1); err != nil {
		t.Fatal(err)
	}
	before := mine.loads(t)
	if err := r.Announce(ctx, notify.Event{Kind: notify.Raised, SKU: notify.All}); err != nil {
		t.Fatal(err)
	}
	if n := f.rdb.Exists(ctx, f.prefix+"cache:product:{1}").Val(); n != 1 {
		t.Error("Announce of every product dropped product 1's entry: that is the reset's")
	}
	if got := w.published(t); !slices.Equal(got, want) {
		t.Errorf("Announce published %q, want %q, as notify sends it", got, want)
	}
	if got := heard(t, events); !slices.Equal(got, []notify.Event{{Kind: notify.Raised, SKU: notify.All}}) {
		t.Errorf("heard %+v, want a Raised of every product", got)
	}
	if got := mine.loads(t); got != [2]int64{before[0] + 1, before[1] + 1} {
		t.Errorf("once this replica heard its announcement, its pages were loaded %v times, want %v: every page forgotten",
			got, [2]int64{before[0] + 1, before[1] + 1})
	}
}

// Without an Announcer, Announce only invalidates: the entry and this
// replica's page are dropped, nothing is published. And when Redis fails,
// this replica's page is dropped all the same (the change has committed),
// and the failure is returned.
func TestAnnounceWithoutAnnouncerOrRedis(t *testing.T) {
	t.Parallel()
	a := announcements(t)
	f, w, mine := a.f, a.w, a.mine
	ctx := context.Background()
	r := f.replicaTold(t, nil, mine.pages, cache.Settings{})
	if _, err := r.Product(ctx, 1); err != nil {
		t.Fatal(err)
	}
	before := mine.loads(t)
	for _, e := range []notify.Event{{Kind: notify.Changed, SKU: 1}, {Kind: notify.Raised, SKU: notify.All}} {
		if err := r.Announce(ctx, e); err != nil {
			t.Fatalf("Announce(%+v): %v", e, err)
		}
	}
	if n := f.rdb.Exists(ctx, f.prefix+"cache:product:{1}").Val(); n != 0 {
		t.Error("product 1's entry is still cached after Announce")
	}
	if got := w.published(t); len(got) != 0 {
		t.Errorf("published %q with no Announcer", got)
	}
	if got := mine.loads(t); got != [2]int64{before[0] + 1, before[1]} {
		t.Errorf("pages loaded %v times, then %v: want product 1's forgotten", before, got)
	}

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { dead.Close() })
	down := cache.New(cache.Deps{Redis: dead, Source: stock.NewCatalog(f.db.Gorm), Announcer: notify.New(dead, f.prefix), Pages: mine.pages}, cache.Settings{})
	before = mine.loads(t)
	if err := down.Announce(ctx, notify.Event{Kind: notify.SoldOut, SKU: 2, Fence: 1}); err == nil {
		t.Error("Announce on a dead Redis returned no error")
	}
	if got := mine.loads(t); got != [2]int64{before[0], before[1] + 1} {
		t.Errorf("pages loaded %v times, then %v: want product 2's forgotten though Redis failed", before, got)
	}
}

// Hear drops this replica's copy of the page of the product an event is
// about, whatever its kind, and of every page for notify.All; a Raised of
// notify.All (a seed) drops its copies of the Bloom filter too, which are
// kept otherwise: the next check asks Redis.
func TestHear(t *testing.T) {
	t.Parallel()
	const absent = 100
	f := newFixture(t, 10, 1)
	ctx := context.Background()
	mine := newPageLoads(t)
	rdb := f.topo.Client(t, nil)
	var sent testenv.RoundTrips
	rdb.AddHook(&sent)
	r := f.replicaOn(t, cache.Deps{Redis: rdb, Pages: mine.pages}, rdb, cache.Settings{Bloom: true, BloomCopy: time.Hour}, lock.RedisOptions{})
	if _, err := r.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	// ruleOut rules the absent id out and returns how many commands or
	// pipelines that sent Redis: none when a copy of its shard answered.
	ruleOut := func() int64 {
		t.Helper()
		before := sent.N()
		if err := r.RuleOut(ctx, absent); !errors.Is(err, stock.ErrNotFound) {
			t.Fatalf("RuleOut(%d) = %v, want ErrNotFound", absent, err)
		}
		return sent.N() - before
	}
	// The first check copies the shard in the background.
	for deadline := time.Now().Add(10 * time.Second); ruleOut() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no copy of the Bloom filter answers 10s on")
		}
	}

	for _, e := range []notify.Event{
		{Kind: notify.Changed, SKU: 1},
		{Kind: notify.SoldOut, SKU: 1, Fence: 2},
		{Kind: notify.Raised, SKU: 1},
		{Kind: notify.Raised, SKU: 1, Fence: 3},
	} {
		before := mine.loads(t)
		r.Hear(e)
		if got := mine.loads(t); got != [2]int64{before[0] + 1, before[1]} {
			t.Errorf("Hear(%+v): pages loaded %v times, then %v; want product 1's forgotten, product 2's kept", e, before, got)
		}
		if n := ruleOut(); n != 0 {
			t.Errorf("after Hear(%+v), a check sent Redis %d commands: the copies of the Bloom filter were dropped", e, n)
		}
	}

	before := mine.loads(t)
	r.Hear(notify.Event{Kind: notify.Raised, SKU: notify.All})
	if got := mine.loads(t); got != [2]int64{before[0] + 1, before[1] + 1} {
		t.Errorf("Hear of every product: pages loaded %v times, then %v; want every page forgotten", before, got)
	}
	if n := ruleOut(); n == 0 {
		t.Error("after Hear of every product, a copy of the Bloom filter still answered")
	}

	// A replica with no copy of the pages hears too.
	f.replica(t, cache.Settings{}).Hear(notify.Event{Kind: notify.Changed, SKU: 1})
}
