package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A request that began before the drain and is answered during it closes its
// connection too: otherwise the connection would go back to idle, and
// Shutdown would close it under a request the balancer may be writing.
func TestDrainClosesConnectionsOfRequestsUnderWay(t *testing.T) {
	t.Parallel()
	d := newDrainer()
	started, answer := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(d.handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-answer
		}
		w.WriteHeader(http.StatusOK)
	})))
	defer srv.Close()

	get := func(path string) *http.Response {
		t.Helper()
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	if res := get("/fast"); res.Close {
		t.Fatal("an answer before the drain closes its connection")
	}
	slow := make(chan *http.Response)
	go func() { slow <- get("/slow") }()
	<-started
	d.draining.Store(true) // the drain begins while /slow is under way
	close(answer)
	if res := <-slow; !res.Close {
		t.Error("the answer to a request under way when the drain began keeps its connection open; want Connection: close")
	}
	if res := get("/fast"); !res.Close {
		t.Error("an answer during the drain keeps its connection open; want Connection: close")
	}
}
