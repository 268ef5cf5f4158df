package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/failpoint"
	"shop/internal/handler"
	"shop/internal/payments"
	"shop/internal/stock"
	"shop/internal/stripepay"
)

// stripeMode is SHOP_PAYMENTS=stripe's parts: the Stripe client that the
// checkouts and the refunder call. Its zero value is webhook mode, which
// has neither.
type stripeMode struct {
	client *stripepay.Client
}

// newStripe builds stripe mode's client when cfg asks for it.
func newStripe(cfg paymentsConfig) (stripeMode, error) {
	if cfg.Provider != payments.ProviderStripe || cfg.StripeKey == "" {
		return stripeMode{}, nil
	}
	c, err := stripepay.New(stripepay.Config{SecretKey: cfg.StripeKey, APIBase: cfg.StripeAPIBase})
	if err != nil {
		return stripeMode{}, configError{err}
	}
	return stripeMode{client: c}, nil
}

// checkouts is what the orders create their checkouts through, nil in
// webhook mode.
func (m stripeMode) checkouts() stock.Checkouts {
	if m.client == nil {
		return nil
	}
	return intents{m.client}
}

// checkoutRoute is the checkout route's dependency: orders in stripe
// mode, nil (no route) in webhook mode.
func (m stripeMode) checkoutRoute(orders *stock.Service) handler.Checkouts {
	if m.client == nil {
		return nil
	}
	return orders
}

// refunderInterval is how often each replica's refunder looks for refunds
// owed.
const refunderInterval = 2 * time.Second

// runRefunder starts stripe mode's refunder on the replica's refund pool,
// and returns what stops it; in webhook mode refunds are settled by the
// provider's events or by hand, and nothing runs.
func (m stripeMode) runRefunder(ctx context.Context, cfg paymentsConfig, p pools, locker stock.Locker, hooks failpoint.Hooks,
	reg prometheus.Registerer, log *slog.Logger) func() {
	if m.client == nil {
		return func() {}
	}
	calls := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shop_refunder_calls_total",
		Help: "Calls of the payment provider's Refund API by this replica's refunder.",
	})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_refunder_errors_total",
		Help: "The refunder's failed calls, by kind: network, rate_limited, lock_timeout, conflict, server, auth, pending, invalid.",
	}, []string{"kind"})
	claims := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_refunder_claims_total",
		Help: "The refunder's claims by outcome: recorded (the provider's answer kept), retry (backing off), failed (the provider refused: operators act), left (the lease ran short).",
	}, []string{"outcome"})
	reg.MustRegister(calls, errs, claims)
	// Its own Service on its own pool: the refunds' claims and records
	// never wait for a connection of the order path.
	book := stock.NewService(stock.Deps{DB: p.refunds, Reads: p.refunds, Locks: locker, Logger: log}, stock.Settings{}, stock.Hooks{})
	r := &stripepay.Refunder{
		Store:  refundStore{book},
		Client: m.client,
		Logger: log,
		Metrics: stripepay.Metrics{
			Call:    calls.Inc,
			Error:   func(k stripepay.Kind) { errs.WithLabelValues(string(k)).Inc() },
			Outcome: func(o string) { claims.WithLabelValues(o).Inc() },
		},
		Hooks: stripepay.Hooks{BetweenCallAndRecord: hooks.BetweenRefundCallAndRecord},
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); r.Run(runCtx, refunderInterval) }()
	return func() { stop(); <-done }
}

// intents are the orders' checkouts as Stripe PaymentIntents.
type intents struct{ c *stripepay.Client }

func (k intents) Create(ctx context.Context, o stock.Order, key string) (stock.Checkout, error) {
	if o.AmountCents == nil || o.Currency == nil {
		return stock.Checkout{}, errors.New("stripe: an order without an amount cannot be checked out")
	}
	in, err := k.c.CreateIntent(ctx, o.ID, *o.AmountCents, *o.Currency, key)
	if err != nil {
		return stock.Checkout{}, err
	}
	return stock.Checkout{OrderID: o.ID, PaymentIntent: in.ID, ClientSecret: in.ClientSecret,
		AmountCents: *o.AmountCents, Currency: *o.Currency}, nil
}

// Cancel cancels a PaymentIntent; one already cancelled, succeeded or
// processing is final, and nothing more can be done to it here (a payment
// that succeeded is owed back when its event comes).
func (k intents) Cancel(ctx context.Context, id string) error {
	if err := k.c.CancelIntent(ctx, id); err != nil && !errors.Is(err, stripepay.ErrIntentFinal) {
		return err
	}
	return nil
}

// refundStore is the refunder's Store on the refunds table.
type refundStore struct{ svc *stock.Service }

// pendingRecheck is how long a refund the provider answered pending waits
// for its refund.updated event before the refunder asks again (with the
// same key).
const pendingRecheck = 10 * time.Minute

func (s refundStore) Claim(ctx context.Context, lease time.Duration, n int) ([]stripepay.Claim, error) {
	rs, err := s.svc.ClaimRefunds(ctx, payments.ProviderStripe, lease, n)
	if err != nil {
		return nil, err
	}
	claims := make([]stripepay.Claim, 0, len(rs))
	for _, r := range rs {
		claims = append(claims, stripepay.Claim{RefundID: r.RefundID, PaymentID: r.PaymentID, AmountCents: *r.AmountCents,
			Currency: *r.Currency, Attempts: r.Attempts})
	}
	return claims, nil
}

func (s refundStore) Record(ctx context.Context, refundID, providerRefundID, status string) error {
	if status == "succeeded" {
		_, err := s.svc.Settle(ctx, stock.Settlement{Provider: payments.ProviderStripe, RefundID: refundID, ProviderRefundID: providerRefundID})
		return err
	}
	return s.svc.RetryRefund(ctx, refundID, "the provider's refund "+providerRefundID+" is "+status, pendingRecheck)
}

func (s refundStore) Retry(ctx context.Context, refundID, msg string, after time.Duration) error {
	return s.svc.RetryRefund(ctx, refundID, msg, after)
}

func (s refundStore) Fail(ctx context.Context, refundID, msg string) error {
	_, err := s.svc.Settle(ctx, stock.Settlement{Provider: payments.ProviderStripe, RefundID: refundID, Failed: true, Reason: msg})
	return err
}
