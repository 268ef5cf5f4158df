package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// newTestTap starts a tap that sends each buyer's request once, from the
// system's choice of address.
func newTestTap(t *testing.T) *tap {
	t.Helper()
	srcs, err := newSources(0, 1, tapConnsPerHost)
	if err != nil {
		t.Fatal(err)
	}
	tp := newTap(retryPolicy{attempts: 1, timeout: time.Minute}, srcs)
	if err := tp.listen(); err != nil {
		t.Fatal(err)
	}
	return tp
}

// A connection that never carries a request, as hey's transport leaves
// when the request it dialled for took another connection, does not hold
// the tap open: close ends at once, and closes it. http.Server's Shutdown
// waited for such a connection until it was five seconds old.
func TestTapCloseSkipsUnusedConnections(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order_id":1,"sku_id":1,"user_id":1}`)
	}))
	defer srv.Close()
	tp := newTestTap(t)
	unused, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer unused.Close()
	// A buyer answered on a second connection: the tap accepts its
	// connections in turn, so it has accepted the unused one too.
	hey := heyTransport(tp)
	defer hey.CloseIdleConnections()
	res, err := hey.RoundTrip(newOrder(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("the buyer through the tap was answered %d, want 201", res.StatusCode)
	}
	closed := make(chan struct{})
	go func() {
		tp.close(time.Minute)
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(4 * time.Second):
		t.Fatal("close still waits for a connection without a request after 4s")
	}
	if n, err := unused.Read(make([]byte, 1)); err == nil {
		t.Errorf("the unused connection is still open after close: read %d bytes", n)
	}
	if tl := tp.snapshot(); tl.finals["201"] != 1 {
		t.Errorf("finals %v; want the buyer's 201", tl.finals)
	}
}

// heyTransport sends its requests through the tap, as hey does.
func heyTransport(tp *tap) *http.Transport {
	proxy, _ := url.Parse("http://" + tp.addr)
	return &http.Transport{Proxy: http.ProxyURL(proxy)}
}

// newOrder is a buyer's order to the service at url.
func newOrder(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/api/v1/orders", strings.NewReader(`{"sku_id":1,"user_id":1}`))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// close waits for a buyer still in the tap's hands, and its answer is
// counted; a request that comes once close has begun is refused. (In a
// run, close comes after hey has every answer it waits for: the buyers
// left are those it gave up on, so that whether this one's answer reaches
// its client before the tap closes is not part of close's promise.)
func TestTapCloseWaitsForBuyers(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order_id":1,"sku_id":1,"user_id":1}`)
	}))
	defer srv.Close()
	tp := newTestTap(t)
	hey := heyTransport(tp)
	defer hey.CloseIdleConnections()
	req := newOrder(t, srv.URL)
	buyer := make(chan struct{})
	go func() {
		defer close(buyer)
		if res, err := hey.RoundTrip(req); err == nil {
			res.Body.Close()
		}
	}()
	<-arrived
	closed := make(chan struct{})
	go func() {
		tp.close(time.Minute)
		close(closed)
	}()
	// Once close has begun, the buyer is still in flight and close waits.
	for {
		tp.servingMu.Lock()
		closing := tp.closing
		tp.servingMu.Unlock()
		if closing {
			break
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-closed:
		t.Fatal("close returned while a buyer was in flight")
	default:
	}
	if tp.enter() {
		tp.leave()
		t.Error("a new buyer was taken in after close began")
	}
	close(release)
	<-closed
	<-buyer
	tl := tp.snapshot()
	if tl.finals["201"] != 1 || len(tl.acks) != 1 || tp.done.Load() != 1 {
		t.Errorf("finals %v, acks %v, done %d; want the buyer in flight counted", tl.finals, tl.acks, tp.done.Load())
	}
}

// wire records where a test server's requests came from: each request's
// source address and the connections it opened.
type wire struct {
	mu      sync.Mutex
	sources map[string]int // source IP → requests
	conns   int            // connections opened
	header  map[string]int // requests that carried each of the headers asked about
}

// serve starts handler behind a server that records its wire, counting
// the requests that carry any of headers.
func serve(t *testing.T, handler http.Handler, headers ...string) (*httptest.Server, *wire) {
	t.Helper()
	w := &wire{sources: map[string]int{}, header: map[string]int{}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.mu.Lock()
		w.sources[ip]++
		for _, h := range headers {
			if r.Header.Get(h) != "" {
				w.header[h]++
			}
		}
		w.mu.Unlock()
		handler.ServeHTTP(rw, r)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			w.mu.Lock()
			w.conns++
			w.mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, w
}
