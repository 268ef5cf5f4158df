package eventsink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"shop/internal/outbox"
	"shop/internal/payments"
)

// maxBody bounds a delivery's body; an event is far smaller.
const maxBody = 1 << 20

// relistenEvery is how often Up tries the events address again when it is
// taken, which a port freed by Down should not be for long.
const relistenEvery = 50 * time.Millisecond

// ErrClosed is returned by the faults of a sink that was closed.
var ErrClosed = errors.New("eventsink: closed")

// Options configure Start.
type Options struct {
	// Secret is the Standard Webhooks secret, whsec_ + base64 of at least
	// payments.MinSecret bytes, or a comma list of them (a delivery
	// signed with any verifies).
	Secret string
	// Addr and ControlAddr are the listeners' addresses; empty is a free
	// loopback port. Down listens again on the port Addr was given.
	Addr        string
	ControlAddr string
	// RecordFile, when set, is appended a JSON line per delivery.
	RecordFile string
	// FailFirst arms FailFirst from the start.
	FailFirst int
}

// Sink receives events; see the package comment.
type Sink struct {
	hooks   []*standardwebhooks.Webhook
	addr    string // the events listener's, its port fixed by the first listen
	control *http.Server
	ctlAddr string
	done    chan struct{} // closed by Close
	serving sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	srv       *http.Server // nil while down
	upTimer   *time.Timer  // pending while down for a time
	failNext  int
	closeNext int
	hangUntil time.Time
	held      int // deliveries being held by Hang
	record    []Delivery
	file      *os.File
	fileErr   error         // the first write to the file that failed
	changed   chan struct{} // closed and replaced when the record grows
}

// Start verifies the secret, opens the record file and listens on both
// addresses.
func Start(ctx context.Context, o Options) (*Sink, error) {
	if o.Secret == "" {
		return nil, errors.New("eventsink: no secret")
	}
	s := &Sink{done: make(chan struct{}), changed: make(chan struct{}), failNext: o.FailFirst}
	entries := strings.Split(o.Secret, ",")
	for i, entry := range entries {
		key, err := payments.DecodeSecret(entry)
		if err != nil {
			return nil, fmt.Errorf("eventsink: secret %d of %d: %w", i+1, len(entries), err)
		}
		hook, err := standardwebhooks.NewWebhookRaw(key)
		if err != nil {
			return nil, fmt.Errorf("eventsink: secret %d of %d: %w", i+1, len(entries), err)
		}
		s.hooks = append(s.hooks, hook)
	}
	if o.RecordFile != "" {
		f, err := os.OpenFile(o.RecordFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("eventsink: record file: %w", err)
		}
		s.file = f
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", orLoopback(o.Addr))
	if err != nil {
		s.closeFile()
		return nil, fmt.Errorf("eventsink: listen: %w", err)
	}
	ctl, err := lc.Listen(ctx, "tcp", orLoopback(o.ControlAddr))
	if err != nil {
		ln.Close()
		s.closeFile()
		return nil, fmt.Errorf("eventsink: control listen: %w", err)
	}
	s.addr, s.ctlAddr = ln.Addr().String(), ctl.Addr().String()
	s.control = &http.Server{Handler: s.ControlHandler(), ReadHeaderTimeout: 10 * time.Second}
	s.serve(s.control, ctl)
	s.mu.Lock()
	s.serveEventsLocked(ln)
	s.mu.Unlock()
	return s, nil
}

func orLoopback(addr string) string {
	if addr == "" {
		return "127.0.0.1:0"
	}
	return addr
}

// URL is where events are to be POSTed: SHOP_EVENTS_URL.
func (s *Sink) URL() string { return "http://" + s.addr + "/events" }

// Addr is the events listener's address.
func (s *Sink) Addr() string { return s.addr }

// ControlURL is the control listener's base URL, ending in /control/.
func (s *Sink) ControlURL() string { return "http://" + s.ctlAddr + "/control/" }

// serve runs srv on ln until it is closed.
func (s *Sink) serve(srv *http.Server, ln net.Listener) {
	s.serving.Add(1)
	go func() {
		defer s.serving.Done()
		// Serve returns ErrServerClosed when Down or Close closes it.
		_ = srv.Serve(ln)
	}()
}

// serveEventsLocked serves deliveries on ln. Each connection is tracked so
// that a sender that closes it while held by Hang is timed when the sink
// saw it go, not when the held handler next ran.
func (s *Sink) serveEventsLocked(ln net.Listener) {
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
	s.serve(s.srv, trackListener{ln})
}

// Close stops both listeners, releases held deliveries and closes the
// record file. It returns the first error of a write to the file.
func (s *Sink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	if s.upTimer != nil {
		s.upTimer.Stop()
	}
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	s.control.Close()
	s.serving.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closeFile(); err != nil && s.fileErr == nil {
		s.fileErr = err
	}
	return s.fileErr
}

func (s *Sink) closeFile() error {
	if s.file == nil {
		return nil
	}
	err := s.file.Close()
	s.file = nil
	if err != nil {
		return fmt.Errorf("eventsink: record file: %w", err)
	}
	return nil
}

// FailFirst answers 500 to the next n deliveries (0 disarms it).
func (s *Sink) FailFirst(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = max(n, 0)
}

// CloseNext closes the connections of the next n deliveries without
// answering them (0 disarms it).
func (s *Sink) CloseNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeNext = max(n, 0)
}

