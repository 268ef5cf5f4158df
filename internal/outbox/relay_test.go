package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"shop/internal/eventsink"
	"shop/internal/outbox"
	"shop/internal/testenv"
)

// fixture is an outbox on a database of its own and a receiver.
type fixture struct {
	db     *testenv.DB
	store  *outbox.Store
	sink   *eventsink.Sink
	signer *standardwebhooks.Webhook
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	signer, err := standardwebhooks.NewWebhookRaw(key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sink, err := eventsink.Start(ctx, eventsink.Options{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		sink.Close()
	})
	db := testenv.MySQL(t)
	return &fixture{db: db, store: outbox.NewStore(db.OpenReads(t, 4)), sink: sink, signer: signer}
}

// relay is a relay of f's outbox to its receiver, as o says, running
// until the test ends; stop stops it sooner.
func (f *fixture) relay(t *testing.T, o *outbox.Relay) (stop func()) {
	t.Helper()
	o.Store, o.URL, o.Signer = f.store, f.sink.URL(), f.signer
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 50 * time.Millisecond
	}
	if o.Poll == 0 {
		o.Poll = 20 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); o.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// add writes n events of each of streams, as package stock writes them:
// sequences 1..n, occurred age ago by MySQL's clock. It returns the events'
// ids, by stream, in order.
func (f *fixture) add(t *testing.T, streams []string, n int, age time.Duration) map[string][]string {
	t.Helper()
	ids := map[string][]string{}
	for seq := 1; seq <= n; seq++ {
		for _, s := range streams {
			id := eventID()
			if err := f.db.Gorm.Exec("INSERT INTO outbox (event_id, type, stream, sequence, occurred_at, aging_from, next_at, data) "+
				"SELECT ?, 'order.paid', ?, ?, t, t, UTC_TIMESTAMP(6), JSON_OBJECT('sequence', ?) "+
				"FROM (SELECT UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AS t) n",
				id, s, seq, seq, age.Microseconds()).Error; err != nil {
				t.Fatal(err)
			}
			ids[s] = append(ids[s], id)
		}
	}
	return ids
}

// eventID is a new event id, in the form of MySQL's UUID().
func eventID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a []byte, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// streams names n streams.
func streams(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("order:%d", i+1)
	}
	return s
}

// states counts the outbox's events by state.
func (f *fixture) states(t *testing.T) map[string]int {
	t.Helper()
	var rows []struct {
		State string
		N     int
	}
	if err := f.db.Gorm.Raw("SELECT state, COUNT(*) AS n FROM outbox GROUP BY state").Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, r := range rows {
		m[r.State] = r.N
	}
	return m
}

