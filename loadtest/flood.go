package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// flood sends the scenario's requests from o.concurrency clients, each
// sending its next request as soon as it has the answer to its last, for
// o.flood, and counts the answers by status. It is the other side of a
// sale: a crowd of clients, or a botnet, asking one public route as fast as
// the edge answers, while buyers order. No hey and no tap stand between the
// clients and the service, so that the flood costs this process as little
// as it can, and every request i leaves from source address i mod -src-n.
// A request still in flight when the time is up is not counted.
func flood(ctx context.Context, o options, stdout, stderr io.Writer) error {
	srcs, err := newSources(o.srcFrom, o.srcN, o.concurrency)
	if err != nil {
		return err
	}
	defer srcs.closeIdle()
	// Each source keeps its connections to each URL open between
	// requests.
	if err := raiseFileLimit(uint64(len(o.urls)*max(srcs.conns(), o.concurrency) + 256)); err != nil {
		return fmt.Errorf("%w: lower -c or -src-n", err)
	}
	// The flood's span starts before its deadline is set, so that it is
	// never shorter than -for.
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, o.flood)
	defer cancel()
	next := requests(o)
	var sent atomic.Int64
	var (
		mu       sync.Mutex
		statuses = map[string]int{}
		errs     = map[string]int{}
		lats     []float64
		wg       sync.WaitGroup
	)
	fmt.Fprintf(stderr, "loadtest: flood of %s for %s, %d clients, from %d source address(es), to %v\n",
		o.scenario, o.flood, o.concurrency, o.srcN, o.urls)
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine, myErrs := map[string]int{}, map[string]int{}
			var myLats []float64
			for ctx.Err() == nil {
				i := int(sent.Add(1) - 1)
				rctx, rcancel := context.WithTimeout(ctx, o.timeout)
				began := time.Now()
				a := roundTrip(srcs.of(i), next().WithContext(rctx))
				rcancel()
				switch {
				case ctx.Err() != nil:
					// answered, or cut short, after the end of the flood
				case a.err != nil:
					myErrs[a.err.Error()]++
				default:
					mine[strconv.Itoa(a.status)]++
					myLats = append(myLats, time.Since(began).Seconds())
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for k, n := range mine {
				statuses[k] += n
			}
			for k, n := range myErrs {
				errs[k] += n
			}
			lats = append(lats, myLats...)
		}()
	}
	wg.Wait()
	took := time.Since(start).Seconds()

	res := Result{Scenario: o.scenario, URLs: o.urls, Concurrency: o.concurrency, Seconds: took, Statuses: statuses}
	if len(errs) > 0 {
		res.Errors = errs
	}
	for _, n := range statuses {
		res.Requests += n
	}
	res.RPS = float64(res.Requests) / took
	slices.Sort(lats)
	res.P50Ms, res.P99Ms = percentile(lats, 50)*1000, percentile(lats, 99)*1000
	fmt.Fprintf(stdout, "flood %s: %d answers in %.1fs, %.0f/s, p50 %.1f ms, p99 %.1f ms; statuses %s\n",
		o.scenario, res.Requests, took, res.RPS, res.P50Ms, res.P99Ms, counts(statuses))
	for e, n := range errs {
		fmt.Fprintf(stdout, "error [%d]: %s\n", n, e)
	}
	if o.jsonPath != "" {
		data, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(o.jsonPath, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}
