package handler_test

// The OpenAPI description is checked with kin-openapi (getkin/kin-openapi),
// a test-only dependency: the binary serves openapi.json as bytes. Its
// v0.153 validates OpenAPI 3.1 documents (3.1-only forms such as type arrays
// and keywords next to a $ref included) and, through openapi3filter,
// validates responses with a JSON Schema 2020-12 validator when the document
// is 3.1, which is what 3.1 schemas are. It depends on little (a JSON
// pointer, a YAML and a JSON Schema package, gorilla/mux for its router),
// where pb33f/libopenapi-validator brings a larger tree for the same checks.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/gin-gonic/gin"

	"shop/internal/handler"
)

// loadOpenAPI parses and validates doc, an OpenAPI 3.1 description.
func loadOpenAPI(doc []byte) (*openapi3.T, error) {
	spec, err := openapi3.NewLoader().LoadFromData(doc)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if !spec.IsOpenAPI31OrLater() || strings.HasPrefix(spec.OpenAPI, "3.2") {
		return nil, fmt.Errorf("openapi is %q, want 3.1.x", spec.OpenAPI)
	}
	if err := spec.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validate: %w", err)
	}
	return spec, nil
}

// The description the service serves is a valid OpenAPI 3.1 document.
func TestOpenAPIIsValid(t *testing.T) {
	if _, err := loadOpenAPI(handler.OpenAPI); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
}

// The validation TestOpenAPIIsValid relies on refuses broken documents.
func TestOpenAPIValidationRefuses(t *testing.T) {
	tests := []struct {
		name   string
		change func(doc map[string]any)
	}{
		{"an unknown schema type", func(doc map[string]any) {
			schema(doc, "Order")["properties"].(map[string]any)["created_at"] = map[string]any{"type": "strnig"}
		}},
		{"a reference to nothing", func(doc map[string]any) {
			schema(doc, "Order")["properties"].(map[string]any)["sku_id"] = map[string]any{"$ref": "#/components/schemas/Nothing"}
		}},
		{"a response without its description", func(doc map[string]any) {
			delete(doc["components"].(map[string]any)["responses"].(map[string]any)["StatusOK"].(map[string]any), "description")
		}},
		{"a parameter in no place", func(doc map[string]any) {
			doc["components"].(map[string]any)["parameters"].(map[string]any)["IdempotencyKey"].(map[string]any)["in"] = "body"
		}},
		{"a path parameter not declared", func(doc map[string]any) {
			delete(doc["paths"].(map[string]any)["/api/v1/products/{id}"].(map[string]any)["get"].(map[string]any), "parameters")
		}},
		{"OpenAPI 3.0", func(doc map[string]any) { doc["openapi"] = "3.0.3" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var doc map[string]any
			if err := json.Unmarshal(handler.OpenAPI, &doc); err != nil {
				t.Fatal(err)
			}
			tt.change(doc)
			changed, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := loadOpenAPI(changed); err == nil {
				t.Error("the changed document passed")
			}
		})
	}
}

func schema(doc map[string]any, name string) map[string]any {
	return doc["components"].(map[string]any)["schemas"].(map[string]any)[name].(map[string]any)
}

// operation names a route as "listener METHOD /path/{param}", listener
// public or admin.
func operation(listener, method, path string) string { return listener + " " + method + " " + path }

// documented returns the operations of the description, each on the
// listener its x-listener names.
func documented(t *testing.T) map[string]bool {
	t.Helper()
	spec, err := loadOpenAPI(handler.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]bool{}
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			listener, _ := op.Extensions["x-listener"].(string)
			ops[operation(listener, method, path)] = true
		}
	}
	return ops
}

// registered returns the routes gin serves on each listener, their :name
// and *name segments written as OpenAPI's {name}.
func registered() map[string]bool {
	ops := map[string]bool{}
	public, admin := handler.Routes()
	for listener, routes := range map[string]gin.RoutesInfo{"public": public, "admin": admin} {
		for _, r := range routes {
			segments := strings.Split(r.Path, "/")
			for i, s := range segments {
				if strings.HasPrefix(s, ":") || strings.HasPrefix(s, "*") {
					segments[i] = "{" + s[1:] + "}"
				}
			}
			ops[operation(listener, r.Method, strings.Join(segments, "/"))] = true
		}
	}
	return ops
}

