package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The relay's defaults, for its zero fields.
const (
	DefaultTimeout     = 5 * time.Second
	DefaultMaxBackoff  = 5 * time.Minute
	DefaultConcurrency = 16
	DefaultMaxAge      = 24 * time.Hour
	DefaultRetain      = 7 * 24 * time.Hour
	// DefaultPoll is how often an idle relay looks for due events.
	DefaultPoll = 250 * time.Millisecond
	// minBackoff is the first retry's longest wait: the n-th retry waits
	// up to minBackoff × 2ⁿ⁻¹, at most MaxBackoff, drawn at random (full
	// jitter).
	minBackoff = time.Second
	// markTimeout bounds each mark, which runs even while the relay is
	// being stopped: an answer received is recorded if it can be.
	markTimeout = 5 * time.Second
	// markBatch bounds the events one mark marks.
	markBatch = 256
	// leaseSlack is what a claim's lease holds beyond its POST: the mark,
	// and the clocks of MySQL and the replica apart.
	leaseSlack = 5 * time.Second
	// figuresEvery and pruneEvery pace the relay's look at the outbox for
	// metrics and its deletion of delivered events.
	figuresEvery = 5 * time.Second
	pruneEvery   = time.Minute
	pruneBatch   = 1000
	// SchemaVersion is the envelope's schema_version.
	SchemaVersion = 1
)

// Metrics are the relay's counts; a nil func counts nothing.
type Metrics struct {
	// Delivery counts each attempt by its result: delivered, rejected (an
	// answer other than 2xx), failed (no answer: refused, timed out,
	// closed), dead.
	Delivery func(result string)
	// Figures reports the outbox's figures, every few seconds.
	Figures func(Figures)
}

// Hooks are where a test or the demo can stop the relay; nil means no
// hook.
type Hooks struct {
	// BetweenPostAndMark runs after an event's POST was answered 2xx and
	// before it is marked delivered: failpoint.Hooks.BetweenEventPostAndMark,
	// where the demo SIGKILLs the process.
	BetweenPostAndMark func(ctx context.Context, eventID string)
}

// Relay delivers the outbox's events: every replica with SHOP_EVENTS_URL
// runs one, and the leases keep them off each other's events.
//
// Each event is delivered in three steps: a claim (a lease on the event,
// written in a statement of its own), the POST outside any transaction,
// and a mark of the answer. A crash between the POST and the mark leaves
// the event claimed; once its lease runs out a relay claims it again and
// POSTs it again, with the same webhook-id and a new timestamp. Two relays
// do not POST one event at once: a POST is bounded by Timeout and ends
// before its claim's lease does (Timeout + leaseSlack). Only a process
// stopped for longer than that could still be sending when another claims.
//
// Order per stream: a claim takes only the first undelivered event of each
// stream, so an event is sent only after every earlier one of its stream
// was delivered, and a dead event holds the rest of its stream until an
// operator redelivers it.
type Relay struct {
	Store   *Store
	URL     string
	Signer  *standardwebhooks.Webhook
	Client  *http.Client // nil: a client of its own, with Timeout, that follows no redirect
	Logger  *slog.Logger // nil: logs nothing
	Metrics Metrics
	Hooks   Hooks

	// Lease is a claim's lease: longer than Timeout, which it must
	// outlast; zero means Timeout plus 5 s for the mark and the clocks.
	Lease time.Duration
	// Timeout bounds one POST; MaxBackoff the wait before a retry;
	// Concurrency the POSTs in flight; MaxAge how long an event may stay
	// undelivered before it is dead; Retain how long delivered events are
	// kept; Poll how often an idle relay looks. Zero means the default.
	Timeout     time.Duration
	MaxBackoff  time.Duration
	Concurrency int
	MaxAge      time.Duration
	Retain      time.Duration
	Poll        time.Duration

	// unanswered says that an attempt got no answer since the last that
	// got one (wake).
	unanswered atomic.Bool
}

// Run delivers events until ctx ends, then waits for the POSTs in flight
// and their marks. It claims on each poll, and between polls once half its
// slots are free while the last claim found more than it could take: a
// claim per answer would ask MySQL as often as events come.
func (r *Relay) Run(ctx context.Context) {
	r.defaults()
	done := make(chan struct{}, r.Concurrency)
	marks := make(chan delivery, r.Concurrency)
	marked := make(chan struct{})
	go func() { defer close(marked); r.mark(ctx, marks, done) }()
	defer func() { close(marks); <-marked }()
	inflight := 0
	tick := time.NewTicker(r.Poll)
	defer tick.Stop()
	var figures, prune time.Time
	look, more := true, false
	for {
		if now := time.Now(); look {
			if now.Sub(figures) >= figuresEvery {
				figures = now
				r.figures(ctx)
			}
			if now.Sub(prune) >= pruneEvery {
				prune = now
				r.prune(ctx)
			}
		}
		if free := r.Concurrency - inflight; free > 0 && (look || more && 2*free >= r.Concurrency) {
			n := r.claim(ctx, free, marks, done)
			inflight += n
			more = n == free
		}
		look = false
		select {
		case <-ctx.Done():
			for ; inflight > 0; inflight-- {
				<-done
			}
			return
		case <-done:
			inflight--
		case <-tick.C:
			look = true
		}
	}
}

