// Package striperec is a recording proxy for stripe-mock: it forwards every
// request to its target and appends one JSON line per call to a file —
// method, path, query, Idempotency-Key, the answer's status and, for a
// form POST, the form — so that the tests and the demo can count what the
// service asked of Stripe. stripe-mock itself ignores Idempotency-Key and
// drops metadata from its answers; the proxy sees both in the request.
//
// A test can also make the proxy answer the next matching request itself
// (Inject), with an error stripe-mock never gives, such as
// charge_already_refunded.
package striperec

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"
)

// Call is one line of the log.
type Call struct {
	Time           time.Time `json:"time"`
	Method         string    `json:"method"`
	Path           string    `json:"path"`
	Query          string    `json:"query,omitempty"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Status         int       `json:"status"`
	// RefundID is a POST /v1/refunds's metadata[refund_id].
	RefundID string `json:"refund_id,omitempty"`
	// Form is a form POST's fields, the first value of each.
	Form map[string]string `json:"form,omitempty"`
	// Injected says that the proxy answered itself (Inject).
	Injected bool `json:"injected,omitempty"`
}

// maxForm bounds the form a request's body is read for; Stripe's API
// bodies are far smaller.
const maxForm = 1 << 20

// Recorder is the proxy, an http.Handler. It is safe for concurrent use.
type Recorder struct {
	proxy *httputil.ReverseProxy

	mu       sync.Mutex
	log      *os.File
	injected []*injection
}

type injection struct {
	method, path string
	status       int
	body         []byte
}

// New returns a proxy to target that appends to the file at logPath,
// creating it if need be.
func New(target, logPath string) (*Recorder, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("striperec: target %q is not an http(s) URL", target)
	}
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("striperec: %w", err)
	}
	p := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) }}
	return &Recorder{proxy: p, log: f}, nil
}

// Close closes the log; calls that are still being answered are not
// logged.
func (rec *Recorder) Close() error {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.log == nil {
		return nil
	}
	err := rec.log.Close()
	rec.log = nil
	return err
}

// Inject makes the proxy answer the next request to method and path itself,
// with status and body (JSON), rather than forward it. Injections are used
// once each, in the order given.
func (rec *Recorder) Inject(method, path string, status int, body string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.injected = append(rec.injected, &injection{method: method, path: path, status: status, body: []byte(body)})
}

// take removes and returns the first injection for method and path.
func (rec *Recorder) take(method, path string) *injection {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, in := range rec.injected {
		if in.method == method && in.path == path {
			rec.injected = append(rec.injected[:i], rec.injected[i+1:]...)
			return in
		}
	}
	return nil
}

func (rec *Recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := Call{
		Time:           time.Now().UTC(),
		Method:         r.Method,
		Path:           r.URL.Path,
		Query:          r.URL.RawQuery,
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
	}
	if err := readForm(r, &c); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		c.Status = http.StatusBadRequest
		rec.write(c)
		return
	}
	if in := rec.take(r.Method, r.URL.Path); in != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(in.status)
		w.Write(in.body)
		c.Status, c.Injected = in.status, true
		rec.write(c)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	rec.proxy.ServeHTTP(sw, r)
	c.Status = sw.status
	rec.write(c)
}

// readForm reads a form POST's fields into c, and leaves the body for the
// proxy to forward as it came.
func readForm(r *http.Request, c *Call) error {
	if r.Method != http.MethodPost || r.Body == nil {
		return nil
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/x-www-form-urlencoded" {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxForm+1))
	r.Body.Close()
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if len(body) > maxForm {
		return errors.New("form too large")
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return fmt.Errorf("parse form: %w", err)
	}
	c.Form = make(map[string]string, len(form))
	for k := range form {
		c.Form[k] = form.Get(k)
	}
	if c.Path == "/v1/refunds" {
		c.RefundID = form.Get("metadata[refund_id]")
	}
	return nil
}

// write appends c to the log as one line, in one write: a reader never
// sees a line that is half written unless the proxy died writing it.
func (rec *Recorder) write(c Call) {
	line, err := json.Marshal(c)
	if err != nil {
		return // a Call always marshals
	}
	line = append(line, '\n')
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.log != nil {
		rec.log.Write(line)
	}
}

// statusWriter notes the status of the answer it forwards.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Read returns the calls logged in the file at path, in the order they
// were answered. A last line without its newline is one still being
// written (or whose writer died writing it) and is left out.
func Read(path string) ([]Call, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("striperec: %w", err)
	}
	if i := bytes.LastIndexByte(b, '\n'); i < len(b)-1 {
		b = b[:i+1]
	}
	var calls []Call
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 4*maxForm)
	for n := 1; sc.Scan(); n++ {
		var c Call
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("striperec: %s line %d: %w", path, n, err)
		}
		calls = append(calls, c)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("striperec: %s: %w", path, err)
	}
	return calls, nil
}

// RefundCalls are the calls of the Refund API for one refund.
type RefundCalls struct {
	// Calls is how many times it was called for.
	Calls int
	// Keys are the distinct Idempotency-Keys it was called with, in the
	// order first sent.
	Keys []string
}

// Refunds groups the POST /v1/refunds among calls by refund id
// (metadata[refund_id]; "" for calls that had none).
func Refunds(calls []Call) map[string]*RefundCalls {
	m := map[string]*RefundCalls{}
	for _, c := range calls {
		if c.Method != http.MethodPost || c.Path != "/v1/refunds" {
			continue
		}
		rc := m[c.RefundID]
		if rc == nil {
			rc = &RefundCalls{}
			m[c.RefundID] = rc
		}
		rc.Calls++
		if !slices.Contains(rc.Keys, c.IdempotencyKey) {
			rc.Keys = append(rc.Keys, c.IdempotencyKey)
		}
	}
	return m
}
