// Package slowclient holds connections to an HTTP server open the way a
// slow or hostile client does from one address: idle connections that
// never send a byte, connections that trickle their header a byte at a
// time (slowloris) and connections that send a header and then trickle
// the body. It records when the server closes each one, and how. The nginx
// tests of cmd/shop and the edge bench (loadtest/slowbench) use it.
package slowclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Kind is how a held connection behaves.
type Kind int

const (
	// Idle connections send nothing.
	Idle Kind = iota
	// Header connections send a request line and then their header a
	// byte at a time, never ending it.
	Header
	// Body connections send a whole header naming a body, then the body a
	// byte at a time.
	Body
)

func (k Kind) String() string {
	return [...]string{"idle", "header", "body"}[k]
}

// Config is what to hold open.
type Config struct {
	// Addr is the server, host:port; From the source address of every
	// connection (nil: the system's choice).
	Addr string
	From net.IP
	// How many connections of each kind.
	Idle, Header, Body int
	// Every is how long a trickling connection waits between two bytes.
	Every time.Duration
	// BodyBytes is how many bytes of its body a body connection sends
	// before it stops sending (and only waits); 0 is no end.
	BodyBytes int
	// BodyPath is the path body connections POST to, a body of
	// BodyLength bytes.
	BodyPath   string
	BodyLength int
	// Reopen opens a connection again once the server closed it, as an
	// attacker keeping its count does, until StopReopening.
	Reopen bool
}

// dialers is how many connections Start opens at once.
const dialers = 16

// Closure is one connection the server closed.
type Closure struct {
	Kind Kind
	// Opened is when the connection was established, LastSent when its
	// last byte was sent (Opened for an idle one), Closed when the client
	// saw it closed.
	Opened, LastSent, Closed time.Time
	// Reset is a close by a TCP reset, not an orderly close; Answered that
	// the server sent something (an HTTP answer) first.
	Reset, Answered bool
}

// Hold is connections held open until Stop.
type Hold struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	reopen atomic.Bool

	mu       sync.Mutex
	open     [3]int
	closures []Closure
	dialErrs int
}

// Start dials every connection of cfg, then keeps each one as its kind
// does in goroutines of its own until Stop. It returns once all are
// established, or with the first dial's error (after closing the others).
func Start(ctx context.Context, cfg Config) (*Hold, error) {
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	h := &Hold{cfg: cfg, ctx: ctx, cancel: cancel}
	h.reopen.Store(cfg.Reopen)
	kinds := make(chan Kind)
	errs := make(chan error, dialers)
	var wg sync.WaitGroup
	for range dialers {
		wg.Go(func() {
			for kind := range kinds {
				c, err := h.dial()
				if err != nil {
					errs <- fmt.Errorf("slowclient: a connection of kind %s, with %d open: %w", kind, h.Open(), err)
					return
				}
				h.keep(kind, c)
			}
		})
	}
	var err error
feed:
	for kind, n := range [3]int{cfg.Idle, cfg.Header, cfg.Body} {
		for range n {
			select {
			case kinds <- Kind(kind):
			case err = <-errs:
				break feed
			}
		}
	}
	close(kinds)
	wg.Wait()
	select {
	case e := <-errs:
		err = cmp.Or(err, e)
	default:
	}
	if err != nil {
		h.Stop()
		return nil, err
	}
	return h, nil
}

// StopReopening makes the connections that the server closes from now on
// stay closed.
func (h *Hold) StopReopening() { h.reopen.Store(false) }

func (h *Hold) dial() (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if h.cfg.From != nil {
		d.LocalAddr = &net.TCPAddr{IP: h.cfg.From}
	}
	return d.DialContext(h.ctx, "tcp", h.cfg.Addr)
}

// keep runs c as kind in a goroutine of its own, opening it again when
// the server closed it and cfg.Reopen is set.
func (h *Hold) keep(kind Kind, c net.Conn) {
	h.mu.Lock()
	h.open[kind]++
	h.mu.Unlock()
	h.wg.Go(func() {
		for c != nil {
			cl, closed := h.run(kind, c)
			h.mu.Lock()
			h.open[kind]--
			if closed {
				h.closures = append(h.closures, cl)
			}
			h.mu.Unlock()
			c = nil
			for closed && h.reopen.Load() && h.ctx.Err() == nil && c == nil {
				var err error
				if c, err = h.dial(); err != nil {
					h.mu.Lock()
					h.dialErrs++
					h.mu.Unlock()
					select {
					case <-h.ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
			if c != nil {
				h.mu.Lock()
				h.open[kind]++
				h.mu.Unlock()
			}
		}
	})
}

// run sends what kind sends on c until the server closes it (closed true,
// with how) or the hold stops.
func (h *Hold) run(kind Kind, c net.Conn) (cl Closure, closed bool) {
	defer c.Close()
	// Closed under a Read when the hold stops, which then fails.
	stop := context.AfterFunc(h.ctx, func() { c.Close() })
	defer stop()
	now := time.Now()
	cl = Closure{Kind: kind, Opened: now, LastSent: now}
	// What is left to send, a byte each Every; a header connection's
	// header value never ends (endless).
	var pending string
	endless := false
	switch kind {
	case Header:
		pending, endless = "GET /healthz HTTP/1.1\r\nHost: shop\r\nX-Slow: a", true
	case Body:
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: shop\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", h.cfg.BodyPath, h.cfg.BodyLength)
		if _, err := io.WriteString(c, head); err != nil {
			return h.closed(cl, err), h.ctx.Err() == nil
		}
		cl.LastSent = time.Now()
		n := h.cfg.BodyLength
		if h.cfg.BodyBytes > 0 {
			n = min(n, h.cfg.BodyBytes)
		}
		pending = strings.Repeat("a", n)
	}
	buf := make([]byte, 512)
	for {
		if pending != "" {
			c.SetReadDeadline(time.Now().Add(h.cfg.Every))
		} else {
			c.SetReadDeadline(time.Time{})
		}
		n, err := c.Read(buf)
		if n > 0 {
			cl.Answered = true
			continue
		}
		if h.ctx.Err() != nil {
			return cl, false
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if _, err := io.WriteString(c, pending[:1]); err != nil {
				return h.closed(cl, err), true
			}
			pending, cl.LastSent = pending[1:], time.Now()
			if pending == "" && endless {
				pending = "a"
			}
			continue
		}
		return h.closed(cl, err), true
	}
}

// closed completes cl with the error that ended its connection.
func (h *Hold) closed(cl Closure, err error) Closure {
	cl.Closed = time.Now()
	cl.Reset = errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
	return cl
}

// Open is how many connections are held open now.
func (h *Hold) Open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open[Idle] + h.open[Header] + h.open[Body]
}

// OpenOf is how many connections of kind are held open now.
func (h *Hold) OpenOf(kind Kind) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open[kind]
}

// Closures are the connections the server has closed so far.
func (h *Hold) Closures() []Closure {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Closure(nil), h.closures...)
}

// DialErrors is how many times opening a connection again failed.
func (h *Hold) DialErrors() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dialErrs
}

// Stop closes every connection and waits for their goroutines.
func (h *Hold) Stop() {
	h.cancel()
	h.wg.Wait()
}
