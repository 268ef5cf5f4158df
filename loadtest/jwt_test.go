package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"shop/internal/auth"
)

const testSecret = "0123456789abcdef0123456789abcdef"

// With -jwt-secret every buyer's order carries a token that shop's own
// verifier accepts, whose sub is the body's user_id, the same token for
// each attempt of a buyer.
func TestJWTSecretSignsEachBuyer(t *testing.T) {
	v, err := auth.New(auth.Options{Secret: []byte(testSecret), Issuer: "gw", Audience: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		tokens   = map[int64]map[string]bool{} // user → tokens seen
		attempts = map[int64]int{}
		bad      []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			SKU  int64 `json:"sku_id"`
			User int64 `json:"user_id"`
		}
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &req)
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sub, err := v.Buyer(token)
		mu.Lock()
		defer mu.Unlock()
		if err != nil || sub != req.User {
			bad = append(bad, fmt.Sprintf("user %d: sub %d, %v", req.User, sub, err))
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if tokens[sub] == nil {
			tokens[sub] = map[string]bool{}
		}
		tokens[sub][token] = true
		// The first attempt of each buyer fails, so that it retries.
		if attempts[sub]++; attempts[sub] == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":%d,"sku_id":%d,"user_id":%d,"created_at":"x"}`, sub, req.SKU, sub)
	}))
	defer srv.Close()

	var out bytes.Buffer
	err = run(context.Background(), []string{"-scenario", "hotsku", "-n", "20", "-c", "4", "-url", srv.URL, "-retry",
		"-jwt-secret", testSecret, "-jwt-issuer", "gw", "-jwt-audience", "shop"}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Errorf("%d requests with a bad token, first: %s", len(bad), bad[0])
	}
	for user := int64(1); user <= 20; user++ {
		if n := len(tokens[user]); n != 1 || attempts[user] != 2 {
			t.Errorf("user %d sent %d different tokens in %d attempts, want 1 in 2", user, n, attempts[user])
		}
	}
	if !strings.Contains(out.String(), "acknowledged orders: 20") {
		t.Errorf("want 20 acknowledged orders:\n%s", out.String())
	}
}

func TestJWTFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-jwt-secret", "short"},
		{"-jwt-issuer", "gw"},
		{"-jwt-audience", "shop"},
	} {
		if _, err := parse(args); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
	o, err := parse([]string{"-jwt-secret", testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := o.tokens.of(7), o.tokens.of(7); a != b || a == o.tokens.of(8) {
		t.Errorf("tokens: user 7 twice %t equal, users 7 and 8 %t different; want both", a == b, a != o.tokens.of(8))
	}
}
