package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"shop/internal/testenv"
)

// Both listeners take a request whose headers hold a large bearer token,
// and answer 431 to one whose headers pass 16 KiB (net/http reads 4 KiB
// past MaxHeaderBytes before it refuses), rather than read and hold a
// megabyte of them.
func TestHeaderLimit(t *testing.T) {
	t.Parallel()
	r := startReplica(t, fleetVars(t, testenv.MySQL(t), nil)())
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, tt := range []struct {
		listener, url string
	}{{"public", r.public.base + "/healthz"}, {"admin", r.admin.base + "/metrics"}} {
		for _, c := range []struct {
			size int
			want int
		}{{8 << 10, http.StatusOK}, {14 << 10, http.StatusOK}, {20 << 10, http.StatusRequestHeaderFieldsTooLarge}, {64 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
			req, err := http.NewRequest("GET", tt.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Padding", strings.Repeat("p", c.size))
			res, err := hc.Do(req)
			if err != nil {
				t.Errorf("%s, a %d-byte header: %v", tt.listener, c.size, err)
				continue
			}
			res.Body.Close()
			if res.StatusCode != c.want {
				t.Errorf("%s, a %d-byte header: %d, want %d", tt.listener, c.size, res.StatusCode, c.want)
			}
		}
	}
}
