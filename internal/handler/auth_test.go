package handler_test

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/auth"
	"shop/internal/handler"
	"shop/internal/stock"
)

// jwtSecret is the HS256 secret of the tests' verifier.
var jwtSecret = []byte("the tests' secret, 32 bytes long")

// mint returns a token for sub signed with key by m, expiring at exp.
func mint(t testing.TB, m jwt.SigningMethod, key any, sub string, exp time.Time) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, jwt.MapClaims{"sub": sub, "exp": exp.Unix()}).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func bearer(token string) map[string][]string {
	return map[string][]string{"Authorization": {"Bearer " + token}}
}

// placed records the orders a fake Orders was asked to place.
type placed struct {
	noSoldOut
	mu     sync.Mutex
	orders []stock.Order
}

func (p *placed) PlaceOrder(_ context.Context, sku, user int64, key string) (stock.Order, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := stock.Order{ID: int64(len(p.orders) + 1), SKUID: sku, UserID: user, CreatedAt: time.Now(), Status: "paid"}
	p.orders = append(p.orders, o)
	return o, nil
}

// Order, BuyerOrder and Cancel make p a Lifecycle, whose every order the
// buyer asking for it holds: what it records is who asked.
func (p *placed) Order(_ context.Context, user, id int64) (stock.Order, error) {
	return p.PlaceOrder(context.Background(), id, user, "")
}

func (p *placed) BuyerOrder(_ context.Context, user, id int64) (stock.Order, error) {
	return p.PlaceOrder(context.Background(), id, user, "")
}

func (p *placed) Cancel(_ context.Context, user, id int64) (stock.Order, error) {
	return p.PlaceOrder(context.Background(), id, user, "")
}

func (p *placed) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.orders)
}

// productFunc is a Products and a Stock that know every product.
type productFunc struct{}

func (productFunc) Product(_ context.Context, id int64) (stock.Product, error) {
	return stock.Product{ID: id, Name: "Product", PriceCents: 100, Currency: "USD", Stock: 1}, nil
}

func (productFunc) Stock(context.Context, int64) (int, error) { return 1, nil }

// authAPI serves the API with v authenticating buyers (nil: SHOP_AUTH=none)
// and orders recorded instead of placed; every answer is checked against
// openapi.json.
func authAPI(t *testing.T, v handler.Authenticator) (*api, *placed) {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	p := &placed{}
	d := handler.Deps{Orders: p, Lifecycle: p, Products: productFunc{}, Stock: productFunc{}, Registry: prometheus.NewRegistry()}
	if v != nil {
		d.Auth = v
	}
	return &api{url: serve(t, both(handler.New(d, handler.Settings{}))).URL}, p
}

