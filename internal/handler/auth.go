package handler

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gin-gonic/gin"

	"shop/internal/auth"
)

// Authenticator tells who a buyer is from the bearer token of the request:
// *auth.Verifier implements it. An error means the token is refused.
type Authenticator interface {
	Buyer(token string) (int64, error)
}

// buyerKey is the gin context key under which authenticate leaves the
// buyer: the token's subject with authentication on, 0 with it off.
const buyerKey = "shop.buyer"

// authenticate is the first step of every buyer route. With a nil
// Authenticator (SHOP_AUTH=none) it lets every request through, and the
// body names the buyer; otherwise a request must carry a bearer token that
// v accepts, or it is answered 401 before its body is read. Either way it
// marks the request for buyer, which refuses one that did not come
// through here.
//
// Why a token was refused is logged at debug only: the access log, at info
// for a 401, names the kind of refusal (expired or not valid), never what
// the token holds, which its client chose and may have made as large as
// a header allows.
func authenticate(v Authenticator, log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		if v == nil {
			c.Set(buyerKey, int64(0))
			c.Next()
			return
		}
		token, err := bearerToken(c)
		if err != nil {
			writeError(c, err)
			return
		}
		user, err := v.Buyer(token)
		if err != nil {
			log.DebugContext(c.Request.Context(), "bearer token refused", "reason", err)
			kind := auth.ErrInvalid
			if errors.Is(err, auth.ErrExpired) {
				kind = auth.ErrExpired
			}
			writeError(c, fmt.Errorf("%w: %w", errBadToken, kind))
			return
		}
		c.Set(buyerKey, user)
		c.Next()
	}
}

// bearerToken returns the token of the request's one Authorization header,
// "Bearer <token>" with the scheme in any letter case (RFC 7235).
func bearerToken(c *gin.Context) (string, error) {
	values := c.Request.Header.Values("Authorization")
	switch len(values) {
	case 0:
		return "", errNoToken
	case 1:
	default:
		return "", fmt.Errorf("%w: %d Authorization headers", errBadToken, len(values))
	}
	// Another scheme, or the scheme alone, is no token: the challenge
	// then asks for one without calling it invalid (RFC 6750 section 3.1).
	scheme, token, _ := strings.Cut(values[0], " ")
	if token = strings.TrimLeft(token, " "); !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", errNoToken
	}
	return token, nil
}

// buyer is who a buyer route acts for, given the user_id the request
// claims (nil when it names none). With authentication off that is the
// claim, which is then required. With it on, it is the token's subject, and
// a claim naming anyone else is refused: errForbidden.
func buyer(c *gin.Context, claimed *int64) (int64, error) {
	v, ok := c.Get(buyerKey)
	if !ok {
		// A route wired without authenticate: refused rather than trusting
		// the body with authentication on.
		return 0, fmt.Errorf("%w: buyer route %s does not authenticate", errInternal, c.FullPath())
	}
	sub := v.(int64)
	switch {
	case sub == 0 && claimed == nil:
		return 0, invalid("user_id is required")
	case sub == 0:
		return *claimed, nil
	case claimed != nil && *claimed != sub:
		return 0, fmt.Errorf("%w: user_id %d, token's sub %d", errForbidden, *claimed, sub)
	}
	return sub, nil
}
