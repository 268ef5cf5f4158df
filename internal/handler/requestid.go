package handler

import (
	"net/http"

	"shop/internal/requestid"
)

// withRequestID names each request before gin sees it: the id it brings in
// X-Request-ID if valid (nginx sends its $request_id), else a new one. The
// id goes on the response's header before anything is written, and on the
// request's context, where the access log, writeError and every log line
// of the request's work find it (requestid.LogHandler).
//
// It wraps the engine rather than being the first gin middleware: gin
// answers some requests without running any middleware (the redirect of a
// path with a trailing slash), and those must carry an id too.
func withRequestID(h http.Handler) http.Handler {
	// The header's name in the form http.Header keeps it: a name in another
	// form is put in that one, in a new string, on each lookup.
	name := http.CanonicalHeaderKey(requestid.Header)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := requestid.Choose(r.Header[name])
		w.Header()[name] = []string{id}
		h.ServeHTTP(w, r.WithContext(requestid.NewContext(r.Context(), id)))
	})
}
