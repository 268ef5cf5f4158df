package requestid_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"shop/internal/requestid"
)

var generated = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestChoose(t *testing.T) {
	long := strings.Repeat("a", 128)
	for _, id := range []string{"0123456789abcdef0123456789abcdef", "a", long, "A.b_c:d-E", "550e8400-e29b-41d4-a716-446655440000"} {
		if got := requestid.Choose([]string{id}); got != id {
			t.Errorf("Choose(%q) = %q, want it kept", id, got)
		}
	}
	for _, values := range [][]string{nil, {""}, {long + "a"}, {"a b"}, {"a/b"}, {`a"b`}, {"a\nb"}, {"ключ"}, {"a+b"}, {"x", "y"}, {"x", "x"}} {
		got := requestid.Choose(values)
		if !generated.MatchString(got) {
			t.Errorf("Choose(%q) = %q, want a new id of 32 lowercase hex digits", values, got)
		}
	}
	if a, b := requestid.New(), requestid.New(); a == b {
		t.Errorf("two new ids are both %q", a)
	}
}

// Every record logged with a context that carries an id has it, through
// loggers derived with With too; a record without one is left alone.
func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(requestid.LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	ctx := requestid.NewContext(context.Background(), "abc-1")
	log.InfoContext(ctx, "with id", "k", 1)
	log.Log(context.WithoutCancel(ctx), slog.LevelWarn, "derived context")
	log.Info("without context")
	log.InfoContext(context.Background(), "context without id")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := map[string]string{"with id": "abc-1", "derived context": "abc-1", "without context": "", "context without id": ""}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		id, has := rec[requestid.Key]
		switch w := want[rec["msg"].(string)]; {
		case w == "" && has:
			t.Errorf("line without a request has request_id %v: %s", id, line)
		case w != "" && id != w:
			t.Errorf("request_id = %v, want %q: %s", id, w, line)
		}
		if rec["component"] != "test" {
			t.Errorf("the logger's own attributes are lost: %s", line)
		}
	}
	if n := strings.Count(buf.String(), `"request_id"`); n != 2 {
		t.Errorf("request_id appears %d times, want 2 (once on each line with an id):\n%s", n, buf.String())
	}
}
