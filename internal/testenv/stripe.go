package testenv

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"shop/internal/striperec"
)

// StripeMockEnv names the stripe-mock binary; default: stripe-mock on
// PATH, else ~/go/bin/stripe-mock, where `go install
// github.com/stripe/stripe-mock@v0.203.0` puts it.
const StripeMockEnv = "SHOP_TEST_STRIPE_MOCK"

// StripeMock starts a private stripe-mock on a free loopback port and
// returns its URL once it answers; it is killed when the test ends, and
// dies with the test binary if that ends first. stripe-mock is stateless:
// it ignores Idempotency-Key, drops metadata, and a retrieve returns a
// fixture. A test that cannot find the binary fails; -short runs, which
// start no servers, skip it. It takes a second or two to start: a
// package's tests share one (Shared).
func StripeMock(tb testing.TB) string {
	tb.Helper()
	if testing.Short() {
		tb.Skip("stripe-mock is a server; -short runs skip tests that need servers")
	}
	bin := stripeMockBin()
	if bin == "" {
		tb.Fatalf("stripe-mock: not on PATH nor in ~/go/bin (go install github.com/stripe/stripe-mock@v0.203.0, or set %s)", StripeMockEnv)
	}
	addr := "127.0.0.1:" + freePort(tb)
	// Given only -http-addr, stripe-mock also serves HTTPS on port 12112
	// of every address, which a second stripe-mock on the machine cannot
	// bind: it exits. HTTPS goes to a socket of its own instead, in a
	// short directory (a socket's path is at most 107 bytes).
	dir, err := os.MkdirTemp("", "stripe-mock-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	out := filepath.Join(dir, "out.log")
	f, err := os.Create(out)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, "-http-addr", addr, "-https-unix", filepath.Join(dir, "https.sock"))
	cmd.Stdout, cmd.Stderr = f, f
	p := &proc{}
	if _, err := p.start(cmd); err != nil {
		tb.Fatalf("start stripe-mock: %v", err)
	}
	tb.Cleanup(p.kill)
	// Any answer means it serves: / is 401 without a key.
	url := "http://" + addr
	hc := &http.Client{Timeout: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if p.pid() == 0 {
			tb.Fatalf("stripe-mock on %s exited; its output:\n%s", addr, tail(out))
		}
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			return url
		}
		if ctx.Err() != nil {
			tb.Fatalf("stripe-mock on %s does not answer: %v; its output:\n%s", addr, err, tail(out))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stripeMockBin finds the stripe-mock binary, "" if there is none.
func stripeMockBin() string {
	if bin := os.Getenv(StripeMockEnv); bin != "" {
		return bin
	}
	if bin, err := exec.LookPath("stripe-mock"); err == nil {
		return bin
	}
	if home, err := os.UserHomeDir(); err == nil {
		bin := filepath.Join(home, "go", "bin", "stripe-mock")
		if st, err := os.Stat(bin); err == nil && !st.IsDir() {
			return bin
		}
	}
	return ""
}

// StripeRec is a recording proxy (striperec) in the test's process.
type StripeRec struct {
	*striperec.Recorder
	// URL is where it listens: the service's SHOP_STRIPE_API_BASE.
	URL string
	// Log is the file it logs the calls to.
	Log string
}

// Calls returns the calls logged so far.
func (r *StripeRec) Calls(tb testing.TB) []striperec.Call {
	tb.Helper()
	calls, err := striperec.Read(r.Log)
	if err != nil {
		tb.Fatal(err)
	}
	return calls
}

// StartStripeRecorder starts a recording proxy to target (stripe-mock's
// URL) that logs to a file in the test's temporary directory; it stops
// when the test ends.
func StartStripeRecorder(tb testing.TB, target string) *StripeRec {
	tb.Helper()
	log := filepath.Join(tb.TempDir(), "stripe-calls.jsonl")
	rec, err := striperec.New(target, log)
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(rec)
	tb.Cleanup(func() {
		srv.Close()
		rec.Close()
	})
	return &StripeRec{Recorder: rec, URL: srv.URL, Log: log}
}

// StripeRecorder is StartStripeRecorder's URL and log file.
func StripeRecorder(tb testing.TB, target string) (url, logPath string) {
	tb.Helper()
	r := StartStripeRecorder(tb, target)
	return r.URL, r.Log
}
