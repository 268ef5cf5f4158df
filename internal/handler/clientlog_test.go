package handler_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/handler"
	"shop/internal/testenv"
)

// logged serves the public API with a log at level, trusting the proxies
// given, and returns its URL and its log. What these tests read is the
// log, so the answers are not held to openapi.json here (serve does that),
// which would take longer than the tests themselves.
func logged(t *testing.T, level slog.Level, d handler.Deps, trusted ...string) (string, *testenv.Log) {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	log := &testenv.Log{}
	d.Logger = slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: level}))
	d.Registry = prometheus.NewRegistry()
	srv := httptest.NewServer(handler.New(d, handler.Settings{TrustedProxies: trusted}).Public)
	t.Cleanup(srv.Close)
	return srv.URL, log
}

// records are the log's lines with message msg.
func records(t *testing.T, log *testenv.Log, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(log.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %.200q", line)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// A refused token's sub is the client's to make as large as a header
// allows: at info, the 401's access log line says the token was not valid
// and nothing of what it holds; at debug, why, with the sub cut short.
func TestRefusedTokenIsNotLoggedWhole(t *testing.T) {
	sub := strings.Repeat("x", 200<<10)
	token := mint(t, jwt.SigningMethodHS256, jwtSecret, sub, time.Now().Add(time.Hour))
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			p := &placed{}
			url, log := logged(t, level, handler.Deps{Orders: p, Lifecycle: p, Products: productFunc{}, Stock: productFunc{}, Auth: hsVerifier(t)})
			a := &api{url: url}
			if r := a.order(t, `{"sku_id":1}`, bearer(token)); r.status != http.StatusUnauthorized {
				t.Fatalf("%d %s, want 401", r.status, r.raw)
			}
			if n := len(log.String()); n > 2<<10 {
				t.Errorf("the log is %d bytes for one refused token, want at most 2 KiB: %.500s…", n, log)
			}
			if strings.Contains(log.String(), strings.Repeat("x", 64)) {
				t.Errorf("the log shows the sub: %.500s…", log)
			}
			access := records(t, log, "request")
			if len(access) != 1 || access[0]["status"] != float64(401) || !strings.Contains(access[0]["err"].(string), "not valid") {
				t.Errorf("access log lines %v, want one of the 401 saying the token is not valid", access)
			}
			refused := records(t, log, "bearer token refused")
			switch {
			case level == slog.LevelInfo && len(refused) != 0:
				t.Errorf("why the token was refused is logged at info: %v", refused)
			case level == slog.LevelDebug && (len(refused) != 1 || !strings.Contains(refused[0]["reason"].(string), "204800 bytes")):
				t.Errorf("at debug, %v; want one line with the reason and the sub's length", refused)
			}
		})
	}
}

// The client's address is X-Forwarded-For's, from a trusted proxy only, and
// never X-Real-IP's, which a trusted proxy that does not set it passes on
// from the client as it came.
func TestClientAddressIsXForwardedForOnly(t *testing.T) {
	for _, tt := range []struct {
		name    string
		trusted []string
		header  map[string]string
		client  string
	}{
		{"X-Real-IP from a trusted proxy", []string{"127.0.0.0/8"}, map[string]string{"X-Real-IP": "203.0.113.7"}, "127.0.0.1"},
		{"X-Forwarded-For from a trusted proxy", []string{"127.0.0.0/8"}, map[string]string{"X-Forwarded-For": "203.0.113.8"}, "203.0.113.8"},
		{"both from a trusted proxy", []string{"127.0.0.0/8"}, map[string]string{"X-Forwarded-For": "203.0.113.8", "X-Real-IP": "203.0.113.7"}, "203.0.113.8"},
		{"X-Forwarded-For, no proxy trusted", nil, map[string]string{"X-Forwarded-For": "203.0.113.8"}, "127.0.0.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url, log := logged(t, slog.LevelDebug, handler.Deps{}, tt.trusted...)
			req, err := http.NewRequest("GET", url+"/healthz", nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if access := records(t, log, "request"); len(access) != 1 || access[0]["client"] != tt.client {
				t.Errorf("access log %v, want the client %s", access, tt.client)
			}
		})
	}
}