// Hang holds the deliveries that arrive in the next d until d has passed,
// or until their sender gives up (0 disarms it; held deliveries are then
// answered).
func (s *Sink) Hang(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hangUntil = time.Now().Add(d)
	s.signalLocked()
}

// Down closes the events listener and its connections, so that deliveries
// are refused, and listens again on the same address after d (Up does so
// sooner). Down while down moves the time it comes back.
func (s *Sink) Down(d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.srv != nil {
		// Closed under the lock, so that an Up cannot listen before the
		// port is free. Close does not wait for handlers, which need the
		// lock.
		s.srv.Close()
		s.srv = nil
	}
	s.scheduleUpLocked(d)
	return nil
}

// Up listens again now, after Down; a sink that is up is left as it is.
// When the address is taken it keeps trying in the background and returns
// the error.
func (s *Sink) Up() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.srv != nil {
		return nil
	}
	if s.upTimer != nil {
		s.upTimer.Stop()
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.scheduleUpLocked(relistenEvery)
		return fmt.Errorf("eventsink: listen again: %w", err)
	}
	s.serveEventsLocked(ln)
	return nil
}

// IsUp says whether the events listener is listening.
func (s *Sink) IsUp() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv != nil
}

func (s *Sink) scheduleUpLocked(d time.Duration) {
	if s.upTimer != nil {
		s.upTimer.Stop()
	}
	// The timer's error is retried by Up itself.
	s.upTimer = time.AfterFunc(d, func() { _ = s.Up() })
}

// Record returns a copy of the deliveries recorded so far, in the order
// they were answered.
func (s *Sink) Record() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.record)
}

// Summary is Summarize of the record so far.
func (s *Sink) Summary() Summary { return Summarize(s.Record()) }

// WaitFor returns once done holds for the record, checking it again each
// time a delivery is recorded, or ctx's error.
func (s *Sink) WaitFor(ctx context.Context, done func([]Delivery) bool) error {
	if err := s.waitUntil(ctx, func() bool { return done(s.Record()) }); err != nil {
		return fmt.Errorf("eventsink: waiting for the record: %w", err)
	}
	return nil
}

// Held is how many deliveries Hang is holding.
func (s *Sink) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// WaitHeld returns once at least n deliveries are being held by Hang, or
// ctx's error: a test holds its sender's delivery before it acts.
func (s *Sink) WaitHeld(ctx context.Context, n int) error {
	if err := s.waitUntil(ctx, func() bool { return s.Held() >= n }); err != nil {
		return fmt.Errorf("eventsink: waiting for %d held deliveries, %d are: %w", n, s.Held(), err)
	}
	return nil
}

