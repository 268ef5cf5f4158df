// Command loadtest fires hey's requester at shop and records what the buyers
// were told.
//
//	go run ./loadtest -scenario sellout -url http://127.0.0.1:8080 -skus 5000 -buyers 4
//
// Scenarios:
//
//	sellout  every SKU 1..skus wanted by buyers buyers at once (one unit each after `shop seed`)
//	hotsku   one SKU wanted by n buyers
//	read     n GET /api/v1/products/{id} over ids 1..skus
//	hotread  n GET of product sku (breakdown: run it as the key expires)
//	absent   n GET over ids skus+1..skus+distinct, which do not exist (penetration)
//	absent-stock  the same ids' GET /api/v1/products/{id}/stock
//	stock    n GET /api/v1/products/{sku}/stock of the SKU sku, which exists
//	order-guess   n GET /api/v1/orders/{id}?user_id=N of order ids drawn
//	              from 1..distinct and user ids from 1..2^31, as someone
//	              reading other buyers' orders would guess them; with
//	              -jwt-secret, with the token of user first-user, which
//	              owns none of them, and user_id its own
//	healthz  n GET /healthz
//	malformed     n POST /api/v1/orders that are refused 400: in turn a body
//	              that is not JSON, and sku_id 0 (user firstUser+i)
//
// With -for D, one of the GET scenarios or malformed is a flood instead:
// -c clients send its requests one after the other for D, without hey or
// the tap, and the result counts the answers by status (flood.go).
//
// With -client direct, a run of -n requests goes through the load test's
// own client instead of hey: -c workers hand each buyer to the tap's
// bookkeeping in process, with no proxy hop (direct.go), so that the load
// test costs about what a flood's client costs per request. hey, through
// the tap, stays the default.
//
// With -src-n N, request i leaves from loopback address i mod N, so that a
// crowd reaches nginx from many addresses, as real buyers do (source.go).
//
// With several -url (comma-separated), request i goes to url i mod len, so
// the buyers of one SKU arrive through different replicas. It prints hey's
// summary and a progress line each second, and writes a JSON result (-json)
// and the acknowledged orders, one "order_id sku_id user_id" line per 201
// (-acks), for `shop verify --acks`.
//
// Buyer i (counted from 0) is user firstUser+i: -first-user sends a second
// round of buyers who have not bought before.
//
// With -retry, every buyer sends an Idempotency-Key of its own
// (lt-<sku>-<user>-<run>, where run is drawn anew by each run, so that no
// run replays an earlier one's orders) and retries a 429, 502, 503, 504 or
// a transport error with the same key, waiting a random time up to what
// Retry-After says (at least 50 ms, at most 5 s, longer the more it has
// failed), within -retries attempts and -retry-for: the retries happen in
// the tap, before hey is answered, so hey's latency is the buyer's whole
// wait. Each buyer's last answer is reported (final_statuses): answered
// (2xx or 4xx but 429) or unanswered (still 429, 5xx or a transport error
// when the bound is reached). -rate R caps
// the buyers started per second over all workers (hey gives each worker
// R/c), so that a sale lasts long enough for a fault to land mid-sale.
//
// The order lifecycle: a 201 whose status is "reserved" must be paid by
// its pay_by, and the payers play the payment provider (pay.go): a payment
// is the provider's signed event that money arrived, never a buyer's word.
// With -pay-frac F, a share F of the orders (picked by order id, see
// payShare) is paid at once: a payment.succeeded event, signed by Standard
// Webhooks with -webhook-secret (the service's
// SHOP_PAYMENT_WEBHOOK_SECRET, read from the environment when the flag is
// empty), POSTed to /api/v1/payments/events with the payment id
// pay-<order_id> and the amount_cents and currency of the order's 201.
// With -late-frac L, another share L is paid -late-by after pay_by, too
// late on purpose: the service must answer 200 "owed" and owe it back
// (order_expired). Payments that are wrong on purpose: -dup-frac D (D of
// the orders, among those paid in time, paid a second time under another
// payment id: duplicate_payment), -mismatch-frac M (another share M paid
// at once one unit short: amount_mismatch, the order stays reserved) and
// -unknown-orders N (N payments for orders that do not exist, ids from
// 2^62: unknown_order). Payments need a secret: without one, these flags
// are an error (exit 2, as every bad flag is). Payers deliver a payment
// again after a 429, 502, 503, 504 or a transport error, with the same
// body and message id (msg_<payment_id>) and a fresh timestamp and
// signature, within -retries and -retry-for. With -stripe they play
// Stripe: each payment of an order's own follows its checkout (POST
// /api/v1/orders/{id}/checkout, as its buyer) and is a
// payment_intent.succeeded event for the checkout's PaymentIntent, signed
// with the Stripe endpoint's secret (-webhook-secret, or
// SHOP_STRIPE_WEBHOOK_SECRET) and POSTed to /api/v1/payments/stripe.
// -payments writes one line per payment; the JSON result counts them by
// kind and last answer (paid: 200 applied; refused: 200 owed, to be paid
// back). Once every order is placed and every payment but the late ones
// made, the load test says so on stderr ("loadtest: orders done"), then
// waits for the late payments.
//
// With -until K, a buyer answered 409 sold_out buys again after a backoff
// (100 ms doubling up to 1 s, jittered), each purchase attempt under a key
// of its own, until the run has won K orders or -until-for has passed: a
// second wave of new buyers (-first-user) waiting for the units that lapsed
// reservations give back.
//
// With -jwt-secret S, for a shop with SHOP_AUTH=jwt and SHOP_JWT_SECRET=S,
// every buyer sends Authorization: Bearer <JWT>, HS256 with S, its user id
// as sub, expiring an hour after it was minted (and -jwt-issuer,
// -jwt-audience as iss and aud when given). A buyer's token is minted once,
// the first time its request is built, and kept: a retry, or the same user
// in another request, sends the same token.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/rakyll/hey/requester"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var usage usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// usageError is a bad flag, or flags that do not go together: exit 2, as
// the flag package's own errors are.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

