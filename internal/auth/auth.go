// Package auth tells who a buyer is from the JSON Web Token sent as the
// request's bearer token (RFC 7519): a token signed with a secret shared
// with the service (HS256), or by a gateway whose Ed25519 or RSA public keys
// the service holds (EdDSA, RS256, RS384, RS512).
//
// The algorithms a Verifier accepts are pinned by the keys it has: HS256
// only with a secret, EdDSA and RS* only with public keys of those kinds. A
// token's own alg header never chooses the kind of key, so neither "none"
// nor a token signed with HS256 using a public key's bytes as the secret
// (algorithm confusion) is accepted.
package auth

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const (
	// MinSecret is the shortest HS256 secret in bytes: as long as the
	// SHA-256 output, as RFC 7518 section 3.2 asks.
	MinSecret = 32
	// minRSABits and maxRSABits bound the modulus of an RSA public key:
	// below 2048 bits a key can be factored too cheaply; above 8192 every
	// token's check costs more than it protects, and a key that large is
	// a mistake or a way to make each request expensive.
	minRSABits = 2048
	maxRSABits = 8192
	// shownSub is how much of a sub that is not a user id an error
	// quotes: a token is as large as its client makes it, and its errors
	// end up in the log.
	shownSub = 32
)

var (
	// ErrInvalid is the cause of every refusal of a token: malformed, not
	// signed by a trusted key with an allowed algorithm, outside its
	// lifetime, for another issuer or audience, or with a sub that is not
	// a user id.
	ErrInvalid = errors.New("invalid token")
	// ErrExpired is an otherwise good token past its exp. It is also an
	// ErrInvalid.
	ErrExpired = fmt.Errorf("%w: expired", ErrInvalid)
)

// Options are a Verifier's keys and the claims it requires.
type Options struct {
	// Secret is the HS256 key, at least MinSecret bytes. PublicKeys are a
	// gateway's keys (ed25519.PublicKey, *rsa.PublicKey), as
	// ParsePublicKeys reads them. Exactly one of the two is set.
	Secret     []byte
	PublicKeys []crypto.PublicKey
	// Issuer and Audience, when set, must be the token's iss and be among
	// its aud.
	Issuer   string
	Audience string
	// Leeway is the clock skew allowed on exp and nbf.
	Leeway time.Duration
	// MaxTTL, when above 0, is the longest lifetime a token may have: its
	// exp minus its iat, or minus now when it has no iat. Whatever its
	// iat, a token that would still be good for longer than MaxTTL (and
	// the leeway) from now is refused too.
	MaxTTL time.Duration
	// Now is the clock, time.Now when nil.
	Now func() time.Time
}

// Verifier checks buyers' tokens. It is safe for concurrent use.
type Verifier struct {
	parser *jwt.Parser
	// secret is the HS256 key; ed and rsa the public keys by kind, each
	// tried in turn. Only the kinds present have their algorithms
	// allowed.
	secret []byte
	ed     jwt.VerificationKeySet
	rsa    jwt.VerificationKeySet
	// maxTTL and leeway are Options'; now is the parser's clock.
	maxTTL time.Duration
	leeway time.Duration
	now    func() time.Time
}

// New returns a Verifier of tokens signed with o's keys.
func New(o Options) (*Verifier, error) {
	if o.MaxTTL < 0 {
		return nil, fmt.Errorf("a maximum lifetime of %s: must be 0 (none) or more", o.MaxTTL)
	}
	v := &Verifier{maxTTL: o.MaxTTL, leeway: o.Leeway, now: o.Now}
	if v.now == nil {
		v.now = time.Now
	}
	var methods []string
	switch {
	case len(o.Secret) > 0 && len(o.PublicKeys) > 0:
		return nil, errors.New("a secret and public keys: give exactly one")
	case len(o.Secret) > 0:
		if len(o.Secret) < MinSecret {
			return nil, fmt.Errorf("the secret is %d bytes, must be at least %d", len(o.Secret), MinSecret)
		}
		v.secret = append([]byte(nil), o.Secret...)
		methods = []string{jwt.SigningMethodHS256.Alg()}
	case len(o.PublicKeys) > 0:
		for i, k := range o.PublicKeys {
			switch k := k.(type) {
			case ed25519.PublicKey:
				v.ed.Keys = append(v.ed.Keys, k)
			case *rsa.PublicKey:
				if err := checkRSA(k); err != nil {
					return nil, fmt.Errorf("key %d: %w", i+1, err)
				}
				v.rsa.Keys = append(v.rsa.Keys, k)
			default:
				return nil, fmt.Errorf("key %d is a %T: only Ed25519 and RSA public keys are accepted", i+1, k)
			}
		}
		if len(v.ed.Keys) > 0 {
			methods = append(methods, jwt.SigningMethodEdDSA.Alg())
		}
		if len(v.rsa.Keys) > 0 {
			methods = append(methods, jwt.SigningMethodRS256.Alg(), jwt.SigningMethodRS384.Alg(), jwt.SigningMethodRS512.Alg())
		}
	default:
		return nil, errors.New("no key: give a secret or public keys")
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(methods),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(o.Leeway),
		jwt.WithStrictDecoding(),
	}
	if o.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(o.Issuer))
	}
	if o.Audience != "" {
		opts = append(opts, jwt.WithAudience(o.Audience))
	}
	if o.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(o.Now))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// Buyer returns the user id a token names in its sub, once its signature,
