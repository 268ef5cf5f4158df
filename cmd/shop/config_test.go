package main

import (
	"context"
	"maps"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"shop/internal/testenv"
)

// serveBase returns the settings serveWith starts from: the test's own
// database and Redis key space, so that a value wrongly taken for good
// reaches no server the user runs, a free loopback port and no drain.
func serveBase(t *testing.T) map[string]string {
	t.Helper()
	return fleetVars(t, testenv.MySQL(t), map[string]string{"SHOP_HTTP_ADDR": "127.0.0.1:0", "SHOP_DRAIN": "0s"})()
}

// serveWith runs `shop serve` with the settings base and vars on a context
// cancelled before it starts, and returns its exit code and output: a
// configuration it takes for good ends it at once with exit 0, without
// leaving a server running, and a bad one with exit 2.
func serveWith(base, vars map[string]string) (int, string) {
	all := maps.Clone(base)
	maps.Copy(all, vars)
	// A testenv.Log: what serve started may still log after it returned.
	out := &testenv.Log{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := run(ctx, []string{"serve"}, env(all), out, out)
	return exitCode(err, out), out.String()
}

// Every address variable is host:port with a numeric port, without a
// scheme, and a list names each server once; a listener's address may leave
// out the host and take port 0. The admin token has no white space around
// it. Each bad value stops `shop serve` with exit 2 and a message naming its
// variable and what is wrong.
func TestConfigAddressesAndToken(t *testing.T) {
	t.Parallel()
	const (
		token = "sixteen-chars-and-more"
		// password is in a URL given for an address.
		password   = "s3cretpw"
		dialPort   = "the port must be a number from 1 to 65535"
		listenPort = "the port must be a number from 0 to 65535"
	)
	base := serveBase(t)
	bad := []struct {
		name, value string
		// want is in the message.
		want string
	}{
		{"SHOP_REDIS_ADDR", "redis://h:6379", `drop the scheme "redis://"`},
		{"SHOP_REDIS_ADDR", "redis://:" + password + "@h:6379/0", `drop the scheme "redis://"`},
		{"SHOP_REDIS_ADDR", "h:", dialPort},
		{"SHOP_REDIS_ADDR", "h:abc", dialPort},
		{"SHOP_REDIS_ADDR", "h:0", dialPort},
		{"SHOP_REDIS_ADDR", "h:65536", dialPort},
		{"SHOP_REDIS_ADDR", "h:+6379", dialPort},
		{"SHOP_REDIS_ADDR", ":6379", "names no host"},
		{"SHOP_REDIS_ADDR", "h:6379:1", "must be host:port"},
		{"SHOP_REDIS_ADDR", "a:7000,b:7001,a:7000", `"a:7000" is listed twice`},
		{"SHOP_REDIS_ADDR", "a:7000, a:7000 ", `"a:7000" is listed twice`},
		{"SHOP_REDIS_ADDR", "127.0.0.1:7000,b:x", `"b:x": the port`},
		{"SHOP_REDLOCK_ADDRS", "a:1,b:2,a:1", `"a:1" is listed twice: a master listed twice counts twice towards a majority`},
		{"SHOP_REDLOCK_ADDRS", "redis://a:1,b:2,c:3", `drop the scheme "redis://"`},
		{"SHOP_REDLOCK_ADDRS", "a:1,b:,c:3", dialPort},
		{"SHOP_REDLOCK_ADDRS", "a:1,:2,c:3", "names no host"},
		{"SHOP_ETCD_ENDPOINTS", "http://a:2379", `drop the scheme "http://"`},
		{"SHOP_ETCD_ENDPOINTS", "a:2379,a:2379", `"a:2379" is listed twice`},
		{"SHOP_ETCD_ENDPOINTS", "", "etcd mode needs the members"},
		{"SHOP_ZK_SERVERS", "a:2181,b:", dialPort},
		{"SHOP_ZK_SERVERS", "", "zookeeper mode needs the servers"},
		{"SHOP_HTTP_ADDR", "h:abc", listenPort},
		{"SHOP_HTTP_ADDR", ":65536", listenPort},
		{"SHOP_HTTP_ADDR", "127.0.0.1:-1", listenPort},
		{"SHOP_HTTP_ADDR", "http://127.0.0.1:8080", `drop the scheme "http://"`},
		{"SHOP_HTTP_ADDR", "8080", "must be [host]:port"},
		{"SHOP_DEBUG_ADDR", "127.0.0.1:abc", listenPort},
		{"SHOP_DEBUG_ADDR", "localhost:", listenPort},
		{"SHOP_DEBUG_ADDR", "127.0.0.1:70000", listenPort},
		{"SHOP_DEBUG_ADDR", "http://127.0.0.1:6060", `drop the scheme "http://"`},
		{"SHOP_DEBUG_ADDR", ":0", "must be a loopback host:port"},
		{"SHOP_ADMIN_TOKEN", " " + token, "white space"},
		{"SHOP_ADMIN_TOKEN", token + "\n", "white space"},
		{"SHOP_ADMIN_TOKEN", "\t" + token + " ", "white space"},
	}
	for _, tt := range bad {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			vars := map[string]string{tt.name: tt.value}
			switch tt.name {
			case "SHOP_REDLOCK_ADDRS":
				vars["SHOP_LOCK_MODE"] = "redlock"
			case "SHOP_ETCD_ENDPOINTS":
				vars["SHOP_LOCK_MODE"] = "etcd"
			case "SHOP_ZK_SERVERS":
				vars["SHOP_LOCK_MODE"] = "zookeeper"
			}
			code, out := serveWith(base, vars)
			if code != 2 {
				t.Errorf("exit code %d, want 2:\n%s", code, out)
			}
			if !strings.Contains(out, tt.name) || !strings.Contains(out, tt.want) {
				t.Errorf("message does not name %s with %q:\n%s", tt.name, tt.want, out)
			}
			// Secrets stay out of the message.
			for _, secret := range []string{password, token} {
				if strings.Contains(out, secret) {
					t.Errorf("message shows %q:\n%s", secret, out)
				}
			}
		})
	}

	// Good values start the service on the test's servers.
	single := testenv.TopologyNamed(t, "single").Addrs[0]
	cluster := testenv.TopologyNamed(t, "cluster")
	_, port, _ := net.SplitHostPort(single)
	good := []map[string]string{
		{"SHOP_REDIS_ADDR": single},
		{"SHOP_REDIS_ADDR": "localhost:" + port},
		{"SHOP_REDIS_ADDR": " " + strings.Join(cluster.Addrs, ", ") + ","},
		testenv.TopologyNamed(t, "sentinel").Env(),
		{"SHOP_LOCK_MODE": "redlock", "SHOP_REDLOCK_ADDRS": strings.Join(cluster.Addrs, ",")},
		{"SHOP_HTTP_ADDR": "localhost:0"},
		{"SHOP_DEBUG_ADDR": "127.0.0.1:0"},
		{"SHOP_DEBUG_ADDR": "localhost:0"},
		{"SHOP_ADMIN_TOKEN": token},
		{"SHOP_ADMIN_TOKEN": "correct horse battery staple"},
	}
	for _, g := range good {
		if code, out := serveWith(base, g); code != 0 || !listenRE.MatchString(out) {
			t.Errorf("%q: exit code %d, want 0 after listening:\n%s", g, code, out)
		}
	}
	// Listeners on every interface: checked, not started.
	for _, addr := range []string{":0", ":8080", "0.0.0.0:8080", "[::]:65535"} {
		if _, err := loadConfig(env(map[string]string{"SHOP_HTTP_ADDR": addr})); err != nil {
			t.Errorf("SHOP_HTTP_ADDR=%q rejected: %v", addr, err)
		}
	}
}

