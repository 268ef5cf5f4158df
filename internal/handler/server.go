// Package handler is shop's HTTP API on gin: request decoding and
// validation, the mapping of domain errors to statuses in one place
// (errors.go), health, readiness and metrics.
package handler

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/payments"
	"shop/internal/stock"
)

// Orders places orders; *stock.Service implements it. KnownSoldOut is what
// it knows without a round trip: products known to be sold out, from this
// replica's findings and the others' announcements.
type Orders interface {
	PlaceOrder(ctx context.Context, sku, user int64, idempotencyKey string) (stock.Order, error)
	KnownSoldOut(sku int64) bool
}

// Products reads products; *cache.Products implements it. The answer may
// come from a cache, so its stock may lag.
type Products interface {
	Product(ctx context.Context, id int64) (stock.Product, error)
}

// Pages keeps product pages as the bytes they are sent as; *cache.Pages,
// a replica's own copy, implements it. Page returns id's page, from the
// copy or from load.
type Pages interface {
	Page(ctx context.Context, id int64, load func(context.Context) ([]byte, error)) ([]byte, error)
}

// Stock reads a product's stock as MySQL has it now; *stock.Catalog
// implements it.
type Stock interface {
	Stock(ctx context.Context, id int64) (int, error)
}

// Seeder resets the catalog. An error means the catalog was not reset.
// Warnings, in words for the client, say what did not follow a reset that
// did happen (the product cache, the other replicas): the seed stands, and
// seeding again to fix them would delete the orders placed meanwhile.
//
// Every product is on sale within sale (see stock.Window).
type Seeder interface {
	Seed(ctx context.Context, products, units int, o stock.SeedOptions) (warnings []string, err error)
}

// ProductAdmin changes a product's sale window and stock (see
// stock.Service.ChangeProduct) and returns it as MySQL has it after the
// change. An error means nothing changed, but for
// stock.ErrChangeOutcomeUnknown: the change may or may not have been made.
// Warnings, in words for the client, say what did not follow a change that
// did happen (the product cache, the other replicas).
type ProductAdmin interface {
	ChangeProduct(ctx context.Context, id int64, c stock.Change) (p stock.Product, warnings []string, err error)
}

// Replays finds the order a buyer placed under an Idempotency-Key;
// *stock.Catalog implements it. A request over its rate limit that replays
// a committed order is answered with it, never refused.
type Replays interface {
	Replay(ctx context.Context, sku, user int64, key string) (stock.Order, error)
}

// Filter rules out ids that are no product without asking MySQL (the
// product cache's Bloom filter); *cache.Products implements it.
type Filter interface {
	RuleOut(ctx context.Context, id int64) error
}

