package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// flakyShop sells one unit per SKU, like shopStub, with Idempotency-Keys
// (a key's first answer is replayed), but fails each buyer's first
// attempts: buyer (user) u fails u%4 times, in turn with 503 and
// Retry-After: 1, by closing the connection without an answer after
// placing the order (a reply lost after the commit), and with 502 and no
// Retry-After. With never set, every attempt is a 503 with Retry-After: 0.
type flakyShop struct {
	never bool

	mu       sync.Mutex
	attempts map[string]int    // key (or the buyer's would-be key) → attempts seen
	buyers   map[string]string // key → the body it was sent with
	noKey    int               // requests without a key
	sold     map[int64]int64   // sku → the user it was sold to
	replies  map[string]string // key → its first answer (status and body)
	sent     map[string]int    // what the shop answered: "503", "502", "closed", "201"…
}

func newFlakyShop() *flakyShop {
	return &flakyShop{attempts: map[string]int{}, buyers: map[string]string{}, sold: map[int64]int64{},
		replies: map[string]string{}, sent: map[string]int{}}
}

func (s *flakyShop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		SKU  int64 `json:"sku_id"`
		User int64 `json:"user_id"`
	}
	json.Unmarshal(body, &req)
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == "" {
		s.noKey++
		key = fmt.Sprintf("lt-%d-%d", req.SKU, req.User) // the buyer, for the counts
	}
	if prev, ok := s.buyers[key]; ok && prev != string(body) {
		s.buyers[key] = "two bodies: " + prev + " and " + string(body)
	} else if !ok {
		s.buyers[key] = string(body)
	}
	s.attempts[key]++
	n := s.attempts[key]
	switch {
	case s.never:
		s.sent["503"]++
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	case n <= int(req.User%4) && n%3 == 1:
		s.sent["503"]++
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	case n <= int(req.User%4) && n%3 == 2:
		s.sent["closed"]++
		s.place(key, req.SKU, req.User) // done, but the answer is lost
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case n <= int(req.User%4):
		s.sent["502"]++
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	reply := s.place(key, req.SKU, req.User)
	status, text, _ := strings.Cut(reply, " ")
	s.sent[status]++
	var code int
	fmt.Sscan(status, &code)
	w.WriteHeader(code)
	io.WriteString(w, text)
}

// place sells the SKU to the user if it is free and returns the key's
// answer ("201 {…}" or "409 {…}"), the first one again for a key seen
// before.
func (s *flakyShop) place(key string, sku, user int64) string {
	if reply, ok := s.replies[key]; ok {
		return reply
	}
	reply := `409 {"error":{"code":"sold_out","message":"x"}}`
	if _, ok := s.sold[sku]; !ok {
		s.sold[sku] = user
		reply = fmt.Sprintf(`201 {"order_id":%d,"sku_id":%d,"user_id":%d,"created_at":"x"}`, sku, sku, user)
	}
	s.replies[key] = reply
	return reply
}

// runLoad runs the load test against url with args and returns its result
// and acks.
func runLoad(t *testing.T, url string, args ...string) (Result, []string) {
	t.Helper()
	var out strings.Builder
	return runLoadOut(t, &out, url, args...)
}

// runLoadOut is runLoad, with the load test's output written to out.
func runLoadOut(t *testing.T, out *strings.Builder, url string, args ...string) (Result, []string) {
	t.Helper()
	dir := t.TempDir()
	acks, result := filepath.Join(dir, "acks"), filepath.Join(dir, "result.json")
	args = append([]string{"-url", url, "-acks", acks, "-json", result}, args...)
	if err := run(context.Background(), args, out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var r Result
	data, err := os.ReadFile(result)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("buyers: %d, answered %d, unanswered %d; retries %d", r.Buyers, r.Answered, r.Unanswered, r.Retries)) {
		t.Errorf("summary lacks the buyers line:\n%s", out.String())
	}
	if r.Payments != nil && !strings.Contains(out.String(), r.Payments.summary()+"\n") {
		t.Errorf("summary lacks the payments line %q:\n%s", r.Payments.summary(), out.String())
	}
	data, err = os.ReadFile(acks)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) == 0 {
		return r, nil
	}
	return r, strings.Split(strings.TrimSpace(string(data)), "\n")
}

