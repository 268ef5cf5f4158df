package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"shop/internal/testenv"
	"shop/internal/verify"
)

// Three replicas with SHOP_USER_LIMIT=3, each of a few users ordering many
// different products at once, spread over the three: each order runs under
// its own SKU lock, on its own replica, and exactly three of each user's
// are placed.
func TestThreeReplicasHoldTheUserLimit(t *testing.T) {
	t.Parallel()
	crowded(t)
	const skus, users, limit = 40, 5, 3
	db := testenv.MySQL(t)
	// Each user's orders of 40 products are serialized on the user's
	// counter row, each while its SKU's lock is held: on a machine shared
	// with the other test packages a buyer may wait for that lock longer
	// than the default 2 s. And each user orders many SKUs at once: the
	// orders rate limit, which would refuse most of them first, is off.
	vars := fleetVars(t, db, map[string]string{"SHOP_USER_LIMIT": fmt.Sprint(limit), "SHOP_LOCK_WAIT": "10s", "SHOP_RATE_USER": "0"})
	// A unit of every product for every user: only the limit refuses.
	if code, out := shopWith(vars(), "seed", "--products", fmt.Sprint(skus), "--stock", fmt.Sprint(users)); code != 0 {
		t.Fatal(out)
	}
	replicas := startReplicas(t, 3, vars)
	if !strings.Contains(replicas[0].log.String(), fmt.Sprintf(`"user_limit":%d`, limit)) {
		t.Errorf("the start-up log does not show the limit:\n%s", replicas[0].log)
	}

	var (
		mu     sync.Mutex
		status = map[int]int{}
		codes  = map[string]int{}
		acks   []string
		errs   []error
		wg     sync.WaitGroup
	)
	start := make(chan struct{})
	for sku := 1; sku <= skus; sku++ {
		for user := 1; user <= users; user++ {
			buyer := replicas[(sku+user)%len(replicas)].public
			wg.Go(func() {
				<-start
				o := buyer.order(sku, user)
				mu.Lock()
				defer mu.Unlock()
				if o.err != nil {
					errs = append(errs, o.err)
					return
				}
				status[o.status]++
				if o.status == http.StatusCreated {
					acks = append(acks, fmt.Sprintf("%d %d %d", o.body.ID, sku, user))
				} else {
					codes[o.code()]++
				}
			})
		}
	}
	close(start)
	wg.Wait()
	placed, refused := users*limit, users*(skus-limit)
	if status[201] != placed || status[409] != refused || codes["user_limit"] != refused || len(errs) > 0 {
		t.Errorf("responses %v, error codes %v, transport errors %v; want %d×201 and %d×409 user_limit",
			status, codes, errs, placed, refused)
		logErrors(t, replicas)
	}
	var held []struct{ UserID, N int }
	if err := db.Gorm.Raw("SELECT user_id, COUNT(*) AS n FROM orders GROUP BY user_id ORDER BY user_id").Scan(&held).Error; err != nil {
		t.Fatal(err)
	}
	if len(held) != users {
		t.Errorf("orders by user in MySQL: %+v, want %d of each of %d users", held, limit, users)
	}
	for _, h := range held {
		if h.N != limit {
			t.Errorf("user %d holds %d orders in MySQL, want %d", h.UserID, h.N, limit)
		}
	}
	code, out := shopWith(vars(), "verify", "--acks", acksFile(t, acks))
	if code != 0 || !strings.Contains(out, fmt.Sprintf("ok    orders per user <= %d\n", limit)) {
		t.Errorf("verify with SHOP_USER_LIMIT=%d: exit %d\n%s", limit, code, out)
	}
}

// With SHOP_USER_LIMIT set, shop verify reports a user holding more active
// orders than the limit, in text and in JSON, and only that; without it, it
// does not check.
func TestVerifyDetectsUserOverLimit(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "5", "--stock", "1"); code != 0 {
		t.Fatal(out)
	}
	for _, q := range []string{
		"UPDATE products SET stock = 0 WHERE id IN (1, 2, 3)",
		"INSERT INTO orders (sku_id, user_id) VALUES (1, 7), (2, 7), (3, 8)",
		// Orders that gave their units back do not count against the limit.
		"INSERT INTO orders (sku_id, user_id, status, returned_at) VALUES (4, 7, 'expired', NOW(6)), (5, 7, 'cancelled', NOW(6))",
	} {
		if err := db.Gorm.Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	limited := func(limit string, args ...string) (int, string) {
		return shopWith(map[string]string{"SHOP_MYSQL_DSN": db.DSN, "SHOP_USER_LIMIT": limit}, args...)
	}
	code, out := limited("1", "verify")
	if code != 1 || !strings.Contains(out, "FAIL  orders per user <= 1: 1 violations, first: user 7 orders 2\n") ||
		strings.Count(out, "FAIL") != 1 {
		t.Errorf("verify with SHOP_USER_LIMIT=1: exit %d, want 1 and user 7 named, only\n%s", code, out)
	}
	code, out = limited("1", "verify", "--json")
	var r struct {
		OK     bool           `json:"ok"`
		Checks []verify.Check `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("verify --json: %v\n%s", err, out)
	}
	want := verify.Check{Name: "orders per user <= 1", Violations: 1, Examples: []string{"user 7 orders 2"}}
	if found := r.Checks[len(r.Checks)-1]; code != 1 || r.OK || fmt.Sprint(found) != fmt.Sprint(want) {
		t.Errorf("verify --json with SHOP_USER_LIMIT=1: exit %d, ok %v, last check %+v; want %+v", code, r.OK, found, want)
	}
	if code, out := limited("2", "verify"); code != 0 || !strings.Contains(out, "ok    orders per user <= 2\n") {
		t.Errorf("verify with SHOP_USER_LIMIT=2: exit %d\n%s", code, out)
	}
	if code, out := limited("", "verify"); code != 0 || strings.Contains(out, "per user") {
		t.Errorf("verify without SHOP_USER_LIMIT: exit %d\n%s", code, out)
	}
}
