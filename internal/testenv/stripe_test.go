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
			req, err := http.NewRequest(http.MethodGet, base+"/v1/refunds", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer sk_test_123")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET /v1/refunds answered %d", resp.StatusCode)
			}
		})
	}
}