type options struct {
	scenario    string
	urls        []string
	skus        int
	buyers      int
	sku         int
	firstUser   int
	distinct    int
	n           int
	concurrency int
	timeout     time.Duration
	jsonPath    string
	acksPath    string
	keys        bool
	retry       bool
	retries     int
	retryFor    time.Duration
	rate        float64
	srcN        int
	srcFrom     int
	// client sends the requests of a run of -n: hey through the tap's
	// proxy, or the load test's own (direct.go).
	client string
	// run makes this run's Idempotency-Keys its own: a second wave, or the
	// same buyers sent again, never replays an earlier run's key.
	run string

	payFrac       float64
	lateFrac      float64
	dupFrac       float64
	mismatchFrac  float64
	cancelFrac    float64
	unknownOrders int
	lateBy        time.Duration
	paymentsPath  string
	// provider signs the payments (-webhook-secret, -stripe); nil when
	// the run makes none.
	provider provider
	// flood, when above zero, is -for: how long a flood lasts.
	flood    time.Duration
	until    int
	untilFor time.Duration
	// tokens mints the buyers' JWTs with -jwt-secret; nil without it.
	tokens *tokens
}

// minJWTSecret is the shortest secret shop takes for SHOP_JWT_SECRET.
const minJWTSecret = 32

// tokenLife is how long a buyer's token is good for: longer than any run.
const tokenLife = time.Hour

// tokens are the buyers' JWTs, each minted the first time it is asked for
// and kept, so that what a request costs the load test stays what it cost
// before: one map lookup, not an HMAC.
type tokens struct {
	secret           []byte
	issuer, audience string
	mu               sync.Mutex
	byUser           map[int]string
}

func newTokens(secret, issuer, audience string) *tokens {
	return &tokens{secret: []byte(secret), issuer: issuer, audience: audience, byUser: map[int]string{}}
}

// of returns user's token.
func (t *tokens) of(user int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.byUser[user]; ok {
		return s
	}
	now := time.Now()
	claims := jwt.MapClaims{"sub": strconv.Itoa(user), "iat": now.Unix(), "exp": now.Add(tokenLife).Unix()}
	if t.issuer != "" {
		claims["iss"] = t.issuer
	}
	if t.audience != "" {
		claims["aud"] = t.audience
	}
	// HS256 with a []byte key does not fail.
	s, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(t.secret)
	t.byUser[user] = s
	return s
}

