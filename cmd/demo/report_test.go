package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fake returns a result whose verify report broke the named checks.
func fake(r row, orders, oversold int64, broken ...string) result {
	res := result{Row: r, Load: loadResult{Requests: 800, Seconds: 2, Statuses: map[string]int{"201": int(orders)}}}
	res.Verify.Orders, res.Verify.Oversold = orders, oversold
	for _, name := range append(oversellChecks, "one order per (user, sku)", "every acknowledged order exists") {
		c := check{Name: name}
		for _, b := range broken {
			if b == name {
				c.Violations = 1
			}
		}
		res.Verify.Checks = append(res.Verify.Checks, c)
	}
	res.Verify.OK = len(broken) == 0
	return res
}

func TestOutcome(t *testing.T) {
	must := row{Lock: "redis", Update: "naive", Replicas: 3, MustHold: true}
	race := row{Lock: "none", Update: "naive", Replicas: 3}
	const oversell = "initial_stock == stock + orders"
	tests := []struct {
		name    string
		res     result
		verdict string
		outcome string
		failed  bool
	}{
		{"must hold, held", fake(must, 200, 0), "correct", "holds, as it must", false},
		{"must hold, oversold", fake(must, 201, 1, oversell), "OVERSOLD", "FAILED: " + oversell, true},
		{"must hold, sold nothing", fake(must, 0, 0), "correct", "FAILED: nothing sold", true},
		{"race, raced", fake(race, 300, 100, oversell), "OVERSOLD", "oversold, as expected", false},
		{"race, did not", fake(race, 200, 0), "correct", "expected to race; did not race this run", false},
		{"race, lost an ack", fake(race, 300, 100, oversell, "every acknowledged order exists"), "BROKEN",
			"FAILED: every acknowledged order exists", true},
	}
	for _, tt := range tests {
		if got := tt.res.verdict(); got != tt.verdict {
			t.Errorf("%s: verdict %q, want %q", tt.name, got, tt.verdict)
		}
		if got := tt.res.outcome(); got != tt.outcome {
			t.Errorf("%s: outcome %q, want %q", tt.name, got, tt.outcome)
		}
		if got := tt.res.failed(); got != tt.failed {
			t.Errorf("%s: failed %v, want %v", tt.name, got, tt.failed)
		}
	}
}

func TestReport(t *testing.T) {
	o, err := parse([]string{"-skus", "200", "-out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	rows := experiment(o)
	var results []result
	for i, r := range rows {
		res := fake(r, 200, 0)
		if !r.MustHold {
			res = fake(r, 200+int64(i), int64(i), "initial_stock == stock + orders")
		}
		if r.Pause {
			res.Paused = 2 * time.Second
			res.Busy = map[string]int{"lease_lost": 3, "stale_fence": 1}
		}
		if r.Kill {
			res.Killed = 500 * time.Millisecond
		}
		results = append(results, res)
	}

	tbl := table(results)
	if lines := strings.Split(strings.TrimSpace(tbl), "\n"); len(lines) != len(rows)+1 {
		t.Fatalf("table has %d lines, want %d:\n%s", len(lines), len(rows)+1, tbl)
	}
	for _, want := range []string{"redis    guarded", "2s > TTL 500ms", "3 / 1", "oversold, as expected", "holds, as it must",
		"redlock  naive", "master 3 killed at 500ms"} {
		if !strings.Contains(tbl, want) {
			t.Errorf("table lacks %q:\n%s", want, tbl)
		}
	}

	if err := writeReport(o, results, 2); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(md), "\n| "); n != len(rows)+1 {
		t.Errorf("report.md has %d table lines, want %d:\n%s", n, len(rows)+1, md)
	}
	data, err := os.ReadFile(filepath.Join(o.out, "report.png"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if h := img.Bounds().Dy(); h != headerSpace+rowHeight*len(rows)+footerSpace {
		t.Errorf("chart is %d px high, want one band per row", h)
	}
}

func TestParseRefusesPauseWithinTTL(t *testing.T) {
	if _, err := parse([]string{"-ttl", "2s", "-pause", "1s"}); err == nil {
		t.Error("a pause shorter than the TTL was accepted")
	}
	if _, err := parse([]string{"-buyers", "1"}); err == nil {
		t.Error("one buyer per product was accepted: nothing could race")
	}
}

func TestReadEnvFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ports.env")
	os.WriteFile(path, []byte("NGINX_PORT=8080\nREPLICA_PORTS='1 2 3'\n"), 0o644)
	env, err := readEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if env["NGINX_PORT"] != "8080" || env["REPLICA_PORTS"] != "1 2 3" {
		t.Errorf("env = %v", env)
	}
}
