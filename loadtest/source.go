package main

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// Source addresses. Real buyers reach the edge from many addresses, and
// nginx limits each address (limit_req, limit_conn): a load test from one
// address would meet those limits as a single bot does, and measure them,
// not the service. With -src-n N the load test's requests leave from N
// loopback addresses instead, request i (counted from 0, in the order the
// requests are made) from address i mod N. All of 127.0.0.0/8 is local on
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
// address; with one source, a single transport that leaves from wherever
// the system chooses (127.0.0.1 to a loopback service).
type sources []*http.Transport

// newSources makes n transports. Each keeps at most conns connections per
// service URL (at least one), so that n sources together hold about as
// many connections as one transport with conns did: requests beyond that
// wait in the load test, as they would in a server's accept queue.
func newSources(n, conns int) (sources, error) {
	if n < 1 || n > maxSources {
		return nil, fmt.Errorf("-src-n %d: want 1 to %d", n, maxSources)
	}
	per := max(1, (conns+n-1)/n)
	s := make(sources, n)
	for i := range s {
		s[i] = &http.Transport{
			MaxConnsPerHost:     per,
			MaxIdleConnsPerHost: per,
			IdleConnTimeout:     30 * time.Second,
		}
		if n > 1 {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: sourceAddr(i)}, Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
			s[i].DialContext = d.DialContext
		}
	}
	return s, nil
}

// of is the transport of request i.
func (s sources) of(i int) *http.Transport { return s[i%len(s)] }

// conns is the most connections the sources open to one service URL.
func (s sources) conns() int { return len(s) * s[0].MaxConnsPerHost }

// closeIdle closes every source's idle connections.
func (s sources) closeIdle() {
	for _, t := range s {
		t.CloseIdleConnections()
	}
}
