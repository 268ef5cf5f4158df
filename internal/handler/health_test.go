package handler_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"shop/internal/handler"
)

// /readyz answers what Ready says, naming the dependencies that keep the
// replica from serving, and 503 once the replica stops whatever Ready says.
func TestReadyz(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	tests := []struct {
		name     string
		ready    func() []string
		stopping bool
		status   int
		// want is in the body.
		want string
	}{
		{"no readiness wired", nil, false, 200, `"ok"`},
		{"ready", func() []string { return nil }, false, 200, `"ok"`},
		{"one failing", func() []string { return []string{"mysql"} }, false, 503, "a dependency does not answer: mysql"},
		{"both failing", func() []string { return []string{"mysql", "redis"} }, false, 503, "mysql, redis"},
		{"stopping", func() []string { return nil }, true, 503, "shutting down"},
		{"stopping and failing", func() []string { return []string{"redis"} }, true, 503, "shutting down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := handler.New(handler.Deps{Ready: tt.ready, Stopping: func() bool { return tt.stopping }}, handler.Settings{}).Public
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != tt.status || !strings.Contains(rec.Body.String(), tt.want) {
				t.Errorf("%d %s; want %d with %q", rec.Code, rec.Body, tt.status, tt.want)
			}
			if tt.status == 503 && rec.Header().Get("Retry-After") == "" {
				t.Error("503 without Retry-After")
			}
		})
	}
}