// Every bad value is reported at once, each naming its variable.
func TestConfigReportsEveryBadAddressAtOnce(t *testing.T) {
	t.Parallel()
	code, out := serveWith(serveBase(t), map[string]string{
		"SHOP_REDIS_ADDR":    "redis://h:6379",
		"SHOP_REDLOCK_ADDRS": "a:1,a:1",
		"SHOP_HTTP_ADDR":     "h:abc",
		"SHOP_DEBUG_ADDR":    "127.0.0.1:abc",
		"SHOP_ADMIN_TOKEN":   "sixteen-chars-and-more\n",
	})
	if code != 2 {
		t.Errorf("exit code %d, want 2:\n%s", code, out)
	}
	for _, name := range []string{"SHOP_REDIS_ADDR", "SHOP_REDLOCK_ADDRS", "SHOP_HTTP_ADDR", "SHOP_DEBUG_ADDR", "SHOP_ADMIN_TOKEN"} {
		if !strings.Contains(out, name+": ") {
			t.Errorf("%s not reported:\n%s", name, out)
		}
	}
}

var debugListenRE = regexp.MustCompile(`"msg":"debug listener","addr":"([^"]+)"`)

// SHOP_DEBUG_ADDR's port 0 is logged as the port bound, where pprof
// answers.
func TestDebugListenerLogsTheAddressBound(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	r := startReplica(t, fleetVars(t, db, map[string]string{"SHOP_DEBUG_ADDR": "127.0.0.1:0"})())
	waitFor(t, 5*time.Second, "the debug listener logged", logged(r.log, debugListenRE))
	addr := debugListenRE.FindStringSubmatch(r.log.String())[1]
	if strings.HasSuffix(addr, ":0") {
		t.Fatalf("debug listener logged %q, not the port it bound", addr)
	}
	pprof := newClient("http://" + addr).using(&http.Client{Timeout: 5 * time.Second})
	if a := pprof.send("GET", "/debug/pprof/", ""); a.expect(http.StatusOK) != nil {
		t.Errorf("GET /debug/pprof/ on the logged %s: %v", addr, a)
	}
}

