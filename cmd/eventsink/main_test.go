package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"shop/internal/eventsink"
)

var secret = "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x3c}, 32))

// delivery is an acknowledged delivery of stream/seq that arrived at ms.
func delivery(stream string, seq int64, ms int) eventsink.Delivery {
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	return eventsink.Delivery{
		WebhookID: stream + "/" + strconv.FormatInt(seq, 10), Type: "order.paid", Stream: stream, Sequence: seq,
		OccurredAt: t0, Arrived: t0.Add(time.Duration(ms) * time.Millisecond),
		Answered: t0.Add(time.Duration(ms+1) * time.Millisecond), Status: 200,
	}
}

func TestSummaryExitCode(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, record ...eventsink.Delivery) string {
		var b bytes.Buffer
		if err := eventsink.WriteRecord(&b, record); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cases := []struct {
		name string
		path string
		code int
	}{
		{"ordered, one duplicate", write("ok", delivery("order:1", 1, 0), delivery("order:1", 1, 5), delivery("order:1", 2, 10)), 0},
		{"out of order", write("late", delivery("order:1", 1, 0), delivery("order:1", 2, 10), delivery("order:1", 1, 20)), 1},
		{"gap", write("gap", delivery("order:1", 1, 0), delivery("order:1", 3, 10)), 1},
		{"no such file", filepath.Join(dir, "none"), 2},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		code := run(t.Context(), []string{"-summary", c.path}, noEnv, &out, &errOut)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d (%s)", c.name, code, c.code, errOut.String())
		}
		if c.code == 2 {
			continue
		}
		var sum eventsink.Summary
		if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
			t.Errorf("%s: output %q: %v", c.name, out.String(), err)
		}
		if sum.Acknowledged < 2 || sum.OK != (c.code == 0) {
			t.Errorf("%s: summary %+v", c.name, sum)
		}
	}
}

func TestServesUntilCancelled(t *testing.T) {
	record := filepath.Join(t.TempDir(), "record.jsonl")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out, outW := io.Pipe()
	var errOut bytes.Buffer
	code := make(chan int, 1)
	env := func(k string) string {
		if k == envSecret {
			return secret
		}
		return ""
	}
	go func() {
		code <- run(ctx, []string{"-record", record, "-fail-first", "1"}, env, outW, &errOut)
		outW.Close()
	}()
	lines := bufio.NewScanner(out)
	urls := map[string]string{}
	for range 2 {
		if !lines.Scan() {
			t.Fatalf("the addresses were not printed: %s", errOut.String())
		}
		name, url, _ := strings.Cut(lines.Text(), " ")
		urls[name] = url
	}
	if !strings.HasSuffix(urls["control"], "/control/") || !strings.HasPrefix(urls["events"], "http://127.0.0.1:") {
		t.Fatalf("printed %v", urls)
	}

	// -fail-first 1, then an answer; the secret came from the environment.
	for _, want := range []int{500, 200} {
		if got := post(t, urls["events"]); got != want {
			t.Errorf("status %d, want %d", got, want)
		}
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit %d: %s", c, errOut.String())
	}
	got, err := eventsink.ReadRecordFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Status != 500 || got[1].Status != 200 || got[1].Stream != "order:9" {
		t.Errorf("record %+v", got)
	}
}

func TestRefusesNoSecret(t *testing.T) {
	var errOut bytes.Buffer
	if code := run(t.Context(), nil, noEnv, io.Discard, &errOut); code != 2 || !strings.Contains(errOut.String(), "secret") {
		t.Errorf("exit %d: %s", code, errOut.String())
	}
}

func noEnv(string) string { return "" }

// post delivers one signed event to url and returns the status.
func post(t *testing.T, url string) int {
	t.Helper()
	id := "evt-9-1"
	body := []byte(`{"event_id":"evt-9-1","type":"order.reserved","schema_version":1,"occurred_at":"2025-06-01T12:00:00.000001Z","stream":"order:9","data":{"sequence":1}}`)
	req, err := eventsink.SignedRequest(t.Context(), url, secret, id, time.Now(), body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
