package testenv_test

import (
	"net/http"
	"sync"
	"testing"

	"shop/internal/testenv"
)

// Two stripe-mocks run side by side, as two test packages' do: neither
// binds a port the other needs. Given only -http-addr, each would also
// serve HTTPS on port 12112 and the second would exit.
func TestStripeMocksSideBySide(t *testing.T) {
	var started sync.WaitGroup
	started.Add(2)
	for _, name := range []string{"a", "b"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Each answers once both have started (or one failed to).
			done := sync.OnceFunc(started.Done)
			defer done()
			base := testenv.StripeMock(t)
			done()
			started.Wait()
			// It answers 401 to a request without a key, once it serves.
			resp, err := http.Get(base + "/v1/refunds")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET /v1/refunds without a key answered %d, want 401", resp.StatusCode)
			}
		})
	}
}
