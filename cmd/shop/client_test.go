package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// client is the tests' client of the API (internal/handler's routes.go):
// of a replica's public listener, of its operators' listener with the
// admin token, or of nginx in front of the replicas. It has a method for
// each call the tests make, and each returns the answer as a reply; none
// fails the test itself, so buyers may call it from goroutines of their own.
type client struct {
	// base is where the listener is: "http://host:port".
	base string
	http *http.Client
	// token, when set, is sent as the bearer token of the operators' calls.
	token string
}

// newClient is a client of the listener at base (http://host:port), with
// a timeout of 30 s a call.
func newClient(base string) *client {
	return &client{base: base, http: &http.Client{Timeout: 30 * time.Second}}
}

// using is c sending its calls through hc: a client with another timeout,
// or one whose connections come from many addresses (crowdClient).
func (c *client) using(hc *http.Client) *client {
	cp := *c
	cp.http = hc
	return &cp
}

// none is the body of a reply that is not decoded: the tests look at its
// status, its headers or its raw bytes.
type none struct{}

// reply is an answer as the tests look at it: its status and headers, its
// body raw and, when the status is 2xx, decoded into a T. err is the
// transport's error (status is 0 then), or the body's when a 2xx body is
// not a T in JSON.
type reply[T any] struct {
	status int
	header http.Header
	raw    []byte
	body   T
	err    error
}

// code is the code of an answer in the API's error shape,
// {"error":{"code","message"}}; "" for any other answer.
func (r reply[T]) code() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(r.raw, &e)
	return e.Error.Code
}

// expect is nil when r is an answer with status, else an error that says
// what r is instead.
func (r reply[T]) expect(status int) error {
	if r.err != nil || r.status != status {
		return fmt.Errorf("%v; want %d", r, status)
	}
	return nil
}

// rateLimited reports whether r is a 429 rate_limited with a Retry-After of
// whole seconds, at least one.
func (r reply[T]) rateLimited() bool {
	n, err := strconv.Atoi(r.header.Get("Retry-After"))
	return r.status == http.StatusTooManyRequests && r.code() == "rate_limited" && err == nil && n >= 1
}

// replayed reports whether r answers with an order placed earlier under the
// same Idempotency-Key.
func (r reply[T]) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// summary is r's status and error code ("503 busy", "201"), or "error"
// for a transport error.
func (r reply[T]) summary() string {
	if r.err != nil && r.status == 0 {
		return "error"
	}
	return strings.TrimSpace(fmt.Sprint(r.status, " ", r.code()))
}

// retryAfter is r's Retry-After, 0 when it has none.
func (r reply[T]) retryAfter() time.Duration {
	secs, _ := strconv.Atoi(r.header.Get("Retry-After"))
	return time.Duration(secs) * time.Second
}

// String is r for a failure message: its status and body, or its error.
func (r reply[T]) String() string {
	if r.err != nil {
		return fmt.Sprintf("%d %.300s (%v)", r.status, bytes.TrimSpace(r.raw), r.err)
	}
	return fmt.Sprintf("%d %.300s", r.status, bytes.TrimSpace(r.raw))
}

// option changes a call's request.
type option func(*http.Request) *http.Request

// withKey sends the call under Idempotency-Key key.
func withKey(key string) option { return withHeader("Idempotency-Key", key) }

// withBearer sends token as the call's bearer token.
func withBearer(token string) option { return withHeader("Authorization", "Bearer "+token) }

// withHeader sets the call's header name to value.
func withHeader(name, value string) option {
	return func(req *http.Request) *http.Request {
		req.Header.Set(name, value)
		return req
	}
}

// withContext sends the call on ctx: it ends when ctx does.
func withContext(ctx context.Context) option {
	return func(req *http.Request) *http.Request { return req.WithContext(ctx) }
}

// closing closes the call's connection after the answer: an idle one left
// behind would keep a stopping replica draining.
func closing() option {
	return func(req *http.Request) *http.Request {
		req.Close = true
		return req
	}
}

// call sends method path with body (JSON, unless empty) and opts to c, and
// reads the answer.
func call[T any](c *client, method, path, body string, opts ...option) reply[T] {
	var r reply[T]
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		r.err = err
		return r
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, o := range opts {
		req = o(req)
	}
	res, err := c.http.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	defer res.Body.Close()
	r.status, r.header = res.StatusCode, res.Header
	if r.raw, err = io.ReadAll(res.Body); err != nil {
		r.err = err
		return r
	}
	if _, skip := any(&r.body).(*none); !skip && res.StatusCode/100 == 2 {
		if err := json.Unmarshal(r.raw, &r.body); err != nil {
			r.err = fmt.Errorf("%s %s: body not JSON: %w", method, path, err)
		}
	}
	return r
}

// send is any call, method path with body (JSON, unless empty): one the
// API does not have, or that the tests send as a client would get it
// wrong.
func (c *client) send(method, path, body string, opts ...option) reply[none] {
	return call[none](c, method, path, body, opts...)
}

// order is what the tests read of an order as the API answers it (POST
// /api/v1/orders and the calls on one order).
type order struct {
	ID     int64  `json:"order_id"`
	SKU    int64  `json:"sku_id"`
	User   int64  `json:"user_id"`
	Status string `json:"status"`
	// PayBy is null for an order paid when placed; PaymentID is absent
	// until a payment paid the order.
	PayBy     *string `json:"pay_by"`
	PaymentID *string `json:"payment_id"`
	// Amount and Currency are what it owes.
	Amount   *int64  `json:"amount_cents"`
	Currency *string `json:"currency"`
}