// algorithm and claims hold. Every error is an ErrInvalid, ErrExpired for a
// token whose exp has passed.
func (v *Verifier) Buyer(token string) (int64, error) {
	var claims numericClaims
	if _, err := v.parser.ParseWithClaims(token, &claims, v.key); err != nil {
		if errors.Is(err, jwt.ErrTokenExpired) {
			return 0, fmt.Errorf("%w: %w", ErrExpired, err)
		}
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := v.checkLifetime(claims.RegisteredClaims); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	user, err := strconv.ParseInt(claims.Subject, 10, 64)
	// The one way the id prints: "+7", "007" or " 7" would be taken for
	// user 7 by the service and for another subject by whoever issued it.
	if err != nil || user <= 0 || strconv.FormatInt(user, 10) != claims.Subject {
		return 0, fmt.Errorf("%w: sub %s is not a user id (a positive integer in decimal, without sign or leading zeros)", ErrInvalid, quoteSub(claims.Subject))
	}
	return user, nil
}

// checkLifetime refuses a token whose lifetime is above the verifier's
// maximum: exp minus iat, or minus now without an iat; and, whatever its
// iat, one still good for longer than the maximum from now, which an iat
// in the future would otherwise let through. The parser has checked that
// exp is there.
func (v *Verifier) checkLifetime(c jwt.RegisteredClaims) error {
	if v.maxTTL <= 0 {
		return nil
	}
	exp, now := c.ExpiresAt.Time, v.now()
	if c.IssuedAt != nil {
		if ttl := exp.Sub(c.IssuedAt.Time); ttl > v.maxTTL {
			return fmt.Errorf("a lifetime of %s (exp - iat), above the maximum of %s", ttl.Round(time.Second), v.maxTTL)
		}
	}
	if left := exp.Sub(now); left > v.maxTTL+v.leeway {
		return fmt.Errorf("good for %s more, above the maximum lifetime of %s", left.Round(time.Second), v.maxTTL)
	}
	return nil
}

// quoteSub is sub quoted for an error, cut to its first shownSub bytes
// with its length when it is longer.
func quoteSub(sub string) string {
	if len(sub) <= shownSub {
		return strconv.Quote(sub)
	}
	return fmt.Sprintf("%q… (%d bytes)", sub[:shownSub], len(sub))
}

// numericClaims are the registered claims, with exp, nbf and iat held to
// RFC 7519's NumericDate: a JSON number. jwt.NumericDate also takes a JSON
// string of digits, which no conforming issuer sends; a token that carries
// one was made by hand, and is refused.
type numericClaims struct {
	jwt.RegisteredClaims
}

func (c *numericClaims) UnmarshalJSON(data []byte) error {
	var dates struct {
		Exp json.RawMessage `json:"exp"`
		Nbf json.RawMessage `json:"nbf"`
		Iat json.RawMessage `json:"iat"`
	}
	if err := json.Unmarshal(data, &dates); err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		raw  json.RawMessage
	}{{"exp", dates.Exp}, {"nbf", dates.Nbf}, {"iat", dates.Iat}} {
		if d.raw == nil {
			continue
		}
		var n json.Number
		// A json.Number takes a JSON string of digits; a number's first
		// byte is a digit or a minus sign.
		if first := d.raw[0]; (first != '-' && (first < '0' || first > '9')) || json.Unmarshal(d.raw, &n) != nil {
			return fmt.Errorf("%s is not a NumericDate (a JSON number of seconds)", d.name)
		}
	}
	return json.Unmarshal(data, &c.RegisteredClaims)
}

// key is the parser's Keyfunc: the keys of the kind the token's algorithm
// needs. The parser has refused the algorithms of the other kinds already;
// the switch keeps a key from ever being used with another kind's
// algorithm all the same.
func (v *Verifier) key(t *jwt.Token) (any, error) {
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		if v.secret != nil {
			return v.secret, nil
		}
	case *jwt.SigningMethodEd25519:
		if len(v.ed.Keys) > 0 {
			return v.ed, nil
		}
	case *jwt.SigningMethodRSA:
		if len(v.rsa.Keys) > 0 {
			return v.rsa, nil
		}
	}
	return nil, fmt.Errorf("no key for algorithm %s", t.Method.Alg())
}

// ParsePublicKeys reads every PEM block of data: PUBLIC KEY (PKIX, Ed25519
// or RSA) or RSA PUBLIC KEY (PKCS #1). Anything else is an error, a private
// key above all: it has no business in a verifier's file.
func ParsePublicKeys(data []byte) ([]crypto.PublicKey, error) {
	var keys []crypto.PublicKey
	for n := 1; ; n++ {
		block, rest := pem.Decode(data)
		if block == nil {
			break
		}
		data = rest
		var (
			key crypto.PublicKey
			err error
		)
		switch block.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(block.Bytes)
		default:
			return nil, fmt.Errorf("PEM block %d is %q: want PUBLIC KEY or RSA PUBLIC KEY blocks only", n, block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		switch k := key.(type) {
		case ed25519.PublicKey:
		case *rsa.PublicKey:
			if err := checkRSA(k); err != nil {
				return nil, fmt.Errorf("PEM block %d: %w", n, err)
			}
		default:
			return nil, fmt.Errorf("PEM block %d is a %T: only Ed25519 and RSA public keys are accepted", n, key)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("no PEM block: want one or more PUBLIC KEY blocks")
	}
	return keys, nil
}

func checkRSA(k *rsa.PublicKey) error {
	if bits := k.N.BitLen(); bits < minRSABits || bits > maxRSABits {
		return fmt.Errorf("an RSA key of %d bits, want %d to %d", bits, minRSABits, maxRSABits)
	}
	return nil
}
