package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"shop/internal/handler"
	"shop/internal/payments"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// The stack's provider secret in these tests, and another one.
const (
	testWebhookSecret  = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	otherWebhookSecret = "whsec_ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="
	testStripeSecret   = "whsec_dGhlIGRlbW8ncyBTdHJpcGUgdGVzdHMnIHNlY3JldA=="
)

// moneyDB is a migrated database on the test MariaDB, with the service's
// payments and a replica's public routes over it: a payment event route
// checked with testWebhookSecret, or in stripe mode with
// testStripeSecret.
type moneyDB struct {
	db      *sql.DB
	svc     *stock.Service
	catalog *stock.Catalog
	replica string // the replica's URL
}

func newMoneyDB(t *testing.T, stripe bool) *moneyDB {
	t.Helper()
	var v payments.Verifier
	var err error
	if stripe {
		v, err = payments.NewStripe(testStripeSecret)
	} else {
		v, err = payments.NewStandard(testWebhookSecret)
	}
	if err != nil {
		t.Fatal(err)
	}
	tdb := testenv.MySQL(t)
	sqlDB, err := tdb.Gorm.DB()
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.ReleaseMode)
	svc := stock.NewService(stock.Deps{DB: tdb.Gorm}, stock.Settings{}, stock.Hooks{})
	srv := httptest.NewServer(handler.New(handler.Deps{Verifier: v, Payments: svc}, handler.Settings{}).Public)
	t.Cleanup(srv.Close)
	return &moneyDB{db: sqlDB, svc: svc, catalog: stock.NewCatalog(tdb.Gorm), replica: srv.URL}
}