// waitUntil returns once check holds, checking it again at each signal,
// or ctx's error. check runs without the lock, and the signal it waits for
// is taken before it runs, so that no change between the two is missed.
func (s *Sink) waitUntil(ctx context.Context, check func() bool) error {
	for {
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()
		if check() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// signalLocked wakes WaitFor, WaitHeld and held deliveries.
func (s *Sink) signalLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// add records d, in memory and in the file.
func (s *Sink) add(d Delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.record = append(s.record, d)
	if s.file != nil && s.fileErr == nil {
		line, err := marshalLine(d)
		if err == nil {
			// One write per line, so that a reader sees whole lines
			// (O_APPEND) but for the one being written.
			_, err = s.file.Write(line)
		}
		if err != nil {
			s.fileErr = fmt.Errorf("eventsink: record file: %w", err)
		}
	}
	s.signalLocked()
}

// parseEnvelope reads a verified body into d.
func parseEnvelope(body []byte, d *Delivery) error {
	var e outbox.Envelope
	if err := json.Unmarshal(body, &e); err != nil {
		return fmt.Errorf("not an envelope: %w", err)
	}
	switch {
	case e.EventID != d.WebhookID:
		return fmt.Errorf("event_id %q is not the webhook-id %q", e.EventID, d.WebhookID)
	case e.Type == "":
		return errors.New("no type")
	case e.Stream == "":
		return errors.New("no stream")
	}
	at, err := time.Parse(time.RFC3339Nano, e.OccurredAt)
	if err != nil {
		return fmt.Errorf("occurred_at: %w", err)
	}
	var data struct {
		Sequence json.Number `json:"sequence"`
	}
	if err := json.Unmarshal(e.Data, &data); err != nil {
		return fmt.Errorf("data: %w", err)
	}
	seq, err := strconv.ParseInt(string(data.Sequence), 10, 64)
	if err != nil || seq < 1 {
		return fmt.Errorf("data.sequence %q is not an integer of at least 1", data.Sequence)
	}
	d.Type, d.Stream, d.Sequence, d.OccurredAt = e.Type, e.Stream, seq, at.UTC()
	d.SchemaVersion, d.Data = e.SchemaVersion, e.Data
	return nil
}

// verify checks the signature against each secret, and the timestamp
// against the library's tolerance.
func (s *Sink) verify(h http.Header, body []byte) error {
	var err error
	for _, hook := range s.hooks {
		if err = hook.Verify(body, h); err == nil {
			return nil
		}
	}
	return err
}

// ServeHTTP handles one delivery.
func (s *Sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d := Delivery{Arrived: now()}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "deliveries are POSTed", http.StatusMethodNotAllowed)
		return
	}
	d.WebhookID = r.Header.Get(standardwebhooks.HeaderWebhookID)
	d.WebhookTimestamp, _ = strconv.ParseInt(r.Header.Get(standardwebhooks.HeaderWebhookTimestamp), 10, 64)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		s.answer(w, d, http.StatusBadRequest, "", fmt.Sprintf("reading the body: %v", err))
		return
	}
	if err := s.verify(r.Header, body); err != nil {
		s.answer(w, d, http.StatusUnauthorized, "", err.Error())
		return
	}
	if err := parseEnvelope(body, &d); err != nil {
		s.answer(w, d, http.StatusBadRequest, "", err.Error())
		return
	}

	// The faults, in this order: close, hang, fail.
	if s.take(&s.closeNext) {
		s.closeConn(w, d)
		return
	}
	if !s.hold(r.Context()) {
		d.Answered = goneAt(r.Context())
		d.Fault, d.Error = FaultHang, "the sender closed the connection while held"
		s.add(d)
		return
	}
	if s.take(&s.failNext) {
		s.answer(w, d, http.StatusInternalServerError, FaultFail, "failed on purpose")
		return
	}
	s.answer(w, d, http.StatusOK, "", "")
}

// take counts down one of the armed faults' counters, under the lock, and
// says whether it was armed.
func (s *Sink) take(counter *int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *counter == 0 {
		return false
	}
	*counter--
	return true
}

// answer records d with status, then writes the answer.
func (s *Sink) answer(w http.ResponseWriter, d Delivery, status int, fault, msg string) {
	d.Answered, d.Status, d.Fault, d.Error = now(), status, fault, msg
	s.add(d)
	if status == http.StatusOK {
		w.WriteHeader(status)
		return
	}
	http.Error(w, msg, status)
}

// closeConn closes the delivery's connection without an answer.
func (s *Sink) closeConn(w http.ResponseWriter, d Delivery) {
	d.Fault = FaultClose
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not an HTTP/1 connection: the nearest is to abort the answer.
		d.Answered, d.Error = now(), "closed by aborting the answer: "+err.Error()
		s.add(d)
		panic(http.ErrAbortHandler)
	}
	d.Answered, d.Error = now(), "closed on purpose"
	s.add(d)
	conn.Close()
}

// hold waits while Hang holds deliveries. It returns false when the sender
// went away first.
func (s *Sink) hold(ctx context.Context) bool {
	counted := false
	defer func() {
		if counted {
			s.mu.Lock()
			s.held--
			s.signalLocked()
			s.mu.Unlock()
		}
	}()
	for {
		s.mu.Lock()
		wait, changed := time.Until(s.hangUntil), s.changed
		if wait > 0 && !counted {
			counted = true
			s.held++
			s.signalLocked()
			changed = s.changed
		}
		s.mu.Unlock()
		if wait <= 0 {
			// A sender seen to leave while held is not answered, even
			// if the hang ended meanwhile.
			return !counted || ctx.Err() == nil
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-changed:
			// Hang was moved, or the record grew: look again.
		case <-s.done:
			t.Stop()
			return true
		case <-ctx.Done():
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// now is the sink's clock, without a monotonic reading, so that a record
// read from its file compares as the one in memory does.
func now() time.Time { return time.Now().UTC() }

type connKey struct{}

// goneAt is when the delivery's connection was seen to close, or now when
// that is not known.
func goneAt(ctx context.Context) time.Time {
	if c, ok := ctx.Value(connKey{}).(*trackedConn); ok {
		if ns := c.gone.Load(); ns != 0 {
			return time.Unix(0, ns).UTC()
		}
	}
	return now()
}

// trackListener hands out trackedConns.
type trackListener struct{ net.Listener }

func (l trackListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &trackedConn{Conn: c}, nil
}

// trackedConn notes when a read first failed: while a handler is held,
// the server reads in the background only to see the sender close.
type trackedConn struct {
	net.Conn
	gone atomic.Int64 // Unix nanoseconds
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.gone.CompareAndSwap(0, time.Now().UnixNano())
	}
	return n, err
}
