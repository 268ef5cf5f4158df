package stock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"shop/internal/stock"
	"shop/internal/verify"
)

// oweRefunds has svc record n refunds owed, by payments for orders that do
// not exist, and returns their ids in order.
func oweRefunds(t *testing.T, svc *stock.Service, provider string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		r, err := svc.Receive(context.Background(), stock.Payment{Provider: provider, PaymentID: "p-" + string(rune('a'+i)),
			OrderID: int64(1<<40 + i), AmountCents: int64(100 + i), Currency: "USD", EventID: "msg"})
		if err != nil || r.Outcome != stock.OutcomeOwed {
			t.Fatal(r, err)
		}
		ids = append(ids, r.RefundID)
	}
	return ids
}

// Refunds are listed a page at a time, by refund id, in a state or in
// every state.
func TestRefundPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc, db, _ := openOrdersPool(t)
	ids := oweRefunds(t, svc, "webhook", 5)
	if _, err := svc.Settle(ctx, stock.Settlement{RefundID: ids[1], ProviderRefundID: "re_1"}); err != nil {
		t.Fatal(err)
	}
	catalog := stock.NewCatalog(db.Gorm)
	page, more, err := catalog.Refunds(ctx, stock.RefundQuery{Limit: 2})
	if err != nil || !more || len(page) != 2 || page[0].RefundID != ids[0] || page[1].RefundID != ids[1] {
		t.Fatalf("first page = %+v, %v, %v; want refunds 0, 1 and more", page, more, err)
	}
	page, more, err = catalog.Refunds(ctx, stock.RefundQuery{Limit: 10, After: ids[1]})
	if err != nil || more || len(page) != 3 || page[0].RefundID != ids[2] {
		t.Fatalf("after refund 1 = %+v, %v, %v; want refunds 2-4, no more", page, more, err)
	}
	page, _, err = catalog.Refunds(ctx, stock.RefundQuery{Limit: 10, State: stock.RefundRefunded})
	if err != nil || len(page) != 1 || page[0].RefundID != ids[1] || deref(page[0].ProviderRefundID) != "re_1" || page[0].SettledAt == nil {
		t.Fatalf("refunded = %+v, %v; want refund 1, by re_1", page, err)
	}
	for _, q := range []stock.RefundQuery{{Limit: 0}, {Limit: 1001}, {Limit: 1, State: "paid"}, {Limit: 1, After: "x"}} {
		if _, _, err := catalog.Refunds(ctx, q); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", q, err)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Settling is idempotent; another reference for a settled refund is
// refused; a refund is found by its id or by its payment; a failure is
// kept.
func TestSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc, _, _ := openOrdersPool(t)
	ids := oweRefunds(t, svc, "stripe", 3)
	for range 2 {
		r, err := svc.Settle(ctx, stock.Settlement{Provider: "stripe", RefundID: ids[0], ProviderRefundID: "re_0"})
		if err != nil || r.State != stock.RefundRefunded || deref(r.ProviderRefundID) != "re_0" {
			t.Errorf("settle = %+v, %v; want refunded by re_0", r, err)
		}
	}
	if _, err := svc.Settle(ctx, stock.Settlement{Provider: "stripe", RefundID: ids[0], ProviderRefundID: "re_other"}); !errors.Is(err, stock.ErrRefundSettled) {
		t.Errorf("another reference: %v, want ErrRefundSettled", err)
	}
	if r, err := svc.Settle(ctx, stock.Settlement{Provider: "stripe", PaymentID: "p-b", ProviderRefundID: "re_b"}); err != nil || r.RefundID != ids[1] {
		t.Errorf("settle by payment = %+v, %v; want refund 1", r, err)
	}
	if r, err := svc.Settle(ctx, stock.Settlement{Provider: "stripe", RefundID: ids[2], Failed: true, Reason: "card closed"}); err != nil || r.State != stock.RefundFailed {
		t.Errorf("fail = %+v, %v; want failed", r, err)
	}
	if _, err := svc.Settle(ctx, stock.Settlement{RefundID: stock.NewRefundID(), ProviderRefundID: "re_x"}); !errors.Is(err, stock.ErrRefundNotFound) {
		t.Errorf("unknown refund: %v, want ErrRefundNotFound", err)
	}
	if _, err := svc.Settle(ctx, stock.Settlement{RefundID: "nope", ProviderRefundID: "re_x"}); !errors.Is(err, stock.ErrInvalid) {
		t.Errorf("bad refund id: %v, want ErrInvalid", err)
	}
}

