package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// shopStub sells one unit per SKU: the first buyer gets 201 with the SKU as
// order id, later ones 409. It also records who asked.
type shopStub struct {
	mu    sync.Mutex
	sold  map[int64]bool
	users map[int64]int64 // user → sku
}

func (s *shopStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ SKUID, UserID int64 }
	body, _ := io.ReadAll(r.Body)
	json.Unmarshal(bytes.ReplaceAll(bytes.ReplaceAll(body, []byte("sku_id"), []byte("SKUID")), []byte("user_id"), []byte("UserID")), &req)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users[req.UserID] = req.SKUID
	if s.sold[req.SKUID] {
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"error":{"code":"sold_out","message":"x"}}`)
		return
	}
	s.sold[req.SKUID] = true
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%d,"sku_id":%d,"user_id":%d,"created_at":"x"}`, req.SKUID, req.SKUID, req.UserID)
}

func TestSelloutRecordsAcks(t *testing.T) {
	stub := &shopStub{sold: map[int64]bool{}, users: map[int64]int64{}}
	a, b := httptest.NewServer(stub), httptest.NewServer(stub)
	defer a.Close()
	defer b.Close()
	dir := t.TempDir()
	acks, result := filepath.Join(dir, "acks"), filepath.Join(dir, "result.json")

	var out bytes.Buffer
	err := run(context.Background(), []string{"-scenario", "sellout", "-url", a.URL + "," + b.URL,
		"-skus", "10", "-buyers", "4", "-c", "8", "-acks", acks, "-json", result}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Each line is "order_id sku_id user_id" as the 201 said; the stub's
	// order id is the SKU, and SKU s was sold to one of users 4(s-1)+1..4s.
	data, _ := os.ReadFile(acks)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var orders []string
	for _, line := range lines {
		var order, sku, user int64
		if n, err := fmt.Sscanf(line, "%d %d %d", &order, &sku, &user); n != 3 || err != nil {
			t.Fatalf("ack line %q: want \"order_id sku_id user_id\"", line)
		}
		if sku != order || (user-1)/4+1 != sku || stub.users[user] != sku {
			t.Errorf("ack line %q: not the order the stub answered", line)
		}
		orders = append(orders, fmt.Sprint(order))
	}
	sort.Strings(orders)
	if got := strings.Join(orders, ","); got != "1,10,2,3,4,5,6,7,8,9" {
		t.Errorf("acks = %s, want the ten orders", got)
	}
	var r Result
	data, _ = os.ReadFile(result)
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if r.Requests != 40 || r.Statuses["201"] != 10 || r.Statuses["409"] != 30 || r.Acks != 10 || r.RPS <= 0 || r.P99Ms <= 0 {
		t.Errorf("result = %+v", r)
	}
	// Every buyer is a different user; buyers of SKU s are users 4(s-1)+1..4s.
	if len(stub.users) != 40 || stub.users[1] != 1 || stub.users[4] != 1 || stub.users[5] != 2 || stub.users[40] != 10 {
		t.Errorf("requests went out as %v", stub.users)
	}
	if !strings.Contains(out.String(), "Requests/sec:") || strings.Contains(out.String(), "@@") {
		t.Errorf("summary:\n%s", out.String())
	}
}

func TestFirstUser(t *testing.T) {
	for _, tt := range []struct {
		args      []string
		sku, user []int
	}{
		{[]string{"-scenario", "sellout", "-skus", "2", "-buyers", "2", "-first-user", "101"}, []int{1, 1, 2, 2}, []int{101, 102, 103, 104}},
		{[]string{"-scenario", "hotsku", "-sku", "7", "-n", "3"}, []int{7, 7, 7}, []int{1, 2, 3}},
		{[]string{"-scenario", "hotsku", "-sku", "7", "-n", "2", "-first-user", "50"}, []int{7, 7}, []int{50, 51}},
	} {
		o, err := parse(tt.args)
		if err != nil {
			t.Fatal(err)
		}
		next := requests(o)
		for i := range tt.sku {
			body, _ := io.ReadAll(next().Body)
			if want := fmt.Sprintf(`{"sku_id":%d,"user_id":%d}`, tt.sku[i], tt.user[i]); string(body) != want {
				t.Errorf("%v request %d: %s, want %s", tt.args, i, body, want)
			}
		}
	}
	if _, err := parse([]string{"-first-user", "0"}); err == nil {
		t.Error("-first-user 0 accepted")
	}
}

func TestAckLine(t *testing.T) {
	if got := fmt.Sprint(ack{7, 3, 9}); got != "7 3 9" {
		t.Errorf("ack line %q", got)
	}
	if got := fmt.Sprint(ack{orderID: 7}); got != "7" {
		t.Errorf("ack line of a 201 without sku and user: %q", got)
	}
}

func TestParse(t *testing.T) {
	o, err := parse([]string{"-skus", "5000", "-buyers", "4", "-c", "3000"})
	if err != nil {
		t.Fatal(err)
	}
	if o.n != 20000 || 20000%o.concurrency != 0 || o.concurrency > 3000 {
		t.Errorf("n %d, c %d: hey would drop requests", o.n, o.concurrency)
	}
	for _, bad := range [][]string{{"-scenario", "x"}, {"-url", "nope"}, {"-c", "0"}, {"-buyers", "0"}} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%v) accepted", bad)
		}
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tt := range []struct {
		p    int
		want float64
	}{{50, 5}, {99, 10}, {10, 1}, {100, 10}} {
		if got := percentile(xs, tt.p); got != tt.want {
			t.Errorf("p%d = %v, want %v", tt.p, got, tt.want)
		}
	}
	if percentile(nil, 50) != 0 {
		t.Error("empty")
	}
}