// missing returns the keys of have that want lacks, sorted.
func missing(have, want map[string]bool) []string {
	var out []string
	for k := range have {
		if !want[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Every route the service registers is described.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	if m := missing(registered(), documented(t)); len(m) > 0 {
		t.Errorf("routes the service serves that openapi.json does not describe:\n\t%s", strings.Join(m, "\n\t"))
	}
}

// Every operation described is a route the service registers.
func TestOpenAPIOperationsAreServed(t *testing.T) {
	if m := missing(documented(t), registered()); len(m) > 0 {
		t.Errorf("operations openapi.json describes that the service does not register:\n\t%s", strings.Join(m, "\n\t"))
	}
}

// GET /openapi.json serves the embedded description as JSON.
func TestOpenAPIServed(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	srv := serve(t, both(handler.New(handler.Deps{}, handler.Settings{})))
	res, err := http.Get(srv.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(res.Body); err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" || !bytes.Equal(body.Bytes(), handler.OpenAPI) {
		t.Errorf("GET /openapi.json: %d, Content-Type %q, %d bytes; want 200, application/json and the %d bytes of openapi.json",
			res.StatusCode, res.Header.Get("Content-Type"), body.Len(), len(handler.OpenAPI))
	}
}

// reporter receives what a conformance check finds; a testing.TB is one.
type reporter interface {
	Errorf(format string, args ...any)
}

// conformance checks responses against the description.
type conformance struct {
	router routers.Router
	// unmatched answers the requests no operation matches: any other path
	// answers 404 not_found, a described path with another method 405
	// method_not_allowed, as the description says.
	unmatched map[error]*routers.Route
}

// loadConformance builds the check from the embedded description.
func loadConformance(tb testing.TB) *conformance {
	tb.Helper()
	spec, err := loadOpenAPI(handler.OpenAPI)
	if err != nil {
		tb.Fatalf("openapi.json: %v", err)
	}
	router, err := gorillamux.NewRouter(spec)
	if err != nil {
		tb.Fatalf("openapi.json: %v", err)
	}
	only := func(status int, name string) *routers.Route {
		return &routers.Route{Spec: spec, Operation: &openapi3.Operation{
			Responses: openapi3.NewResponses(openapi3.WithStatus(status, spec.Components.Responses[name])),
		}}
	}
	return &conformance{router: router, unmatched: map[error]*routers.Route{
		routers.ErrPathNotFound:     only(http.StatusNotFound, "NotFound"),
		routers.ErrMethodNotAllowed: only(http.StatusMethodNotAllowed, "MethodNotAllowed"),
	}}
}

// check reports to rep whether the response rec holds, to r, is one the
// description allows: a status its operation lists, with that status's
// headers and body.
func (c *conformance) check(rep reporter, r *http.Request, rec *httptest.ResponseRecorder) {
	input := &openapi3filter.RequestValidationInput{Request: r}
	route, params, err := c.router.FindRoute(r)
	switch {
	case err == nil:
		input.Route, input.PathParams = route, params
	case c.unmatched[err] != nil: // the router returns these two as they are
		input.Route = c.unmatched[err]
	default:
		rep.Errorf("openapi: %s %s: no operation: %v", r.Method, r.URL.Path, err)
		return
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: input,
		Status:                 rec.Code,
		Header:                 rec.Header(),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	out.SetBodyBytes(rec.Body.Bytes())
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		rep.Errorf("openapi: %s %s answered %d %s %s, which openapi.json does not allow: %v",
			r.Method, r.URL.Path, rec.Code, headerList(rec.Header()), excerpt(rec.Body.Bytes()), err)
	}
}

// excerpt is the start of a body, enough to see which answer it is.
func excerpt(body []byte) string {
	const most = 300
	if len(body) > most {
		return fmt.Sprintf("%s… (%d bytes)", body[:most], len(body))
	}
	return string(body)
}

func headerList(h http.Header) string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(h)) {
		kv = append(kv, k+": "+strings.Join(h[k], ", "))
	}
	return "[" + strings.Join(kv, "; ") + "]"
}

// checked serves h, checking each response against the description before
// the client gets it, so that a response the description does not allow
// fails the test that asked for it, by rep. A response to a client that has
// gone is not checked: nobody receives it (the 499 that the log and the
// metrics count).
func checked(rep reporter, c *conformance, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if r.Context().Err() == nil {
			c.check(rep, r, rec)
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// serve serves h to the test, checked against the description, until the
// test ends.
func serve(tb testing.TB, h http.Handler) *httptest.Server {
	tb.Helper()
	rep := &firstFindings{tb: tb}
	srv := httptest.NewServer(checked(rep, loadConformance(tb), h))
	tb.Cleanup(func() {
		srv.Close()
		if n := rep.more.Load(); n > 0 {
			tb.Errorf("openapi: and %d more responses openapi.json does not allow", n)
		}
	})
	return srv
}

// firstFindings reports the first few findings to a test and counts the
// rest: a test of a thousand requests need not print a thousand times the
// same drift.
type firstFindings struct {
	tb   testing.TB
	told atomic.Int64
	more atomic.Int64
}

func (f *firstFindings) Errorf(format string, args ...any) {
	const most = 5
	if f.told.Add(1) > most {
		f.more.Add(1)
		return
	}
	f.tb.Errorf(format, args...)
}

// findings is a reporter that keeps what it is told.
type findings struct {
	mu  sync.Mutex
	got []string
}

func (f *findings) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, fmt.Sprintf(format, args...))
}

