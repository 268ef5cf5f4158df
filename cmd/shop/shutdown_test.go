package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"shop/internal/testenv"
)

// asShopEnv makes the test binary run main, as `shop`, instead of the
// tests: a test that needs a real process with real signals re-executes
// itself with it.
const asShopEnv = "SHOP_TEST_AS_SHOP"

// logged is what checks that log has a line matching re.
func logged(log *logSink, re *regexp.Regexp) func() error {
	return func() error {
		if s := log.String(); !re.MatchString(s) {
			return fmt.Errorf("no line matching %s in:\n%s", re, s)
		}
		return nil
	}
}

// stopBegun matches the first line a replica logs once it has been told to
// stop and has acted on it.
var stopBegun = regexp.MustCompile(`"msg":"(draining|shutting down)`)

// rawRequest writes req on conn and reads the answer.
func rawRequest(t *testing.T, conn net.Conn, r *bufio.Reader, req string) (*http.Response, error) {
	t.Helper()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write([]byte(req)); err != nil {
		return nil, err
	}
	res, err := http.ReadResponse(r, nil)
	if err != nil {
		return nil, err
	}
	var body strings.Builder
	_, err = bufio.NewReader(res.Body).WriteTo(&body)
	res.Body.Close()
	return res, err
}

// A balancer writes a request on an idle keep-alive connection at any
// moment; a replica that is stopping must not close that connection under
// it. Stopped with keep-alive connections idle, the replica refuses new
// connections (a balancer sends those requests elsewhere), answers /readyz
// with 503 on one of the idle connections, and a POST written afterwards on
// another gets a real answer with "Connection: close"; then, with no
// connection left, the drain ends long before its period and the replica
// exits.
func TestStopAnswersRequestOnIdleConnection(t *testing.T) {
	t.Parallel()
	const drain = 20 * time.Second
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "2", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	r := startReplica(t, map[string]string{
		"SHOP_MYSQL_DSN": db.DSN, "SHOP_REDIS_ADDR": testenv.RedisAddr(t), "SHOP_REDIS_PREFIX": redisPrefix(t),
		"SHOP_DRAIN": drain.String(), "SHOP_PAYMENT_WEBHOOK_SECRET": testWebhookSecret,
	})
	addr := r.addr()
	idle := func() (net.Conn, *bufio.Reader) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		br := bufio.NewReader(conn)
		res, err := rawRequest(t, conn, br, "GET /healthz HTTP/1.1\r\nHost: shop\r\n\r\n")
		if err != nil || res.StatusCode != 200 || res.Close {
			t.Fatalf("first request on a keep-alive connection: %v, %v", res, err)
		}
		return conn, br
	}
	conn, br := idle()
	probe, probeReader := idle()

	stopped := time.Now()
	r.stop() // what SIGTERM does in main
	waitFor(t, 10*time.Second, "the stop begun", logged(r.log, stopBegun))
	time.Sleep(200 * time.Millisecond) // a balancer's request comes whenever it comes

	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("a new connection was accepted while stopping; want it refused, for the balancer to go elsewhere")
	}
	if ready, err := rawRequest(t, probe, probeReader, "GET /readyz HTTP/1.1\r\nHost: shop\r\n\r\n"); err != nil {
		t.Errorf("/readyz while stopping: %v", err)
	} else if ready.StatusCode != 503 {
		t.Errorf("/readyz while stopping: %d, want 503", ready.StatusCode)
	}

	body := `{"sku_id":1,"user_id":7}`
	res, err := rawRequest(t, conn, br, fmt.Sprintf("POST /api/v1/orders HTTP/1.1\r\nHost: shop\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	if err != nil {
		t.Fatalf("POST on the idle connection after the stop: %v", err)
	}
	if res.StatusCode != 201 && res.StatusCode != 409 {
		t.Errorf("POST on the idle connection after the stop: %d, want 201 or 409", res.StatusCode)
	}
	if !res.Close { // ReadResponse takes "Connection: close" out of the header into Close
		t.Errorf("answer while stopping keeps the connection open; want Connection: close")
	}
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		if err != nil {
			t.Errorf("serve: %v", err)
		}
		if took := time.Since(stopped); took > drain*3/4 {
			t.Errorf("the replica took %s to stop with no connection left; the drain should have ended with the last one", took)
		}
	case <-time.After(drain + 30*time.Second):
		t.Fatalf("the replica did not stop:\n%s", r.log)
	}
	for _, step := range []string{`"msg":"draining`, `"msg":"drained`, `"msg":"shutting down`, `"msg":"stopped"`} {
		if !strings.Contains(r.log.String(), step) {
			t.Errorf("no %s in the log:\n%s", step, r.log)
		}
	}
}

// A second SIGTERM ends `shop serve` at once, while an order is held in
// flight (behind a row lock the test holds in MySQL) and the drain and the
// shutdown would each wait much longer.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	tx := db.Gorm.Begin()
	t.Cleanup(func() { tx.Rollback() })
	if err := tx.Exec("SELECT stock FROM products WHERE id = 1 FOR UPDATE").Error; err != nil {
		t.Fatal(err)
	}

	log := &logSink{addr: make(chan string, 1)}
	cmd := exec.Command(os.Args[0], "serve")
	cmd.Env = append(os.Environ(), asShopEnv+"=1",
		"SHOP_MYSQL_DSN="+db.DSN, "SHOP_REDIS_ADDR="+testenv.RedisAddr(t), "SHOP_REDIS_PREFIX="+redisPrefix(t),
		"SHOP_HTTP_ADDR=127.0.0.1:0", "SHOP_DRAIN=60s", "SHOP_PAYMENT_WEBHOOK_SECRET="+testWebhookSecret)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	var shop *client
	select {
	case addr := <-log.addr:
		shop = newClient("http://" + addr).using(&http.Client{Timeout: time.Minute})
	case err := <-exited:
		t.Fatalf("shop serve exited: %v\n%s", err, log)
	case <-time.After(30 * time.Second):
		t.Fatalf("shop serve did not start:\n%s", log)
	}
	waitReady(t, shop)

	answered := make(chan int, 1)
	go func() { answered <- shop.order(1, 1).status }()
	// The order's UPDATE runs, behind the row lock the test holds.
	name := dbName(db.DSN)
	waitFor(t, 30*time.Second, "an order waiting for the row lock", func() error {
		var n int64
		err := db.Gorm.Raw(`SELECT COUNT(*) FROM information_schema.processlist
			WHERE db = ? AND info LIKE 'UPDATE products %'`, name).Scan(&n).Error
		if err == nil && n == 0 {
			err = errors.New("no UPDATE of products under way")
		}
		return err
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the stop begun", logged(log, stopBegun))
	second := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// A killed process is gone in milliseconds; the in-flight order would
	// hold a graceful stop for its whole 15s, the drain for 60s.
	const promptly = 5 * time.Second
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		took := time.Since(second)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("exit after the second signal: %v, want status 1", err)
		}
		if took > promptly {
			t.Errorf("exited %s after the second signal; want within %s", took.Round(time.Millisecond), promptly)
		} else {
			t.Logf("exited %s after the second signal: %v", took.Round(time.Millisecond), err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("shop serve still runs a minute after the second SIGTERM:\n%s", log)
	}
	if !strings.Contains(log.String(), `"msg":"second signal`) {
		t.Errorf("the forced exit is not logged:\n%s", log)
	}
	select {
	case code := <-answered:
		if code == 201 {
			t.Errorf("the held order was acknowledged although its transaction could not commit")
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the client of the held order got nothing, not even a closed connection")
	}
}