func hsVerifier(t *testing.T) *auth.Verifier {
	t.Helper()
	v, err := auth.New(auth.Options{Secret: jwtSecret})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// With SHOP_AUTH=jwt an order without a good token is 401 with a bearer
// challenge, before its body is read; nothing is placed.
func TestAuthRefusesBadTokens(t *testing.T) {
	a, p := authAPI(t, hsVerifier(t))
	hour := time.Now().Add(time.Hour)
	good := mint(t, jwt.SigningMethodHS256, jwtSecret, "7", hour)
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "7", "exp": hour.Unix()}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	noExp, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "7"}).SignedString(jwtSecret)
	const (
		noToken = `Bearer realm="shop"`
		refused = `Bearer realm="shop", error="invalid_token", error_description="`
	)
	body := `{"sku_id":1,"user_id":7}`
	tests := []struct {
		name        string
		header      map[string][]string
		contentType string
		body        string
		challenge   string // the WWW-Authenticate header starts with it
		message     string // in the error's message
	}{
		{"no Authorization", nil, "application/json", body, noToken, "Authorization: Bearer"},
		{"another scheme", map[string][]string{"Authorization": {"Basic dXNlcjpwdw=="}}, "application/json", body, noToken, "Authorization: Bearer"},
		{"scheme alone", map[string][]string{"Authorization": {"Bearer"}}, "application/json", body, noToken, "Authorization: Bearer"},
		{"empty token", map[string][]string{"Authorization": {"Bearer  "}}, "application/json", body, noToken, "Authorization: Bearer"},
		{"garbage", bearer("garbage"), "application/json", body, refused, "not valid"},
		{"two headers", map[string][]string{"Authorization": {"Bearer " + good, "Bearer " + good}}, "application/json", body, refused, "not valid"},
		{"wrong secret", bearer(mint(t, jwt.SigningMethodHS256, []byte("not the secret, but as long as it"), "7", hour)), "application/json", body, refused, "not valid"},
		{"expired", bearer(mint(t, jwt.SigningMethodHS256, jwtSecret, "7", time.Now().Add(-time.Minute))), "application/json", body, refused, "expired"},
		{"no exp", bearer(noExp), "application/json", body, refused, "not valid"},
		{"alg none", bearer(none), "application/json", body, refused, "not valid"},
		{"HS512", bearer(mint(t, jwt.SigningMethodHS512, jwtSecret, "7", hour)), "application/json", body, refused, "not valid"},
		{"sub 0", bearer(mint(t, jwt.SigningMethodHS256, jwtSecret, "0", hour)), "application/json", body, refused, "not valid"},
		{"sub not decimal", bearer(mint(t, jwt.SigningMethodHS256, jwtSecret, "alice", hour)), "application/json", body, refused, "not valid"},
		// Before the body's own refusals: 415, 400.
		{"no token, not JSON", nil, "text/plain", body, noToken, "Authorization: Bearer"},
		{"no token, malformed body", nil, "application/json", `{"sku_id":`, noToken, "Authorization: Bearer"},
		{"expired, malformed body", bearer(mint(t, jwt.SigningMethodHS256, jwtSecret, "7", time.Now().Add(-time.Minute))), "application/json", `{`, refused, "expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := a.do(t, "POST", "/api/v1/orders", tt.contentType, strings.NewReader(tt.body), tt.header)
			if r.status != 401 || errorCode(t, r) != "unauthorized" {
				t.Fatalf("%d %s, want 401 unauthorized", r.status, r.raw)
			}
			if got := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, tt.challenge) ||
				(tt.challenge == noToken && got != noToken) {
				t.Errorf("WWW-Authenticate %q, want %q…", got, tt.challenge)
			}
			if msg := r.body["error"].(map[string]any)["message"].(string); !strings.Contains(msg, tt.message) {
				t.Errorf("message %q does not say %q", msg, tt.message)
			}
		})
	}
	if n := p.count(); n != 0 {
		t.Errorf("%d orders placed by refused requests", n)
	}
	// Product and stock reads stay public.
	for _, path := range []string{"/api/v1/products/1", "/api/v1/products/1/stock"} {
		if r := a.do(t, "GET", path, "", nil, nil); r.status != 200 {
			t.Errorf("GET %s without a token: %d %s", path, r.status, r.raw)
		}
	}
}

