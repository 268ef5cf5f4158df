// Package requestid names each request, so that what happened to it can be
// found: the response's X-Request-ID header, nginx's access log (id=) and
// every line the replica logs for it (request_id) carry the same id.
//
// It knows neither gin nor the domain: the HTTP layer puts the id on the
// request's context, and LogHandler adds it to every record logged with
// that context, or one derived from it, wherever the logging happens.
package requestid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
)

// Header is the request and response header that carries the id.
const Header = "X-Request-ID"

// maxLen bounds an id taken from a request: nginx's $request_id is 32
// characters, a UUID 36.
const maxLen = 128

// Key is the log attribute that carries the id.
const Key = "request_id"

type ctxKey struct{}

// idContext is a context carrying an id: context.WithValue's, but for
// one allocation per request rather than two (the string boxed in an
// interface, then the context). Its Value of ctxKey is itself, a pointer,
// which FromContext reads without boxing the id again.
type idContext struct {
	context.Context
	id string
}

func (c *idContext) Value(key any) any {
	if key == (ctxKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// NewContext returns ctx carrying id.
func NewContext(ctx context.Context, id string) context.Context {
	return &idContext{Context: ctx, id: id}
}

// FromContext returns the id ctx carries, or "" if none.
func FromContext(ctx context.Context) string {
	if c, ok := ctx.Value(ctxKey{}).(*idContext); ok {
		return c.id
	}
	return ""
}

// New returns a fresh id: 16 random bytes in lowercase hex, the form of
// nginx's $request_id.
func New() string {
	var (
		b [16]byte
		h [32]byte
	)
	rand.Read(b[:]) // never fails (crypto/rand)
	hex.Encode(h[:], b[:])
	return string(h[:])
}

// Valid reports whether id, taken from a request, may be used as its id:
// 1 to 128 characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'. Anything
// else, a client's spaces, quotes or newlines among them, would let one
// request's id forge or break another's log line, or grow the logs.
func Valid(id string) bool {
	if len(id) == 0 || len(id) > maxLen {
		return false
	}
	for i := range len(id) {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// Choose returns the id a request is known by: the one it brings in
// values, its Header's values, when there is exactly one and it is Valid;
// otherwise a New one.
func Choose(values []string) string {
	if len(values) == 1 && Valid(values[0]) {
		return values[0]
	}
	return New()
}

// LogHandler wraps next so that every record logged with a context that
// carries an id (log.InfoContext(ctx, …), log.Log(ctx, …)) has it as the
// attribute request_id. Records logged without one are passed on as they
// are. Under a group (Logger.WithGroup) the attribute is in the group.
func LogHandler(next slog.Handler) slog.Handler { return logHandler{next} }

type logHandler struct{ next slog.Handler }

func (h logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := FromContext(ctx); id != "" {
		r = r.Clone() // the caller's record is not ours to change
		r.AddAttrs(slog.String(Key, id))
	}
	return h.next.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.next.WithAttrs(attrs)}
}

func (h logHandler) WithGroup(name string) slog.Handler {
	return logHandler{h.next.WithGroup(name)}
}
