package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"shop/internal/testenv"
)

// SHOP_READY_GRACE defaults to 10s and takes 0 (no grace).
func TestConfigReadyGrace(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]time.Duration{"": 10 * time.Second, "0": 0, "1s": time.Second, "5m": 5 * time.Minute} {
		if got := testConfig(t, map[string]string{"SHOP_READY_GRACE": v}).Stop.ReadyGrace; got != want {
			t.Errorf("SHOP_READY_GRACE=%q: %s; want %s", v, got, want)
		}
	}
}

// wantNeverReady starts newReadiness's probes with vars, on the real
// servers they name, and fails unless they find dep failing, and still
// failing three probes later, whatever the grace. It returns what names the
// failing dependencies, for the test to go on asking.
func wantNeverReady(t *testing.T, vars map[string]string, dep string) func() []string {
	t.Helper()
	cfg := testConfig(t, vars)
	rdb := newRedis(cfg.Redis)
	t.Cleanup(func() { rdb.Close() })
	failing, stop, err := newReadiness(context.Background(), cfg, rdb, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	waitFor(t, 15*time.Second, dep+" found failing at start", failingOnly(failing, dep))
	time.Sleep(3 * time.Second) // three probes, well inside the grace of 10 s
	if got := failing(); !slices.Equal(got, []string{dep}) {
		t.Fatalf("%s never reached, 3 s later: failing %q; want %s", dep, got, dep)
	}
	return failing
}

// A replica started while Redis, or MySQL, does not answer is not ready,
// however long its grace: it has no answer to ride out a blip on. It is
// ready once the dependency answers. The probes are newReadiness's, on real
// servers.
func TestReadinessWaitsForAFirstAnswer(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		r := testenv.StartRedis(t)
		r.Kill()
		failing := wantNeverReady(t, map[string]string{"SHOP_MYSQL_DSN": db.DSN, "SHOP_REDIS_ADDR": r.Addr, "SHOP_PAYMENT_WEBHOOK_SECRET": testWebhookSecret}, "redis")
		r.Restart()
		waitFor(t, 15*time.Second, "nothing failing once Redis started", failingOnly(failing))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := ln.Addr().String()
		ln.Close()
		wantNeverReady(t, map[string]string{
			"SHOP_MYSQL_DSN":  fmt.Sprintf("root@tcp(%s)/shop?parseTime=true", closed),
			"SHOP_REDIS_ADDR": testenv.RedisAddr(t),

			"SHOP_PAYMENT_WEBHOOK_SECRET": testWebhookSecret,
		}, "mysql")
	})
}

// failingOnly is what checks that failing names deps, and only them.
func failingOnly(failing func() []string, deps ...string) func() error {
	return func() error {
		if got := failing(); !slices.Equal(got, deps) {
			return fmt.Errorf("failing %q; want %q", got, deps)
		}
		return nil
	}
}

// readyzPoll is what polling /readyz every 100ms saw.
type readyzPoll struct {
	polls int
	// unready are the answers that were not 200, in order, as status and
	// body.
	unready []string
	// unanswered are the polls that got no answer within 2 s, as the
	// transport's error: on a loaded machine the replica may not be
	// scheduled in time. They say nothing of readiness (the answer does no
	// I/O), so they are logged, not judged.
	unanswered []string
}

// answered is how many polls got an answer.
func (p readyzPoll) answered() int { return p.polls - len(p.unanswered) }

// pollReadyz asks c's /readyz every 100ms, each time for at most 2 s,
// until stop is closed.
func pollReadyz(c *client, stop <-chan struct{}) <-chan readyzPoll {
	c = c.using(&http.Client{Timeout: 2 * time.Second})
	out := make(chan readyzPoll, 1)
	go func() {
		var p readyzPoll
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				out <- p
				return
			case <-tick.C:
			}
			p.polls++
			r := c.readyz()
			switch {
			case r.err != nil:
				p.unanswered = append(p.unanswered, r.err.Error())
			case r.status != http.StatusOK:
				p.unready = append(p.unready, fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.raw)))
			}
		}
	}()
	return out
}

// The acceptance test of the grace: a replica of a private Redis that stops
// for 5 s — frozen (SIGSTOP: connections open, nothing answered) or killed
// and started again on its port — stays ready throughout with the default
// grace of 10 s, asked every 100ms; with SHOP_READY_GRACE=1s the same stop
// makes it answer 503 naming redis, and it is ready again once Redis is
// back.
func TestReadyzThroughARedisStop(t *testing.T) {
	t.Parallel()
	const outage = 5 * time.Second
	stops := map[string]func(r *testenv.RedisProc) (resume func()){
		"paused": func(r *testenv.RedisProc) func() { r.Pause(); return r.Resume },
		"killed": func(r *testenv.RedisProc) func() { r.Kill(); return r.Restart },
	}
	db := testenv.MySQL(t)
	for _, tc := range []struct {
		stop  string
		grace string // SHOP_READY_GRACE; empty is the default
	}{
		{"paused", ""}, {"killed", ""}, {"paused", "1s"}, {"killed", "1s"},
	} {
		name := tc.stop + ", grace " + tc.grace
		if tc.grace == "" {
			name = tc.stop + ", default grace"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := testenv.StartRedis(t)
			t.Cleanup(r.Resume) // before the kill of StartRedis's cleanup
			vars := fleetVars(t, db, map[string]string{"SHOP_REDIS_ADDR": r.Addr})()
			if tc.grace != "" {
				vars["SHOP_READY_GRACE"] = tc.grace
			}
			rep := startReplica(t, vars)

			stopPolling := make(chan struct{})
			polled := pollReadyz(rep.public, stopPolling)
			time.Sleep(time.Second)
			resume := stops[tc.stop](r)
			time.Sleep(outage)
			resume()
			var p readyzPoll
			if tc.grace == "" {
				// Ready all along, until a second after Redis is back.
				time.Sleep(time.Second)
				close(stopPolling)
				p = <-polled
				if len(p.unready) > 0 {
					t.Errorf("a %s Redis stop with the default grace: %d of %d answers not 200, first %q", outage, len(p.unready), p.polls, p.unready[0])
				}
			} else {
				// Back to 200 within 10 s of Redis's return.
				waitFor(t, 10*time.Second, "ready again once Redis came back", func() error {
					return rep.public.readyz().expect(http.StatusOK)
				})
				close(stopPolling)
				p = <-polled
				if len(p.unready) == 0 {
					t.Fatalf("a %s Redis stop with SHOP_READY_GRACE=%s: all %d answers 200; want 503 past the grace", outage, tc.grace, p.answered())
				}
				for _, u := range p.unready {
					if !strings.HasPrefix(u, "503 ") || !strings.Contains(u, "redis") || strings.Contains(u, "mysql") {
						t.Errorf("answer past the grace: %q; want 503 naming redis only", u)
						break
					}
				}
			}
			if p.answered() < int(outage/(500*time.Millisecond)) {
				t.Errorf("only %d of %d polls of /readyz answered in %s", p.answered(), p.polls, outage)
			}
			t.Logf("%d polls, %d not 200 (first %q), %d unanswered (first %q)",
				p.polls, len(p.unready), first(p.unready), len(p.unanswered), first(p.unanswered))
		})
	}
}

// first is s's first element, or "" when it has none.
func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