func TestRetryAnswersEveryBuyer(t *testing.T) {
	shop := newFlakyShop()
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, acks := runLoad(t, srv.URL, "-scenario", "sellout", "-skus", "10", "-buyers", "4", "-c", "40", "-retry")

	// Every buyer answered, each with its SKU's one sale or a refusal.
	if !r.Retry || r.Buyers != 40 || r.Answered != 40 || r.Unanswered != 0 ||
		r.FinalStatuses["201"] != 10 || r.FinalStatuses["409"] != 30 || len(r.FinalStatuses) != 2 {
		t.Errorf("buyers %d, answered %d, unanswered %d, final %v; want 40 answered: 10 201s, 30 409s",
			r.Buyers, r.Answered, r.Unanswered, r.FinalStatuses)
	}
	// Every attempt after a buyer's first is a retry, and each attempt's
	// answer is counted.
	wantRetries, planned := 0, 0
	for key, n := range shop.attempts {
		wantRetries += n - 1
		var sku, user int
		fmt.Sscanf(key, "lt-%d-%d", &sku, &user)
		planned += user % 4
	}
	if r.Retries != wantRetries || r.Retries != planned {
		t.Errorf("retries %d; the shop saw %d attempts after the first, and failed %d", r.Retries, wantRetries, planned)
	}
	if r.Statuses["503"] != shop.sent["503"] || r.Statuses["502"] != shop.sent["502"] ||
		r.Statuses["201"] != shop.sent["201"] || r.Statuses["409"] != shop.sent["409"] || len(r.Errors) == 0 {
		t.Errorf("statuses %v, errors %v; the shop sent %v", r.Statuses, r.Errors, shop.sent)
	}
	errs := 0
	for _, n := range r.Errors {
		errs += n
	}
	if errs != shop.sent["closed"] {
		t.Errorf("%d transport errors counted, the shop closed %d connections", errs, shop.sent["closed"])
	}
	// One key per buyer, the same on every attempt, named for the buyer.
	if len(shop.attempts) != 40 || shop.noKey != 0 {
		t.Errorf("%d keys for 40 buyers, %d requests without a key", len(shop.attempts), shop.noKey)
	}
	for key, body := range shop.buyers {
		var sku, user int
		fmt.Sscanf(key, "lt-%d-%d", &sku, &user)
		if want := fmt.Sprintf(`{"sku_id":%d,"user_id":%d}`, sku, user); body != want {
			t.Errorf("key %s was sent with %s", key, body)
		}
	}
	// One ack per sale, including the sales whose first answer was lost
	// and whose 201 came from the key's replay.
	if len(acks) != 10 || r.Acks != 10 {
		t.Errorf("acks %v (%d); want the 10 sales once each", acks, r.Acks)
	}
	seen := map[string]bool{}
	for _, a := range acks {
		var order, sku, user int64
		fmt.Sscanf(a, "%d %d %d", &order, &sku, &user)
		if seen[a] || shop.sold[sku] != user {
			t.Errorf("ack %s: twice, or not the shop's sale (sku %d sold to %d)", a, sku, shop.sold[sku])
		}
		seen[a] = true
	}
}

func TestRetryBound(t *testing.T) {
	t.Run("attempts", func(t *testing.T) {
		shop := newFlakyShop()
		shop.never = true
		srv := httptest.NewServer(shop)
		defer srv.Close()
		r, acks := runLoad(t, srv.URL, "-scenario", "hotsku", "-n", "5", "-c", "5", "-retry", "-retries", "3")
		if r.Buyers != 5 || r.Unanswered != 5 || r.Answered != 0 || r.FinalStatuses["503"] != 5 || r.Retries != 10 || len(acks) != 0 {
			t.Errorf("buyers %d, unanswered %d, answered %d, final %v, retries %d, acks %v; want 5 buyers unanswered after 3 attempts each",
				r.Buyers, r.Unanswered, r.Answered, r.FinalStatuses, r.Retries, acks)
		}
		for key, n := range shop.attempts {
			if n != 3 {
				t.Errorf("buyer %s: %d attempts, want 3", key, n)
			}
		}
	})
	t.Run("time", func(t *testing.T) {
		shop := newFlakyShop()
		shop.never = true
		srv := httptest.NewServer(shop)
		defer srv.Close()
		r, _ := runLoad(t, srv.URL, "-scenario", "hotsku", "-n", "5", "-c", "5", "-retry", "-retries", "1000", "-retry-for", "300ms")
		if r.Buyers != 5 || r.Unanswered != 5 || r.FinalStatuses["503"] != 5 {
			t.Errorf("buyers %d, unanswered %d, final %v; want 5 buyers unanswered", r.Buyers, r.Unanswered, r.FinalStatuses)
		}
		// 300ms allows at most 300ms/50ms waits after the first attempt.
		for key, n := range shop.attempts {
			if n < 2 || n > 7 {
				t.Errorf("buyer %s: %d attempts within -retry-for 300ms, want 2 to 7", key, n)
			}
		}
	})
}

// Without -retry, each buyer makes one attempt and its answer is its last.
func TestNoRetryOneAttempt(t *testing.T) {
	shop := newFlakyShop()
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, _ := runLoad(t, srv.URL, "-scenario", "sellout", "-skus", "10", "-buyers", "4", "-c", "40")
	// Users u%4 == 0, one per SKU, succeed at once; the others' first
	// answer is a 503.
	if r.Retry || r.Retries != 0 || r.Buyers != 40 || r.Answered != 10 || r.Unanswered != 30 ||
		r.FinalStatuses["201"] != 10 || r.FinalStatuses["503"] != 30 || len(r.FinalStatuses) != 2 {
		t.Errorf("retry %v, retries %d, buyers %d, answered %d, unanswered %d, final %v", r.Retry, r.Retries, r.Buyers, r.Answered, r.Unanswered, r.FinalStatuses)
	}
	if shop.noKey != 40 {
		t.Errorf("%d of 40 requests without an Idempotency-Key; -retry off sends none", shop.noKey)
	}
}

