package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"shop/internal/testenv"
)

// authSecret is an HS256 secret of the 32 bytes SHOP_JWT_SECRET needs.
const authSecret = "0123456789abcdef0123456789abcdef"

// writeFile writes data to a file of its own in the test's directory and
// returns its path.
func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// publicKeysPEM returns a PEM file of an Ed25519 and an RSA public key, as a
// gateway that signs buyers' tokens would hand out, and the Ed25519 private
// key.
func publicKeysPEM(t *testing.T) ([]byte, ed25519.PrivateKey) {
	t.Helper()
	edPub, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, pub := range []any{edPub, &rsaKey.PublicKey} {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	return out, edPriv
}

// rsaPEM is k as a PUBLIC KEY PEM block.
func rsaPEM(t *testing.T, k *rsa.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// SHOP_AUTH and the SHOP_JWT_* settings: each bad combination stops `shop
// serve` with exit 2 and a message naming the variables; the secret never
// shows.
func TestConfigAuth(t *testing.T) {
	t.Parallel()
	base := serveBase(t)
	keys, edPriv := publicKeysPEM(t)
	keysFile := writeFile(t, "keys.pem", keys)
	privDER, err := x509.MarshalPKCS8PrivateKey(edPriv)
	if err != nil {
		t.Fatal(err)
	}
	privFile := writeFile(t, "private.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}))
	garbageFile := writeFile(t, "garbage.pem", []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA gateway\n"))
	unreadable := writeFile(t, "unreadable.pem", keys)
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	missingFile := filepath.Join(t.TempDir(), "missing.pem")
	smallKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	smallRSA := writeFile(t, "small.pem", rsaPEM(t, &smallKey.PublicKey))
	// An odd number of 8200 bits stands for a key that size, which would
	// take too long to generate: only its size is looked at.
	huge := new(big.Int).Lsh(big.NewInt(1), 8199)
	hugeRSA := writeFile(t, "huge.pem", rsaPEM(t, &rsa.PublicKey{N: huge.SetBit(huge, 0, 1), E: 65537}))
	short := authSecret[:31]

	bad := []struct {
		name string
		vars map[string]string
		// want are in the message.
		want []string
	}{
		{"SHOP_AUTH unknown", map[string]string{"SHOP_AUTH": "oauth"}, []string{"SHOP_AUTH", "none, jwt"}},
		{"jwt, neither", map[string]string{"SHOP_AUTH": "jwt"}, []string{"SHOP_JWT_SECRET or SHOP_JWT_PUBLIC_KEYS", "needs one"}},
		{"jwt, both", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_PUBLIC_KEYS": keysFile},
			[]string{"SHOP_JWT_SECRET and SHOP_JWT_PUBLIC_KEYS", "both set"}},
		{"jwt, short secret", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": short}, []string{"SHOP_JWT_SECRET", "31 bytes, must be at least 32"}},
		{"jwt, secret with a newline", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret + "\n"}, []string{"SHOP_JWT_SECRET", "white space"}},
		{"jwt, no such PEM file", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_PUBLIC_KEYS": missingFile}, []string{"SHOP_JWT_PUBLIC_KEYS", "no such file"}},
		{"jwt, PEM file not PEM", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_PUBLIC_KEYS": garbageFile}, []string{"SHOP_JWT_PUBLIC_KEYS", "no PEM block"}},
		{"jwt, a private key", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_PUBLIC_KEYS": privFile}, []string{"SHOP_JWT_PUBLIC_KEYS", `"PRIVATE KEY"`}},
		{"jwt, issuer with a space", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_ISSUER": "gw "}, []string{"SHOP_JWT_ISSUER", "white space"}},
		{"jwt, RSA key of 1024 bits", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_PUBLIC_KEYS": smallRSA}, []string{"SHOP_JWT_PUBLIC_KEYS", "1024 bits, want 2048 to 8192"}},
		{"jwt, RSA key of 8200 bits", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_PUBLIC_KEYS": hugeRSA}, []string{"SHOP_JWT_PUBLIC_KEYS", "8200 bits, want 2048 to 8192"}},
		{"jwt, max TTL negative", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_MAX_TTL": "-1h"}, []string{"SHOP_JWT_MAX_TTL"}},
		{"jwt, max TTL not a duration", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_MAX_TTL": "1d"}, []string{"SHOP_JWT_MAX_TTL"}},
		{"jwt, max TTL above a year", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_MAX_TTL": "8761h"}, []string{"SHOP_JWT_MAX_TTL"}},
		{"none, a max TTL", map[string]string{"SHOP_JWT_MAX_TTL": "1h"}, []string{"SHOP_JWT_MAX_TTL", "SHOP_AUTH is none"}},
		{"none, a secret", map[string]string{"SHOP_JWT_SECRET": authSecret}, []string{"SHOP_JWT_SECRET", "SHOP_AUTH is none"}},
		{"none said, keys and audience", map[string]string{"SHOP_AUTH": "none", "SHOP_JWT_PUBLIC_KEYS": keysFile, "SHOP_JWT_AUDIENCE": "shop"},
			[]string{"SHOP_JWT_PUBLIC_KEYS, SHOP_JWT_AUDIENCE", "SHOP_AUTH is none"}},
	}
	// root reads a file whatever its mode.
	if os.Geteuid() != 0 {
		bad = append(bad, struct {
			name string
			vars map[string]string
			want []string
		}{"jwt, unreadable PEM file", map[string]string{"SHOP_AUTH": "jwt", "SHOP_JWT_PUBLIC_KEYS": unreadable}, []string{"SHOP_JWT_PUBLIC_KEYS", "permission denied"}})
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			code, out := serveWith(base, tt.vars)
			if code != 2 {
				t.Errorf("exit code %d, want 2:\n%s", code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("message does not say %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, authSecret[:16]) {
				t.Errorf("message shows the secret:\n%s", out)
			}
		})
	}

	good := []map[string]string{
		{"SHOP_AUTH": "none"},
		{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret},
		{"SHOP_AUTH": "jwt", "SHOP_JWT_PUBLIC_KEYS": keysFile},
		{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_ISSUER": "https://gw.example", "SHOP_JWT_AUDIENCE": "shop"},
		{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_MAX_TTL": "1h"},
		{"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_MAX_TTL": "0"},
	}
	for _, g := range good {
		if code, out := serveWith(base, g); code != 0 || !listenRE.MatchString(out) {
			t.Errorf("%q: exit code %d, want 0 after listening:\n%s", g, code, out)
		} else if want := fmt.Sprintf(`"auth":%q`, g["SHOP_AUTH"]); !strings.Contains(out, want) {
			t.Errorf("%q: the start-up log does not say %s:\n%s", g, want, out)
		}
	}
}

// A replica with SHOP_AUTH=jwt, through HTTP: an order without a token is
// 401 and one naming another user 403, both before MySQL is asked
// anything; with the token alone the order is the token's user's.
func TestAuthEndToEnd(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{
		"SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_JWT_ISSUER": "gw", "SHOP_JWT_AUDIENCE": "shop",
	})
	if code, out := shopWith(vars(), "seed", "--products", "2", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	r := startReplica(t, vars())
	token := func(sub, iss string) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"sub": sub, "iss": iss, "aud": "shop", "exp": time.Now().Add(time.Hour).Unix(),
		}).SignedString([]byte(authSecret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// who is what the answer says: the order's user, or the error's code.
	who := func(o reply[order]) string {
		if o.code() != "" {
			return o.code()
		}
		return fmt.Sprint(o.body.User)
	}
	if o := r.public.order(1, 5); o.status != 401 || who(o) != "unauthorized" || o.header.Get("WWW-Authenticate") == "" {
		t.Errorf("no token: %v, WWW-Authenticate %q; want 401 unauthorized with a challenge", o, o.header.Get("WWW-Authenticate"))
	}
	if o := r.public.order(1, 0, withBearer(token("5", "another issuer"))); o.status != 401 || !strings.Contains(o.header.Get("WWW-Authenticate"), "invalid_token") {
		t.Errorf("token of another issuer: %v, WWW-Authenticate %q; want 401 invalid_token", o, o.header.Get("WWW-Authenticate"))
	}
	if o := r.public.order(1, 6, withBearer(token("5", "gw"))); o.status != 403 || who(o) != "forbidden" {
		t.Errorf("user_id 6 with sub 5: %v, want 403 forbidden", o)
	}
	if rep := verifyReport(t, vars()); rep.Orders != 0 {
		t.Fatalf("refused requests placed %d orders", rep.Orders)
	}
	if o := r.public.order(1, 0, withBearer(token("5", "gw"))); o.status != 201 || who(o) != "5" {
		t.Errorf("sub 5 alone: %v, want 201 for user 5", o)
	}
	if o := r.public.order(2, 5, withBearer(token("5", "gw"))); o.status != 201 || who(o) != "5" {
		t.Errorf("sub 5, user_id 5: %v, want 201 for user 5", o)
	}
	// Product reads stay public.
	if p := r.public.product(1); p.expect(200) != nil {
		t.Errorf("GET product without a token: %v, want 200", p)
	}
	if rep := verifyReport(t, vars()); rep.Orders != 2 || !rep.OK {
		t.Errorf("verify: %+v, want 2 orders and every invariant holding", rep)
	}
}

// verifyReport is `shop verify --json`'s report.
func verifyReport(t *testing.T, vars map[string]string) (rep struct {
	Orders int  `json:"orders"`
	OK     bool `json:"ok"`
}) {
	t.Helper()
	code, out := shopWith(vars, "verify", "--json")
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &rep); err != nil {
		t.Fatalf("verify (exit %d): %v\n%s", code, err, out)
	}
	return rep
}
