package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// How stale a product page may be. Each replica keeps its own copy of the
// pages (cache.Pages) and drops a page when the change of its product is
// announced to it, so a page another replica serves may lag an
// acknowledged order by the time the announcement takes to arrive. The
// probe measures that: it places orders one at a time through the first
// replica, straight to its port, and after each 201 reads the product's
// page from every replica, again and again, until it shows the stock the
// order left; the wait is the page's staleness. The first replica made the
// change, and must never serve the page from before it.

// stalenessOrders is how many orders the probe places, one at a time.
const stalenessOrders = 200

// stalenessLimit is how long the probe waits for one replica's page to
// show an order: beyond the pages' TTL (SHOP_CACHE_LOCAL_TTL, 1s), which
// bounds it when an announcement is lost.
const stalenessLimit = 3 * time.Second

// stalenessResult is what the probe saw.
type stalenessResult struct {
	Orders int
	// Own counts the reads of the first replica, right after its 201, that
	// showed the page from before the order.
	Own int
	// Others are the waits of the other replicas' pages, one per order and
	// replica; a page that never showed the order within stalenessLimit
	// counts as the limit, and in Missed.
	Others []time.Duration
	// StaleFirst counts the other replicas' first reads that showed the
	// page from before the order.
	StaleFirst int
	Missed     int
	Verify     verifyReport
}

// probeStaleness runs the probe on the stack, whose replicas listen on
// ports (REPLICA_PORTS), and verifies the sale it made.
func probeStaleness(ctx context.Context, o edgeOptions, env []string, replicaPorts string, stderr io.Writer) (stalenessResult, error) {
	var r stalenessResult
	ports := strings.Fields(replicaPorts)
	if len(ports) < 2 {
		return r, fmt.Errorf("page staleness: want two replicas or more, have ports %q", replicaPorts)
	}
	if _, err := commandEnv(ctx, env, stderr, o.stack, "shop", "seed", "--products", "1", "--stock", strconv.Itoa(stalenessOrders)); err != nil {
		return r, err
	}
	client := &http.Client{Timeout: 10 * time.Second}
	base := func(port string) string { return "http://127.0.0.1:" + port }
	// Every replica holds the page before the orders.
	for _, p := range ports {
		if _, err := pageStock(ctx, client, base(p)); err != nil {
			return r, err
		}
	}
	var acks bytes.Buffer
	for i := 1; i <= stalenessOrders; i++ {
		id, err := placeOne(ctx, client, base(ports[0]), int64(o.buyers+o.bots+i))
		if err != nil {
			return r, err
		}
		acked := time.Now()
		fmt.Fprintf(&acks, "%d 1 %d\n", id, o.buyers+o.bots+i)
		want := stalenessOrders - i
		r.Orders++
		if n, err := pageStock(ctx, client, base(ports[0])); err != nil {
			return r, err
		} else if n != want {
			r.Own++
		}
		for _, p := range ports[1:] {
			first := true
			for {
				n, err := pageStock(ctx, client, base(p))
				if err != nil {
					return r, err
				}
				waited := time.Since(acked)
				if n != want && first {
					r.StaleFirst++
				}
				first = false
				if n == want {
					r.Others = append(r.Others, waited)
					break
				}
				if waited > stalenessLimit {
					r.Others = append(r.Others, stalenessLimit)
					r.Missed++
					break
				}
			}
		}
	}
	path := filepath.Join(o.out, "runs", "staleness.acks")
	if err := os.WriteFile(path, acks.Bytes(), 0o644); err != nil {
		return r, err
	}
	var err error
	r.Verify, err = verifySale(ctx, o.stack, path, filepath.Join(o.out, "runs", "staleness.verify.json"), stderr, env...)
	return r, err
}

// placeOne orders product 1 for user straight from a replica and returns
// the order's id.
func placeOne(ctx context.Context, client *http.Client, base string, user int64) (int64, error) {
	body := fmt.Sprintf(`{"sku_id":1,"user_id":%d}`, user)
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/api/v1/orders", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("page staleness: order: %w", err)
	}
	defer res.Body.Close()
	var o struct {
		OrderID int64 `json:"order_id"`
	}
	if err := json.NewDecoder(res.Body).Decode(&o); err != nil || res.StatusCode != http.StatusCreated {
		return 0, fmt.Errorf("page staleness: order of user %d: status %d (%v)", user, res.StatusCode, err)
	}
	return o.OrderID, nil
}

// pageStock reads product 1's page from a replica and returns its stock.
func pageStock(ctx context.Context, client *http.Client, base string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/products/1", nil)
	if err != nil {
		return 0, err
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("page staleness: page: %w", err)
	}
	defer res.Body.Close()
	var p struct {
		Stock int `json:"stock"`
	}
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil || res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("page staleness: page: status %d (%v)", res.StatusCode, err)
	}
	return p.Stock, nil
}

// stalenessLine renders the probe's result.
func stalenessLine(r stalenessResult) string {
	if r.Orders == 0 || len(r.Others) == 0 {
		return ""
	}
	ws := slices.Clone(r.Others)
	slices.Sort(ws)
	at := func(q float64) time.Duration { return ws[min(len(ws)-1, int(q*float64(len(ws))))] }
	round := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("page staleness, %d orders placed one at a time through one replica: that replica's own page was stale "+
		"right after its 201 %d times; the other replicas' pages were read from the 201 on until they showed the order: "+
		"%d of %d first reads were stale, and the order showed %s after its 201 at p50, %s at p99, %s at most "+
		"(read included; %d not within %s); verify %s\n",
		r.Orders, r.Own, r.StaleFirst, len(ws), round(at(0.5)), round(at(0.99)), round(ws[len(ws)-1]),
		r.Missed, stalenessLimit, edgeVerdict(r.Verify))
}
