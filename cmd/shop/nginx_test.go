package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"shop/internal/handler"
	"shop/internal/testenv"
	"shop/loadtest/slowclient"
)

const nginxConf = "../../deploy/nginx.conf"

// nginxDirective returns the value of the first directive name in
// deploy/nginx.conf, inside the block that opens with block (or anywhere
// when block is empty), as a duration.
func nginxDirective(t *testing.T, block, name string) time.Duration {
	t.Helper()
	return nginxTime(t, nginxValue(t, block, name))
}

// nginxValue returns the value of the first directive name of one value
// in deploy/nginx.conf, inside the block that opens with block (or
// anywhere when block is empty).
func nginxValue(t *testing.T, block, name string) string {
	t.Helper()
	f, err := os.Open(nginxConf)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	depth, inside := 0, block == ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(strings.TrimSuffix(strings.TrimSpace(line), ";"))
		switch {
		case block != "" && strings.HasPrefix(strings.TrimSpace(line), block+" "):
			inside, depth = true, 0
		case inside && len(fields) == 2 && fields[0] == name:
			return fields[1]
		}
		depth += strings.Count(line, "{") - strings.Count(line, "}")
		if block != "" && inside && depth <= 0 && strings.Contains(line, "}") {
			inside = false
		}
	}
	t.Fatalf("%s: no %s in %q", nginxConf, name, block)
	return ""
}

// nginxTime reads an nginx time: a number of seconds, or with a unit.
func nginxTime(t *testing.T, v string) time.Duration {
	t.Helper()
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: time %q: %v", nginxConf, v, err)
	}
	return d
}

// nginx must wait for an order longer than the order can take, or it
// answers 504 for an order that was placed; and it must close its idle
// connections to a replica before a stopping replica's drain ends, or the
// replica closes them under nginx's requests.
func TestNginxTimeoutsFitTheService(t *testing.T) {
	t.Parallel()
	if read := nginxDirective(t, "server", "proxy_read_timeout"); read <= handler.OrderBudget {
		t.Errorf("proxy_read_timeout %s; want above the order budget, %s", read, handler.OrderBudget)
	}
	if idle := nginxDirective(t, "upstream shop", "keepalive_timeout"); idle >= defaultDrain {
		t.Errorf("upstream keepalive_timeout %s; want below shop's drain, %s", idle, defaultDrain)
	}
	if writeTimeout <= handler.OrderBudget {
		t.Errorf("the server's WriteTimeout %s cuts orders short: the order budget is %s", writeTimeout, handler.OrderBudget)
	}
}

// nginxBin finds nginx where make test installs it. -short runs, which
// start no servers, skip a test that needs it.
func nginxBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("nginx is a server; -short runs skip tests that need servers")
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx", "/opt/homebrew/bin/nginx"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("nginx not found: make test installs it")
	return ""
}

// frontNginx is nginx from deploy/nginx.conf in front of replicas.
type frontNginx struct {
	*client
	dir  string
	port string
	cmd  *exec.Cmd
}

// configure writes the configuration with upstreams (host:port) as the
// replicas.
func (n *frontNginx) configure(t *testing.T, upstreams ...string) {
	t.Helper()
	var servers strings.Builder
	for _, u := range upstreams {
		fmt.Fprintf(&servers, "server %s max_fails=1 fail_timeout=2s; ", u) // as scripts/stack.sh writes them
	}
	tmpl, err := os.ReadFile(nginxConf)
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer("${NGINX_LISTEN}", "127.0.0.1:"+n.port, "${NGINX_DIR}", n.dir,
		"${NGINX_LOG_DIR}", n.dir, "${SHOP_UPSTREAMS}", servers.String()).Replace(string(tmpl))
	if err := os.WriteFile(filepath.Join(n.dir, "nginx.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startNginx runs deploy/nginx.conf on a free loopback port in front of the
// replicas at upstreams (host:port); it stops when the test ends.
func startNginx(t *testing.T, upstreams ...string) *frontNginx {
	t.Helper()
	bin := nginxBin(t)
	dir := t.TempDir()
	port := strings.TrimPrefix(deadAddr(t), "127.0.0.1:")
	n := &frontNginx{client: newClient("http://127.0.0.1:" + port), dir: dir, port: port}
	n.configure(t, upstreams...)
	path := filepath.Join(dir, "nginx.conf")
	opts := "daemon off;"
	if os.Getuid() == 0 {
		opts += " user root;"
	}
	cmd := exec.Command(bin, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", path, "-g", opts)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.cmd = cmd
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGQUIT)
		cmd.Wait()
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx error.log:\n%s", log)
		}
	})
	waitFor(t, 10*time.Second, "nginx listening", func() error {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			return fmt.Errorf("%w; error.log:\n%s", err, log)
		}
		return c.Close()
	})
	return n
}

