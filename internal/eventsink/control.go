package eventsink

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// ControlHandler serves the control routes of the package comment. Start
// serves it on the control listener; it is exported for a test that mounts
// it elsewhere.
func (s *Sink) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /control/fail", func(w http.ResponseWriter, r *http.Request) {
		if n, ok := count(w, r); ok {
			s.FailFirst(n)
			done(w)
		}
	})
	mux.HandleFunc("POST /control/close", func(w http.ResponseWriter, r *http.Request) {
		if n, ok := count(w, r); ok {
			s.CloseNext(n)
			done(w)
		}
	})
	mux.HandleFunc("POST /control/hang", func(w http.ResponseWriter, r *http.Request) {
		if d, ok := duration(w, r); ok {
			s.Hang(d)
			done(w)
		}
	})
	mux.HandleFunc("POST /control/down", func(w http.ResponseWriter, r *http.Request) {
		d, ok := duration(w, r)
		if !ok {
			return
		}
		if err := s.Down(d); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		done(w)
	})
	mux.HandleFunc("POST /control/up", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.Up(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		done(w)
	})
	mux.HandleFunc("GET /control/record", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		// The answer has begun: a failure can only cut it short.
		_ = WriteRecord(w, s.Record())
	})
	mux.HandleFunc("GET /control/summary", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Summary())
	})
	return mux
}

// count reads the query's n, a count of at least 0.
func count(w http.ResponseWriter, r *http.Request) (int, bool) {
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 0 {
		http.Error(w, fmt.Sprintf("n=%q: want a count of at least 0", r.URL.Query().Get("n")), http.StatusBadRequest)
		return 0, false
	}
	return n, true
}

// duration reads the query's for, a Go duration of at least 0.
func duration(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	d, err := time.ParseDuration(r.URL.Query().Get("for"))
	if err != nil || d < 0 {
		http.Error(w, fmt.Sprintf("for=%q: want a duration such as 10s", r.URL.Query().Get("for")), http.StatusBadRequest)
		return 0, false
	}
	return d, true
}

func done(w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) }
