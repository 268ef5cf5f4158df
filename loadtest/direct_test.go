package main

import (
	"fmt"
	"strings"
	"testing"
)

// The load test's own client answers every buyer of a sellout whose shop
// fails buyers' first attempts (503, a lost answer, 502): each buyer is
// its own user with its own body and Idempotency-Key, the same on every
// attempt, from the crowd's source addresses, over kept-alive
// connections, at -c at once even when -c does not divide the requests.
func TestDirectClientAnswersEveryBuyer(t *testing.T) {
	shop := newFlakyShop()
	srv, w := serve(t, shop)
	r, acks := runLoad(t, srv.URL, "-client", "direct", "-scenario", "sellout", "-skus", "10", "-buyers", "4", "-c", "30",
		"-src-n", "3", "-retry")

	if r.Client != clientDirect || r.Concurrency != 30 || r.Requests != 40 {
		t.Errorf("client %q, concurrency %d, requests %d; want direct, 30 at once, 40", r.Client, r.Concurrency, r.Requests)
	}
	if r.Buyers != 40 || r.Answered != 40 || r.Unanswered != 0 ||
		r.FinalStatuses["201"] != 10 || r.FinalStatuses["409"] != 30 || len(r.FinalStatuses) != 2 {
		t.Errorf("buyers %d, answered %d, unanswered %d, final %v; want 40 answered: 10 201s, 30 409s",
			r.Buyers, r.Answered, r.Unanswered, r.FinalStatuses)
	}
	if r.RPS <= 0 || r.P50Ms <= 0 || r.P99Ms < r.P50Ms || r.Seconds <= 0 {
		t.Errorf("rps %v, p50 %v ms, p99 %v ms over %v s; want each buyer's wait measured", r.RPS, r.P50Ms, r.P99Ms, r.Seconds)
	}
	planned, retried := 0, 0
	for key, n := range shop.attempts {
		var sku, user int
		fmt.Sscanf(key, "lt-%d-%d", &sku, &user)
		planned += user % 4
		retried += n - 1
	}
	if r.Retries != planned || retried != planned {
		t.Errorf("retries %d, the shop saw %d attempts after the first; it failed %d", r.Retries, retried, planned)
	}
	// One key per buyer, each buyer its own user, SKU s wanted by users
	// 4(s-1)+1..4s, and a key sent with one body only.
	if len(shop.attempts) != 40 || shop.noKey != 0 {
		t.Errorf("%d keys for 40 buyers, %d requests without a key", len(shop.attempts), shop.noKey)
	}
	for user := 1; user <= 40; user++ {
		sku := (user-1)/4 + 1
		key := fmt.Sprintf("lt-%d-%d-", sku, user)
		found := 0
		for k, body := range shop.buyers {
			if strings.HasPrefix(k, key) {
				found++
				if want := fmt.Sprintf(`{"sku_id":%d,"user_id":%d}`, sku, user); body != want {
					t.Errorf("key %s was sent with %s, want %s", k, body, want)
				}
			}
		}
		if found != 1 {
			t.Errorf("user %d: %d keys, want one", user, found)
		}
	}
	if len(acks) != 10 || r.Acks != 10 {
		t.Errorf("acks %v (%d); want the 10 sales once each", acks, r.Acks)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ip := range []string{"127.1.1.1", "127.1.1.2", "127.1.1.3"} {
		if w.sources[ip] == 0 {
			t.Errorf("no request from %s; sources %v", ip, w.sources)
		}
	}
	if len(w.sources) != 3 {
		t.Errorf("requests from %v; want the three source addresses alone", w.sources)
	}
	// 40 buyers and their retries, most of them kept alive: the shop
	// closes one connection per lost answer, and the rest are reused.
	attempts := 40 + planned
	if w.conns >= attempts-shop.sent["closed"] {
		t.Errorf("%d connections for %d attempts (%d closed by the shop); want connections kept alive", w.conns, attempts,
			shop.sent["closed"])
	}
}

// Without keys or retries, the direct client sends each hot-SKU buyer
// once, with its own user and no Idempotency-Key, and names itself in
// the summary.
func TestDirectClientSendsEachBuyerOnce(t *testing.T) {
	stub := &shopStub{sold: map[int64]bool{}, users: map[int64]int64{}}
	srv, w := serve(t, stub, "Idempotency-Key")
	var out strings.Builder
	r, acks := runLoadOut(t, &out, srv.URL, "-client", "direct", "-scenario", "hotsku", "-sku", "7", "-n", "30", "-c", "4")
	if r.Buyers != 30 || r.Answered != 30 || r.Statuses["201"] != 1 || r.Statuses["409"] != 29 || len(acks) != 1 {
		t.Errorf("buyers %d, answered %d, statuses %v, acks %v; want 30 answered, one sale", r.Buyers, r.Answered, r.Statuses, acks)
	}
	stub.mu.Lock()
	defer stub.mu.Unlock()
	for user := int64(1); user <= 30; user++ {
		if stub.users[user] != 7 {
			t.Errorf("user %d asked for SKU %d; want every buyer of SKU 7", user, stub.users[user])
		}
	}
	if len(stub.users) != 30 {
		t.Errorf("%d users; want 30", len(stub.users))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := w.header["Idempotency-Key"]; n != 0 {
		t.Errorf("%d requests with an Idempotency-Key; want none without -idempotency-keys", n)
	}
	if !strings.Contains(out.String(), "direct hotsku: 30 buyers") {
		t.Errorf("summary:\n%s", out.String())
	}
}

func TestClientFlag(t *testing.T) {
	o, err := parse([]string{"-client", "direct", "-n", "10", "-c", "4", "-scenario", "hotsku"})
	if err != nil {
		t.Fatal(err)
	}
	if o.concurrency != 4 {
		t.Errorf("-client direct -n 10 -c 4: %d at once; want 4 (no divisor of n needed)", o.concurrency)
	}
	if _, err := parse([]string{"-client", "curl"}); err == nil {
		t.Error("-client curl accepted")
	}
}