// /metrics shows the runtime of the process and is for Prometheus, which
// scrapes each replica's operators' listener: through nginx it does not
// exist, in the API's error shape; on the operators' listener it is served.
func TestNginxHidesMetrics(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	r := startReplica(t, fleetVars(t, db, nil)())
	front := startNginx(t, r.addr())
	waitReady(t, front.client)

	wantNotFound(t, front.client, "/metrics", "/metrics?name[]=go_goroutines", "//metrics", "/%6Detrics")
	if m := r.admin.metrics(); m.expect(200) != nil || !bytes.Contains(m.raw, []byte("shop_http_requests_total")) {
		t.Errorf("GET /metrics on the replica's operators' listener: %d %v; want the metrics", m.status, m.err)
	}
}

// TestStopBehindNginxDropsNoOrder stops one of two replicas while buyers
// order through nginx, which is not told (nginx without health checks keeps
// choosing the replica): the replica stops accepting at once, so nginx
// sends new connections to the other one — a refused connection carried no
// request — and serves what it has on the connections open, each answer
// closing its connection. No buyer sees a 502, a 504 or a broken
// connection, and every acknowledged order is in MySQL.
func TestStopBehindNginxDropsNoOrder(t *testing.T) {
	t.Parallel()
	crowded(t)
	// The buyers order before SKUs, then on while the replica stops, and
	// after more once it has gone; the catalog has more than they need.
	const skus, before, after = 2000, 500, 200
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", fmt.Sprint(skus), "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	vars := fleetVars(t, db, map[string]string{"SHOP_DRAIN": defaultDrain.String()})
	stopping, staying := startReplica(t, vars()), startReplica(t, vars())
	front := startNginx(t, stopping.addr(), staying.addr())
	waitReady(t, front.client)

	crowd := crowdClient(60 * time.Second)
	t.Cleanup(crowd.CloseIdleConnections)
	tl := &tally{status: map[int]int{}}
	skusc, wait := buyers(32, front.using(crowd), tl)
	stopped := make(chan time.Duration, 1)
	gone := make(chan struct{})
	stop := func() { // under load
		start := time.Now()
		stopping.stop()
		<-stopping.done
		stopping.done <- nil // for the cleanup
		stopped <- time.Since(start)
		close(gone)
	}
	for sku, left := 1, after; sku <= skus && left > 0; sku++ {
		if sku == before {
			go stop()
		}
		select {
		case <-gone:
			left--
		default:
		}
		skusc <- sku
	}
	close(skusc)
	wait()
	took := <-stopped
	if tl.status[201] == 0 || tl.errs != 0 || len(tl.status) != 1 {
		t.Errorf("answers through nginx: %v, transport errors %d; want only 201s; first others: %v", tl.status, tl.errs, tl.others)
	}
	if code, out := shop(t, db, "verify", "--acks", acksFile(t, tl.acks)); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
	if took >= defaultDrain {
		t.Errorf("the replica took %s to stop: its drain should end when nginx has closed its connections", took)
	}
	t.Logf("%d orders through nginx while a replica stopped in %s: %v", len(tl.acks), took.Round(time.Millisecond), tl.status)
}