// Deps are what the API works with. A nil dependency is one the API does
// without, where its comment says how; the others are needed by the routes
// that use them.
type Deps struct {
	// Logger receives the access log and the failures. Its handler should
	// be wrapped in requestid.LogHandler, as the other dependencies'
	// loggers, so that each line carries the request's id.
	Logger *slog.Logger
	// Registry receives the HTTP metrics; /metrics serves it.
	Registry *prometheus.Registry

	// Orders places orders, and Lifecycle pays, cancels and reads them.
	Orders    Orders
	Lifecycle Lifecycle
	// Replays, when set, answers an order over its rate limit that
	// replays a committed one.
	Replays Replays
	// Auth authenticates buyers: every buyer route needs a bearer token it
	// accepts, and the buyer is the token's subject. Nil is SHOP_AUTH=none:
	// the request's user_id is the buyer.
	Auth Authenticator

	// Products reads products; Pages, when set, is a copy of the product
	// pages in front of it: GET /api/v1/products/{id} answers from it.
	Products Products
	Pages    Pages
	// Stock reads a product's stock as MySQL has it now. Filter, when set,
	// answers GET /api/v1/products/{id}/stock 404 for an id it rules out,
	// before Stock is asked.
	Stock  Stock
	Filter Filter

	// Verifier checks the payment provider's signed events
	// (SHOP_PAYMENTS): its routes are POST /api/v1/payments/events for
	// Standard Webhooks and POST /api/v1/payments/stripe for Stripe, the
	// other's answers 404. Payments does what the events say, and settles
	// refunds by hand. Nil Verifier: no payment routes.
	Verifier payments.Verifier
	Payments Payments
	// Checkouts, when set (SHOP_PAYMENTS=stripe), answers POST
	// /api/v1/orders/{id}/checkout.
	Checkouts Checkouts

	// Seeder resets the catalog, Admin changes products (PATCH
	// /api/v1/admin/products/{id}), Refunds lists the refunds (GET
	// /api/v1/admin/refunds).
	Seeder  Seeder
	Admin   ProductAdmin
	Refunds Refunds
	// Events lists the outbox's events and redelivers them (GET
	// /api/v1/admin/events, POST /api/v1/admin/events/{id}/redeliver);
	// nil: no such routes.
	Events Events

	// Limiter keeps the rate limits' allowances (Settings.Limits); nil
	// limits nothing but the admin token's guesses, which each replica
	// then bounds in its own memory.
	Limiter RateLimiter
	// Ready names the dependencies that keep the replica from serving now;
	// none is ready. /readyz asks it at every request, so it answers from
	// memory (readiness.Tracker's Failing, whose probes run in the
	// background). Nil means always ready.
	Ready func() (failing []string)
	// Stopping reports that the service is being taken out of service:
	// /readyz answers 503 from then on, whatever Ready says. Nil
	// means never.
	Stopping func() bool
}

// Settings are how the API answers. The zero value limits nothing, trusts
// no proxy, and has the admin API off.
type Settings struct {
	// AdminToken is the bearer token of /api/v1/admin/*; empty turns the
	// admin API off.
	AdminToken string
	// TrustedProxies are the addresses and CIDR ranges of the proxies
	// whose X-Forwarded-For names the client on the public listener (gin's
	// trusted proxies), valid ones only; nil trusts none, and the client
	// is the socket's peer, as it always is on the operators' listener.
	TrustedProxies []string
	// Limits are the rate limits.
	Limits Limits
}

// Handlers are the two listeners' handlers.
type Handlers struct {
	// Public is the API of buyers, product pages and balancers; the
	// operators' routes answer 404 there, whatever is in front of it.
	Public http.Handler
	// Admin is the operators' API: /api/v1/admin/* with the admin token,
	// and /metrics. Serve it on an address of its own, out of the
	// public's reach.
	Admin http.Handler
}

// New returns the HTTP handlers of the whole API on d, as s says. It panics
// on a trusted proxy gin cannot parse: the configuration checks them first.
func New(d Deps, s Settings) Handlers {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
	}
	m := newMetrics(d.Registry)
	lim := newLimiter(d.Limiter, s.Limits, d.Logger, d.Registry)
	// The operators' listener trusts no proxy: nothing proxies to it, and
	// a forwarded address there would let a guesser of the admin token
	// choose a fresh allowance for each guess.
	public, admin := newEngine(s.TrustedProxies), newEngine(nil)
	addRoutes(public, d, m, lim)
	addAdminRoutes(admin, d, s.AdminToken, m, lim)
	return Handlers{Public: withRequestID(public), Admin: withRequestID(admin)}
}

// newEngine is a gin engine that takes the client's address from
// X-Forwarded-For only when a trusted proxy sent it. X-Real-IP, which gin
// also reads by default when X-Forwarded-For is absent, is not read: a
// trusted proxy that leaves X-Forwarded-For out and passes a client's own
// X-Real-IP through would let that client name any address it likes.
func newEngine(trusted []string) *gin.Engine {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.RemoteIPHeaders = []string{"X-Forwarded-For"}
	if err := r.SetTrustedProxies(trusted); err != nil {
		panic(fmt.Sprintf("handler: trusted proxies %q: %v", trusted, err))
	}
	return r
}
