package main

import (
	"encoding/json"
	"fmt"
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
	var found string
	waitFor(t, 15*time.Second, "the line with id="+id+" in nginx's access log", func() error {
		log, err := os.ReadFile(filepath.Join(n.dir, "access.log"))
		for line := range strings.Lines(string(log)) {
			if strings.HasSuffix(strings.TrimSpace(line), " id="+id) {
				found = line
				return nil
			}
		}
		return fmt.Errorf("%v, the log:\n%s", err, log)
	})
	return found
}

// oneID returns the X-Request-ID of an answer with header, failing unless
// it has exactly one, of nginx's form.
func oneID(t *testing.T, header http.Header) string {
	t.Helper()
	ids := header.Values(requestid.Header)
	if len(ids) != 1 || !nginxID.MatchString(ids[0]) {
		t.Fatalf("X-Request-ID %q; want exactly one, nginx's 32 hex digits", ids)
	}
	return ids[0]
}

// A buyer's complaint can be traced: the X-Request-ID of an answer through
// nginx is the id= of nginx's access log line for it and the request_id of
// the replica's log line for it. A client's own X-Request-ID is replaced by
// nginx's.
func TestRequestIDThroughNginx(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	// The access log is at debug level.
	r := startReplica(t, fleetVars(t, db, map[string]string{"SHOP_LOG_LEVEL": "debug"})())
	front := startNginx(t, r.addr())
	waitReady(t, front.client)

	o := front.order(1, 7, withHeader(requestid.Header, "chosen-by-the-client"))
	if o.expect(201) != nil {
		t.Fatalf("order through nginx: %v", o)
	}
	id := oneID(t, o.header)

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
	t.Parallel()
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
			t.Parallel()
			a := front.send(tt.method, tt.path, tt.body, withHeader("Content-Type", "application/json"))
			if a.expect(tt.status) != nil {
				t.Fatalf("%v; want %d", a, tt.status)
			}
			id := oneID(t, a.header)
			body := a.raw
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