// A COMMIT that MySQL carries out but whose answer does not come (here the
// proxy between the replica and MySQL holds it, as a stalled network or a
// hung fsync would) is given up on within the orders' pool's read timeout:
// every buyer behind nginx gets the service's own answer — its order, or
// 503 outcome_unknown — before nginx gives up on the replica and answers
// 504, and every acknowledged order is in MySQL.
func TestStalledCommitAnsweredBeforeNginxGivesUp(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", "100"); code != 0 {
		t.Fatal(out)
	}
	proxy, dsn := proxiedMySQL(t, db)
	r := startReplica(t, fleetVars(t, &testenv.DB{DSN: dsn}, nil)())
	front := startNginx(t, r.addr())
	waitReady(t, front.client)
	held, release := proxy.HoldReply(testenv.MySQLQuery("COMMIT"))
	defer release(false)

	buyer := front.using(&http.Client{Timeout: time.Minute})
	readTimeout := nginxDirective(t, "server", "proxy_read_timeout")
	type answer struct {
		user int
		reply[order]
		took time.Duration
	}
	answers := make(chan answer)
	start := time.Now()
	const n = 20
	for user := 1; user <= n; user++ {
		go func() {
			var opts []option
			if user%2 == 0 {
				opts = append(opts, withKey(fmt.Sprint("buyer-", user)))
			}
			o := buyer.order(1, user, opts...)
			answers <- answer{user, o, time.Since(start)}
		}()
	}
	<-held
	var acks []string
	statuses := map[string]int{}
	for range n {
		a := <-answers
		statuses[fmt.Sprint(a.status, " ", a.code())]++
		switch {
		case a.took >= readTimeout:
			t.Errorf("user %d answered %v after %s: nginx gives up after %s", a.user, a.reply, a.took, readTimeout)
		case a.status == 201:
			acks = append(acks, fmt.Sprint(a.body.ID))
		case a.status != 503 || a.code() != "outcome_unknown":
			t.Errorf("user %d: %v; want 201 or 503 outcome_unknown", a.user, a.reply)
		}
	}
	t.Logf("answers while one COMMIT's reply was held: %v", statuses)
	if statuses["503 outcome_unknown"] == 0 {
		t.Errorf("no buyer was told outcome_unknown: the held COMMIT answered no order")
	}
	if code, out := shop(t, db, "verify", "--acks", acksFile(t, acks)); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}

// wantNotFound checks that GET of each path through nginx, front, is
// answered 404 not_found in the API's error shape.
func wantNotFound(t *testing.T, front *client, paths ...string) {
	t.Helper()
	for _, path := range paths {
		a := front.send("GET", path, "")
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.status != 404 || a.code() != "not_found" || bytes.Contains(a.raw, []byte("go_goroutines ")) {
			t.Errorf("GET %s through nginx: %v; want 404 not_found", path, a)
		}
	}
}

// upstreamStub stands in for the replicas behind nginx: it answers every
// request (201 for an order, 200 otherwise) and records what reached it.
type upstreamStub struct {
	mu     sync.Mutex
	paths  map[string]int
	xff    map[string]int // X-Forwarded-For values seen
	realIP map[string]int // X-Real-IP values seen
}

func newUpstreamStub() *upstreamStub {
	return &upstreamStub{paths: map[string]int{}, xff: map[string]int{}, realIP: map[string]int{}}
}

func (u *upstreamStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.paths[r.Method+" "+r.URL.Path]++
	u.xff[r.Header.Get("X-Forwarded-For")]++
	u.realIP[r.Header.Get("X-Real-IP")]++
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.Method == "POST" {
		w.WriteHeader(http.StatusCreated)
	}
	io.WriteString(w, "{}\n")
}

// nginxOverStub starts an upstreamStub and nginx in front of it, both
// stopped when the test ends.
func nginxOverStub(t *testing.T) (*upstreamStub, *frontNginx) {
	t.Helper()
	up := newUpstreamStub()
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	return up, startNginx(t, strings.TrimPrefix(srv.URL, "http://"))
}

func (u *upstreamStub) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.paths[path]
}

// burst sends n orders at once through front and returns their answers.
func burst(front *client, n int) []reply[order] {
	answers := make([]reply[order], n)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = edgeOrder(front) })
	}
	wg.Wait()
	return answers
}

// edgeOrder sends an order through front with X-Forwarded-For set to an
// address the client made up.
func edgeOrder(front *client) reply[order] {
	return front.order(1, 1, withHeader("X-Forwarded-For", "203.0.113.9"), withHeader("X-Real-IP", "203.0.113.9"))
}