// Result is what -json writes.
type Result struct {
	Scenario    string         `json:"scenario"`
	Client      string         `json:"client,omitempty"` // hey or direct; empty for a flood
	URLs        []string       `json:"urls"`
	Requests    int            `json:"requests"`
	Concurrency int            `json:"concurrency"`
	Seconds     float64        `json:"seconds"`
	RPS         float64        `json:"rps"`
	P50Ms       float64        `json:"p50_ms"`
	P99Ms       float64        `json:"p99_ms"`
	Statuses    map[string]int `json:"statuses"`
	Errors      map[string]int `json:"errors,omitempty"`
	Acks        int            `json:"acks"`
	// Rate is -rate: the most buyers started per second, 0 for no limit.
	Rate float64 `json:"rate,omitempty"`
	// Retry is -retry. Statuses and Errors count every attempt's answer,
	// these each buyer's last one; without -retry a buyer makes one
	// attempt.
	Retry         bool           `json:"retry"`
	Buyers        int            `json:"buyers"`
	Answered      int            `json:"answered"`   // last answer 2xx or 4xx, but not 429
	Unanswered    int            `json:"unanswered"` // last answer 429, 5xx or a transport error
	Retries       int            `json:"retries"`    // attempts after the first, in all
	FinalStatuses map[string]int `json:"final_statuses"`

	// Reserved counts the acks whose order was reserved (awaiting
	// payment); Payments, with -pay-frac or -late-frac, what became of the
	// payments.
	Reserved int        `json:"reserved"`
	Payments *PayResult `json:"payments,omitempty"`
	// Cancels, with -cancel-frac, what became of the buyers' cancels.
	Cancels *CancelResult `json:"cancels,omitempty"`
	// Until is -until; Rebuys counts the purchase attempts made after a
	// sold_out.
	Until  int `json:"until,omitempty"`
	Rebuys int `json:"rebuys"`
}

