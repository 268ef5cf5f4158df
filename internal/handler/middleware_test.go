package handler_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/handler"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// panickingOrder is an order that panics.
func panickingOrder(context.Context, int64, int64, string) (stock.Order, error) {
	panic("out of order")
}

// A panic is logged with the stack of the goroutine that panicked, which
// names the function that did; the client gets the JSON 500 and neither.
func TestPanicIsLoggedWithItsStack(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	log := &testenv.Log{}
	srv := serve(t, both(handler.New(handler.Deps{
		Logger:   slog.New(slog.NewJSONHandler(log, nil)),
		Orders:   orderFunc(panickingOrder),
		Registry: prometheus.NewRegistry(),
	}, handler.Settings{})))
	r := send(t, "POST", srv.URL+"/api/v1/orders", `{"sku_id":1,"user_id":1}`, "panic-stack")
	answer := response{status: r.status, raw: r.body}
	if err := json.Unmarshal([]byte(r.body), &answer.body); err != nil {
		t.Fatalf("%d: body is not JSON: %q", r.status, r.body)
	}
	if code := errorCode(t, answer); r.status != 500 || code != "internal" {
		t.Errorf("answer %d %s, want 500 internal", r.status, r.body)
	}
	for _, leak := range []string{"out of order", "panickingOrder", "goroutine", ".go:"} {
		if strings.Contains(r.body, leak) {
			t.Errorf("the answer shows %q: %s", leak, r.body)
		}
	}

	var stack string
	for line := range strings.Lines(log.String()) {
		var rec struct {
			Msg, Panic, Stack string
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if rec.Msg == "panic" && rec.Panic == "out of order" {
			stack = rec.Stack
		}
	}
	if !strings.Contains(stack, "handler_test.panickingOrder(") {
		t.Errorf("the panic's log line has no stack naming panickingOrder: %q\nlog:\n%s", stack, log)
	}
}