// nginx's limits per client address never refuse an honest buyer, 5 orders
// a second in bursts of 10, and refuse one address that sends 200 orders
// as fast as it can: 429 rate_limited with Retry-After and nginx's request
// id, in the API's error shape, without reaching a replica. The replica is
// told the client's own address, in X-Forwarded-For and in X-Real-IP,
// whatever the client sent in them, and nothing of the admin API reaches
// it.
func TestNginxLimitsPerAddress(t *testing.T) {
	t.Parallel()
	up, nginx := nginxOverStub(t)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	// Before nginx's stop (cleanups run last first): nginx stopping
	// gracefully waits for the connections its clients keep.
	t.Cleanup(hc.CloseIdleConnections)
	front := nginx.using(hc)

	// Honest: bursts of 10 orders two seconds apart, 5 a second.
	for i := range 3 {
		if i > 0 {
			time.Sleep(2 * time.Second)
		}
		for _, a := range burst(front, 10) {
			if a.expect(http.StatusCreated) != nil {
				t.Errorf("honest burst %d: an order answered %v; want 201", i+1, a)
			}
		}
	}
	if n := up.count("POST /api/v1/orders"); n != 30 {
		t.Errorf("the replica got %d of the honest buyer's 30 orders", n)
	}

	// A bot: 200 orders at once, 20 at a time.
	statuses := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				a := edgeOrder(front)
				if a.err != nil {
					t.Error(a.err)
				}
				mu.Lock()
				statuses[a.status]++
				mu.Unlock()
				retryAfter, id := a.header.Get("Retry-After"), a.header.Get("X-Request-ID")
				if a.status == http.StatusTooManyRequests && (a.code() != "rate_limited" || retryAfter != "1" || len(id) != 32) {
					t.Errorf("429 with code %q, Retry-After %q, X-Request-ID %q; want rate_limited, 1 and nginx's id", a.code(), retryAfter, id)
				}
			}
		}()
	}
	wg.Wait()
	reached := up.count("POST /api/v1/orders") - 30
	if statuses[http.StatusTooManyRequests] < 100 || statuses[http.StatusCreated] != reached || len(statuses) != 2 {
		t.Errorf("200 orders at once from one address: %v, %d reached the replica; want most refused 429 at nginx", statuses, reached)
	}
	t.Logf("200 orders at once from one address: %v", statuses)

	up.mu.Lock()
	if len(up.xff) != 1 || up.xff["127.0.0.1"] == 0 {
		t.Errorf("X-Forwarded-For at the replica: %v; want the client's address alone, 127.0.0.1", up.xff)
	}
	if len(up.realIP) != 1 || up.realIP["127.0.0.1"] == 0 {
		t.Errorf("X-Real-IP at the replica: %v; want the client's address alone, 127.0.0.1", up.realIP)
	}
	up.mu.Unlock()
	time.Sleep(time.Second) // a little of the orders' rate back
	wantNotFound(t, front, "/api/v1/admin/refunds", "/api/v1/admin/seed", "/api/v1/admin", "/api//v1/admin/refunds")
	for path := range up.paths {
		if strings.Contains(path, "admin") {
			t.Errorf("%s reached the replica", path)
		}
	}
}

