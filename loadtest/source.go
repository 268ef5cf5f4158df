package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Source addresses. Real buyers reach the edge from many addresses, and
// nginx limits each address (limit_req, limit_conn): a load test from one
// address would meet those limits as a single bot does, and measure them,
// not the service. With -src-n N the load test's requests leave from N
// loopback addresses instead, request i (counted from 0, in the order the
// requests are made) from address i mod N; -src-from K starts at the K-th
// address, so that two load tests at once (buyers and a flood) come from
// different addresses. All of 127.0.0.0/8 is local on
// Linux, so nothing needs to be configured; elsewhere (macOS has only
// 127.0.0.1 unless aliases are added) N must stay 1.

// maxSources is the most source addresses -src-n may ask for: 127.1.b.c
// with b and c from 1 to 250, so that no address is 127.0.0.1 (where the
// servers listen) nor one that looks like a network or broadcast address.
const maxSources = 250 * 250

// sourceAddr is the i-th source address (from 0): 127.1.b.c, c counting
// fastest.
func sourceAddr(i int) net.IP {
	return net.IPv4(127, 1, byte(1+i/250), byte(1+i%250))
}

// sources are the transports the load test sends through, one per source
// address (with one source, a single transport that leaves from wherever
// the system chooses: 127.0.0.1 to a loopback service), and a cap on the
// requests in flight to each service URL over all of them: requests
// beyond it wait in the load test, as they would in a server's accept
// queue, so that spreading them over more addresses changes where they
// come from, not how many a service has to answer at once.
type sources struct {
	transports []*http.Transport
	inFlight   int

	mu    sync.Mutex
	slots map[string]chan struct{} // host → a slot per request in flight
}

// newSources makes n sources, addresses from to from+n-1 (when n is above
// one), with at most inFlight requests in flight to each service URL. Each source keeps as many idle connections as its
// share of inFlight (at least one), so that a source's next request finds
// the connection its last one used.
func newSources(from, n, inFlight int) (*sources, error) {
	if from < 0 || n < 1 || from+n > maxSources {
		return nil, fmt.Errorf("-src-from %d, -src-n %d: want addresses 0 to %d", from, n, maxSources-1)
	}
	s := &sources{transports: make([]*http.Transport, n), inFlight: inFlight, slots: map[string]chan struct{}{}}
	for i := range s.transports {
		t := &http.Transport{MaxIdleConnsPerHost: s.idlePerSource(), IdleConnTimeout: 30 * time.Second}
		if n > 1 {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: sourceAddr(from + i)}, Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
			t.DialContext = d.DialContext
		}
		s.transports[i] = t
	}
	return s, nil
}

func (s *sources) idlePerSource() int {
	return max(1, (s.inFlight+len(s.transports)-1)/len(s.transports))
}

// conns is about the most connections the sources hold open to one
// service URL: the idle ones and those in flight.
func (s *sources) conns() int { return len(s.transports)*s.idlePerSource() + s.inFlight }

// of is the round tripper of request i: source i mod n.
func (s *sources) of(i int) http.RoundTripper {
	return sourceTrip{s, s.transports[i%len(s.transports)]}
}

// slot returns host's slots.
func (s *sources) slot(host string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.slots[host]
	if !ok {
		c = make(chan struct{}, s.inFlight)
		s.slots[host] = c
	}
	return c
}

// closeIdle closes every source's idle connections.
func (s *sources) closeIdle() {
	for _, t := range s.transports {
		t.CloseIdleConnections()
	}
}

// sourceTrip sends a request from one source, within its URL's cap.
type sourceTrip struct {
	s *sources
	t *http.Transport
}

// RoundTrip waits for a slot of the request's host, sends the request, and
// gives the slot back once the response's body is closed (or at once if
// there is no response).
func (st sourceTrip) RoundTrip(req *http.Request) (*http.Response, error) {
	slots := st.s.slot(req.URL.Host)
	select {
	case slots <- struct{}{}:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	res, err := st.t.RoundTrip(req)
	if err != nil {
		<-slots
		return nil, err
	}
	res.Body = &slotBody{ReadCloser: res.Body, release: func() { <-slots }}
	return res, nil
}

// slotBody gives its slot back when it is first closed.
type slotBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (b *slotBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.release)
	return err
}