// delivery is an event of a claim that its receiver acknowledged, to be
// marked delivered.
type delivery struct {
	claim Claim
	event Event
}

// claim claims up to n events and starts their deliveries; each tells done
// when it has ended, or hands its event to marks, whose marker tells done
// once it is marked. It returns how many it started.
func (r *Relay) claim(ctx context.Context, n int, marks chan<- delivery, done chan<- struct{}) int {
	start := time.Now()
	c, err := r.Store.Claim(ctx, r.Lease, n)
	if err != nil {
		if ctx.Err() == nil {
			r.logger().ErrorContext(ctx, "events: claim", "err", err)
		}
		return 0
	}
	// The lease was written after start, so it runs past every POST, which
	// ends by start + Timeout (give or take MySQL's clock against ours,
	// which the lease's slack covers).
	ends := start.Add(r.Timeout)
	for _, e := range c.Events {
		go func() {
			if r.deliver(ctx, c, e, ends) {
				marks <- delivery{c, e}
			} else {
				done <- struct{}{}
			}
		}()
	}
	return len(c.Events)
}

// mark marks the events handed to marks delivered, those that wait
// together in one statement per claim, and tells done for each once it is
// marked; it returns when marks is closed. A mark takes a statement and a
// COMMIT; while one is made the next acknowledgements gather, so that a
// busy relay marks many events with each.
func (r *Relay) mark(ctx context.Context, marks <-chan delivery, done chan<- struct{}) {
	for d := range marks {
		batch := []delivery{d}
	gather:
		for len(batch) < markBatch {
			select {
			case d, ok := <-marks:
				if !ok {
					break gather
				}
				batch = append(batch, d)
			default:
				break gather
			}
		}
		r.markAll(ctx, batch)
		for range batch {
			done <- struct{}{}
		}
	}
}

// markAll marks batch's events delivered, one statement per claim.
func (r *Relay) markAll(ctx context.Context, batch []delivery) {
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	byClaim := map[int64][]delivery{}
	for _, d := range batch {
		byClaim[d.claim.token] = append(byClaim[d.claim.token], d)
	}
	for _, ds := range byClaim {
		events := make([]Event, len(ds))
		for i, d := range ds {
			events[i] = d.event
		}
		n, err := r.Store.Delivered(mctx, ds[0].claim, events...)
		switch {
		case err != nil:
			r.logger().ErrorContext(ctx, "events: delivered, and not marked: they are sent again", "events", len(events), "err", err)
		case n < int64(len(events)):
			r.logger().WarnContext(ctx, "events: delivered after their claim ran out: another relay sends them again",
				"events", int64(len(events))-n)
		}
	}
}

// deliver POSTs one claimed event, ending by ends, and reports whether
// the receiver acknowledged it: its mark is then the marker's. A failed
// attempt it records itself.
func (r *Relay) deliver(ctx context.Context, c Claim, e Event, ends time.Time) (acknowledged bool) {
	err := r.post(ctx, e, ends)
	if err == nil && r.Hooks.BetweenPostAndMark != nil {
		r.Hooks.BetweenPostAndMark(ctx, e.EventID)
	}
	if err != nil && ctx.Err() != nil {
		// Stopped: the lease runs out and the event is sent again.
		return false
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	if err == nil {
		r.count("delivered")
		if r.unanswered.CompareAndSwap(true, false) {
			r.wake(mctx)
		}
		return true
	}
	log := r.logger().With("event_id", e.EventID, "type", e.Type, "stream", e.Stream, "sequence", e.Sequence, "attempts", e.Attempts)
	result, problem := "failed", noAnswer+err.Error()
	if _, ok := err.(*rejected); ok {
		result, problem = "rejected", err.Error()
	} else {
		r.unanswered.Store(true)
	}
	r.count(result)
	dead, merr := r.Store.Failed(mctx, c, e, problem, r.backoff(e.Attempts), r.MaxAge)
	switch {
	case merr != nil:
		log.ErrorContext(ctx, "events: a failed attempt not recorded", "err", err, "record_err", merr)
	case dead:
		r.count("dead")
		log.ErrorContext(ctx, "events: event dead: undelivered for too long; its stream waits until an operator redelivers it",
			"err", err, "max_age", r.MaxAge)
	default:
		log.WarnContext(ctx, "events: delivery failed; it is tried again", "err", err)
	}
	return false
}

// rejected is an answer other than 2xx.
type rejected struct{ status int }

func (e *rejected) Error() string { return "the receiver answered " + strconv.Itoa(e.status) }

// post sends e once, signed for this attempt, and returns nil for a 2xx.
func (r *Relay) post(ctx context.Context, e Event, ends time.Time) error {
	ctx, cancel := context.WithDeadline(ctx, ends)
	defer cancel()
	body, err := Body(e)
	if err != nil {
		return err
	}
	now := time.Now()
	sig, err := r.Signer.Sign(e.EventID, now, body)
	if err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "shop-events")
	req.Header.Set("webhook-id", e.EventID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	res, err := r.Client.Do(req)
	if err != nil {
		return err
	}
	// Read a little of the answer, so that the connection can be kept.
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4096))
	_ = res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return &rejected{res.StatusCode}
	}
	return nil
}