// crowdClient is a client whose every request comes from a loopback
// address of its own (127.3.x.y; all of 127.0.0.0/8 is local on Linux), on
// a connection of its own: many buyers, as nginx's limits per address see
// them, not one client sending them all.
func crowdClient(timeout time.Duration) *http.Client {
	var next atomic.Uint32
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		n := next.Add(1) % 62500
		local := &net.TCPAddr{IP: net.IPv4(127, 3, byte(n/250+1), byte(n%250+1))}
		return (&net.Dialer{LocalAddr: local, Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
}

// holdingStub is an upstreamStub that holds each payment event until hold
// of them are in flight at once (or 10 s have passed), and records the
// most it held at once.
type holdingStub struct {
	*upstreamStub
	hold int
	mu   sync.Mutex
	now  int
	most int
	full chan struct{}
	once sync.Once
}

func (h *holdingStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/api/v1/payments/") {
		h.mu.Lock()
		h.now++
		h.most = max(h.most, h.now)
		if h.now == h.hold {
			h.once.Do(func() { close(h.full) })
		}
		h.mu.Unlock()
		select {
		case <-h.full:
		case <-time.After(10 * time.Second):
		}
		h.mu.Lock()
		h.now--
		h.mu.Unlock()
	}
	h.upstreamStub.ServeHTTP(w, r)
}

// paymentEvent sends a payment event of body through front.
func paymentEvent(front *client, body string) reply[none] {
	return front.send("POST", "/api/v1/payments/events", body)
}

// paymentBurst sends n payment events through front from c clients at
// once, and counts the answers by status (0: a transport error).
func paymentBurst(front *client, n, c int) map[int]int {
	return countBurst(n, c, func() reply[none] { return paymentEvent(front, `{"type":"payment.succeeded"}`) })
}

// countBurst calls send n times from c goroutines at once and counts the
// answers by status (0: a transport error).
func countBurst(n, c int, send func() reply[none]) map[int]int {
	statuses := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			for range n / c {
				a := send()
				mu.Lock()
				statuses[a.status]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return statuses
}

// The payment provider's events pass nginx's limits per address: a
// provider sends bursts from a few addresses, right at the end of the pay
// window. From one address, 100 events in flight at once (limit_conn
// allows 64) and then 400 at once (limit_req's burst is 200) all reach the
// replica, and take nothing of the address's share for other routes: its
// orders are still served. An event's body may be 64 KiB, and no more.
func TestNginxExemptsPayments(t *testing.T) {
	t.Parallel()
	const held = 100
	up := &holdingStub{upstreamStub: newUpstreamStub(), hold: held, full: make(chan struct{})}
	srv := httptest.NewServer(up)
	defer srv.Close()
	nginx := startNginx(t, strings.TrimPrefix(srv.URL, "http://"))
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: held}}
	t.Cleanup(hc.CloseIdleConnections)
	front := nginx.using(hc)

	if statuses := paymentBurst(front, held, held); statuses[http.StatusCreated] != held {
		t.Errorf("%d payment events in flight at once from one address: %v; want every one passed to the replica", held, statuses)
	}
	up.once.Do(func() { close(up.full) }) // the later events are not held
	up.mu.Lock()
	most := up.most
	up.mu.Unlock()
	if most != held {
		t.Errorf("the replica held %d payment events at once; want all %d", most, held)
	}
	if statuses := paymentBurst(front, 400, 20); statuses[http.StatusCreated] != 400 {
		t.Errorf("400 payment events at once from one address: %v; want every one passed to the replica", statuses)
	}
	if n := up.count("POST /api/v1/payments/events"); n != held+400 {
		t.Errorf("the replica got %d of the %d payment events", n, held+400)
	}
	for _, a := range burst(front, 10) {
		if a.expect(http.StatusCreated) != nil {
			t.Errorf("an order after the payment events, from the same address: %v; want 201", a)
		}
	}

	if a := paymentEvent(front, strings.Repeat("x", 64<<10)); a.expect(http.StatusCreated) != nil {
		t.Errorf("a payment event of 64 KiB: %v", a)
	}
	if a := paymentEvent(front, strings.Repeat("x", 64<<10+1)); a.status != http.StatusRequestEntityTooLarge || a.code() != "too_large" {
		t.Errorf("a payment event of 64 KiB and a byte: %v; want 413 too_large", a)
	}
}

// A payment event that a replica took and failed on (its connection
// closed without an answer) goes on to the next replica, POST as it is: a
// resent event is one payment, and the provider's own retry may come after
// the pay window. (An order is not resent: deploy/nginx.conf's location /
// says why.)
func TestNginxResendsPaymentEvents(t *testing.T) {
	t.Parallel()
	var broken atomic.Int32
	closer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		broken.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer closer.Close()
	good := newUpstreamStub()
	srv := httptest.NewServer(good)
	defer srv.Close()
	// The closing replica first: nginx's first request goes to it.
	nginx := startNginx(t, strings.TrimPrefix(closer.URL, "http://"), strings.TrimPrefix(srv.URL, "http://"))

	for i := range 10 {
		if a := paymentEvent(nginx.client, `{"type":"payment.succeeded"}`); a.expect(http.StatusCreated) != nil {
			t.Errorf("payment event %d: %v; want it answered by the replica that works", i+1, a)
		}
	}
	if broken.Load() == 0 {
		t.Fatal("no payment event reached the replica that closes its connections: the test proves nothing")
	}
	if n := good.count("POST /api/v1/payments/events"); n != 10 {
		t.Errorf("the working replica got %d of the 10 payment events", n)
	}
	t.Logf("%d payment event(s) resent from the closing replica to the working one", broken.Load())
}

