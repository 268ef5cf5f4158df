package main

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The load test's own client (-client direct). Through hey, every request
// makes two HTTP hops in this process: hey to the tap's proxy, and the tap
// to the service, with hey's bookkeeping of each request on top; on the
// machine that runs the stack, that made an order cost the load test five
// times what a flood's GET /healthz costs it, and the load test measured
// itself. The direct client keeps what the tap does for a buyer (serve:
// its own body, user and Idempotency-Key, retries, payments, purchases
// again, the acks) and drops the hop: -c workers take the requests in
// turn and each hands its request to the tap's buyer in its own
// goroutine, which sends it from source address i mod -src-n over
// keep-alive connections, as the flood's clients do. At most -c requests
// are in flight to each URL (the sources' cap is -c, not the proxy's
// tapConnsPerHost), so that -c is how many the service answers at once.

// clients are -client's values.
const (
	clientHey    = "hey"
	clientDirect = "direct"
)

// timing is what the direct client measured of a run: its span, from
// before the first request to the last answer, and each buyer's wait in
// seconds, sorted.
type timing struct {
	seconds float64
	lats    []float64
}

// direct sends the scenario's o.n requests from o.concurrency workers,
// each request one buyer of tp (serve), within wait (the longest the tap
// may take to answer a buyer, as hey's timeout is). With o.rate, request
// j starts no sooner than j/rate seconds after the first. An interrupt
// (ctx) stops the workers taking requests; a buyer cut short is counted
// with the error it got.
func direct(ctx context.Context, o options, tp *tap, wait time.Duration) timing {
	next := requests(o)
	var (
		taken atomic.Int64
		mu    sync.Mutex
		lats  = make([]float64, 0, o.n)
		wg    sync.WaitGroup
	)
	start := time.Now()
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []float64
			for ctx.Err() == nil {
				j := taken.Add(1) - 1
				if j >= int64(o.n) {
					break
				}
				if o.rate > 0 && !sleepUntil(ctx, start.Add(time.Duration(float64(j)/o.rate*float64(time.Second)))) {
					break
				}
				mine = append(mine, buyer(ctx, tp, next(), wait).Seconds())
			}
			mu.Lock()
			defer mu.Unlock()
			lats = append(lats, mine...)
		}()
	}
	wg.Wait()
	took := time.Since(start).Seconds()
	slices.Sort(lats)
	return timing{seconds: took, lats: lats}
}

// buyer sends req as one buyer of tp, within wait, and returns how long
// the buyer waited for its last answer. Its body is read first, as the
// tap's proxy reads hey's, so that every attempt sends it anew.
func buyer(ctx context.Context, tp *tap, req *http.Request, wait time.Duration) time.Duration {
	began := time.Now()
	defer tp.done.Add(1)
	var body []byte
	if req.Body != nil {
		// The body is the load test's own strings.Reader: it does not fail.
		body, _ = io.ReadAll(req.Body)
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tp.serve(req.WithContext(rctx), body)
	return time.Since(began)
}

// sleepUntil waits until t, or until ctx ends: false then.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