// A gateway's public keys: a token it signed passes; one signed with HS256
// using the public key's PEM as the secret (algorithm confusion) is 401.
func TestAuthRefusesAlgorithmConfusion(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	keys, err := auth.ParsePublicKeys(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.New(auth.Options{PublicKeys: []crypto.PublicKey(keys)})
	if err != nil {
		t.Fatal(err)
	}
	a, p := authAPI(t, v)
	hour := time.Now().Add(time.Hour)
	for name, token := range map[string]string{
		"HS256 with the PEM as secret":       mint(t, jwt.SigningMethodHS256, pemBytes, "7", hour),
		"HS256 with the raw key as secret":   mint(t, jwt.SigningMethodHS256, []byte(pub), "7", hour),
		"HS256 with the shared test secret":  mint(t, jwt.SigningMethodHS256, jwtSecret, "7", hour),
		"EdDSA by another key":               mint(t, jwt.SigningMethodEdDSA, ed25519.NewKeyFromSeed(make([]byte, 32)), "7", hour),
		"EdDSA by the gateway, expired long": mint(t, jwt.SigningMethodEdDSA, priv, "7", time.Now().Add(-time.Hour)),
	} {
		if r := a.order(t, `{"sku_id":1}`, bearer(token)); r.status != 401 || errorCode(t, r) != "unauthorized" ||
			!strings.Contains(r.header.Get("WWW-Authenticate"), `error="invalid_token"`) {
			t.Errorf("%s: %d %s, WWW-Authenticate %q; want 401 with invalid_token", name, r.status, r.raw, r.header.Get("WWW-Authenticate"))
		}
	}
	if r := a.order(t, `{"sku_id":1}`, bearer(mint(t, jwt.SigningMethodEdDSA, priv, "7", hour))); r.status != 201 || r.body["user_id"] != 7.0 {
		t.Errorf("the gateway's token: %d %s, want 201 for user 7", r.status, r.raw)
	}
	if n := p.count(); n != 1 {
		t.Errorf("%d orders placed, want the gateway's one", n)
	}
}

// The token names the buyer: user_id may be left out, may repeat the sub,
// and may not name anyone else (403, before the body's other fields and
// any rule of the sale).
func TestAuthBuyerIsTheSubject(t *testing.T) {
	a, p := authAPI(t, hsVerifier(t))
	token := mint(t, jwt.SigningMethodHS256, jwtSecret, "7", time.Now().Add(time.Hour))
	key := map[string][]string{"Authorization": {"bearer " + token}, "Idempotency-Key": {"k-1"}}
	for _, body := range []string{`{"sku_id":3}`, `{"sku_id":3,"user_id":7}`} {
		r := a.order(t, body, key)
		if r.status != 201 || r.body["user_id"] != 7.0 || r.body["sku_id"] != 3.0 {
			t.Errorf("%s with sub 7: %d %s, want 201 for user 7", body, r.status, r.raw)
		}
	}
	for _, body := range []string{`{"sku_id":3,"user_id":8}`, `{"user_id":8}`, `{"sku_id":0,"user_id":8}`} {
		r := a.order(t, body, bearer(token))
		if r.status != 403 || errorCode(t, r) != "forbidden" {
			t.Errorf("%s with sub 7: %d %s, want 403 forbidden", body, r.status, r.raw)
		}
		if h := r.header.Get("WWW-Authenticate"); h != "" {
			t.Errorf("403 with WWW-Authenticate %q", h)
		}
	}
	if r := a.order(t, `{"user_id":7}`, bearer(token)); r.status != 400 || errorCode(t, r) != "invalid_argument" {
		t.Errorf("no sku_id: %d %s, want 400", r.status, r.raw)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.orders) != 2 || p.orders[0].UserID != 7 || p.orders[1].UserID != 7 {
		t.Errorf("orders placed: %+v, want two for user 7", p.orders)
	}
}

// SHOP_AUTH=none: the body names the buyer and must; a token, good or
// not, is not looked at.
func TestAuthOffNeedsUserID(t *testing.T) {
	a, p := authAPI(t, nil)
	r := a.order(t, `{"sku_id":1}`, nil)
	if r.status != 400 || errorCode(t, r) != "invalid_argument" ||
		!strings.Contains(r.body["error"].(map[string]any)["message"].(string), "user_id is required") {
		t.Errorf("no user_id: %d %s, want 400 user_id is required", r.status, r.raw)
	}
	if r := a.order(t, `{"sku_id":1,"user_id":9}`, bearer("garbage")); r.status != 201 || r.body["user_id"] != 9.0 {
		t.Errorf("user_id 9 and a garbage token: %d %s, want 201 for user 9", r.status, r.raw)
	}
	if n := p.count(); n != 1 {
		t.Errorf("%d orders placed, want 1", n)
	}
}

// Cancelling and reading an order are buyer routes too: 401
// without a token, 403 for another user_id (in the body, or the query of
// GET), and otherwise the token's sub is the buyer, user_id or not.
func TestAuthLifecycleRoutes(t *testing.T) {
	a, p := authAPI(t, hsVerifier(t))
	token := mint(t, jwt.SigningMethodHS256, jwtSecret, "7", time.Now().Add(time.Hour))
	routes := []struct {
		method, path, body, mismatch string
	}{
		{"GET", "/api/v1/orders/5", "", "/api/v1/orders/5?user_id=8"},
		{"POST", "/api/v1/orders/5/cancel", `{}`, `{"user_id":8}`},
	}
	send := func(method, path, body string, header map[string][]string) response {
		if method == "GET" {
			return a.do(t, method, path, "", nil, header)
		}
		return a.do(t, method, path, "application/json", strings.NewReader(body), header)
	}
	for _, rt := range routes {
		if r := send(rt.method, rt.path, rt.body, nil); r.status != 401 || r.header.Get("WWW-Authenticate") != `Bearer realm="shop"` {
			t.Errorf("%s %s without a token: %d %s, WWW-Authenticate %q", rt.method, rt.path, r.status, r.raw, r.header.Get("WWW-Authenticate"))
		}
		mismatchPath, mismatchBody := rt.path, rt.mismatch
		if rt.method == "GET" {
			mismatchPath, mismatchBody = rt.mismatch, ""
		}
		if r := send(rt.method, mismatchPath, mismatchBody, bearer(token)); r.status != 403 || errorCode(t, r) != "forbidden" {
			t.Errorf("%s %s naming user 8 with sub 7: %d %s, want 403 forbidden", rt.method, mismatchPath, r.status, r.raw)
		}
		if r := send(rt.method, rt.path, rt.body, bearer(token)); r.status != 200 || r.body["user_id"] != 7.0 {
			t.Errorf("%s %s with sub 7: %d %s, want 200 for user 7", rt.method, rt.path, r.status, r.raw)
		}
	}
	if n := p.count(); n != len(routes) {
		t.Errorf("%d calls reached the lifecycle, want %d", n, len(routes))
	}

	off, _ := authAPI(t, nil)
	if r := off.do(t, "POST", "/api/v1/orders/5/cancel", "application/json", strings.NewReader(`{}`), nil); r.status != 400 {
		t.Errorf("cancel without user_id, auth off: %d %s, want 400", r.status, r.raw)
	}
	if r := off.do(t, "GET", "/api/v1/orders/5?user_id=9", "", nil, nil); r.status != 200 || r.body["user_id"] != 9.0 {
		t.Errorf("GET with user_id 9, auth off: %d %s, want 200 for user 9", r.status, r.raw)
	}
}

// fixedOrder is an Orders that places every order at once, the same one:
// what is left of POST /api/v1/orders is the HTTP layer.
type fixedOrder struct{ noSoldOut }

func (fixedOrder) PlaceOrder(_ context.Context, sku, user int64, _ string) (stock.Order, error) {
	return stock.Order{ID: 1, SKUID: sku, UserID: user, CreatedAt: time.Unix(0, 0), Status: "reserved"}, nil
}

// BenchmarkAuth is POST /api/v1/orders through the whole gin engine, in
// process, against an Orders that places nothing, with SHOP_AUTH=none and
// with jwt (an HS256 secret, and a gateway's Ed25519 key): what verifying
// adds to an order in time and allocations. internal/auth's BenchmarkBuyer
// is the verify alone.
//
//	go test -run '^$' -bench Auth -benchmem ./internal/handler
func BenchmarkAuth(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	hs, err := auth.New(auth.Options{Secret: jwtSecret})
	if err != nil {
		b.Fatal(err)
	}
	ed, err := auth.New(auth.Options{PublicKeys: []crypto.PublicKey{pub}})
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range []struct {
		name  string
		auth  handler.Authenticator
		token string
		body  string
	}{
		{"off", nil, "", `{"sku_id":1,"user_id":7}`},
		{"jwt-HS256", hs, mint(b, jwt.SigningMethodHS256, jwtSecret, "7", exp), `{"sku_id":1}`},
		{"jwt-EdDSA", ed, mint(b, jwt.SigningMethodEdDSA, priv, "7", exp), `{"sku_id":1}`},
	} {
		b.Run(bb.name, func(b *testing.B) {
			d := handler.Deps{Orders: fixedOrder{}, Registry: prometheus.NewRegistry()}
			if bb.auth != nil {
				d.Auth = bb.auth
			}
			h := both(handler.New(d, handler.Settings{}))
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest("POST", "/api/v1/orders", strings.NewReader(bb.body))
				req.Header.Set("Content-Type", "application/json")
				if bb.token != "" {
					req.Header.Set("Authorization", "Bearer "+bb.token)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 201 {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