// order inserts an order of SKU 1 for user with status, owing amount USD,
// and returns its id. A paid one is paid by pay-<id>.
func (m *moneyDB) order(t *testing.T, user int64, status string, amount int64) int64 {
	t.Helper()
	res, err := m.db.Exec(`INSERT INTO orders (sku_id, user_id, status, pay_by, returned_at, amount_cents, currency)
		VALUES (1, ?, ?, NOW(6) - INTERVAL 1 SECOND, IF(? IN ('expired', 'cancelled'), NOW(6), NULL), ?, 'USD')`,
		user, status, status, amount)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := res.LastInsertId()
	if status == "paid" {
		if _, err := m.db.Exec("UPDATE orders SET payment_id = CONCAT('pay-', id), paid_at = NOW(6) WHERE id = ?", id); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// pay receives payment id for order, of amount USD, as the service does,
// and returns what it did.
func (m *moneyDB) pay(t *testing.T, order int64, id string, amount int64) stock.Receipt {
	t.Helper()
	r, err := m.svc.Receive(context.Background(), stock.Payment{Provider: payments.ProviderWebhook, PaymentID: id,
		OrderID: order, AmountCents: amount, Currency: "USD", EventID: "msg_" + id})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// refundStates returns every refund's state and provider reference:
// refund_id → "state reference".
func (m *moneyDB) refundStates(t *testing.T) map[string]string {
	t.Helper()
	rows, err := m.db.Query("SELECT refund_id, state, COALESCE(provider_refund_id, '') FROM refunds")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	states := map[string]string{}
	for rows.Next() {
		var id, state, ref string
		if err := rows.Scan(&id, &state, &ref); err != nil {
			t.Fatal(err)
		}
		states[id] = strings.TrimSpace(state + " " + ref)
	}
	return states
}

// The demo settles every refund left unsettled with a signed event of the
// replicas' provider that the service accepts — Standard Webhooks'
// refund.succeeded, or in stripe mode Stripe's refund.updated — so that
// the seed that refused before goes through; a refund settled before keeps
// its reference, and a second pass has nothing to do. Without the
// provider's secret, with another, or as the other provider (whose route
// the replica does not serve), nothing is settled.
func TestSettleRefunds(t *testing.T) {
	for _, stripe := range []bool{false, true} {
		secret, env, other := testWebhookSecret+","+otherWebhookSecret, envWebhookSecret, [2]string{otherWebhookSecret, ""}
		if stripe {
			secret, env, other = testStripeSecret, envStripeSecret, [2]string{"", otherWebhookSecret}
		}
		t.Run(map[bool]string{false: "webhook", true: "stripe"}[stripe], func(t *testing.T) {
			t.Parallel() // each on a database of its own
			m := newMoneyDB(t, stripe)
			ctx := context.Background()
			settle := func(webhookSecret, stripeSecret string) (int, error) {
				return settleRefunds(ctx, m.db, m.replica, stripe, webhookSecret, stripeSecret)
			}
			expired := m.order(t, 1, "expired", 1500)
			owed := []string{m.pay(t, expired, "pay-late", 1500).RefundID}
			for i := range 3 {
				owed = append(owed, m.pay(t, int64(1)<<62+int64(i), fmt.Sprintf("pay-unknown-%d", i), 100).RefundID)
			}
			settled := m.pay(t, int64(1)<<62+9, "pay-settled", 100).RefundID
			if _, err := m.svc.Settle(ctx, stock.Settlement{Provider: payments.ProviderWebhook, RefundID: settled, ProviderRefundID: "re_before"}); err != nil {
				t.Fatal(err)
			}
			if err := m.catalog.SeedWith(ctx, 1, 10, stock.SeedOptions{}); !errors.Is(err, stock.ErrRefundsUnsettled) {
				t.Fatalf("seed with %d refunds unsettled: %v; want it refused", len(owed), err)
			}

			if n, err := settle("", ""); n != 0 || err == nil || !strings.Contains(err.Error(), env) {
				t.Errorf("no secret: %d settled, %v; want an error naming %s", n, err, env)
			}
			if n, err := settle(other[0], other[1]); n != 0 || err == nil || !strings.Contains(err.Error(), "401") {
				t.Errorf("another secret: %d settled, %v; want the replica's 401", n, err)
			}
			n, err := settleRefunds(ctx, m.db, m.replica, !stripe, testWebhookSecret, testStripeSecret)
			if n != 0 || err == nil || !strings.Contains(err.Error(), "404") {
				t.Errorf("the other provider: %d settled, %v; want the replica's 404", n, err)
			}

			if stripe {
				n, err = settle("", secret)
			} else {
				n, err = settle(secret, "")
			}
			if err != nil || n != len(owed) {
				t.Fatalf("settled %d, %v; want %d", n, err, len(owed))
			}
			states := m.refundStates(t)
			for _, id := range owed {
				if want := "refunded " + demoRefundRef(id); states[id] != want {
					t.Errorf("refund %s: %q, want %q", id, states[id], want)
				}
			}
			if states[settled] != "refunded re_before" || len(states) != len(owed)+1 {
				t.Errorf("refunds %v; want the one settled before kept as it was", states)
			}
			if n, err := settle("", ""); n != 0 || err != nil {
				t.Errorf("a second pass settled %d, %v; want nothing to do", n, err)
			}
			if err := m.catalog.SeedWith(ctx, 1, 10, stock.SeedOptions{}); err != nil {
				t.Errorf("seed once every refund is settled: %v", err)
			}
		})
	}
}

// A row's refunds are those received since it began, each described if it
// is not owed as a late payment is: order_expired, of what its order owes.
func TestRowRefunds(t *testing.T) {
	t.Parallel() // each on a database of its own
	m := newMoneyDB(t, false)
	ctx := context.Background()
	before := m.order(t, 1, "expired", 1500)
	m.pay(t, before, "pay-before", 1500) // a row before's
	time.Sleep(10 * time.Millisecond)    // received_at has microseconds; MySQL's clock moves on
	var since time.Time
	if err := m.db.QueryRowContext(ctx, "SELECT NOW(6)").Scan(&since); err != nil {
		t.Fatal(err)
	}
	late, short, paid := m.order(t, 2, "expired", 1500), m.order(t, 3, "expired", 1500), m.order(t, 4, "paid", 1500)
	for _, p := range []struct {
		order  int64
		id     string
		amount int64
		reason string
	}{{late, "pay-late", 1500, "order_expired"}, {short, "pay-short", 1499, "order_expired"}, {paid, "pay-twice", 1500, "duplicate_payment"}} {
		if r := m.pay(t, p.order, p.id, p.amount); r.Outcome != "owed" || r.Reason != p.reason {
			t.Fatalf("payment %s: %+v; want owed, %s", p.id, r, p.reason)
		}
	}
	l := &lifeResult{}
	if err := rowRefunds(ctx, m.db, since, l); err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("%d pay-late", late), fmt.Sprintf("%d pay-short", short), fmt.Sprintf("%d pay-twice", paid)}
	slices.Sort(want)
	if !slices.Equal(l.Refunds, want) {
		t.Errorf("refunds %q, want %q (not the row before's)", l.Refunds, want)
	}
	wrong := []string{fmt.Sprintf("order %d, payment pay-short: order_expired, 1499 USD for an order of 1500 USD", short),
		fmt.Sprintf("order %d, payment pay-twice: duplicate_payment, 1500 USD for an order of 1500 USD", paid)}
	if !slices.Equal(l.WrongRefunds, wrong) {
		t.Errorf("wrong refunds %q, want %q", l.WrongRefunds, wrong)
	}
}

// The payments made late are read from the payments files, whatever they
// were answered.
func TestLatePayments(t *testing.T) {
	dir := t.TempDir()
	f1, f2 := filepath.Join(dir, "wave1.payments"), filepath.Join(dir, "wave2.payments")
	os.WriteFile(f1, []byte("3 13 pay-3 late 503\n1 11 pay-1 in_time 200 applied\n2 12 pay-2 late 200 owed order_expired\n"+
		"4611686018427387904 0 pay-4611686018427387904-x unknown 200 owed unknown_order\n"), 0o644)
	got, err := latePayments(f1, f2) // no second wave: no file
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"2 pay-2", "3 pay-3"}; !slices.Equal(got, want) {
		t.Errorf("late payments %q, want %q", got, want)
	}
}

// The waves pay with the stack's secret; in the Stripe rows as Stripe,
// with the Stripe endpoint's.
func TestWaveArgs(t *testing.T) {
	o, err := parse([]string{"-src-n", "16"})
	if err != nil {
		t.Fatal(err)
	}
	o.webhookSecret, o.stripeSecret = testWebhookSecret, testStripeSecret
	for _, r := range append(lifeRows(o), stripeRows(o)...) {
		args := strings.Join(waveArgs(o, "http://x", r), " ")
		secret := testWebhookSecret
		if r.stripe() {
			secret = testStripeSecret
		}
		if !strings.Contains(args, "-webhook-secret "+secret) || !strings.Contains(args, "-src-n 16") ||
			strings.Contains(args, " -stripe") != r.stripe() ||
			strings.Contains(args, "-jwt-secret "+o.jwtSecret) != (r.Life == lifeJWT) || strings.Contains(args, "-retry") != r.Retry {
			t.Errorf("%s: bin/loadtest %s", r.label(), args)
		}
	}
}

// Without the provider's secret the lifecycle rows cannot pay, nor the
// Stripe rows without the Stripe endpoint's: the demo says so before it
// runs a row.
func TestLifeRowsNeedTheSecrets(t *testing.T) {
	for _, missing := range []string{envWebhookSecret, envStripeSecret} {
		t.Setenv(envWebhookSecret, testWebhookSecret)
		t.Setenv(envStripeSecret, testStripeSecret)
		t.Setenv(missing, "")
		state := t.TempDir()
		os.WriteFile(filepath.Join(state, "ports.env"), []byte("NGINX_PORT=1\nADMIN_PORTS='2 3 4'\nREPLICA_PORTS='5 6 7'\n"), 0o644)
		var stderr strings.Builder
		err := run(context.Background(), []string{"-state", state, "-out", t.TempDir(), "-stack", "/nonexistent"}, io.Discard, &stderr)
		if err == nil || !strings.Contains(err.Error(), missing) || strings.Contains(stderr.String(), "== row") {
			t.Errorf("run without %s: %v, stderr %q; want an error naming it before any row", missing, err, stderr.String())
		}
	}
}