// A payment window is paid only by the provider's signed events: without
// the provider's secret, serve refuses to start and names what is missing;
// with SHOP_PAY_WINDOW=0 it starts without (orders are paid when placed).
// Stripe mode needs its two secrets.
func TestConfigPaymentsNeedASecret(t *testing.T) {
	t.Parallel()
	base := serveBase(t)
	delete(base, "SHOP_PAYMENT_WEBHOOK_SECRET")
	for _, c := range []struct {
		vars    map[string]string
		code    int
		missing []string
	}{
		{map[string]string{}, 2, []string{"SHOP_PAYMENT_WEBHOOK_SECRET", "SHOP_PAY_WINDOW"}},
		{map[string]string{"SHOP_PAY_WINDOW": "0"}, 0, nil},
		{map[string]string{"SHOP_PAYMENTS": "stripe"}, 2, []string{"SHOP_STRIPE_SECRET_KEY", "SHOP_STRIPE_WEBHOOK_SECRET"}},
		{map[string]string{"SHOP_PAYMENTS": "stripe", "SHOP_STRIPE_SECRET_KEY": "sk_test_1"}, 2, []string{"SHOP_STRIPE_WEBHOOK_SECRET"}},
		{map[string]string{"SHOP_PAYMENT_WEBHOOK_SECRET": testWebhookSecret}, 0, nil},
	} {
		code, out := serveWith(base, c.vars)
		if code != c.code {
			t.Errorf("%v: exit %d, want %d:\n%s", c.vars, code, c.code, out)
		}
		for _, name := range c.missing {
			if !strings.Contains(out, name) {
				t.Errorf("%v: the message does not name %s:\n%s", c.vars, name, out)
			}
		}
	}
}

// Settings a replica serves with but which are unsafe where other hosts'
// clients reach it are warned of at start-up, each naming its variables:
// no authentication, a short admin token, and a per-address rate limit
// whose addresses would all be a proxy's. A loopback listener, the
// settings that fix each, or a token of 32 characters, warn of nothing.
func TestStartupWarnings(t *testing.T) {
	t.Parallel()
	base := serveBase(t)
	const (
		auth  = "SHOP_AUTH=none on a listener that is not loopback"
		token = "SHOP_ADMIN_TOKEN is short"
		rate  = "SHOP_RATE_IP is on, and SHOP_TRUSTED_PROXIES trusts only loopback"
	)
	short := "sixteen-chars..." + strings.Repeat("x", 15) // 31
	for _, c := range []struct {
		vars map[string]string
		want []string
	}{
		{map[string]string{}, nil},
		{map[string]string{"SHOP_HTTP_ADDR": ":0"}, []string{auth}},
		{map[string]string{"SHOP_HTTP_ADDR": "0.0.0.0:0", "SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret}, nil},
		{map[string]string{"SHOP_ADMIN_TOKEN": short}, []string{token}},
		{map[string]string{"SHOP_ADMIN_TOKEN": short + "x"}, nil},
		{map[string]string{"SHOP_HTTP_ADDR": ":0", "SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_RATE_IP": "10"}, []string{rate}},
		{map[string]string{"SHOP_HTTP_ADDR": ":0", "SHOP_RATE_IP": "10", "SHOP_TRUSTED_PROXIES": "127.0.0.1, ::1", "SHOP_ADMIN_TOKEN": short}, []string{auth, token, rate}},
		{map[string]string{"SHOP_HTTP_ADDR": ":0", "SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_RATE_IP": "10", "SHOP_TRUSTED_PROXIES": "10.0.0.0/8"}, nil},
		{map[string]string{"SHOP_HTTP_ADDR": ":0", "SHOP_AUTH": "jwt", "SHOP_JWT_SECRET": authSecret, "SHOP_RATE_IP": "10", "SHOP_TRUSTED_PROXIES": "127.0.0.0/7"}, nil},
		{map[string]string{"SHOP_RATE_IP": "10"}, nil},
	} {
		code, out := serveWith(base, c.vars)
		if code != 0 || !listenRE.MatchString(out) {
			t.Errorf("%v: exit code %d, want 0 after listening:\n%s", c.vars, code, out)
			continue
		}
		var warned []string
		for line := range strings.Lines(out) {
			if strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, `"msg":"SHOP_`) {
				warned = append(warned, line)
			}
		}
		for _, w := range c.want {
			if !strings.Contains(strings.Join(warned, ""), w) {
				t.Errorf("%v: no warning %q in:\n%s", c.vars, w, out)
			}
		}
		if len(warned) != len(c.want) {
			t.Errorf("%v: warned %q, want %q", c.vars, warned, c.want)
		}
		if strings.Contains(out, short) {
			t.Errorf("%v: the log shows the admin token", c.vars)
		}
	}
}
