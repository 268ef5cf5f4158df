package handler

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
)

// maxBodyBytes bounds every request body; the largest valid one is far
// smaller.
const maxBodyBytes = 4 << 10

// recovery turns a panic into a 500 with the JSON error shape, logged with
// the panic's value and the stack of the goroutine that panicked; the client
// never sees either.
func recovery(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.ErrorContext(c.Request.Context(), "panic", "method", c.Request.Method, "path", c.Request.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				writeError(c, errInternal)
			}
		}()
		c.Next()
	}
}

// observe logs each request as JSON and records its metrics. A request is
// logged at level, or at info when it was refused for its credentials (401
// and 403: someone trying tokens shows in the log at the default level),
// or at error level, with its cause, when it failed at 500 or above. A
// client that went away, 499, is logged at level.
func observe(log *slog.Logger, m *metrics, level slog.Level) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		elapsed := time.Since(start)
		route := c.FullPath()
		if route == "" {
			route = "unmatched"
		}
		code := c.Writer.Status()
		method := methodLabel(c.Request.Method)
		m.requests.WithLabelValues(method, route, m.codeLabel(code)).Inc()
		m.duration.WithLabelValues(method, route).Observe(elapsed.Seconds())

		level := level
		switch {
		case code >= 500:
			level = slog.LevelError
		case code == http.StatusUnauthorized || code == http.StatusForbidden:
			level = max(level, slog.LevelInfo)
		}
		if !log.Enabled(c.Request.Context(), level) {
			return
		}
		attrs := []any{"method", c.Request.Method, "path", c.Request.URL.Path, "status", code, "duration", elapsed, "client", c.ClientIP()}
		if err := c.Errors.Last(); err != nil {
			attrs = append(attrs, "err", err.Err)
		}
		log.Log(c.Request.Context(), level, "request", attrs...)
	}
}

// jsonBody refuses bodies that are not JSON or larger than maxBodyBytes.
func jsonBody() gin.HandlerFunc {
	return func(c *gin.Context) {
		mt, _, err := mime.ParseMediaType(c.GetHeader("Content-Type"))
		if err != nil || mt != "application/json" {
			writeError(c, errUnsupportedMedia)
			return
		}
		if c.Request.ContentLength > maxBodyBytes {
			writeError(c, errTooLarge)
			return
		}
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, maxBodyBytes)
		c.Next()
	}
}

// requireAdmin lets through requests carrying the admin bearer token. With no
// token configured the admin API does not exist. Failed checks are limited
// per client address (Limits.AdminAuth): each check takes a guess from the
// address's allowance before the token is compared, and a right token gives
// it back. An address past its limit is answered 429 before its token is
// looked at, so that the limit bounds guesses, not only the answers to
// them, and however many come at once.
func requireAdmin(token string, lim *limiter, log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		if token == "" {
			writeError(c, errAdminDisabled)
			return
		}
		give, err := lim.takeGuess(c, "admin-auth:"+c.ClientIP())
		if err != nil {
			writeError(c, err)
			return
		}
		// The scheme is case-insensitive (RFC 7235), the token is not.
		scheme, got, ok := strings.Cut(c.GetHeader("Authorization"), " ")
		got = strings.TrimLeft(got, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			log.InfoContext(c.Request.Context(), "admin: missing or wrong token", "client", c.ClientIP(), "path", c.Request.URL.Path)
			writeError(c, errUnauthorized)
			return
		}
		give()
		c.Next()
	}
}
