package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// tap is an HTTP forward proxy on loopback that hey's requester sends every
// request through. hey keeps only status codes and timings; the tap also
// reads each response body, so that every 201 becomes a line of the acks
// file: the orders the buyers were told they have, with the SKU and user
// each answer named.
type tap struct {
	transport *http.Transport
	server    *http.Server
	addr      string

	done     atomic.Int64
	mu       sync.Mutex
	statuses map[int]int
	errors   map[string]int
	acks     []ack
}

// ack is one 201: the order, and the SKU and user its body named (zero if
// it named none).
type ack struct{ orderID, skuID, userID int64 }

// String renders the ack as a line of the acks file: "order_id sku_id
// user_id", or the order id alone if the answer lacked the others.
func (a ack) String() string {
	if a.skuID <= 0 || a.userID <= 0 {
		return strconv.FormatInt(a.orderID, 10)
	}
	return fmt.Sprintf("%d %d %d", a.orderID, a.skuID, a.userID)
}

// tapConnsPerHost caps the tap's connections to each service URL; requests
// beyond it wait in the tap, as they would in a server's accept queue.
const tapConnsPerHost = 256

func newTap() (*tap, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &tap{
		transport: &http.Transport{
			MaxConnsPerHost:     tapConnsPerHost,
			MaxIdleConnsPerHost: tapConnsPerHost,
			IdleConnTimeout:     30 * time.Second,
		},
		addr:     ln.Addr().String(),
		statuses: map[int]int{},
		errors:   map[string]int{},
	}
	t.server = &http.Server{Handler: t, ReadHeaderTimeout: 10 * time.Second}
	go t.server.Serve(ln)
	return t, nil
}

func (t *tap) close() {
	t.server.Close()
	t.transport.CloseIdleConnections()
}

// ServeHTTP forwards a proxied request (absolute URL) and copies the answer
// back, recording it.
func (t *tap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer t.done.Add(1)
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header.Del("Proxy-Connection")
	res, err := t.transport.RoundTrip(out)
	if err != nil {
		t.record(0, nil, err)
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.record(0, nil, err)
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	t.record(res.StatusCode, body, nil)
	for k, vs := range res.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(res.StatusCode)
	w.Write(body)
}

func (t *tap) record(status int, body []byte, err error) {
	var a ack
	if status == http.StatusCreated {
		var o struct {
			OrderID int64 `json:"order_id"`
			SKUID   int64 `json:"sku_id"`
			UserID  int64 `json:"user_id"`
		}
		if json.NewDecoder(bytes.NewReader(body)).Decode(&o) == nil {
			a = ack{o.OrderID, o.SKUID, o.UserID}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.errors[err.Error()]++
		return
	}
	t.statuses[status]++
	if a.orderID > 0 {
		t.acks = append(t.acks, a)
	}
}

// snapshot returns copies of what the tap has seen.
func (t *tap) snapshot() (map[int]int, map[string]int, []ack) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := make(map[int]int, len(t.statuses))
	for k, v := range t.statuses {
		s[k] = v
	}
	e := make(map[string]int, len(t.errors))
	for k, v := range t.errors {
		e[k] = v
	}
	return s, e, append([]ack(nil), t.acks...)
}
