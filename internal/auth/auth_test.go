package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var secret = []byte("0123456789abcdef0123456789abcdef") // 32 bytes

// now is the tests' clock: tokens are judged against it, not the
// machine's.
var now = time.Date(2030, 1, 2, 15, 4, 5, 0, time.UTC)

func clock() time.Time { return now }

// claims returns good claims for user sub, expiring in an hour.
func claims(sub string) jwt.MapClaims {
	return jwt.MapClaims{"sub": sub, "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
}

// sign returns c signed by key with method m.
func sign(t testing.TB, m jwt.SigningMethod, key any, c jwt.Claims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, c).SignedString(key)
	if err != nil {
		t.Fatalf("sign %s: %v", m.Alg(), err)
	}
	return s
}

func newVerifier(t testing.TB, o Options) *Verifier {
	t.Helper()
	if o.Now == nil {
		o.Now = clock
	}
	v, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

// keys are an RSA and an Ed25519 key pair, generated once: RSA keys take a
// while.
var keys = sync.OnceValue(func() (k struct {
	rsa      *rsa.PrivateKey
	ed       ed25519.PrivateKey
	otherEd  ed25519.PrivateKey
	otherRSA *rsa.PrivateKey
}) {
	var err error
	if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if k.otherRSA, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if _, k.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		panic(err)
	}
	if _, k.otherEd, err = ed25519.GenerateKey(rand.Reader); err != nil {
		panic(err)
	}
	return k
})

