package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// addrShop answers every request 201 with an order of its own, or, with
// status set, that status, and records the addresses the requests came
// from and their bodies.
type addrShop struct {
	status int
	mu     sync.Mutex
	from   map[string]int // source address → requests
	bodies map[string]int
	paths  map[string]int
	orders int
}

func newAddrShop(status int) *addrShop {
	return &addrShop{status: status, from: map[string]int{}, bodies: map[string]int{}, paths: map[string]int{}}
}

func (s *addrShop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.from[host]++
	s.bodies[string(body)]++
	s.paths[r.Method+" "+r.URL.Path]++
	if s.status != 0 {
		w.WriteHeader(s.status)
		return
	}
	s.orders++
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%d,"sku_id":1,"user_id":%d,"status":"paid"}`, s.orders, s.orders)
}

// With -src-n N the requests leave from N loopback addresses, each one
// request in N, and never from 127.0.0.1; without it, from one.
func TestSourceAddresses(t *testing.T) {
	for _, tt := range []struct {
		srcN, srcFrom int
		want          []string
	}{
		{1, 0, []string{"127.0.0.1"}},
		{7, 0, []string{"127.1.1.1", "127.1.1.2", "127.1.1.3", "127.1.1.4", "127.1.1.5", "127.1.1.6", "127.1.1.7"}},
		{7, 249, []string{"127.1.1.250", "127.1.2.1", "127.1.2.2", "127.1.2.3", "127.1.2.4", "127.1.2.5", "127.1.2.6"}},
	} {
		t.Run(fmt.Sprint(tt.srcN, "from", tt.srcFrom), func(t *testing.T) {
			shop := newAddrShop(0)
			srv := httptest.NewServer(shop)
			defer srv.Close()
			r, _ := runLoad(t, srv.URL, "-scenario", "hotsku", "-n", "70", "-c", "10", "-src-n", fmt.Sprint(tt.srcN), "-src-from", fmt.Sprint(tt.srcFrom))
			srv.Close() // every handler done before the shop's maps are read
			if r.Statuses["201"] != 70 || len(shop.from) != len(tt.want) {
				t.Fatalf("statuses %v, %d source addresses %v; want 70 201s from %v", r.Statuses, len(shop.from), shop.from, tt.want)
			}
			for _, addr := range tt.want {
				if n := shop.from[addr]; n != 70/len(tt.want) {
					t.Errorf("%s sent %d requests; want %d from each of %v", addr, n, 70/len(tt.want), tt.want)
				}
			}
		})
	}
	if _, err := parse([]string{"-src-n", "0"}); err == nil {
		t.Error("-src-n 0 accepted")
	}
	if _, err := parse([]string{"-src-n", fmt.Sprint(maxSources + 1)}); err == nil {
		t.Error("-src-n above maxSources accepted")
	}
	if _, err := parse([]string{"-src-n", "2", "-src-from", fmt.Sprint(maxSources - 1)}); err == nil {
		t.Error("-src-from past the last address accepted")
	}
}

func TestSourceAddrsDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i := range maxSources {
		ip := sourceAddr(i).To4()
		if ip[0] != 127 || ip[1] != 1 || ip[2] == 0 || ip[3] == 0 || ip[2] == 255 || ip[3] == 255 || seen[ip.String()] {
			t.Fatalf("source %d is %s: want a new 127.1.b.c without .0 or .255", i, ip)
		}
		seen[ip.String()] = true
	}
}

// A flood runs for its time from its clients, spread over the source
// addresses, and counts its answers by status.
func TestFlood(t *testing.T) {
	for _, tt := range []struct {
		scenario string
		paths    []string
	}{
		{"healthz", []string{"GET /healthz"}},
		{"absent-stock", []string{"GET /api/v1/products/6/stock", "GET /api/v1/products/7/stock"}},
		{"absent", []string{"GET /api/v1/products/6", "GET /api/v1/products/7"}},
		{"malformed", []string{"POST /api/v1/orders"}},
	} {
		t.Run(tt.scenario, func(t *testing.T) {
			shop := newAddrShop(http.StatusBadRequest)
			srv := httptest.NewServer(shop)
			defer srv.Close()
			result := filepath.Join(t.TempDir(), "flood.json")
			var out strings.Builder
			err := run(context.Background(), []string{"-url", srv.URL, "-scenario", tt.scenario, "-for", "300ms", "-c", "4",
				"-src-n", "5", "-skus", "5", "-distinct", "2", "-json", result}, &out, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			// A request the flood gave up on at its end may still be in the
			// shop's hands: Close waits for it, before its maps are read.
			srv.Close()
			var r Result
			data, _ := os.ReadFile(result)
			if err := json.Unmarshal(data, &r); err != nil {
				t.Fatal(err)
			}
			if r.Requests < 10 || r.Statuses["400"] != r.Requests || len(r.Statuses) != 1 || r.Seconds < 0.3 || r.Seconds > 5 || r.RPS <= 0 {
				t.Errorf("result %+v; want only 400s for about 300ms", r)
			}
			if len(shop.from) != 5 || len(shop.paths) != len(tt.paths) {
				t.Errorf("from %v, paths %v; want 5 addresses and %v", shop.from, shop.paths, tt.paths)
			}
			for _, p := range tt.paths {
				if shop.paths[p] == 0 {
					t.Errorf("no %s among %v", p, shop.paths)
				}
			}
			if tt.scenario == "malformed" {
				for body := range shop.bodies {
					if body != `{"sku_id":` && !strings.HasPrefix(body, `{"sku_id":0,"user_id":`) {
						t.Errorf("malformed order %q: want one that is not JSON or has sku_id 0", body)
					}
				}
				if len(shop.bodies) < 3 {
					t.Errorf("bodies %v; want both kinds, sku_id 0 with a user each", shop.bodies)
				}
			}
		})
	}
	for _, bad := range [][]string{{"-scenario", "hotsku", "-for", "1s"}, {"-scenario", "sellout", "-for", "1s"}, {"-for", "-1s"}} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%v) accepted", bad)
		}
	}
}

// However many sources, no more requests than the cap are in flight to one
// URL at once; the others wait for a slot.
func TestSourcesCapInFlight(t *testing.T) {
	var mu sync.Mutex
	now, most := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		now--
		mu.Unlock()
	}))
	defer srv.Close()
	srcs, err := newSources(0, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer srcs.closeIdle()
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", srv.URL, nil)
			if a := roundTrip(srcs.of(i), req); a.err != nil || a.status != 200 {
				t.Errorf("request %d: %d %v", i, a.status, a.err)
			}
		}()
	}
	wg.Wait()
	if most != 3 {
		t.Errorf("%d requests in flight at most; want the cap, 3", most)
	}
}