// Envelope is the body of a delivery: what a receiver gets.
type Envelope struct {
	EventID       string          `json:"event_id"`
	Type          string          `json:"type"`
	SchemaVersion int             `json:"schema_version"`
	OccurredAt    string          `json:"occurred_at"`
	Stream        string          `json:"stream"`
	Data          json.RawMessage `json:"data"`
}

// TimeFormat is the events' times: RFC 3339 in UTC, to the microsecond,
// as the data's times are formatted by MySQL.
const TimeFormat = "2006-01-02T15:04:05.000000Z"

// Body is e's body as it is POSTed.
func Body(e Event) ([]byte, error) {
	b, err := json.Marshal(Envelope{EventID: e.EventID, Type: e.Type, SchemaVersion: SchemaVersion,
		OccurredAt: e.OccurredAt.UTC().Format(TimeFormat), Stream: e.Stream, Data: e.Data})
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", e.EventID, err)
	}
	return b, nil
}

// backoff is the wait before an event claimed attempts times is tried
// again: full jitter, drawn from [0, minBackoff × 2^(attempts-1)], capped
// at MaxBackoff.
func (r *Relay) backoff(attempts int) time.Duration {
	ceiling := r.MaxBackoff
	if attempts < 1 {
		attempts = 1
	}
	if attempts <= 32 {
		ceiling = min(ceiling, minBackoff<<(attempts-1))
	}
	return rand.N(ceiling + 1)
}

// wake makes due now the events of every stream that wait out a backoff
// after an attempt with no answer, once an answer came after one: a
// receiver that was down is answering again, and each stream's backoff,
// grown while it was down, would hold it back for as long again. Events
// the receiver answered with a refusal keep their backoff.
func (r *Relay) wake(ctx context.Context) {
	n, err := r.Store.Wake(ctx)
	switch {
	case err != nil:
		r.logger().WarnContext(ctx, "events: the receiver answers again; its waiting events wait out their backoff", "err", err)
	case n > 0:
		r.logger().InfoContext(ctx, "events: the receiver answers again; the events waiting for it are due now", "events", n)
	}
}

func (r *Relay) figures(ctx context.Context) {
	f, err := r.Store.Figures(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.logger().WarnContext(ctx, "events: measure the outbox", "err", err)
		}
		return
	}
	if r.Metrics.Figures != nil {
		r.Metrics.Figures(f)
	}
}

func (r *Relay) prune(ctx context.Context) {
	n, err := r.Store.Prune(ctx, r.Retain, pruneBatch)
	switch {
	case err != nil && ctx.Err() == nil:
		r.logger().WarnContext(ctx, "events: delete delivered events past retention", "err", err)
	case n > 0:
		r.logger().InfoContext(ctx, "events: delivered events past retention deleted", "events", n, "retain", r.Retain)
	}
}

func (r *Relay) count(result string) {
	if r.Metrics.Delivery != nil {
		r.Metrics.Delivery(result)
	}
}

func (r *Relay) defaults() {
	if r.Timeout <= 0 {
		r.Timeout = DefaultTimeout
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = DefaultMaxBackoff
	}
	if r.Concurrency <= 0 {
		r.Concurrency = DefaultConcurrency
	}
	if r.MaxAge <= 0 {
		r.MaxAge = DefaultMaxAge
	}
	if r.Retain <= 0 {
		r.Retain = DefaultRetain
	}
	if r.Poll <= 0 {
		r.Poll = DefaultPoll
	}
	if r.Lease <= r.Timeout {
		r.Lease = r.Timeout + leaseSlack
	}
	if r.Client == nil {
		// A redirect is an answer other than 2xx, tried again: followed,
		// a POST would become a GET, and the event would go where no one
		// configured it to. As many connections are kept to the receiver
		// as POSTs run at once: the default two would open and close the
		// others for each event.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = r.Concurrency
		r.Client = &http.Client{Timeout: r.Timeout, Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}}
	}
}

func (r *Relay) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}
