package stripepay_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"shop/internal/stripepay"
	"shop/internal/striperec"
	"shop/internal/testenv"
)

// memStore is a Store in memory, with a clock of its own that a test moves
// on (advance) to make leases and backoffs run out without waiting. It
// keeps to the contract of the MySQL one: a claim leases a refund, and
// only an owed refund whose lease and backoff have run out is claimed.
type memStore struct {
	mu    sync.Mutex
	now   time.Time
	rows  []*memRefund
	fails int // how many Records fail, writing nothing, before one succeeds
}

type memRefund struct {
	claim        stripepay.Claim
	state        string // owed, requested, refunded, failed
	claimedUntil time.Time
	notBefore    time.Time
	provider     string
	lastError    string
	retryAfter   time.Duration
}

func newMemStore(claims ...stripepay.Claim) *memStore {
	s := &memStore{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, c := range claims {
		s.rows = append(s.rows, &memRefund{claim: c, state: "owed"})
	}
	return s
}

func (s *memStore) Claim(ctx context.Context, lease time.Duration, n int) ([]stripepay.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []stripepay.Claim
	for _, r := range s.rows {
		if len(out) == n {
			break
		}
		if r.state != "owed" || s.now.Before(r.claimedUntil) || s.now.Before(r.notBefore) {
			continue
		}
		r.claimedUntil = s.now.Add(lease)
		out = append(out, r.claim)
		r.claim.Attempts++
	}
	return out, nil
}

// find returns the row of a claimed refund.
func (s *memStore) find(id string) (*memRefund, error) {
	for _, r := range s.rows {
		if r.claim.RefundID == id {
			if r.state != "owed" || !s.now.Before(r.claimedUntil) {
				return nil, fmt.Errorf("refund %s is %s and not claimed", id, r.state)
			}
			return r, nil
		}
	}
	return nil, fmt.Errorf("no refund %s", id)
}

var errCrash = errors.New("the record was lost")

func (s *memStore) Record(ctx context.Context, refundID, providerRefundID, status string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fails > 0 {
		s.fails--
		return errCrash
	}
	r, err := s.find(refundID)
	if err != nil {
		return err
	}
	r.state, r.provider, r.claimedUntil = "requested", providerRefundID, time.Time{}
	if status == "succeeded" {
		r.state = "refunded"
	}
	return nil
}

func (s *memStore) Retry(ctx context.Context, refundID, msg string, after time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.find(refundID)
	if err != nil {
		return err
	}
	r.lastError, r.retryAfter, r.notBefore, r.claimedUntil = msg, after, s.now.Add(after), time.Time{}
	return nil
}

func (s *memStore) Fail(ctx context.Context, refundID, msg string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.find(refundID)
	if err != nil {
		return err
	}
	r.state, r.lastError, r.claimedUntil = "failed", msg, time.Time{}
	return nil
}

func (s *memStore) advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = s.now.Add(d)
}

// row returns a copy of the refund's row.
func (s *memStore) row(id string) memRefund {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.claim.RefundID == id {
			return *r
		}
	}
	return memRefund{}
}

// counts are a refunder's Metrics, counted.
type counts struct {
	mu       sync.Mutex
	calls    int
	errors   map[stripepay.Kind]int
	outcomes map[string]int
}

func (c *counts) metrics() stripepay.Metrics {
	c.errors, c.outcomes = map[stripepay.Kind]int{}, map[string]int{}
	return stripepay.Metrics{
		Call:    func() { c.mu.Lock(); c.calls++; c.mu.Unlock() },
		Error:   func(k stripepay.Kind) { c.mu.Lock(); c.errors[k]++; c.mu.Unlock() },
		Outcome: func(o string) { c.mu.Lock(); c.outcomes[o]++; c.mu.Unlock() },
	}
}

// owed returns n claims of refunds owed, each of its own amount.
func owed(prefix string, n int) []stripepay.Claim {
	var cs []stripepay.Claim
	for i := range n {
		cs = append(cs, stripepay.Claim{RefundID: fmt.Sprintf("%s%02d", prefix, i), PaymentID: fmt.Sprintf("pi_%s%02d", prefix, i),
			AmountCents: int64(100 + i), Currency: "USD"})
	}
	return cs
}