// fromAddr is a client whose connections leave from the loopback address
// ip (all of 127.0.0.0/8 is local on Linux): one client address, as
// nginx's limits see it.
func fromAddr(ip net.IP, conns int) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: conns}}
}

// nginxInt returns the number that the first group of the regular
// expression re matches in deploy/nginx.conf.
func nginxInt(t *testing.T, re string) int {
	t.Helper()
	b, err := os.ReadFile(nginxConf)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(re).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: nothing matches %s", nginxConf, re)
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// nginxSize reads an nginx size of deploy/nginx.conf (64k, 4096, 1m) in
// bytes.
func nginxSize(t *testing.T, block, name string) int {
	t.Helper()
	v := nginxValue(t, block, name)
	unit := 1
	switch {
	case strings.HasSuffix(v, "k"):
		unit, v = 1<<10, strings.TrimSuffix(v, "k")
	case strings.HasSuffix(v, "m"):
		unit, v = 1<<20, strings.TrimSuffix(v, "m")
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %s %q: not a size", nginxConf, name, v)
	}
	return n * unit
}

// nginx outlasts slow clients. From one address, 2000 connections that
// send nothing, 200 that trickle their header a byte at a time and 50
// that send a payment event's header and then a byte or two of its body
// (the payment provider's route, which no limit per address counts) are
// held open at once, while buyers from other addresses are all answered.
// nginx then closes every one of them within its timeouts: the idle and
// header-trickling ones within client_header_timeout of their start,
// however often they send, the others within client_body_timeout of their
// last byte, both with a reset (reset_timedout_connection), and no
// trickled event reaches a replica. The buyers' rate under such a hold is
// make bench-edge's (loadtest/slowbench), not a test's.
func TestNginxOutlastsSlowClients(t *testing.T) {
	t.Parallel()
	const idle, header, body = 2000, 200, 50
	headerTimeout := nginxDirective(t, "http", "client_header_timeout")
	bodyTimeout := nginxDirective(t, "http", "client_body_timeout")
	if headerTimeout > 5*time.Second || bodyTimeout > 5*time.Second {
		t.Errorf("client_header_timeout %s, client_body_timeout %s; want at most 5s each", headerTimeout, bodyTimeout)
	}
	if keepalive := nginxDirective(t, "http", "keepalive_timeout"); keepalive > 15*time.Second {
		t.Errorf("keepalive_timeout %s; want at most 15s", keepalive)
	}
	if v := nginxValue(t, "http", "reset_timedout_connection"); v != "on" {
		t.Errorf("reset_timedout_connection %s; want on", v)
	}
	conns, files := nginxSize(t, "events", "worker_connections"), nginxSize(t, "", "worker_rlimit_nofile")
	if conns < 16384 || files < 2*conns {
		t.Errorf("worker_connections %d, worker_rlimit_nofile %d; want at least 16384, and files for two of each (client and replica)", conns, files)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if need := uint64(idle + header + body + 1024); lim.Cur < need || lim.Max < need {
		t.Skipf("open files limited to %d (hard %d); holding %d connections here and in nginx needs %d: raise ulimit -n", lim.Cur, lim.Max, idle+header+body, need)
	}

	up, nginx := nginxOverStub(t)
	crowd := crowdClient(10 * time.Second)
	t.Cleanup(crowd.CloseIdleConnections)
	buyer := nginx.using(crowd)
	waitReady(t, buyer)

	began := time.Now()
	hold, err := slowclient.Start(t.Context(), slowclient.Config{
		Addr: "127.0.0.1:" + nginx.port, From: net.IPv4(127, 0, 0, 1),
		Idle: idle, Header: header, Body: body,
		Every: 500 * time.Millisecond, BodyBytes: 2, BodyPath: "/api/v1/payments/events", BodyLength: 60 << 10,
		// Until the buyers are answered, one closed is opened again: the
		// hold stays whole however long opening it took.
		Reopen: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Stop()
	heldAfter := time.Since(began)

	// Buyers, each request from an address of its own, while the hold is
	// at its height.
	statuses := countBurst(100, 10, func() reply[none] { return buyer.send("GET", "/api/v1/products/1", "") })
	held := hold.Open()
	hold.StopReopening()
	t.Logf("%d connections held after %s; 100 buyers answered by %s", idle+header+body, heldAfter.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	if statuses[http.StatusOK] != 100 {
		t.Errorf("buyers from other addresses while %d connections were held: %v; want all 100 answered 200", held, statuses)
	}
	if held < (idle+header+body)*9/10 {
		t.Errorf("only %d of the %d connections were held once the buyers were answered: they were not answered during the hold", held, idle+header+body)
	}

	const slack = 3 * time.Second // the client noticing, on a busy machine
	waitFor(t, max(headerTimeout, time.Second+bodyTimeout)+2*slack, "nginx closing every held connection", func() error {
		if n := hold.Open(); n > 0 {
			return fmt.Errorf("%d idle, %d header, %d body connections still open", hold.OpenOf(slowclient.Idle), hold.OpenOf(slowclient.Header), hold.OpenOf(slowclient.Body))
		}
		return nil
	})
	late, answered, orderly := map[slowclient.Kind]int{}, 0, 0
	var slowest [3]time.Duration
	for _, c := range hold.Closures() {
		took := c.Closed.Sub(c.Opened)
		limit := headerTimeout
		if c.Kind == slowclient.Body {
			took, limit = c.Closed.Sub(c.LastSent), bodyTimeout
		}
		slowest[c.Kind] = max(slowest[c.Kind], took)
		if took > limit+slack {
			late[c.Kind]++
		}
		if c.Answered {
			answered++
		}
		if c.Kind != slowclient.Idle && !c.Reset {
			orderly++
		}
	}
	if len(late) > 0 || answered > 0 || orderly > 0 {
		t.Errorf("closed later than their timeout and %s: %v; answered: %d; trickled ones closed without a reset: %d", slack, late, answered, orderly)
	}
	if n := up.count("POST /api/v1/payments/events"); n != 0 {
		t.Errorf("%d trickled payment events reached the replica", n)
	}
	t.Logf("buyers %v while %d held; closed by nginx at the latest after: idle %s, header %s from their start; body %s after its last byte",
		statuses, held, slowest[slowclient.Idle].Round(time.Millisecond), slowest[slowclient.Header].Round(time.Millisecond), slowest[slowclient.Body].Round(time.Millisecond))
}

// The reads a replica answers from MySQL for anyone, a product's stock and
// an order, are limited per address at nginx: a burst of 100 from one
// address is mostly refused 429 rate_limited in the API's error shape,
// while another address is served, and a cached product page, which is
// not such a read, is served to a burst as large.
func TestNginxLimitsReadsPerAddress(t *testing.T) {
	t.Parallel()
	_, nginx := nginxOverStub(t)
	burst, rate := nginxInt(t, `limit_req zone=reads burst=(\d+)`), nginxInt(t, `zone=reads:\w+ rate=(\d+)r/s`)
	const n, c = 200, 50
	for i, path := range []string{"/api/v1/products/7/stock", "/api/v1/orders/42?user_id=3"} {
		flooder := fromAddr(net.IPv4(127, 0, 5, byte(2*i+1)), c)
		other := fromAddr(net.IPv4(127, 0, 5, byte(2*i+2)), 1)
		t.Cleanup(flooder.CloseIdleConnections)
		t.Cleanup(other.CloseIdleConnections)
		start := time.Now()
		statuses := getBurst(t, nginx.using(flooder), path, n, c)
		// What the limit lets through in the time the burst took (a
		// loaded machine takes longer, and the limit lets more through).
		allowed := burst + 1 + int(float64(rate)*time.Since(start).Seconds()+1)
		if statuses[http.StatusTooManyRequests] == 0 || statuses[http.StatusOK] > allowed || statuses[http.StatusOK]+statuses[http.StatusTooManyRequests] != n {
			t.Errorf("GET %s, %d at once from one address over %s: %v; want at most %d served, the others refused 429 rate_limited",
				path, n, time.Since(start).Round(time.Millisecond), statuses, allowed)
		}
		if a := nginx.using(other).send("GET", path, ""); a.expect(http.StatusOK) != nil {
			t.Errorf("GET %s from another address meanwhile: %v; want it served", path, a)
		}
		t.Logf("GET %s, %d at once from one address: %v", path, n, statuses)
	}
	pages := fromAddr(net.IPv4(127, 0, 5, 9), c)
	t.Cleanup(pages.CloseIdleConnections)
	if statuses := getBurst(t, nginx.using(pages), "/api/v1/products/7", n, c); statuses[http.StatusOK] != n {
		t.Errorf("GET /api/v1/products/7, %d at once from one address: %v; want all served (a cached page is not limited as a read)", n, statuses)
	}
}

// getBurst sends n GETs of path through front from c goroutines at once
// and counts the answers by status; every 429 must be nginx's, in the
// API's error shape.
func getBurst(t *testing.T, front *client, path string, n, c int) map[int]int {
	t.Helper()
	return countBurst(n, c, func() reply[none] {
		a := front.send("GET", path, "")
		if a.status == http.StatusTooManyRequests && (a.code() != "rate_limited" || a.header.Get("Retry-After") != "1" || a.header.Get("Content-Type") != "application/json") {
			t.Errorf("GET %s: 429 with code %q, Retry-After %q, Content-Type %q; want rate_limited, 1, application/json",
				path, a.code(), a.header.Get("Retry-After"), a.header.Get("Content-Type"))
		}
		return a
	})
}

// Requests nginx refuses itself, before a replica sees them, are answered
// in the API's error shape, not with nginx's HTML page: 400
// invalid_argument for two Authorization headers, two Host headers or a
// header beyond nginx's buffers, and 413 too_large for a body above the 4
// KiB a replica accepts (one of 4 KiB passes).
func TestNginxAnswersItsRefusalsInJSON(t *testing.T) {
	t.Parallel()
	up, nginx := nginxOverStub(t)
	order := func(n int) string {
		return fmt.Sprintf("POST /api/v1/orders HTTP/1.1\r\nHost: shop\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", n, strings.Repeat(" ", n))
	}
	cases := []struct {
		name, request string
		status        int
		code          string
	}{
		{"two Authorization headers", "GET /api/v1/orders/1 HTTP/1.1\r\nHost: shop\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n", 400, "invalid_argument"},
		{"two Host headers", "GET /api/v1/orders/1 HTTP/1.1\r\nHost: shop\r\nHost: other\r\n\r\n", 400, "invalid_argument"},
		{"a header beyond nginx's buffers", "GET /api/v1/orders/1 HTTP/1.1\r\nHost: shop\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n", 400, "invalid_argument"},
		{"a body above 4 KiB", order(4<<10 + 1), 413, "too_large"},
		{"a body of 4 KiB", order(4 << 10), 201, ""},
	}
	for _, tc := range cases {
		c, err := net.Dial("tcp", "127.0.0.1:"+nginx.port)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, tc.request); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		shape := json.Unmarshal(b, &e) == nil && e.Error.Code == tc.code && e.Error.Message != ""
		if resp.StatusCode != tc.status || (tc.code != "" && (!shape || resp.Header.Get("Content-Type") != "application/json" || len(resp.Header.Get("X-Request-ID")) != 32)) {
			t.Errorf("%s: %d %s %q; want %d %s in the API's error shape, with nginx's X-Request-ID", tc.name, resp.StatusCode, resp.Header.Get("Content-Type"), b, tc.status, tc.code)
		}
	}
	if n := up.count("POST /api/v1/orders"); n != 1 {
		t.Errorf("%d orders reached the replica; want the one of 4 KiB", n)
	}
}
