package striperec_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"shop/internal/striperec"
	"shop/internal/testenv"
)

// target is a server that answers every request with its method, path and
// body, and 201 for POST /v1/refunds.
func target(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && r.URL.Path == "/v1/refunds" {
			w.WriteHeader(http.StatusCreated)
		}
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.RequestURI(), body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, u, key string, form url.Values) (int, string) {
	t.Helper()
	status, body, err := send(u, key, form)
	if err != nil {
		t.Fatal(err)
	}
	return status, body
}

// send is post for goroutines other than the test's.
func send(u, key string, form url.Values) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// Each call is forwarded as it came, answered as the target answered, and
// logged with its key, status and form; concurrent calls each make one
// whole line.
func TestRecordsEachCall(t *testing.T) {
	r := testenv.StartStripeRecorder(t, target(t).URL)
	base, log := r.URL, r.Log
	form := url.Values{"payment_intent": {"pi_1"}, "amount": {"1299"}, "metadata[refund_id]": {"R1"}}
	status, body := post(t, base+"/v1/refunds", "R1", form)
	if status != http.StatusCreated || body != "POST /v1/refunds "+form.Encode() {
		t.Fatalf("answer %d %q: the call was not forwarded as it came", status, body)
	}
	resp, err := http.Get(base + "/v1/refunds?payment_intent=pi_1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("C%d", i)
			if _, _, err := send(base+"/v1/refunds", id, url.Values{"metadata[refund_id]": {id}, "amount": {"1"}}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()

	calls, err := striperec.Read(log)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != n+2 {
		t.Fatalf("%d calls logged, want %d", len(calls), n+2)
	}
	c := calls[0]
	if c.Method != "POST" || c.Path != "/v1/refunds" || c.IdempotencyKey != "R1" || c.Status != http.StatusCreated ||
		c.RefundID != "R1" || c.Form["amount"] != "1299" || c.Form["payment_intent"] != "pi_1" || c.Injected {
		t.Errorf("first call logged as %+v", c)
	}
	if c := calls[1]; c.Method != "GET" || c.Path != "/v1/refunds" || c.Query != "payment_intent=pi_1" || c.Status != http.StatusOK || c.Form != nil {
		t.Errorf("second call logged as %+v", c)
	}
	refunds := striperec.Refunds(calls)
	if len(refunds) != n+1 {
		t.Errorf("%d refunds, want %d", len(refunds), n+1)
	}
	for id, rc := range refunds {
		if rc.Calls != 1 || len(rc.Keys) != 1 || rc.Keys[0] != id {
			t.Errorf("refund %s: %+v, want one call with its own key", id, rc)
		}
	}
}

// An injected answer is given once, in place of the target's, and logged
// as injected.
func TestInject(t *testing.T) {
	r := testenv.StartStripeRecorder(t, target(t).URL)
	base, log := r.URL, r.Log
	const answer = `{"error":{"code":"charge_already_refunded","type":"invalid_request_error","message":"refunded"}}`
	r.Inject("POST", "/v1/refunds", http.StatusBadRequest, answer)
	form := url.Values{"metadata[refund_id]": {"R1"}}
	for i, want := range []struct {
		status int
		body   string
	}{{http.StatusBadRequest, answer}, {http.StatusCreated, "POST /v1/refunds " + form.Encode()}} {
		status, body := post(t, base+"/v1/refunds", "R1", form)
		if status != want.status || body != want.body {
			t.Errorf("call %d answered %d %q, want %d %q", i, status, body, want.status, want.body)
		}
	}
	calls, err := striperec.Read(log)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || !calls[0].Injected || calls[0].Status != http.StatusBadRequest || calls[1].Injected {
		t.Fatalf("calls logged as %+v", calls)
	}
	if rc := striperec.Refunds(calls)["R1"]; rc.Calls != 2 || len(rc.Keys) != 1 {
		t.Errorf("refund R1: %+v, want two calls with one key", rc)
	}
}

// A target that does not answer is a 502, logged.
func TestTargetDown(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	base, log := testenv.StripeRecorder(t, down.URL)
	if status, _ := post(t, base+"/v1/refunds", "R1", url.Values{"metadata[refund_id]": {"R1"}}); status != http.StatusBadGateway {
		t.Errorf("answer %d, want 502", status)
	}
	calls, err := striperec.Read(log)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0].Status != http.StatusBadGateway || calls[0].RefundID != "R1" {
		t.Errorf("calls logged as %+v", calls)
	}
}

// Read leaves out a last line that is not whole yet, and refuses a broken
// line before it.
func TestReadPartialLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	whole := `{"method":"POST","path":"/v1/refunds","idempotency_key":"R1","status":200,"refund_id":"R1"}` + "\n"
	if err := os.WriteFile(path, []byte(whole+`{"method":"PO`), 0o644); err != nil {
		t.Fatal(err)
	}
	calls, err := striperec.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0].RefundID != "R1" {
		t.Errorf("read %+v, want the one whole line", calls)
	}
	if err := os.WriteFile(path, []byte(`{"method":"PO`+"\n"+whole), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := striperec.Read(path); err == nil {
		t.Error("a broken line was read without an error")
	}
}