// order places user's order of sku: POST /api/v1/orders. A user of 0 sends
// no user_id, for the buyer its bearer token names.
func (c *client) order(sku, user int, opts ...option) reply[order] {
	body := fmt.Sprintf(`{"sku_id":%d,"user_id":%d}`, sku, user)
	if user == 0 {
		body = fmt.Sprintf(`{"sku_id":%d}`, sku)
	}
	return call[order](c, "POST", "/api/v1/orders", body, opts...)
}

// getOrder reads order id as user sees it: GET /api/v1/orders/{id}.
func (c *client) getOrder(id int64, user int) reply[order] {
	return call[order](c, "GET", fmt.Sprintf("/api/v1/orders/%d?user_id=%d", id, user), "")
}

// testWebhookSecret signs the payment events of the tests' fleets
// (SHOP_PAYMENT_WEBHOOK_SECRET): 32 bytes, base64.
const testWebhookSecret = "whsec_dGVzdHMnIHBheW1lbnQgcHJvdmlkZXIgc2VjcmV0IQ=="

// event is the answer to a payment event.
type event struct {
	Result   string `json:"result"`
	Reason   string `json:"reason"`
	RefundID string `json:"refund_id"`
	Again    bool   `json:"again"`
}

// paid is the payment provider saying that payment, of amount in currency,
// arrived for order id: a signed payment.succeeded event, POST
// /api/v1/payments/events.
func (c *client) paid(id int64, payment string, amount int64, currency string) reply[event] {
	body := fmt.Sprintf(`{"type":"payment.succeeded","data":{"order_id":%d,"payment_id":%q,"amount_cents":%d,"currency":%q}}`,
		id, payment, amount, currency)
	return c.signedEvent("msg_"+payment, body)
}

// pays is paid of what o owes.
func (c *client) pays(o order, payment string) reply[event] {
	return c.paid(o.ID, payment, *o.Amount, *o.Currency)
}

// signedEvent sends body as a Standard Webhooks message id, signed with
// testWebhookSecret now.
func (c *client) signedEvent(id, body string) reply[event] {
	wh, err := standardwebhooks.NewWebhook(testWebhookSecret)
	if err != nil {
		return reply[event]{err: err}
	}
	now := time.Now()
	sig, err := wh.Sign(id, now, []byte(body))
	if err != nil {
		return reply[event]{err: err}
	}
	return call[event](c, "POST", "/api/v1/payments/events", body, withHeader("webhook-id", id),
		withHeader("webhook-timestamp", strconv.FormatInt(now.Unix(), 10)), withHeader("webhook-signature", sig))
}

// product is what the tests read of a product's page as the API answers
// it.
type product struct {
	SKU          int64      `json:"sku_id"`
	Stock        int        `json:"stock"`
	SaleStartsAt *time.Time `json:"sale_starts_at"`
	SaleEndsAt   *time.Time `json:"sale_ends_at"`
}

// product reads sku's page: GET /api/v1/products/{id}.
func (c *client) product(sku int, opts ...option) reply[product] {
	return call[product](c, "GET", fmt.Sprintf("/api/v1/products/%d", sku), "", opts...)
}

// healthz is GET /healthz.
func (c *client) healthz() reply[none] { return call[none](c, "GET", "/healthz", "") }

// readyz is GET /readyz.
func (c *client) readyz(opts ...option) reply[none] {
	return call[none](c, "GET", "/readyz", "", opts...)
}

// operators is the client of the operators' listener at base, with token.
func operators(base, token string) *client {
	c := newClient(base)
	c.token = token
	return c
}

// adminCall is an operators' call: method path with body, under c's token.
func adminCall[T any](c *client, method, path, body string) reply[T] {
	return call[T](c, method, path, body, withBearer(c.token))
}

// seedResult is a seed as the admin API answers it.
type seedResult struct {
	Products int      `json:"products"`
	Stock    int      `json:"stock"`
	Warnings []string `json:"warnings"`
}

// seed resets the catalog to products of units each: POST
// /api/v1/admin/seed.
func (c *client) seed(products, units int) reply[seedResult] {
	return adminCall[seedResult](c, "POST", "/api/v1/admin/seed", fmt.Sprintf(`{"products":%d,"stock":%d}`, products, units))
}

// changed is a product as the admin API answers a change of it.
type changed struct {
	product
	InitialStock int      `json:"initial_stock"`
	Warnings     []string `json:"warnings"`
}

// patchProduct changes sku as change (JSON) says: PATCH
// /api/v1/admin/products/{id}.
func (c *client) patchProduct(sku int, change string) reply[changed] {
	return adminCall[changed](c, "PATCH", fmt.Sprintf("/api/v1/admin/products/%d", sku), change)
}

// refunds lists the refunds owed: GET /api/v1/admin/refunds.
func (c *client) refunds() reply[none] { return adminCall[none](c, "GET", "/api/v1/admin/refunds", "") }

// settle settles refund id by hand with the provider's reference:
// POST /api/v1/admin/refunds/{id}/settle.
func (c *client) settle(id, ref string) reply[none] {
	return adminCall[none](c, "POST", "/api/v1/admin/refunds/"+id+"/settle", fmt.Sprintf(`{"provider_refund_id":%q}`, ref))
}

// metrics is GET /metrics.
func (c *client) metrics() reply[none] { return call[none](c, "GET", "/metrics", "") }

// metric reads the value of the series named exactly series (name and
// labels, as the text format writes them) from /metrics.
func (c *client) metric(series string) (float64, error) {
	r := c.metrics()
	if err := r.expect(http.StatusOK); err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(r.raw))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("/metrics has no %s", series)
}

// waitFor polls cond until it returns nil, and fails the test when it has
// not within: what says what the test waits for, cond's last error what
// stood in the way.
func waitFor(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