func parse(args []string) (options, error) {
	var o options
	var stripeFlow bool
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.StringVar(&o.scenario, "scenario", "sellout", "sellout, hotsku, read, hotread, absent, absent-stock, stock, order-guess, healthz or malformed")
	urls := fs.String("url", "http://127.0.0.1:8080", "base URL(s), comma-separated")
	fs.IntVar(&o.skus, "skus", 5000, "sellout/read: SKUs 1..skus")
	fs.IntVar(&o.buyers, "buyers", 4, "sellout: buyers per SKU")
	fs.IntVar(&o.sku, "sku", 1, "hotsku, hotread: the SKU")
	fs.IntVar(&o.firstUser, "first-user", 1, "sellout, hotsku: the user id of the first buyer; buyer i is first-user+i")
	fs.IntVar(&o.distinct, "distinct", 1000, "absent: distinct ids asked for")
	fs.IntVar(&o.n, "n", 0, "requests (sellout: skus×buyers)")
	fs.IntVar(&o.concurrency, "c", 4000, "concurrent buyers (workers); each sends n/c requests in turn")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "per-request timeout")
	fs.StringVar(&o.jsonPath, "json", "", "write the result as JSON to this file")
	fs.StringVar(&o.acksPath, "acks", "", "write the acknowledged orders to this file, one \"order_id sku_id user_id\" line each")
	fs.BoolVar(&o.keys, "idempotency-keys", false, "send an Idempotency-Key with each order")
	fs.BoolVar(&o.retry, "retry", false, "retry 429, 502, 503, 504 and transport errors with the buyer's Idempotency-Key, honouring Retry-After")
	fs.IntVar(&o.retries, "retries", 30, "-retry: the most attempts per buyer")
	fs.DurationVar(&o.retryFor, "retry-for", 90*time.Second, "-retry: no attempt starts later than this after a buyer's first")
	fs.Float64Var(&o.rate, "rate", 0, "the most buyers started per second, over all workers (0: no limit)")
	fs.StringVar(&o.client, "client", clientHey, "the client of a run of -n requests: hey (hey's requester through the load test's tap, "+
		"an HTTP proxy in this process) or direct (the load test's own client, without the proxy hop; see direct.go)")
	fs.IntVar(&o.srcFrom, "src-from", 0, "-src-n: the first source address, counted from 127.1.1.1 (0)")
	fs.DurationVar(&o.flood, "for", 0, "flood: send the scenario's requests (not sellout or hotsku) from -c clients for this long; 0: -n requests through hey")
	fs.IntVar(&o.srcN, "src-n", 1, "spread the requests over this many loopback source addresses (127.1.b.c), request i from address i mod src-n; 1: the system's choice")
	fs.Float64Var(&o.payFrac, "pay-frac", 0, "the share of the reserved orders paid at once, by a signed payment event (picked by order id)")
	fs.Float64Var(&o.lateFrac, "late-frac", 0, "another share of the reserved orders paid -late-by after their pay_by: too late, owed back (order_expired)")
	fs.DurationVar(&o.lateBy, "late-by", time.Second, "how long after its order's pay_by a late payment is made")
	fs.Float64Var(&o.dupFrac, "dup-frac", 0, "the share of the reserved orders (among those -pay-frac pays) paid a second time under another payment id: owed back, duplicate_payment")
	fs.Float64Var(&o.mismatchFrac, "mismatch-frac", 0, "another share of the reserved orders paid at once one unit short: owed back, amount_mismatch; the order stays reserved")
	fs.Float64Var(&o.cancelFrac, "cancel-frac", 0, "another share of the reserved orders cancelled at once by their buyer (POST /api/v1/orders/{id}/cancel)")
	fs.IntVar(&o.unknownOrders, "unknown-orders", 0, "this many payments for orders that do not exist: owed back, unknown_order")
	webhookSecret := fs.String("webhook-secret", "", "the payment provider's secret the payments are signed with; empty: $"+envWebhookSecret+
		" (with -stripe: $"+envStripeSecret+")")
	fs.BoolVar(&stripeFlow, "stripe", false, "pay as Stripe: each order's checkout, then a signed payment_intent.succeeded for its PaymentIntent (-webhook-secret is the Stripe endpoint's whsec_)")
	fs.StringVar(&o.paymentsPath, "payments", "", "write the payments to this file, one \"order_id user_id payment_id kind last_answer\" line each")
	fs.IntVar(&o.until, "until", 0, "buyers answered 409 sold_out buy again, after a backoff, until the run has won this many orders (0: never)")
	fs.DurationVar(&o.untilFor, "until-for", 2*time.Minute, "-until: no purchase attempt starts later than this after the run began")
	jwtSecret := fs.String("jwt-secret", "", "send each buyer's order with a JWT (HS256, sub = its user id) signed with this secret: shop's SHOP_JWT_SECRET")
	jwtIssuer := fs.String("jwt-issuer", "", "-jwt-secret: the tokens' iss (shop's SHOP_JWT_ISSUER)")
	jwtAudience := fs.String("jwt-audience", "", "-jwt-secret: the tokens' aud (shop's SHOP_JWT_AUDIENCE)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case *jwtSecret != "" && len(*jwtSecret) < minJWTSecret:
		return o, fmt.Errorf("-jwt-secret: %d bytes; shop's SHOP_JWT_SECRET has at least %d", len(*jwtSecret), minJWTSecret)
	case *jwtSecret != "":
		o.tokens = newTokens(*jwtSecret, *jwtIssuer, *jwtAudience)
	case *jwtIssuer != "" || *jwtAudience != "":
		return o, errors.New("-jwt-issuer and -jwt-audience need -jwt-secret")
	}
	for _, u := range strings.Split(*urls, ",") {
		if _, err := url.ParseRequestURI(u); err != nil {
			return o, fmt.Errorf("-url %q: %w", u, err)
		}
		o.urls = append(o.urls, strings.TrimRight(u, "/"))
	}
	switch o.scenario {
	case "sellout":
		o.n = o.skus * o.buyers
	case "hotsku", "read", "hotread", "absent", "absent-stock", "stock", "order-guess", "healthz", "malformed":
		if o.n <= 0 {
			o.n = 1000
		}
	default:
		return o, fmt.Errorf("-scenario %q: want sellout, hotsku, read, hotread, absent, absent-stock, stock, order-guess, healthz or malformed", o.scenario)
	}
	if o.flood < 0 || o.flood > 0 && (o.scenario == "sellout" || o.scenario == "hotsku") {
		return o, errors.New("-for must not be negative, and floods no order scenario: buyers are counted by hey")
	}
	if o.n <= 0 || o.skus <= 0 || o.buyers <= 0 || o.distinct <= 0 || o.firstUser <= 0 {
		return o, errors.New("-n, -skus, -buyers, -distinct and -first-user must be positive")
	}
	if o.concurrency <= 0 {
		return o, errors.New("-c must be positive")
	}
	if o.client != clientHey && o.client != clientDirect {
		return o, fmt.Errorf("-client %q: want %s or %s", o.client, clientHey, clientDirect)
	}
	if o.retries <= 0 || o.retryFor <= 0 || o.timeout <= 0 {
		return o, errors.New("-retries, -retry-for and -timeout must be positive")
	}
	if o.rate < 0 {
		return o, errors.New("-rate must not be negative")
	}
	if o.srcN < 1 || o.srcFrom < 0 || o.srcFrom+o.srcN > maxSources {
		return o, fmt.Errorf("-src-n must be positive, -src-from not negative, and their sum at most %d", maxSources)
	}
	if o.lateBy < 0 || o.until < 0 || o.untilFor <= 0 {
		return o, errors.New("-late-by and -until must not be negative, -until-for must be positive")
	}
	if err := o.payments(*webhookSecret, stripeFlow); err != nil {
		return o, err
	}
	o.run = strconv.FormatUint(uint64(rand.Uint32()), 36)
	if o.flood > 0 {
		return o, nil // -c clients for -for, however many requests
	}
	o.concurrency = min(o.concurrency, o.n)
	// hey gives each worker n/c requests and drops the remainder; the
	// direct client's workers take the requests in turn, however many.
	for o.client == clientHey && o.n%o.concurrency != 0 {
		o.concurrency--
	}
	return o, nil
}