// A refunder claims owed refunds for a lease: another claims none of them
// until the lease runs out, then the same ones again.
func TestClaimRefunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc, _, _ := openOrdersPool(t)
	ids := oweRefunds(t, svc, "stripe", 3)
	oweRefunds(t, svc, "webhook", 1) // not the refunder's
	got, err := svc.ClaimRefunds(ctx, "stripe", 500*time.Millisecond, 10)
	if err != nil || len(got) != 3 || got[0].RefundID != ids[0] || got[0].State != stock.RefundOwed {
		t.Fatalf("claim = %+v, %v; want the 3 stripe refunds", got, err)
	}
	if again, err := svc.ClaimRefunds(ctx, "stripe", time.Second, 10); err != nil || len(again) != 0 {
		t.Fatalf("claim while claimed = %+v, %v; want none", again, err)
	}
	if err := svc.RetryRefund(ctx, ids[0], "timeout", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Settle(ctx, stock.Settlement{RefundID: ids[1], ProviderRefundID: "re_1"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	again, err := svc.ClaimRefunds(ctx, "stripe", time.Second, 10)
	if err != nil || len(again) != 2 || again[0].RefundID != ids[0] || again[1].RefundID != ids[2] || again[0].Attempts != 1 {
		t.Fatalf("claim after the lease = %+v, %v; want refunds 0 and 2, claimed once before", again, err)
	}
}

// A seed refuses while refunds are unsettled, saying how many, and changes
// nothing; with DiscardRefunds it deletes them and their payments; settled
// refunds and the ledger stay.
func TestSeedKeepsMoney(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc, db, _ := openOrdersPool(t)
	ids := oweRefunds(t, svc, "webhook", 3)
	if _, err := svc.Settle(ctx, stock.Settlement{RefundID: ids[0], ProviderRefundID: "re_0"}); err != nil {
		t.Fatal(err)
	}
	// A paid order, and a cancelled one paid all the same and refunded:
	// the seed deletes both orders, and keeps their payments and the
	// settled refund, which shop verify then does not hold to the orders
	// of the new catalog.
	paidOrder, err := svc.PlaceOrder(ctx, 1, 50, "")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := pay(ctx, svc, paidOrder, "p-paid"); err != nil || r.Outcome != stock.OutcomeApplied {
		t.Fatal(r, err)
	}
	cancelled, err := svc.PlaceOrder(ctx, 2, 50, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Cancel(ctx, 50, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	late, err := pay(ctx, svc, cancelled, "p-late")
	if err != nil || late.Outcome != stock.OutcomeOwed {
		t.Fatal(late, err)
	}
	if _, err := svc.Settle(ctx, stock.Settlement{RefundID: late.RefundID, ProviderRefundID: "re_late"}); err != nil {
		t.Fatal(err)
	}
	catalog := stock.NewCatalog(db.Gorm)
	err = catalog.SeedWith(ctx, 2, 1, stock.SeedOptions{})
	if !errors.Is(err, stock.ErrRefundsUnsettled) || !strings.Contains(err.Error(), "2 refunds") {
		t.Fatalf("seed with 2 unsettled: %v, want ErrRefundsUnsettled naming 2", err)
	}
	if n := stockOf(t, db, 3); n != 2 {
		t.Errorf("the refused seed changed the catalog: stock of 3 = %d", n)
	}
	if err := catalog.SeedWith(ctx, 2, 1, stock.SeedOptions{DiscardRefunds: true, PriceCents: 2500, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	var counts struct{ Refunds, Payments int64 }
	if err := db.Gorm.Raw("SELECT (SELECT COUNT(*) FROM refunds) AS refunds, (SELECT COUNT(*) FROM payments) AS payments").Scan(&counts).Error; err != nil {
		t.Fatal(err)
	}
	if counts.Refunds != 2 || counts.Payments != 3 {
		t.Errorf("after the seed: %d refunds, %d payments; want the 2 settled and the 3 payments of the settled and the paid", counts.Refunds, counts.Payments)
	}
	p, err := catalog.Product(ctx, 1)
	if err != nil || p.PriceCents != 2500 || p.Currency != "EUR" {
		t.Errorf("seeded product = %+v, %v; want 2500 EUR", p, err)
	}
	if err := catalog.Seed(ctx, 2, 1); err != nil {
		t.Errorf("seed with only settled refunds: %v", err)
	}
	r, err := verify.Sale(ctx, db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || r.Orders != 0 {
		t.Errorf("after a seed:\n%s", r)
	}
}