// checkOneKeyEach checks, from the recorder's log, that each refund was
// called for calls times, always with its own id as the key and the
// claim's amount and PaymentIntent.
func checkOneKeyEach(t *testing.T, rec *testenv.StripeRec, claims []stripepay.Claim, calls int) {
	t.Helper()
	logged := rec.Calls(t)
	refunds := striperec.Refunds(logged)
	if len(refunds) != len(claims) {
		t.Errorf("the Refund API was called for %d refunds, want %d", len(refunds), len(claims))
	}
	for _, c := range claims {
		rc := refunds[c.RefundID]
		if rc == nil || rc.Calls != calls || !slices.Equal(rc.Keys, []string{c.RefundID}) {
			t.Errorf("refund %s: %+v, want %d calls, all with the key %s", c.RefundID, rc, calls, c.RefundID)
		}
	}
	for _, call := range logged {
		if call.Method != "POST" || call.Path != "/v1/refunds" {
			continue
		}
		i := slices.IndexFunc(claims, func(c stripepay.Claim) bool { return c.RefundID == call.RefundID })
		if i < 0 || call.Form["amount"] != fmt.Sprint(claims[i].AmountCents) || call.Form["payment_intent"] != claims[i].PaymentID {
			t.Errorf("call %+v is not for a claimed refund's amount and payment", call)
		}
	}
}

// Every claimed refund is called for once, with its id as the key, and
// recorded with Stripe's Refund; a claim takes at most a batch.
func TestRefunderRecordsEveryClaim(t *testing.T) {
	rec := recorder(t)
	claims := owed("01JEVERY", 5)
	store := newMemStore(claims...)
	var m counts
	r := &stripepay.Refunder{Store: store, Client: client(t, rec.URL), Metrics: m.metrics(), Batch: 3}
	for i, want := range []int{3, 2, 0} {
		n, err := r.Once(context.Background())
		if err != nil || n != want {
			t.Fatalf("Once %d: %d, %v; want %d claimed", i, n, err, want)
		}
	}
	for _, c := range claims {
		if row := store.row(c.RefundID); row.state != "refunded" || !strings.HasPrefix(row.provider, "re_") {
			t.Errorf("refund %s is %s (%q), want refunded with Stripe's refund", c.RefundID, row.state, row.provider)
		}
	}
	checkOneKeyEach(t, rec, claims, 1)
	if m.calls != 5 || m.outcomes["recorded"] != 5 || len(m.errors) != 0 {
		t.Errorf("metrics: %d calls, outcomes %v, errors %v", m.calls, m.outcomes, m.errors)
	}
}

// A refund whose answer was never recorded — the process died between the
// call and the record — is claimed again once its lease runs out, by a
// refunder of another process, and called for again with the same key.
func TestRefunderRepeatsTheCallAfterACrash(t *testing.T) {
	rec := recorder(t)
	claims := owed("01JCRASH", 1)
	id := claims[0].RefundID
	store := newMemStore(claims...)
	store.fails = 1
	// The hook runs between the call and the record: the call is made and
	// logged, and nothing is recorded yet.
	var between []string
	hook := func(ctx context.Context, refundID string) {
		rc := striperec.Refunds(rec.Calls(t))[refundID]
		between = append(between, fmt.Sprintf("%s called %d times, %s", refundID, rc.Calls, store.row(refundID).state))
	}
	first := &stripepay.Refunder{Store: store, Client: client(t, rec.URL), Hooks: stripepay.Hooks{BetweenCallAndRecord: hook}}
	if n, err := first.Once(context.Background()); n != 1 || !errors.Is(err, errCrash) {
		t.Fatalf("Once: %d, %v; want the record lost", n, err)
	}
	if row := store.row(id); row.state != "owed" {
		t.Fatalf("refund is %s after its record was lost", row.state)
	}
	// The lease holds it while the dead process's claim lasts.
	if n, err := first.Once(context.Background()); n != 0 || err != nil {
		t.Fatalf("Once within the lease: %d, %v; want nothing claimed", n, err)
	}
	store.advance(stripepay.DefaultLease)
	restarted := &stripepay.Refunder{Store: store, Client: client(t, rec.URL), Hooks: stripepay.Hooks{BetweenCallAndRecord: hook}}
	if n, err := restarted.Once(context.Background()); n != 1 || err != nil {
		t.Fatalf("Once after the lease: %d, %v", n, err)
	}
	if row := store.row(id); row.state != "refunded" || row.claim.Attempts != 2 {
		t.Errorf("refund is %s after %d claims, want refunded after 2", row.state, row.claim.Attempts)
	}
	checkOneKeyEach(t, rec, claims, 2)
	if want := []string{id + " called 1 times, owed", id + " called 2 times, owed"}; !slices.Equal(between, want) {
		t.Errorf("between the calls and the records: %q, want %q", between, want)
	}
}

// charge_already_refunded is answered by the PaymentIntent's list of
// refunds, and the refund is recorded from it.
func TestRefunderChargeAlreadyRefunded(t *testing.T) {
	rec := recorder(t)
	claims := owed("01JALREADY", 1)
	store := newMemStore(claims...)
	r := &stripepay.Refunder{Store: store, Client: client(t, rec.URL)}
	rec.Inject("POST", "/v1/refunds", http.StatusBadRequest, alreadyRefunded)
	if n, err := r.Once(context.Background()); n != 1 || err != nil {
		t.Fatalf("Once: %d, %v", n, err)
	}
	want := listedByMock(t, rec.URL)
	if row := store.row(claims[0].RefundID); row.state != "refunded" || row.provider != want {
		t.Errorf("refund is %s as %q, want refunded as %s, from the list", row.state, row.provider, want)
	}
	logged := rec.Calls(t)
	if len(logged) < 2 || logged[1].Method != "GET" || !strings.Contains("&"+logged[1].Query+"&", "&payment_intent="+claims[0].PaymentID+"&") {
		t.Errorf("calls %+v, want the list of the payment's refunds after the refused refund", logged)
	}
}