func TestReadScenariosAskForTheRightIDs(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"-scenario", "read", "-skus", "3", "-n", "4"}, []string{"/1", "/2", "/3", "/1"}},
		{[]string{"-scenario", "hotread", "-sku", "7", "-n", "2"}, []string{"/7", "/7"}},
		{[]string{"-scenario", "absent", "-skus", "10", "-distinct", "2", "-n", "3"}, []string{"/11", "/12", "/11"}},
	}
	for _, tt := range tests {
		o, err := parse(tt.args)
		if err != nil {
			t.Fatal(err)
		}
		next := requests(o)
		for i, want := range tt.want {
			req := next()
			if req.Method != "GET" || req.URL.Path != "/api/v1/products"+want {
				t.Errorf("%v request %d: %s %s, want GET /api/v1/products%s", tt.args, i, req.Method, req.URL.Path, want)
			}
		}
	}
}

// A flood runs -c clients, whatever -n is: hey's rule that c divides n is
// a sale's, not a flood's.
func TestFloodKeepsItsClients(t *testing.T) {
	o, err := parse([]string{"-scenario", "healthz", "-for", "1s", "-c", "300"})
	if err != nil {
		t.Fatal(err)
	}
	if o.concurrency != 300 {
		t.Errorf("-for 1s -c 300: %d clients; want 300", o.concurrency)
	}
}

// The floods of routes that exist: an existing SKU's stock, and orders
// guessed by id and user, each request its own guess; with a token, the
// guesser's own user id, whose token it sends.
func TestFloodsOfExistingRoutes(t *testing.T) {
	o, err := parse([]string{"-scenario", "stock", "-sku", "7", "-for", "1s"})
	if err != nil {
		t.Fatal(err)
	}
	if req := requests(o)(); req.Method != "GET" || req.URL.Path != "/api/v1/products/7/stock" {
		t.Errorf("stock: %s %s, want GET /api/v1/products/7/stock", req.Method, req.URL.Path)
	}
	for _, args := range [][]string{nil, {"-jwt-secret", testSecret}} {
		o, err := parse(append([]string{"-scenario", "order-guess", "-distinct", "50", "-first-user", "9", "-for", "1s"}, args...))
		if err != nil {
			t.Fatal(err)
		}
		next := requests(o)
		seen := map[string]bool{}
		for range 20 {
			req := next()
			var id, user int
			if _, err := fmt.Sscanf(req.URL.Path+" "+req.URL.Query().Get("user_id"), "/api/v1/orders/%d %d", &id, &user); err != nil ||
				req.Method != "GET" || id < 1 || id > 50 || user < 1 {
				t.Fatalf("order-guess %v: %s %s (%v); want GET /api/v1/orders/{1..50}?user_id=N", args, req.Method, req.URL, err)
			}
			seen[req.URL.String()] = true
			auth := req.Header.Get("Authorization")
			if (o.tokens != nil) != (auth != "") || o.tokens != nil && (user != 9 || auth != "Bearer "+o.tokens.of(9)) {
				t.Errorf("order-guess %v: user_id %d, Authorization %q; want the guesser's own with a token, none without", args, user, auth)
			}
		}
		if len(seen) < 10 {
			t.Errorf("order-guess %v: %d different requests of 20; want guesses, not one order asked again", args, len(seen))
		}
	}
}
