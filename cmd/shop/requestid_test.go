package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"shop/internal/requestid"
	"shop/internal/testenv"
)

// nginxID is the form of nginx's $request_id.
var nginxID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// accessLine returns the line of nginx's access log for the request with
// id, waiting for nginx to flush its buffer (flush=1s).
func (n *frontNginx) accessLine(t *testing.T, id string) string {
	t.Helper()
	var log []byte
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		log, _ = os.ReadFile(filepath.Join(n.dir, "access.log"))
		for line := range strings.Lines(string(log)) {
			if strings.HasSuffix(strings.TrimSpace(line), " id="+id) {
				return line
			}
		}
	}
	t.Fatalf("no line with id=%s in nginx's access log:\n%s", id, log)
	return ""
}

// oneID returns res's X-Request-ID, failing unless it has exactly one, of
// nginx's form.
func oneID(t *testing.T, res *http.Response) string {
	t.Helper()
	ids := res.Header.Values(requestid.Header)
	if len(ids) != 1 || !nginxID.MatchString(ids[0]) {
		t.Fatalf("%s: X-Request-ID %q; want exactly one, nginx's 32 hex digits", res.Status, ids)
	}
	return ids[0]
}

// A buyer's complaint can be traced: the X-Request-ID of an answer through
// nginx is the id= of nginx's access log line for it and the request_id of
// the replica's log line for it. A client's own X-Request-ID is replaced by
// nginx's.
func TestRequestIDThroughNginx(t *testing.T) {
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	// The access log is at debug level.
	r := startReplica(t, fleetVars(t, db, map[string]string{"SHOP_LOG_LEVEL": "debug"})())
	front := startNginx(t, strings.TrimPrefix(r.url, "http://"))
	waitReady(t, front.url)

	req, err := http.NewRequest("POST", front.url+"/api/v1/orders", strings.NewReader(`{"sku_id":1,"user_id":7}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(requestid.Header, "chosen-by-the-client")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 201 {
		t.Fatalf("order through nginx: %d %s", res.StatusCode, body)
	}
	id := oneID(t, res)

	if line := front.accessLine(t, id); !strings.Contains(line, `"POST /api/v1/orders HTTP/1.1" 201 `) {
		t.Errorf("nginx's access log line with id=%s is not the order's: %s", id, line)
	}
	var logged bool
	for line := range strings.Lines(r.log.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["request_id"] == id {
			logged = logged || rec["msg"] == "request" && rec["path"] == "/api/v1/orders" && rec["status"] == 201.0
		}
	}
	if !logged {
		t.Errorf("no access log line of the replica with request_id %s:\n%s", id, r.log)
	}
}

// nginx's own answers carry its id too, in the header (and, for a 5xx, in
// the body) and on its access log line: the 502 when no replica answers,
// its 413 and the 404 of /metrics.
func TestNginxOwnAnswersCarryRequestID(t *testing.T) {
	front := startNginx(t, deadAddr(t))
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"no replica", "GET", "/api/v1/products/1", "", 502},
		{"too large", "POST", "/api/v1/orders", strings.Repeat(" ", 128<<10), 413},
		{"metrics", "GET", "/metrics", "", 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, front.url+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, tt.status, body)
			}
			id := oneID(t, res)
			var e struct {
				Error struct {
					RequestID *string `json:"request_id"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body is not JSON: %s", body)
			}
			switch got := e.Error.RequestID; {
			case tt.status >= 500 && (got == nil || *got != id):
				t.Errorf("%d body %s: want request_id %s", tt.status, body, id)
			case tt.status < 500 && got != nil:
				t.Errorf("%d body %s: want no request_id below 500", tt.status, body)
			}
			front.accessLine(t, id)
		})
	}
}
