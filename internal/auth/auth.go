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
	// minRSABits is the smallest RSA modulus accepted for a public key.
	minRSABits = 2048
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
}

// New returns a Verifier of tokens signed with o's keys.
func New(o Options) (*Verifier, error) {
	v := &Verifier{}
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
	var claims jwt.RegisteredClaims
	if _, err := v.parser.ParseWithClaims(token, &claims, v.key); err != nil {
		if errors.Is(err, jwt.ErrTokenExpired) {
			return 0, fmt.Errorf("%w: %w", ErrExpired, err)
		}
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	user, err := strconv.ParseInt(claims.Subject, 10, 64)
	// The one way the id prints: "+7", "007" or " 7" would be taken for
	// user 7 by the service and for another subject by whoever issued it.
	if err != nil || user <= 0 || strconv.FormatInt(user, 10) != claims.Subject {
		return 0, fmt.Errorf("%w: sub %q is not a user id (a positive integer in decimal, without sign or leading zeros)", ErrInvalid, claims.Subject)
	}
	return user, nil
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
	if bits := k.N.BitLen(); bits < minRSABits {
		return fmt.Errorf("an RSA key of %d bits, want at least %d", bits, minRSABits)
	}
	return nil
}