// The settings -webhook-secret falls back to: the service's own names for
// the secrets.
const (
	envWebhookSecret = "SHOP_PAYMENT_WEBHOOK_SECRET"
	envStripeSecret  = "SHOP_STRIPE_WEBHOOK_SECRET"
)

// payments checks the payment flags and, when they make payments, sets
// o.provider: Standard Webhooks signed with secret, or Stripe with
// stripeFlow. An empty secret is read from the environment, under the
// name the service reads it by.
func (o *options) payments(secret string, stripeFlow bool) error {
	if o.payFrac < 0 || o.lateFrac < 0 || o.mismatchFrac < 0 || o.dupFrac < 0 || o.cancelFrac < 0 || o.unknownOrders < 0 {
		return errors.New("-pay-frac, -late-frac, -mismatch-frac, -dup-frac, -cancel-frac and -unknown-orders must not be negative")
	}
	if o.payFrac+o.lateFrac+o.mismatchFrac+o.cancelFrac > 1 {
		return errors.New("-pay-frac, -late-frac, -mismatch-frac and -cancel-frac must not add up to more than 1")
	}
	if o.dupFrac > o.payFrac {
		return errors.New("-dup-frac must not be above -pay-frac: a second payment is made for an order paid in time")
	}
	if !o.plan().pays() {
		return nil
	}
	env := envWebhookSecret
	if stripeFlow {
		env = envStripeSecret
	}
	if secret == "" {
		secret = os.Getenv(env)
	}
	if secret == "" {
		return fmt.Errorf("payments are signed events: -pay-frac, -late-frac, -mismatch-frac and -unknown-orders need "+
			"-webhook-secret (or %s), the secret the service checks them with", env)
	}
	var err error
	if stripeFlow {
		o.provider, err = newStripeProvider(secret)
	} else {
		o.provider, err = newStandardProvider(secret)
	}
	if err != nil {
		// The error names the service's setting; the secret is this
		// flag's, or that setting's when the flag is empty.
		return fmt.Errorf("-webhook-secret: %w", err)
	}
	return nil
}

// plan is the payment plan the flags ask for.
func (o options) plan() payPlan {
	return payPlan{frac: o.payFrac, lateFrac: o.lateFrac, dupFrac: o.dupFrac, mismatchFrac: o.mismatchFrac,
		cancelFrac: o.cancelFrac, unknownOrders: o.unknownOrders, lateBy: o.lateBy}
}