// A call that may succeed later is tried again after a backoff that grows
// with the attempts, up to a cap; one that never will, or a refund that
// Stripe failed, fails.
func TestRefunderBacksOffOrFails(t *testing.T) {
	const minBackoff, maxBackoff = time.Second, 100 * time.Second
	for _, tc := range []struct {
		name     string
		attempts int
		status   int
		body     string
		state    string
		lo, hi   time.Duration
		kind     stripepay.Kind
	}{
		{"first 5xx", 0, 503, `{"error":{"type":"api_error","message":"down"}}`, "owed", minBackoff / 2, 3 * minBackoff / 2, stripepay.KindServer},
		{"fourth 429", 3, 429, `{"error":{"code":"rate_limit","type":"invalid_request_error","message":"slow"}}`, "owed", 4 * minBackoff, 12 * minBackoff, stripepay.KindRateLimited},
		{"30th bad gateway", 30, 502, `bad gateway`, "owed", maxBackoff / 2, 3 * maxBackoff / 2, stripepay.KindServer},
		{"invalid", 0, 400, `{"error":{"code":"resource_missing","type":"invalid_request_error","message":"No such payment_intent"}}`, "failed", 0, 0, stripepay.KindInvalid},
		{"failed by Stripe", 0, 200, `{"id":"re_failed","object":"refund","status":"failed"}`, "failed", 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := recorder(t)
			claims := owed("01JBACKOFF", 1)
			claims[0].Attempts = tc.attempts
			store := newMemStore(claims...)
			var m counts
			r := &stripepay.Refunder{Store: store, Client: client(t, rec.URL), Metrics: m.metrics(), MinBackoff: minBackoff, MaxBackoff: maxBackoff}
			rec.Inject("POST", "/v1/refunds", tc.status, tc.body)
			if n, err := r.Once(context.Background()); n != 1 || err != nil {
				t.Fatalf("Once: %d, %v", n, err)
			}
			row := store.row(claims[0].RefundID)
			if row.state != tc.state || row.lastError == "" {
				t.Fatalf("refund is %s (%q), want %s with its error", row.state, row.lastError, tc.state)
			}
			if row.retryAfter < tc.lo || row.retryAfter > tc.hi {
				t.Errorf("tried again after %s, want within [%s, %s]", row.retryAfter, tc.lo, tc.hi)
			}
			if tc.kind != "" && m.errors[tc.kind] != 1 {
				t.Errorf("errors counted %v, want one %s", m.errors, tc.kind)
			}
			if tc.state == "owed" {
				// Not claimed again before its backoff has run out.
				if n, _ := r.Once(context.Background()); n != 0 {
					t.Error("claimed again within its backoff")
				}
				store.advance(row.retryAfter)
				if n, err := r.Once(context.Background()); n != 1 || err != nil || store.row(claims[0].RefundID).state != "refunded" {
					t.Errorf("after its backoff: %d claimed, %v, refund %s", n, err, store.row(claims[0].RefundID).state)
				}
			}
		})
	}
}

// A lease no longer than a call's timeout is refused before anything is
// claimed: two refunders could call for one refund at once.
func TestRefunderLeaseLongerThanACall(t *testing.T) {
	claims := owed("01JLEASE", 1)
	store := newMemStore(claims...)
	r := &stripepay.Refunder{Store: store, Client: client(t, "http://127.0.0.1:1"), Lease: callTimeout}
	if _, err := r.Once(context.Background()); err == nil {
		t.Fatal("a lease as long as a call was taken")
	}
	if row := store.row(claims[0].RefundID); row.claim.Attempts != 0 {
		t.Error("the refund was claimed")
	}
}

// Run claims again at once after a full batch, and stops with its context.
func TestRefunderRun(t *testing.T) {
	rec := recorder(t)
	claims := owed("01JRUN", 3)
	store := newMemStore(claims...)
	r := &stripepay.Refunder{Store: store, Client: client(t, rec.URL), Batch: 1}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// An interval far longer than the test: only full batches make
		// Run claim again.
		r.Run(ctx, time.Hour)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for store.row(claims[2].RefundID).state != "refunded" {
		if time.Now().After(deadline) {
			t.Fatal("Run did not pay back the third refund")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop with its context")
	}
	checkOneKeyEach(t, rec, claims, 1)
}
