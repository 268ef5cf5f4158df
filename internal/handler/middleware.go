package handler

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"runtime/debug"
	"strconv"
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

// observe logs each request as JSON and records its metrics. Failures at 500
// and above are logged at error level with their cause, the rest at debug
// (a client that went away, 499, among them).
func observe(log *slog.Logger, m *metrics) gin.HandlerFunc {
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
		m.requests.WithLabelValues(method, route, strconv.Itoa(code)).Inc()
		m.duration.WithLabelValues(method, route).Observe(elapsed.Seconds())

		level := slog.LevelDebug
		if code >= 500 {
			level = slog.LevelError
		}
		if !log.Enabled(c.Request.Context(), level) {
			return
		}
		attrs := []any{"method", c.Request.Method, "path", c.Request.URL.Path, "status", code, "duration", elapsed}
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
// token configured the admin API does not exist.
func requireAdmin(token string) gin.HandlerFunc {
	return func(c *gin.Context) {
		if token == "" {
			writeError(c, errAdminDisabled)
			return
		}
		// The scheme is case-insensitive (RFC 7235), the token is not.
		scheme, got, ok := strings.Cut(c.GetHeader("Authorization"), " ")
		got = strings.TrimLeft(got, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			writeError(c, errUnauthorized)
			return
		}
		c.Next()
	}
}
