// Command slowbench measures what slow clients from one address cost
// other buyers at nginx: it starts nginx from deploy/nginx.conf in front of
// a replica stand-in that answers at once, measures the buyers' rate
// (GET /api/v1/products/1, each request on a new connection from one of
// many loopback addresses) alone, then while one address holds 2000 idle
// connections, 200 that trickle their header and 50 that trickle a
// payment event's body, opening again each one nginx closes; and prints
// both rates and their ratio, for -rounds rounds side by side, and the
// median ratio. make bench-edge runs it
// (scripts/bench-edge.sh).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"shop/loadtest/slowclient"
)

// What one address holds open, and how many addresses the buyers come
// from (127.2.x.y).
const (
	idle, header, body = 2000, 200, 50
	srcN               = 200
)

func main() {
	nginxBin := flag.String("nginx", "nginx", "the nginx binary")
	conf := flag.String("conf", "deploy/nginx.conf", "the nginx template")
	dur := flag.Duration("for", 5*time.Second, "how long each rate is measured")
	buyers := flag.Int("c", 32, "buyers at once")
	rounds := flag.Int("rounds", 3, "rounds of alone and held")
	flag.Parse()
	if err := run(*nginxBin, *conf, *dur, *buyers, max(*rounds, 1)); err != nil {
		log.Fatal(err)
	}
}

func run(nginxBin, conf string, dur time.Duration, buyers, rounds int) error {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{}\n")
	})}
	go up.Serve(ln)
	defer up.Close()
	addr, stop, err := startNginx(nginxBin, conf, ln.Addr().String())
	if err != nil {
		return err
	}
	defer stop()

	// A warm-up first: nginx's workers and the buyers' connections to it.
	if _, err := rate(ctx, addr, time.Second, buyers, srcN); err != nil {
		return err
	}
	// Rounds of alone, then held, side by side, so that the machine's
	// drift during the run falls on both; the median ratio is the figure.
	fmt.Printf("| buyers (GET /api/v1/products/1 through nginx, %d at once from %d addresses, %s each) | alone | while one address holds %d idle, %d header-trickling, %d body-trickling connections | ratio |\n|---|---|---|---|\n",
		buyers, srcN, dur, idle, header, body)
	var ratios []float64
	for i := range rounds {
		alone, err := rate(ctx, addr, dur, buyers, srcN)
		if err != nil {
			return err
		}
		hold, err := slowclient.Start(ctx, slowclient.Config{
			Addr: addr, From: net.IPv4(127, 0, 0, 1), Idle: idle, Header: header, Body: body,
			Every: time.Second, BodyPath: "/api/v1/payments/events", BodyLength: 60 << 10, Reopen: true,
		})
		if err != nil {
			return err
		}
		held, err := rate(ctx, addr, dur, buyers, srcN)
		open := hold.Open()
		hold.Stop()
		if err != nil {
			return err
		}
		ratios = append(ratios, held/alone)
		fmt.Printf("| round %d | %.0f/s | %.0f/s (%d open at the end, %d closed by nginx and opened again) | %.2f× |\n",
			i+1, alone, held, open, len(hold.Closures()), held/alone)
	}
	slices.Sort(ratios)
	fmt.Printf("| median | | | %.2f× (goal ≥ 0.90×) |\n", ratios[len(ratios)/2])
	return nil
}

// rate runs c buyers for dur, each request on a new connection from the
// next of srcN loopback addresses, and returns the answers a second. Any
// answer but 200 is an error.
func rate(ctx context.Context, addr string, dur time.Duration, c, srcN int) (float64, error) {
	var next, done atomic.Int64
	var bad atomic.Value
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		n := int(next.Add(1)) % srcN
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 2, byte(1+n/250), byte(1+n%250))}, Timeout: 5 * time.Second}
		return d.DialContext(ctx, network, a)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	deadline := time.Now().Add(dur)
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/api/v1/products/1", nil)
				resp, err := hc.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					bad.CompareAndSwap(nil, err)
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		return 0, fmt.Errorf("a buyer's request: %w", err)
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

// startNginx runs the template conf on a free loopback port in front of
// upstream, and returns its address and how to stop it.
func startNginx(bin, conf, upstream string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "slowbench")
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	tmpl, err := os.ReadFile(conf)
	if err != nil {
		return "", nil, err
	}
	text := strings.NewReplacer("${NGINX_LISTEN}", addr, "${NGINX_DIR}", dir, "${NGINX_LOG_DIR}", dir,
		"${SHOP_UPSTREAMS}", "server "+upstream+";").Replace(string(tmpl))
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return "", nil, err
	}
	opts := "daemon off;"
	if os.Getuid() == 0 {
		opts += " user root;"
	}
	cmd := exec.Command(bin, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", path, "-g", opts)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("nginx: %w", err)
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGQUIT)
		cmd.Wait()
		os.RemoveAll(dir)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("nginx on %s: %w", addr, err)
		}
	}
}