// pemOf is the PKIX PEM block of a public key.
func pemOf(t testing.TB, pub crypto.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// publicKeys is what a gateway's PEM file of its RSA and Ed25519 keys
// reads as.
func publicKeys(t testing.TB) []crypto.PublicKey {
	t.Helper()
	k := keys()
	got, err := ParsePublicKeys(append(pemOf(t, k.ed.Public()), pemOf(t, &k.rsa.PublicKey)...))
	if err != nil {
		t.Fatalf("ParsePublicKeys: %v", err)
	}
	return got
}

func TestSecretAcceptsAGoodToken(t *testing.T) {
	v := newVerifier(t, Options{Secret: secret})
	for _, sub := range []string{"1", "42", "9223372036854775807"} {
		user, err := v.Buyer(sign(t, jwt.SigningMethodHS256, secret, claims(sub)))
		if err != nil {
			t.Errorf("sub %s: %v", sub, err)
			continue
		}
		if got := strconv.FormatInt(user, 10); got != sub {
			t.Errorf("sub %s: user %d", sub, user)
		}
	}
}

// Each token is refused with ErrInvalid; expired ones with ErrExpired too.
func TestSecretRefuses(t *testing.T) {
	v := newVerifier(t, Options{Secret: secret, Leeway: 5 * time.Second})
	k := keys()
	expired := claims("7")
	expired["exp"] = now.Add(-10 * time.Second).Unix()
	noExp := claims("7")
	delete(noExp, "exp")
	notYet := claims("7")
	notYet["nbf"] = now.Add(time.Minute).Unix()
	numericSub := claims("7")
	numericSub["sub"] = 7
	noSub := claims("7")
	delete(noSub, "sub")
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("7"))
	good := sign(t, jwt.SigningMethodHS256, secret, claims("7"))
	header, payload, _ := strings.Cut(good, ".")
	payload, sig, _ := strings.Cut(payload, ".")
	// The same claims under a header that says none, with and without the
	// signature the secret made.
	noneHeader := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	cases := []struct {
		name, token string
		expired     bool
	}{
		{"empty", "", false},
		{"not a JWT", "not-a-token", false},
		{"two segments", header + "." + payload, false},
		{"padded", good + "=", false},
		{"wrong secret", sign(t, jwt.SigningMethodHS256, []byte("another secret of thirty-two bytes"), claims("7")), false},
		{"tampered payload", header + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"8","exp":1900000000}`)) + "." + sig, false},
		{"expired", sign(t, jwt.SigningMethodHS256, secret, expired), true},
		{"no exp", sign(t, jwt.SigningMethodHS256, secret, noExp), false},
		{"not yet valid", sign(t, jwt.SigningMethodHS256, secret, notYet), false},
		{"alg none", none, false},
		{"alg none, hand-made", noneHeader + "." + payload + ".", false},
		{"alg none, with a signature", noneHeader + "." + payload + "." + sig, false},
		{"HS384 with the secret", sign(t, jwt.SigningMethodHS384, secret, claims("7")), false},
		{"HS512 with the secret", sign(t, jwt.SigningMethodHS512, secret, claims("7")), false},
		{"RS256", sign(t, jwt.SigningMethodRS256, k.rsa, claims("7")), false},
		{"EdDSA", sign(t, jwt.SigningMethodEdDSA, k.ed, claims("7")), false},
		{"sub 0", sign(t, jwt.SigningMethodHS256, secret, claims("0")), false},
		{"sub negative", sign(t, jwt.SigningMethodHS256, secret, claims("-7")), false},
		{"sub with plus", sign(t, jwt.SigningMethodHS256, secret, claims("+7")), false},
		{"sub with leading zero", sign(t, jwt.SigningMethodHS256, secret, claims("07")), false},
		{"sub with space", sign(t, jwt.SigningMethodHS256, secret, claims(" 7")), false},
		{"sub not decimal", sign(t, jwt.SigningMethodHS256, secret, claims("alice")), false},
		{"sub hex", sign(t, jwt.SigningMethodHS256, secret, claims("0x7")), false},
		{"sub fraction", sign(t, jwt.SigningMethodHS256, secret, claims("7.0")), false},
		{"sub beyond int64", sign(t, jwt.SigningMethodHS256, secret, claims("9223372036854775808")), false},
		{"sub empty", sign(t, jwt.SigningMethodHS256, secret, claims("")), false},
		{"sub missing", sign(t, jwt.SigningMethodHS256, secret, noSub), false},
		{"sub a number, not a string", sign(t, jwt.SigningMethodHS256, secret, numericSub), false},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			user, err := v.Buyer(tt.token)
			if err == nil {
				t.Fatalf("accepted as user %d", user)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
			if got := errors.Is(err, ErrExpired); got != tt.expired {
				t.Errorf("errors.Is(%v, ErrExpired) = %t, want %t", err, got, tt.expired)
			}
		})
	}
}

// exp is judged with the leeway: a token that expired within it still
// passes.
func TestLeeway(t *testing.T) {
	c := claims("7")
	c["exp"] = now.Add(-3 * time.Second).Unix()
	token := sign(t, jwt.SigningMethodHS256, secret, c)
	if _, err := newVerifier(t, Options{Secret: secret, Leeway: 5 * time.Second}).Buyer(token); err != nil {
		t.Errorf("expired 3 s ago, leeway 5 s: %v", err)
	}
	if _, err := newVerifier(t, Options{Secret: secret}).Buyer(token); !errors.Is(err, ErrExpired) {
		t.Errorf("expired 3 s ago, no leeway: %v, want ErrExpired", err)
	}
}

func TestIssuerAndAudience(t *testing.T) {
	v := newVerifier(t, Options{Secret: secret, Issuer: "https://gw.example", Audience: "shop"})
	with := func(iss string, aud any) string {
		c := claims("7")
		if iss != "" {
			c["iss"] = iss
		}
		if aud != nil {
			c["aud"] = aud
		}
		return sign(t, jwt.SigningMethodHS256, secret, c)
	}
	good := []string{
		with("https://gw.example", "shop"),
		with("https://gw.example", []string{"other", "shop"}),
	}
	for _, token := range good {
		if _, err := v.Buyer(token); err != nil {
			t.Errorf("refused: %v", err)
		}
	}
	bad := map[string]string{
		"wrong iss":   with("https://evil.example", "shop"),
		"no iss":      with("", "shop"),
		"wrong aud":   with("https://gw.example", "other"),
		"aud list":    with("https://gw.example", []string{"other", "more"}),
		"no aud":      with("https://gw.example", nil),
		"iss as aud":  with("shop", "https://gw.example"),
		"aud unicode": with("https://gw.example", "ѕhop"),
	}
	for name, token := range bad {
		if _, err := v.Buyer(token); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	// Not configured: not checked.
	if _, err := newVerifier(t, Options{Secret: secret}).Buyer(with("anyone", "anything")); err != nil {
		t.Errorf("iss and aud not configured: %v", err)
	}
}

// A gateway's keys: each algorithm of each kind of key it holds is
// accepted, and nothing else.
func TestPublicKeys(t *testing.T) {
	k := keys()
	v := newVerifier(t, Options{PublicKeys: publicKeys(t)})
	for _, tt := range []struct {
		m   jwt.SigningMethod
		key any
	}{
		{jwt.SigningMethodEdDSA, k.ed},
		{jwt.SigningMethodRS256, k.rsa},
		{jwt.SigningMethodRS384, k.rsa},
		{jwt.SigningMethodRS512, k.rsa},
	} {
		if user, err := v.Buyer(sign(t, tt.m, tt.key, claims("42"))); err != nil || user != 42 {
			t.Errorf("%s: user %d, %v", tt.m.Alg(), user, err)
		}
	}

	pemBytes := append(pemOf(t, k.ed.Public()), pemOf(t, &k.rsa.PublicKey)...)
	rsaDER, _ := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	expired := claims("42")
	expired["exp"] = now.Add(-time.Minute).Unix()
	bad := map[string]string{
		"another Ed25519 key":              sign(t, jwt.SigningMethodEdDSA, k.otherEd, claims("42")),
		"another RSA key":                  sign(t, jwt.SigningMethodRS256, k.otherRSA, claims("42")),
		"PS256 with the RSA key":           sign(t, jwt.SigningMethodPS256, k.rsa, claims("42")),
		"HS256 with the PEM file":          sign(t, jwt.SigningMethodHS256, pemBytes, claims("42")),
		"HS256 with the RSA key's PEM":     sign(t, jwt.SigningMethodHS256, pemOf(t, &k.rsa.PublicKey), claims("42")),
		"HS256 with the RSA key's DER":     sign(t, jwt.SigningMethodHS256, rsaDER, claims("42")),
		"HS256 with the Ed25519 key":       sign(t, jwt.SigningMethodHS256, []byte(k.ed.Public().(ed25519.PublicKey)), claims("42")),
		"HS256 with the Ed25519 key's PEM": sign(t, jwt.SigningMethodHS256, pemOf(t, k.ed.Public()), claims("42")),
		"alg none":                         sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("42")),
		"expired":                          sign(t, jwt.SigningMethodEdDSA, k.ed, expired),
		"sub 0":                            sign(t, jwt.SigningMethodRS256, k.rsa, claims("0")),
	}
	for name, token := range bad {
		if user, err := v.Buyer(token); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: user %d, %v, want ErrInvalid", name, user, err)
		}
	}

	// Ed25519 keys alone allow no RSA algorithm, and the other way round.
	edOnly := newVerifier(t, Options{PublicKeys: []crypto.PublicKey{k.ed.Public()}})
	if _, err := edOnly.Buyer(sign(t, jwt.SigningMethodRS256, k.rsa, claims("42"))); !errors.Is(err, ErrInvalid) {
		t.Errorf("RS256 to an Ed25519-only verifier: %v", err)
	}
	rsaOnly := newVerifier(t, Options{PublicKeys: []crypto.PublicKey{&k.rsa.PublicKey}})
	if _, err := rsaOnly.Buyer(sign(t, jwt.SigningMethodEdDSA, k.ed, claims("42"))); !errors.Is(err, ErrInvalid) {
		t.Errorf("EdDSA to an RSA-only verifier: %v", err)
	}
	// Several keys of one kind: each is tried.
	two := newVerifier(t, Options{PublicKeys: []crypto.PublicKey{k.otherEd.Public(), k.ed.Public()}})
	if _, err := two.Buyer(sign(t, jwt.SigningMethodEdDSA, k.ed, claims("42"))); err != nil {
		t.Errorf("second Ed25519 key of two: %v", err)
	}
}

func TestNewRefuses(t *testing.T) {
	k := keys()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Options{
		"nothing":         {},
		"short secret":    {Secret: secret[:31]},
		"both":            {Secret: secret, PublicKeys: []crypto.PublicKey{k.ed.Public()}},
		"small RSA key":   {PublicKeys: []crypto.PublicKey{&small.PublicKey}},
		"ECDSA key":       {PublicKeys: []crypto.PublicKey{&ec.PublicKey}},
		"a private key":   {PublicKeys: []crypto.PublicKey{k.ed}},
		"RSA private key": {PublicKeys: []crypto.PublicKey{k.rsa}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestParsePublicKeys(t *testing.T) {
	k := keys()
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)})
	file := append([]byte("# the gateway's keys\n"), pemOf(t, k.ed.Public())...)
	file = append(file, pkcs1...)
	got, err := ParsePublicKeys(file)
	if err != nil {
		t.Fatalf("ParsePublicKeys: %v", err)
	}
	if len(got) != 2 {
		t.Fatalf("%d keys, want 2", len(got))
	}
	if !k.ed.Public().(ed25519.PublicKey).Equal(got[0]) || !k.rsa.PublicKey.Equal(got[1]) {
		t.Errorf("keys read are not the keys written")
	}

	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	edPriv, _ := x509.MarshalPKCS8PrivateKey(k.ed)
	bad := map[string][]byte{
		"empty":         nil,
		"no PEM":        []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI user@host\n"),
		"private key":   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: edPriv}),
		"certificate":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}),
		"corrupt block": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("not DER")}),
		"small RSA":     pemOf(t, &small.PublicKey),
		"ECDSA":         pemOf(t, &ec.PublicKey),
		"good then bad": append(pemOf(t, k.ed.Public()), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: edPriv})...),
	}
	for name, data := range bad {
		if keys, err := ParsePublicKeys(data); err == nil {
			t.Errorf("%s: read %d keys", name, len(keys))
		}
	}
}

// The verify cost alone, per token, for each kind of key: what a buyer's
// request pays on top of the order path with SHOP_AUTH=jwt.
func BenchmarkBuyer(b *testing.B) {
	k := keys()
	for _, bb := range []struct {
		name string
		o    Options
		m    jwt.SigningMethod
		key  any
	}{
		{"HS256", Options{Secret: secret}, jwt.SigningMethodHS256, secret},
		{"EdDSA", Options{PublicKeys: []crypto.PublicKey{k.ed.Public()}}, jwt.SigningMethodEdDSA, k.ed},
		{"RS256", Options{PublicKeys: []crypto.PublicKey{&k.rsa.PublicKey}}, jwt.SigningMethodRS256, k.rsa},
	} {
		b.Run(bb.name, func(b *testing.B) {
			v := newVerifier(b, bb.o)
			token := sign(b, bb.m, bb.key, claims("42"))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Buyer(token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// exp, nbf and iat are NumericDates (RFC 7519 section 2): JSON numbers. A
// string of digits, which jwt.NumericDate would read as the number, is
// refused, as is null; a number in any JSON form passes.
func TestDatesMustBeNumbers(t *testing.T) {
	v := newVerifier(t, Options{Secret: secret})
	exp := now.Add(time.Hour).Unix()
	for _, tt := range []struct {
		name  string
		claim string
		value any
		ok    bool
	}{
		{"exp a number", "exp", exp, true},
		{"exp a fraction", "exp", float64(exp) + 0.5, true},
		{"iat a number", "iat", now.Unix(), true},
		{"exp a string", "exp", strconv.FormatInt(exp, 10), false},
		{"exp null", "exp", nil, false},
		{"nbf a string", "nbf", strconv.FormatInt(now.Unix(), 10), false},
		{"iat a string", "iat", strconv.FormatInt(now.Unix(), 10), false},
		{"iat an object", "iat", map[string]any{"n": 1}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := claims("7")
			c[tt.claim] = tt.value
			_, err := v.Buyer(sign(t, jwt.SigningMethodHS256, secret, c))
			if tt.ok && err != nil {
				t.Errorf("refused: %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrInvalid) {
				t.Errorf("%s = %#v: %v, want ErrInvalid", tt.claim, tt.value, err)
			}
		})
	}
}

// With MaxTTL, a token is refused whose exp - iat is above it, or, without
// an iat, whose exp - now is; and one with an iat in the future that would
// be good for longer than MaxTTL from now. Without MaxTTL the lifetime is
// the issuer's.
func TestMaxTTL(t *testing.T) {
	const max = time.Hour
	v := newVerifier(t, Options{Secret: secret, MaxTTL: max, Leeway: 5 * time.Second})
	token := func(iat *time.Time, exp time.Time) string {
		c := jwt.MapClaims{"sub": "7", "exp": exp.Unix()}
		if iat != nil {
			c["iat"] = iat.Unix()
		}
		return sign(t, jwt.SigningMethodHS256, secret, c)
	}
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	for _, tt := range []struct {
		name  string
		token string
		ok    bool
	}{
		{"exp - iat = max", token(&now, now.Add(max)), true},
		{"exp - iat = max, issued 50 minutes ago", token(ago(50*time.Minute), now.Add(10*time.Minute)), true},
		{"no iat, exp - now = max", token(nil, now.Add(max)), true},
		{"exp - iat above max", token(&now, now.Add(max+time.Second)), false},
		{"exp - iat above max, most of it gone", token(ago(2*time.Hour), now.Add(time.Minute)), false},
		{"no iat, exp - now above max", token(nil, now.Add(max+time.Minute)), false},
		{"no iat, a year", token(nil, now.Add(365*24*time.Hour)), false},
		{"iat in the future", token(ago(-2*time.Hour), now.Add(2*time.Hour+max)), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := v.Buyer(tt.token)
			if tt.ok && err != nil {
				t.Errorf("refused: %v", err)
			}
			if !tt.ok && (!errors.Is(err, ErrInvalid) || errors.Is(err, ErrExpired)) {
				t.Errorf("%v, want ErrInvalid and not ErrExpired", err)
			}
		})
	}
	if _, err := newVerifier(t, Options{Secret: secret}).Buyer(token(nil, now.Add(365*24*time.Hour))); err != nil {
		t.Errorf("a year's token without MaxTTL: %v", err)
	}
	if _, err := New(Options{Secret: secret, MaxTTL: -time.Second}); err == nil {
		t.Error("a negative MaxTTL accepted")
	}
}

// rsaOfBits is an RSA public key whose modulus is bits long: an odd
// number, not a product of two primes anyone knows, which checking its
// size does not need; generating a real key above 8192 bits takes too
// long for a test.
func rsaOfBits(bits int) *rsa.PublicKey {
	n := new(big.Int).Lsh(big.NewInt(1), uint(bits-1))
	return &rsa.PublicKey{N: n.SetBit(n, 0, 1), E: 65537}
}

// RSA keys are 2048 to 8192 bits, in a PEM file and given to New.
func TestRSAKeySize(t *testing.T) {
	for bits, ok := range map[int]bool{2047: false, 2048: true, 8192: true, 8193: false, 16384: false} {
		k := rsaOfBits(bits)
		_, err := ParsePublicKeys(pemOf(t, k))
		if (err == nil) != ok {
			t.Errorf("%d bits in a PEM file: %v, want accepted %t", bits, err, ok)
		}
		if _, err := New(Options{PublicKeys: []crypto.PublicKey{k}}); (err == nil) != ok {
			t.Errorf("%d bits given to New: %v, want accepted %t", bits, err, ok)
		}
	}
}

// A sub that is not a user id is quoted in the error cut short: a client
// makes the token as large as it likes, and the error is logged.
func TestLongSubIsCutInTheError(t *testing.T) {
	v := newVerifier(t, Options{Secret: secret})
	sub := strings.Repeat("x", 200<<10)
	_, err := v.Buyer(sign(t, jwt.SigningMethodHS256, secret, claims(sub)))
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("%v, want ErrInvalid", err)
	}
	if msg := err.Error(); len(msg) > 300 || !strings.Contains(msg, "204800 bytes") {
		t.Errorf("the error is %d bytes, want the sub cut short with its length: %.300s", len(msg), msg)
	}
}