// The check that serve puts on every handler test refuses what the
// description does not allow, and lets through what it does.
func TestConformanceCheck(t *testing.T) {
	c := loadConformance(t)
	const id = "0123456789abcdef0123456789abcdef"
	tests := []struct {
		name   string
		method string
		path   string
		status int
		header map[string]string
		body   string
		ok     bool
	}{
		{"a described answer", "GET", "/api/v1/products/1/stock", 200, map[string]string{"X-Request-ID": id}, `{"sku_id":1,"stock":3}`, true},
		{"a described error", "POST", "/api/v1/orders", 409, map[string]string{"X-Request-ID": id}, `{"error":{"code":"sold_out","message":"m"}}`, true},
		{"a described 5xx", "POST", "/api/v1/orders", 503, map[string]string{"X-Request-ID": id, "Retry-After": "1"}, `{"error":{"code":"busy","message":"m","request_id":"` + id + `"}}`, true},
		{"the metrics", "GET", "/metrics", 200, map[string]string{"X-Request-ID": id, "Content-Type": "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"}, "# HELP x y\n", true},
		{"no such route", "GET", "/nothing", 404, map[string]string{"X-Request-ID": id}, `{"error":{"code":"not_found","message":"m"}}`, true},
		{"another method", "DELETE", "/api/v1/orders", 405, map[string]string{"X-Request-ID": id}, `{"error":{"code":"method_not_allowed","message":"m"}}`, true},
		{"a made-up method", "M001", "/api/v1/orders", 405, map[string]string{"X-Request-ID": id}, `{"error":{"code":"method_not_allowed","message":"m"}}`, true},

		{"a status not described", "GET", "/api/v1/products/1/stock", 409, map[string]string{"X-Request-ID": id}, `{"error":{"code":"sold_out","message":"m"}}`, false},
		{"an unknown error code", "POST", "/api/v1/orders", 409, map[string]string{"X-Request-ID": id}, `{"error":{"code":"gone","message":"m"}}`, false},
		{"a code of another status", "POST", "/api/v1/orders", 409, map[string]string{"X-Request-ID": id}, `{"error":{"code":"not_found","message":"m"}}`, false},
		{"an error without its message", "POST", "/api/v1/orders", 409, map[string]string{"X-Request-ID": id}, `{"error":{"code":"sold_out"}}`, false},
		{"a member not described", "GET", "/api/v1/products/1/stock", 200, map[string]string{"X-Request-ID": id}, `{"sku_id":1,"stock":3,"extra":1}`, false},
		{"a member missing", "GET", "/api/v1/products/1/stock", 200, map[string]string{"X-Request-ID": id}, `{"sku_id":1}`, false},
		{"a member of the wrong type", "GET", "/api/v1/products/1/stock", 200, map[string]string{"X-Request-ID": id}, `{"sku_id":1,"stock":"3"}`, false},
		{"a window bound that is no time", "GET", "/api/v1/products/1", 200, map[string]string{"X-Request-ID": id}, `{"sku_id":1,"name":"n","price_cents":1,"stock":1,"sale_starts_at":"soon","sale_ends_at":null}`, false},
		{"no X-Request-ID", "GET", "/api/v1/products/1/stock", 200, nil, `{"sku_id":1,"stock":3}`, false},
		{"a 503 without Retry-After", "POST", "/api/v1/orders", 503, map[string]string{"X-Request-ID": id}, `{"error":{"code":"busy","message":"m","request_id":"` + id + `"}}`, false},
		{"a 5xx without request_id", "POST", "/api/v1/orders", 503, map[string]string{"X-Request-ID": id, "Retry-After": "1"}, `{"error":{"code":"busy","message":"m"}}`, false},
		{"a 4xx with request_id", "POST", "/api/v1/orders", 409, map[string]string{"X-Request-ID": id}, `{"error":{"code":"sold_out","message":"m","request_id":"` + id + `"}}`, false},
		{"another content type", "GET", "/api/v1/products/1/stock", 200, map[string]string{"X-Request-ID": id, "Content-Type": "text/plain"}, `{"sku_id":1,"stock":3}`, false},
		{"no such route answering 200", "GET", "/nothing", 200, map[string]string{"X-Request-ID": id}, `{"status":"ok"}`, false},
		{"another method answering 404", "DELETE", "/api/v1/orders", 404, map[string]string{"X-Request-ID": id}, `{"error":{"code":"not_found","message":"m"}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			})
			var f findings
			r := httptest.NewRequest(tt.method, tt.path, nil)
			checked(&f, c, h).ServeHTTP(httptest.NewRecorder(), r)
			if tt.ok && len(f.got) > 0 {
				t.Errorf("refused: %s", f.got)
			}
			if !tt.ok && len(f.got) == 0 {
				t.Error("let through")
			}
		})
	}
}

// both serves hs as one handler, the operators' routes (/api/v1/admin/
// and /metrics) by hs.Admin and the rest by hs.Public: one server for the
// tests of routes, which are not about which listener serves them
// (TestOperatorsHaveTheirOwnDoor is).
func both(hs handler.Handlers) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/v1/admin/") || r.URL.Path == "/metrics" {
			hs.Admin.ServeHTTP(w, r)
			return
		}
		hs.Public.ServeHTTP(w, r)
	})
}
