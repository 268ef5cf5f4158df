package testenv

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on loopback between a client under test and a real
// server (MariaDB, Redis). It forwards bytes as they come and, on cue, loses
// one reply the way a network or a dying server does: the request reaches
// the server and is carried out there, and the client sees its connection
// close instead of the answer. Tests use it for the outcomes a client
// cannot tell apart from a failure: a COMMIT that committed, a release that
// released.
type Proxy struct {
	// Addr is where the proxy listens; point the client here.
	Addr string

	target string
	ln     net.Listener
	mu     sync.Mutex
	cuts   []*cut
	held   []*cut // every HoldReply, to lose what is still held at the end
	conns  map[net.Conn]struct{}
	dark   map[net.Conn]bool // Blackhole's connections
	wg     sync.WaitGroup
}

// cut is an armed CutReply or HoldReply.
type cut struct {
	match []byte
	done  chan struct{}
	// deliver, for a HoldReply, says what to do with the reply it holds:
	// true delivers it, false loses it. Nil for a CutReply.
	deliver chan bool
	once    sync.Once
}

// decide tells a held reply what to do with it, once.
func (c *cut) decide(deliver bool) {
	c.once.Do(func() { c.deliver <- deliver })
}

// StartProxy starts a proxy to target (host:port); it stops when the test
// ends.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	tb.Cleanup(p.close)
	return p
}

// CutReply arms the proxy: the next chunk a client sends that contains
// match is forwarded to the server, and the server's reply to it is thrown
// away and the connection closed at both ends as soon as the first byte of
// the reply arrives — so the server has done the work. The returned channel
// is closed when that has happened.
func (p *Proxy) CutReply(match []byte) <-chan struct{} {
	c := &cut{match: bytes.Clone(match), done: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = append(p.cuts, c)
	return c.done
}

// HoldReply arms the proxy as CutReply does, but holds the reply — the
// server has done the work, the client waits on an open connection, as
// behind a stalled network or an fsync that does not return — until
// release is called: release(true) delivers it, release(false) loses it
// with the connection. held is closed once the reply has arrived and is
// held. A reply still held when the test ends is lost.
func (p *Proxy) HoldReply(match []byte) (held <-chan struct{}, release func(deliver bool)) {
	c := &cut{match: bytes.Clone(match), done: make(chan struct{}), deliver: make(chan bool, 1)}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = append(p.cuts, c)
	p.held = append(p.held, c)
	return c.done, c.decide
}

// MySQLQuery is query as a MySQL client sends it alone: one COM_QUERY
// packet. CutReply(MySQLQuery("COMMIT")) loses the reply to a COMMIT and to
// no statement that only contains the word, such as a session's SET …
// READ COMMITTED.
func MySQLQuery(query string) []byte {
	n := 1 + len(query)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), 0, 0x03}, query...)
}

// Disarm drops the cuts armed and not yet carried out: a test that armed
// a cut on several proxies, for a command that goes to one of them, disarms
// the others.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = nil
}

// CloseAll closes every connection through the proxy at once, as a server
// crash or a reset network does; new connections are still accepted.
func (p *Proxy) CloseAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Blackhole silences every connection through the proxy at once, as a
// peer gone from the network without a reset does: the connections stay
// open, and what either end sends is thrown away. New connections are
// carried as before.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dark == nil {
		p.dark = map[net.Conn]bool{}
	}
	for c := range p.conns {
		p.dark[c] = true
	}
}

// silenced reports whether Blackhole silenced c.
func (p *Proxy) silenced(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dark[c]
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.held {
		c.decide(false)
	}
	p.mu.Unlock()
	p.CloseAll()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(client, server) })
	}
}

// take returns the armed cut whose match chunk contains, removing it.
func (p *Proxy) take(chunk []byte) *cut {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, c := range p.cuts {
		if bytes.Contains(chunk, c.match) {
			p.cuts = append(p.cuts[:i], p.cuts[i+1:]...)
			return c
		}
	}
	return nil
}

// pipe copies both ways between client and server until either side
// closes, carrying out cuts and holds.
func (p *Proxy) pipe(client, server net.Conn) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, client)
		delete(p.conns, server)
		delete(p.dark, client)
		delete(p.dark, server)
		p.mu.Unlock()
	}()
	// armed carries the cut whose request has just gone to the server: the
	// next bytes the server sends are its reply.
	armed := make(chan *cut, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer server.Close()
		defer client.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 && !p.silenced(client) {
				if c := p.take(buf[:n]); c != nil {
					armed <- c
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	wg.Go(func() {
		defer server.Close()
		defer client.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && !p.silenced(server) {
				select {
				case c := <-armed:
					close(c.done)
					if c.deliver == nil || !<-c.deliver {
						return // the reply is lost with the connection
					}
				default:
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	wg.Wait()
}