// waitDelivered waits until every one of the outbox's n events is
// delivered.
func (f *fixture) waitDelivered(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := f.states(t)
		if s[outbox.StateDelivered] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events by state %v, want %d delivered", s, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantOrdered fails unless the receiver's record shows every event
// acknowledged, none out of order, no gap and no event sent twice at once.
func wantOrdered(t *testing.T, sink *eventsink.Sink, events int) eventsink.Summary {
	t.Helper()
	s := sink.Summary()
	if s.Acknowledged != events || s.OutOfOrder != 0 || s.Gaps != 0 || s.Concurrent != 0 {
		t.Errorf("receiver: %d acknowledged (want %d), %d out of order, %d gaps, %d concurrent (want 0 each); %v",
			s.Acknowledged, events, s.OutOfOrder, s.Gaps, s.Concurrent, s.Examples)
	}
	return s
}

// Every event reaches the receiver signed, once acknowledged, in order per
// stream, as the envelope the relay builds; the receiver verified each
// signature, or it would have refused it.
func TestRelayDeliversInOrder(t *testing.T) {
	f := newFixture(t)
	f.add(t, streams(20), 3, 0)
	f.relay(t, &outbox.Relay{})
	f.waitDelivered(t, 60)
	s := wantOrdered(t, f.sink, 60)
	if s.Duplicates != 0 || s.Rejected != 0 {
		t.Errorf("%d duplicates, %d refused by the receiver; want none", s.Duplicates, s.Rejected)
	}
	for _, d := range f.sink.Record() {
		if d.SchemaVersion != 1 || d.Type != "order.paid" || !jsonEqual(d.Data, fmt.Sprintf(`{"sequence":%d}`, d.Sequence)) {
			t.Errorf("delivery %+v: want schema 1, its type and its data as written", d)
			break
		}
	}
}

// A relay stopped between an event's POST and its mark (a process frozen,
// or killed: its mark never comes) leaves the event claimed; once the
// claim's lease runs out another relay sends it again, with the same
// webhook-id and a timestamp of its own attempt, and marks it. The stopped
// relay's late mark changes nothing.
func TestRelayStoppedBetweenPostAndMark(t *testing.T) {
	f := newFixture(t)
	ids := f.add(t, streams(1), 2, 0)["order:1"]
	held, let := make(chan string, 1), make(chan struct{})
	f.relay(t, &outbox.Relay{Timeout: 500 * time.Millisecond, Lease: 1500 * time.Millisecond, Concurrency: 1,
		Hooks: outbox.Hooks{BetweenPostAndMark: func(_ context.Context, id string) {
			select {
			case held <- id:
				<-let
			default:
			}
		}}})
	var first string
	select {
	case first = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first relay never posted")
	}
	if first != ids[0] {
		t.Fatalf("held %s, want the stream's first event %s", first, ids[0])
	}
	f.relay(t, &outbox.Relay{Timeout: 500 * time.Millisecond, Lease: 1500 * time.Millisecond})
	f.waitDelivered(t, 2)
	close(let)
	var sends []eventsink.Delivery
	for _, d := range f.sink.Record() {
		if d.WebhookID == first {
			sends = append(sends, d)
		}
	}
	if len(sends) != 2 || !sends[0].Acknowledged() || !sends[1].Acknowledged() || sends[1].WebhookTimestamp <= sends[0].WebhookTimestamp {
		t.Fatalf("deliveries of %s: %+v; want two acknowledged, the second with a later webhook-timestamp", first, sends)
	}
	s := wantOrdered(t, f.sink, 2)
	if s.Duplicates != 1 {
		t.Errorf("%d events acknowledged twice, want 1", s.Duplicates)
	}
	if st := f.states(t); st[outbox.StateDelivered] != 2 {
		t.Errorf("states %v after the stopped relay's mark, want both delivered", st)
	}
}

// Two relays at once never send one event at the same time, nor one event
// twice while their leases hold: each claim takes what no live claim
// holds. The receiver holds the first deliveries, so that the two relays'
// sends overlap.
func TestTwoRelaysNeverSendOneEventAtOnce(t *testing.T) {
	f := newFixture(t)
	f.add(t, streams(60), 3, 0)
	f.sink.Hang(300 * time.Millisecond)
	f.relay(t, &outbox.Relay{Concurrency: 8})
	f.relay(t, &outbox.Relay{Concurrency: 8})
	f.waitDelivered(t, 180)
	s := wantOrdered(t, f.sink, 180)
	if s.Duplicates != 0 {
		t.Errorf("%d events sent twice, want none: no lease ran out", s.Duplicates)
	}
}

// The receiver failing in every way — 500s, a hang past the timeout, a
// closed connection, a listener down — costs retries, never the order of a
// stream, and every event is delivered in the end; the attempts are counted
// by result.
func TestRelayRetriesEveryFailure(t *testing.T) {
	f := newFixture(t)
	f.add(t, streams(5), 4, 0)
	f.sink.FailFirst(3)
	f.sink.CloseNext(2)
	var mu sync.Mutex
	results := map[string]int{}
	f.relay(t, &outbox.Relay{Timeout: 300 * time.Millisecond, Concurrency: 4, Metrics: outbox.Metrics{
		Delivery: func(r string) { mu.Lock(); results[r]++; mu.Unlock() }}})
	time.Sleep(100 * time.Millisecond)
	f.sink.Hang(time.Second)
	if err := f.sink.Down(500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	f.waitDelivered(t, 20)
	wantOrdered(t, f.sink, 20)
	mu.Lock()
	defer mu.Unlock()
	if results["delivered"] < 20 || results["rejected"] < 3 || results["failed"] < 2 {
		t.Errorf("attempts by result %v; want at least 20 delivered, 3 rejected (500), 2 failed (closed)", results)
	}
}

// An event undelivered for longer than MaxAge, by MySQL's clock, is dead
// after its next failed attempt: kept, listed, and holding its stream's
// later events pending, whose age does not count meanwhile; other streams
// flow. Redelivered, it and the events it held go out in order.
func TestDeadEventHoldsItsStream(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	old := f.add(t, []string{"order:1"}, 2, 25*time.Hour)["order:1"]
	f.add(t, []string{"order:2"}, 2, 0)
	f.sink.FailFirst(1)
	var dead atomic.Int32
	stop := f.relay(t, &outbox.Relay{Concurrency: 1, MaxAge: 24 * time.Hour, Metrics: outbox.Metrics{
		Delivery: func(r string) {
			if r == "dead" {
				dead.Add(1)
			}
		}}})
	f.waitDelivered(t, 2) // order:2's
	stop()
	if st := f.states(t); st[outbox.StateDead] != 1 || st[outbox.StatePending] != 1 || dead.Load() != 1 {
		t.Fatalf("states %v, %d counted dead; want order:1's first dead and its second pending", st, dead.Load())
	}
	page, more, err := f.store.List(ctx, outbox.Page{State: outbox.StateDead, Limit: 10})
	if err != nil || more || len(page) != 1 || page[0].EventID != old[0] {
		t.Fatalf("dead events %+v, %v, %v; want %s alone", page, more, err, old[0])
	}
	fig, err := f.store.Figures(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fig.Pending != 1 || fig.Dead != 1 || fig.Oldest != 0 {
		t.Errorf("figures %+v; want 1 pending whose age does not count (oldest 0), 1 dead", fig)
	}
	if _, err := f.store.Redeliver(ctx, old[1]); err != nil { // pending: due now, still behind the dead one
		t.Fatal(err)
	}
	if _, err := f.store.Redeliver(ctx, old[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Redeliver(ctx, old[0]); err != nil {
		t.Fatal(err)
	}
	f.relay(t, &outbox.Relay{Concurrency: 1, MaxAge: 24 * time.Hour})
	f.waitDelivered(t, 4)
	wantOrdered(t, f.sink, 4)
	if _, err := f.store.Redeliver(ctx, old[0]); err == nil {
		t.Error("redelivered a delivered event, want ErrDelivered")
	}
}

// Retention deletes delivered events older than it, by MySQL's clock, in
// batches, and nothing else: not newer ones, not pending or dead ones,
// however old.
func TestRetention(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	f.add(t, streams(5), 1, 8*24*time.Hour)
	f.add(t, []string{"order:9"}, 1, 8*24*time.Hour)
	f.add(t, []string{"order:7", "order:8"}, 1, 6*24*time.Hour)
	if err := f.db.Gorm.Exec("UPDATE outbox SET state = 'delivered', delivered_at = UTC_TIMESTAMP(6) WHERE stream <> 'order:9'").Error; err != nil {
		t.Fatal(err)
	}
	n, err := f.store.Prune(ctx, 7*24*time.Hour, 2)
	if err != nil || n != 5 {
		t.Fatalf("pruned %d, %v; want the 5 delivered events older than 7 days", n, err)
	}
	if st := f.states(t); st[outbox.StateDelivered] != 2 || st[outbox.StatePending] != 1 {
		t.Errorf("states %v; want the 2 newer delivered and the old pending kept", st)
	}
}

// A redirect is not a delivery: the relay follows none (a POST would
// become a GET elsewhere), and the event stays pending, to be tried again.
func TestRelayFollowsNoRedirect(t *testing.T) {
	f := newFixture(t)
	f.add(t, streams(1), 1, 0)
	var asked atomic.Int32
	moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		http.Redirect(w, r, f.sink.URL(), http.StatusFound)
	}))
	defer moved.Close()
	r := outbox.Relay{Store: f.store, URL: moved.URL, Signer: f.signer, Poll: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); asked.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	var lastError string
	if err := f.db.Gorm.Raw("SELECT last_error FROM outbox").Scan(&lastError).Error; err != nil {
		t.Fatal(err)
	}
	if asked.Load() < 3 || len(f.sink.Record()) != 0 || f.states(t)[outbox.StatePending] != 1 || !strings.Contains(lastError, "302") {
		t.Errorf("asked %d times, receiver got %d, states %v, last error %q; want retries, nothing followed, the event pending",
			asked.Load(), len(f.sink.Record()), f.states(t), lastError)
	}
}

// A receiver that answers again after attempts that got none is sent, at
// once, every event waiting out a backoff that grew while it was down,
// rather than an hour later; an event it refused keeps its backoff.
func TestRelayWakesWaitingEventsWhenTheReceiverAnswers(t *testing.T) {
	f := newFixture(t)
	f.add(t, []string{"order:1"}, 1, 0)
	f.add(t, streams(11)[1:], 1, 0)
	f.add(t, []string{"order:99"}, 1, 0)
	for _, q := range []string{
		"UPDATE outbox SET next_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, attempts = 3, last_error = 'no answer: connection refused' WHERE stream NOT IN ('order:1', 'order:99')",
		"UPDATE outbox SET next_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, attempts = 3, last_error = 'the receiver answered 500' WHERE stream = 'order:99'",
	} {
		if err := f.db.Gorm.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	f.sink.CloseNext(1) // order:1's first attempt gets no answer; its retry does
	f.relay(t, &outbox.Relay{Concurrency: 1})
	f.waitDelivered(t, 11)
	if st := f.states(t); st[outbox.StatePending] != 1 {
		t.Errorf("states %v; want order:99, refused, still waiting", st)
	}
}