// requests returns hey's RequestFunc for the scenario: request i (in the
// order hey asks for them) is always the same request.
func requests(o options) func() *http.Request {
	var next atomic.Int64
	return func() *http.Request {
		i := int(next.Add(1) - 1)
		base := o.urls[i%len(o.urls)]
		var sku, user int
		switch o.scenario {
		case "read":
			return getProduct(base, i%o.skus+1)
		case "hotread":
			return getProduct(base, o.sku)
		case "absent":
			return getProduct(base, o.skus+1+i%o.distinct)
		case "absent-stock":
			return getStock(base, o.skus+1+i%o.distinct)
		case "stock":
			return getStock(base, o.sku)
		case "order-guess":
			return guessOrder(o, base, i)
		case "healthz":
			req, _ := http.NewRequest("GET", base+"/healthz", nil)
			return req
		case "malformed":
			body := `{"sku_id":`
			if i%2 == 1 {
				body = fmt.Sprintf(`{"sku_id":0,"user_id":%d}`, o.firstUser+i)
			}
			req, _ := http.NewRequest("POST", base+"/api/v1/orders", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			return req
		case "hotsku":
			sku, user = o.sku, o.firstUser+i
		default: // sellout: the buyers of a SKU are consecutive
			sku, user = i/o.buyers+1, o.firstUser+i
		}
		body := fmt.Sprintf(`{"sku_id":%d,"user_id":%d}`, sku, user)
		req, _ := http.NewRequest("POST", base+"/api/v1/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if o.tokens != nil {
			req.Header.Set("Authorization", "Bearer "+o.tokens.of(user))
		}
		if o.keys || o.retry {
			req.Header.Set("Idempotency-Key", fmt.Sprintf("lt-%d-%d-%s", sku, user, o.run))
		}
		return req
	}
}

func getStock(base string, id int) *http.Request {
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/api/v1/products/%d/stock", base, id), nil)
	return req
}

// guessOrder is order-guess's request i: the order id and user id are
// drawn from i (a different pair for each i, the same for the same i), as
// a guesser would, not in turn; with tokens, the guesser's own token and
// user id, which own none of the orders.
func guessOrder(o options, base string, i int) *http.Request {
	r := rand.New(rand.NewPCG(uint64(i), 0x9e3779b97f4a7c15))
	id, user := 1+r.IntN(o.distinct), 1+r.IntN(1<<31-1)
	if o.tokens != nil {
		user = o.firstUser
	}
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/api/v1/orders/%d?user_id=%d", base, id, user), nil)
	if o.tokens != nil {
		req.Header.Set("Authorization", "Bearer "+o.tokens.of(user))
	}
	return req
}

func getProduct(base string, id int) *http.Request {
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/api/v1/products/%d", base, id), nil)
	return req
}

// summary is hey's summary, rendered by hey's report with this template;
// the lines starting with @@ carry figures for the JSON result.
const summary = `
Summary:
  Total:	{{ formatNumber .Total.Seconds }} secs
  Slowest:	{{ formatNumber .Slowest }} secs
  Fastest:	{{ formatNumber .Fastest }} secs
  Average:	{{ formatNumber .Average }} secs
  Requests/sec:	{{ formatNumber .Rps }}

Response time histogram:
{{ histogram .Histogram }}
Latency distribution:{{ range .LatencyDistribution }}
  {{ .Percentage }}% in {{ formatNumber .Latency }} secs{{ end }}

Status code distribution:{{ range $code, $num := .StatusCodeDist }}
  [{{ $code }}]	{{ $num }} responses{{ end }}
{{ if gt (len .ErrorDist) 0 }}
Error distribution:{{ range $err, $num := .ErrorDist }}
  [{{ $num }}]	{{ $err }}{{ end }}{{ end }}
@@total {{ .Total.Seconds }}
@@rps {{ .Rps }}
@@lats{{ range .Lats }} {{ . }}{{ end }}
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args)
	if err != nil {
		return usageError{err}
	}
	if o.flood > 0 {
		return flood(ctx, o, stdout, stderr)
	}
	policy := retryPolicy{attempts: 1, budget: o.timeout, timeout: o.timeout}
	if o.retry {
		policy.attempts, policy.budget = o.retries, o.retryFor
	}
	// Through hey, the tap's proxy caps the requests in flight to each
	// URL; the direct client's -c workers are each one of them.
	inFlight, conns := tapConnsPerHost, 0
	if o.client == clientDirect {
		inFlight = o.concurrency
	} else {
		conns = 2 * o.concurrency // each of hey's workers to the tap, and the tap's end
	}
	srcs, err := newSources(o.srcFrom, o.srcN, inFlight)
	if err != nil {
		return err
	}
	tp := newTap(policy, srcs)
	if err := raiseFileLimit(uint64(conns + len(o.urls)*tp.sources.conns() + 256)); err != nil {
		return fmt.Errorf("%w: lower -c", err)
	}
	if o.provider != nil || o.cancelFrac > 0 {
		// Payers retry whether or not buyers do: a payment (or a cancel)
		// is delivered until it is answered.
		payPolicy := retryPolicy{attempts: o.retries, budget: o.retryFor, timeout: o.timeout}
		tp.payer = newPayer(ctx, o.plan(), o.provider, o.run, payPolicy)
		for i := range o.unknownOrders {
			tp.payer.schedule(tp.payer.unknownPayment(i, o.urls[i%len(o.urls)], tp.sources.of(i)))
		}
	}
	if o.until > 0 {
		tp.until, tp.untilEnd = int64(o.until), time.Now().Add(o.untilFor)
	}
	wait := policy.wait()
	if o.until > 0 {
		wait += o.untilFor
	}

	fmt.Fprintf(stderr, "loadtest: %s, %d requests, %d at once, through %s, to %s\n", o.scenario, o.n, o.concurrency, o.client,
		strings.Join(o.urls, ", "))
	res := Result{Scenario: o.scenario, URLs: o.urls, Requests: o.n, Concurrency: o.concurrency, Rate: o.rate, Retry: o.retry,
		Until: o.until, Client: o.client}
	if o.client == clientDirect {
		finished := make(chan struct{})
		go progress(ctx, tp, o.n, finished, stderr, func() {})
		// The tap answers a buyer within wait; a few seconds more, as
		// hey's timeout has, so that the tap's timeout ends an attempt.
		tm := direct(ctx, o, tp, wait+5*time.Second)
		close(finished)
		tp.close(0)
		res.Seconds = tm.seconds
		if tm.seconds > 0 {
			res.RPS = float64(len(tm.lats)) / tm.seconds
		}
		res.P50Ms, res.P99Ms = percentile(tm.lats, 50)*1000, percentile(tm.lats, 99)*1000
		fmt.Fprintf(stdout, "direct %s: %d buyers in %.2fs, %.0f/s, p50 %.1f ms, p99 %.1f ms\n", o.scenario, len(tm.lats),
			res.Seconds, res.RPS, res.P50Ms, res.P99Ms)
	} else {
		report, err := viaHey(ctx, o, tp, wait, stderr)
		if err != nil {
			return err
		}
		printSummary(report, stdout, &res)
	}
	var pays PayResult
	var payLines []string
	if tp.payer != nil {
		tp.payer.inTime.Wait()
	}
	if o.provider != nil {
		pays, _ = tp.payer.result()
	}
	// The demo starts its next wave on this line: every order of this one
	// is placed and every payment in time made.
	fmt.Fprintf(stderr, "loadtest: orders done: %d acknowledged, %d paid in time\n", tp.won.Load(), pays.InTime.Paid)
	if tp.payer != nil {
		if o.lateFrac > 0 {
			fmt.Fprintf(stderr, "loadtest: waiting for the late payments (%s after their pay_by)\n", o.lateBy)
		}
		tp.payer.late.Wait()
	}
	if o.provider != nil {
		pays, payLines = tp.payer.result()
	}

	tl := tp.snapshot()
	tl.fill(&res)
	if o.provider != nil {
		res.Payments = &pays
		fmt.Fprintln(stdout, pays.summary())
	}
	if o.cancelFrac > 0 {
		cancels := tp.payer.cancelResult()
		res.Cancels = &cancels
		fmt.Fprintln(stdout, cancels)
	}
	if o.until > 0 {
		fmt.Fprintf(stdout, "bought %d of %d wanted; purchase attempts after a sold_out: %d\n", res.Acks, o.until, res.Rebuys)
	}
	for e, n := range res.Errors {
		fmt.Fprintf(stdout, "tap error [%d]: %s\n", n, e)
	}
	fmt.Fprintf(stdout, "acknowledged orders: %d\n", res.Acks)
	fmt.Fprintf(stdout, "buyers: %d, answered %d, unanswered %d; retries %d; last answers %s\n",
		res.Buyers, res.Answered, res.Unanswered, res.Retries, counts(res.FinalStatuses))

	if o.acksPath != "" {
		var b strings.Builder
		for _, a := range tl.acks {
			fmt.Fprintln(&b, a)
		}
		if err := os.WriteFile(o.acksPath, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	if o.paymentsPath != "" {
		var b strings.Builder
		for _, line := range payLines {
			fmt.Fprintln(&b, line)
		}
		if err := os.WriteFile(o.paymentsPath, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	if o.jsonPath != "" {
		data, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(o.jsonPath, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// viaHey sends the scenario's requests through hey's requester and the
// tap's proxy, each buyer within wait, and returns hey's summary.
func viaHey(ctx context.Context, o options, tp *tap, wait time.Duration, stderr io.Writer) (string, error) {
	if err := tp.listen(); err != nil {
		return "", err
	}
	proxy, _ := url.Parse("http://" + tp.addr)
	var report bytes.Buffer
	w := &requester.Work{
		Request:     requests(o)(), // hey needs Request set even with RequestFunc
		RequestFunc: requests(o),
		N:           o.n,
		C:           o.concurrency,
		QPS:         o.rate / float64(o.concurrency),
		// Longer than the tap takes for a buyer, so that the tap's
		// timeout, not hey's, ends an attempt and is counted.
		Timeout:   int(math.Ceil((wait + 5*time.Second).Seconds())),
		ProxyAddr: proxy,
		Output:    summary,
		Writer:    &report,
	}
	w.Init()
	finished := make(chan struct{})
	go progress(ctx, tp, o.n, finished, stderr, w.Stop)
	w.Run()
	close(finished)
	tp.close(10 * time.Second) // buyers whose hey request gave up are still counted
	return report.String(), nil
}

// fill puts the tally's counts into res.
func (tl tally) fill(res *Result) {
	res.Statuses = map[string]int{}
	for code, n := range tl.statuses {
		res.Statuses[strconv.Itoa(code)] = n
	}
	if len(tl.errors) > 0 {
		res.Errors = tl.errors
	}
	res.Acks = len(tl.acks)
	res.Reserved = tl.reserved
	res.Rebuys = tl.rebuys
	res.Retries = tl.retries
	res.FinalStatuses = tl.finals
	for key, n := range tl.finals {
		res.Buyers += n
		if code, err := strconv.Atoi(key); err == nil && !retryableStatus(code) && code < 500 {
			res.Answered += n
		} else {
			res.Unanswered += n
		}
	}
}

// counts renders a count per key, keys in order: "201 10, 409 30".
func counts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// printSummary prints hey's summary without the @@ lines, which it reads into
// res. Percentiles are taken here from every latency hey measured (nearest
// rank), as hey's own table leaves p99 empty below 100 requests.
func printSummary(report string, w io.Writer, res *Result) {
	sc := bufio.NewScanner(strings.NewReader(report))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "@@total":
			res.Seconds, _ = strconv.ParseFloat(f[1], 64)
		case len(f) == 2 && f[0] == "@@rps":
			res.RPS, _ = strconv.ParseFloat(f[1], 64)
		case len(f) > 0 && f[0] == "@@lats":
			lats := make([]float64, 0, len(f)-1)
			for _, v := range f[1:] {
				if x, err := strconv.ParseFloat(v, 64); err == nil {
					lats = append(lats, x)
				}
			}
			slices.Sort(lats)
			res.P50Ms = percentile(lats, 50) * 1000
			res.P99Ms = percentile(lats, 99) * 1000
		case strings.HasPrefix(line, "@@"):
		default:
			fmt.Fprintln(w, line)
		}
	}
}

// percentile returns the nearest-rank p-th percentile of sorted xs.
func percentile(xs []float64, p int) float64 {
	if len(xs) == 0 {
		return 0
	}
	rank := (p*len(xs) + 99) / 100 // ceil(p/100 × n)
	return xs[max(rank, 1)-1]
}

// progress prints a line each second until the run ends; an interrupt stops
// the run early.
func progress(ctx context.Context, tp *tap, total int, finished <-chan struct{}, w io.Writer, stop func()) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case <-finished:
			return
		case <-ctx.Done():
			stop()
			return
		case <-tick.C:
			tl := tp.snapshot()
			n := 0
			for _, v := range tl.errors {
				n += v
			}
			fmt.Fprintf(w, "progress: %d/%d done in %s, statuses %v, errors %d, retries %d\n",
				tp.done.Load(), total, time.Since(start).Round(time.Second), tl.statuses, n, tl.retries)
		}
	}
}

// raiseFileLimit lifts the open-files limit to at least want: every worker
// holds a connection to the tap and the tap one to the service.
func raiseFileLimit(want uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= want {
		return nil
	}
	if lim.Max < want {
		raised := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			return nil
		}
	}
	lim.Cur = min(want, lim.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur < want {
		return fmt.Errorf("open-files limit is %d, below the %d this run needs", lim.Cur, want)
	}
	return nil
}
