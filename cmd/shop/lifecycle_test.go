package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"shop/internal/testenv"
)

// lifecycleCall posts body to path at url and decodes the answer.
func lifecycleCall(t *testing.T, client *http.Client, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(res.Body).Decode(&m); err != nil {
		t.Fatalf("%s %s: %d, body not JSON: %v", method, url, res.StatusCode, err)
	}
	return res.StatusCode, m
}

// errCode is the error code of an error answer, "" for another.
func errCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// A sale on three replicas with a payment window: the winners reserve
// every unit, half pay (through other replicas than the one they bought
// through), and every replica learns the product sold out. The other
// reservations lapse; the replicas' sweeps give their units back, once,
// and announce it, so that the replicas that remembered the product sold
// out sell it again to new buyers. A payment after the window is refused
// and owed back; verify --acks holds throughout.
func TestLifecycleOnThreeReplicas(t *testing.T) {
	const units = 10
	db := testenv.MySQL(t)
	vars := fleetVars(t, db, map[string]string{"SHOP_PAY_WINDOW": "3s", "SHOP_SWEEP_INTERVAL": "200ms"})
	if code, out := shop(t, db, "seed", "--products", "1", "--stock", fmt.Sprint(units)); code != 0 {
		t.Fatal(out)
	}
	var replicas []*replica
	for range 3 {
		replicas = append(replicas, startReplica(t, vars()))
	}
	client := &http.Client{Timeout: 30 * time.Second}
	var acks []string
	type reservation struct {
		id, user int
		payBy    time.Time
	}
	var won []reservation
	for user := 1; user <= units+3; user++ {
		code, o := lifecycleCall(t, client, "POST", replicas[user%3].url+"/api/v1/orders", fmt.Sprintf(`{"sku_id":1,"user_id":%d}`, user))
		switch {
		case code == 201 && o["status"] == "reserved":
			payBy, err := time.Parse(time.RFC3339Nano, fmt.Sprint(o["pay_by"]))
			if err != nil {
				t.Fatalf("pay_by %v: %v", o["pay_by"], err)
			}
			won = append(won, reservation{int(o["order_id"].(float64)), user, payBy})
			acks = append(acks, fmt.Sprint(o["order_id"]))
		case code == 409 && errCode(o) == "sold_out" && user > units:
		default:
			t.Fatalf("order of user %d: %d %v", user, code, o)
		}
	}
	if len(won) != units {
		t.Fatalf("%d reservations, want %d", len(won), units)
	}
	for i, r := range won[:units/2] {
		url := fmt.Sprintf("%s/api/v1/orders/%d/pay", replicas[(i+1)%3].url, r.id)
		body := fmt.Sprintf(`{"user_id":%d,"payment_id":"pay-%d"}`, r.user, r.id)
		for range 2 { // the same payment twice: 200 both times
			if code, o := lifecycleCall(t, client, "POST", url, body); code != 200 || o["status"] != "paid" || o["payment_id"] != fmt.Sprintf("pay-%d", r.id) {
				t.Fatalf("pay order %d: %d %v", r.id, code, o)
			}
		}
	}
	// Someone else's order is not found, nor is one that does not exist.
	if code, o := lifecycleCall(t, client, "GET", fmt.Sprintf("%s/api/v1/orders/%d?user_id=999", replicas[0].url, won[0].id), ""); code != 404 {
		t.Errorf("another buyer's order: %d %v, want 404", code, o)
	}

	// The unpaid half lapses; the sweeps give the units back and every
	// replica sells them again.
	late := won[units-1]
	waitWithin(t, 15*time.Second, "the unpaid reservations expired", func() bool {
		_, o := lifecycleCall(t, client, "GET", fmt.Sprintf("%s/api/v1/orders/%d?user_id=%d", replicas[2].url, late.id, late.user), "")
		return o["status"] == "expired"
	})
	code, o := lifecycleCall(t, client, "POST", fmt.Sprintf("%s/api/v1/orders/%d/pay", replicas[0].url, late.id),
		fmt.Sprintf(`{"user_id":%d,"payment_id":"late-%d"}`, late.user, late.id))
	if code != 409 || errCode(o) != "order_expired" {
		t.Errorf("late payment: %d %v, want 409 order_expired", code, o)
	}
	var refunds int
	if err := db.Gorm.Raw("SELECT COUNT(*) FROM refunds WHERE order_id = ? AND reason = 'order_expired'", late.id).Scan(&refunds).Error; err != nil || refunds != 1 {
		t.Errorf("refunds owed for the late payment: %d, %v; want 1", refunds, err)
	}
	for i := range units / 2 {
		user := 100 + i
		code, o := lifecycleCall(t, client, "POST", replicas[i%3].url+"/api/v1/orders", fmt.Sprintf(`{"sku_id":1,"user_id":%d}`, user))
		if code != 201 {
			t.Fatalf("second wave, user %d via replica %d: %d %v, want 201", user, i%3, code, o)
		}
		acks = append(acks, fmt.Sprint(o["order_id"]))
	}
	if code, o := lifecycleCall(t, client, "POST", replicas[1].url+"/api/v1/orders", `{"sku_id":1,"user_id":200}`); code != 409 || errCode(o) != "sold_out" {
		t.Errorf("after the second wave: %d %v, want 409 sold_out", code, o)
	}
	var expired, returned int
	if err := db.Gorm.Raw("SELECT COUNT(*), COUNT(returned_at) FROM orders WHERE status = 'expired'").Row().Scan(&expired, &returned); err != nil {
		t.Fatal(err)
	}
	if expired != units/2 || returned != expired {
		t.Errorf("expired orders %d (returned %d), want %d, each returned", expired, returned, units/2)
	}
	path := filepath.Join(t.TempDir(), "acks")
	if err := os.WriteFile(path, []byte(strings.Join(acks, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := shop(t, db, "verify", "--acks", path); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}