func TestRetryDelay(t *testing.T) {
	p := retryPolicy{attempts: 30, budget: time.Minute, timeout: time.Second}
	for _, tt := range []struct {
		n          int
		retryAfter string
		window     time.Duration
	}{
		{1, "", retryBase},
		{3, "", 4 * retryBase},
		{1, "1", time.Second},
		{1, "2", 2 * time.Second},
		{1, "0", retryBase},
		{1, "soon", retryBase},
		{30, "", retryCap},
		{1, "3600", retryCap},
	} {
		var lo, hi time.Duration = time.Hour, 0
		for range 2000 {
			d := p.delay(tt.n, tt.retryAfter)
			lo, hi = min(lo, d), max(hi, d)
		}
		// Full jitter: spread over [floor, window], not bunched at either end.
		if lo < retryFloor || hi > tt.window || lo > retryFloor+(tt.window-retryFloor)/4 || hi < tt.window-(tt.window-retryFloor)/4 {
			t.Errorf("delay(%d, %q) ranged over [%s, %s], want [%s, %s] spread", tt.n, tt.retryAfter, lo, hi, retryFloor, tt.window)
		}
	}
}

// -rate R spreads the buyers over time: 20 buyers at 40 a second take at
// least about half a second, however fast the shop answers.
func TestRate(t *testing.T) {
	srv := httptest.NewServer(newFlakyShop())
	defer srv.Close()
	r, _ := runLoad(t, srv.URL, "-scenario", "hotsku", "-n", "20", "-c", "2", "-rate", "40")
	if r.Seconds < 0.4 || r.Rate != 40 || r.Buyers != 20 {
		t.Errorf("20 buyers at -rate 40 took %.2fs (rate %v, buyers %d); want at least 0.4s", r.Seconds, r.Rate, r.Buyers)
	}
	if _, err := parse([]string{"-rate", "-1"}); err == nil {
		t.Error("-rate -1 accepted")
	}
}

// A buyer's 201 is one ack, however many 201s (a replay) it is answered
// with; buyers without a key are each their own.
func TestOneAckPerBuyer(t *testing.T) {
	tp := newTestTap(t)
	defer tp.close(0)
	created := answer{status: http.StatusCreated, body: []byte(`{"order_id":7,"sku_id":3,"user_id":9}`)}
	tp.record("lt-3-9", created)
	tp.record("lt-3-9", created)
	tp.record("", answer{status: http.StatusCreated, body: []byte(`{"order_id":8,"sku_id":4,"user_id":1}`)})
	tp.record("", answer{status: http.StatusCreated, body: []byte(`{"order_id":9,"sku_id":5,"user_id":2}`)})
	tl := tp.snapshot()
	if got := fmt.Sprint(tl.acks); got != "[7 3 9 8 4 1 9 5 2]" || tl.statuses[201] != 4 {
		t.Errorf("acks %s, 201s %d; want each buyer once, every 201 counted", got, tl.statuses[201])
	}
}

// limitedShop answers each buyer's first attempt 429 with Retry-After: 1,
// as nginx or the service's rate limit does, and sells on the next.
type limitedShop struct {
	mu       sync.Mutex
	attempts map[string]int
}

func (s *limitedShop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	s.attempts[key]++
	n, buyers := s.attempts[key], len(s.attempts)
	s.mu.Unlock()
	if n == 1 {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"code":"rate_limited","message":"x"}}`)
		return
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%d,"sku_id":1,"user_id":1}`, buyers)
}

// -retry retries a 429 after its Retry-After; without -retry a 429 is the
// buyer's last answer, and counts as unanswered: it decided nothing.
func TestRetryRateLimited(t *testing.T) {
	shop := &limitedShop{attempts: map[string]int{}}
	srv := httptest.NewServer(shop)
	defer srv.Close()
	r, acks := runLoad(t, srv.URL, "-scenario", "hotsku", "-n", "10", "-c", "10", "-retry")
	if r.Answered != 10 || r.FinalStatuses["201"] != 10 || r.Statuses["429"] != 10 || r.Retries != 10 || len(acks) != 10 {
		t.Errorf("answered %d, final %v, statuses %v, retries %d, acks %d; want each buyer sold after one 429",
			r.Answered, r.FinalStatuses, r.Statuses, r.Retries, len(acks))
	}
	for key, n := range shop.attempts {
		if n != 2 {
			t.Errorf("buyer %s: %d attempts, want 2", key, n)
		}
	}

	shop = &limitedShop{attempts: map[string]int{}}
	srv2 := httptest.NewServer(shop)
	defer srv2.Close()
	r, _ = runLoad(t, srv2.URL, "-scenario", "hotsku", "-n", "10", "-c", "10", "-idempotency-keys")
	if r.Unanswered != 10 || r.FinalStatuses["429"] != 10 || r.Retries != 0 {
		t.Errorf("without -retry: unanswered %d, final %v, retries %d; want 10 buyers left with a 429", r.Unanswered, r.FinalStatuses, r.Retries)
	}
}
