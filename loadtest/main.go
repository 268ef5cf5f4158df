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
// (lt-<sku>-<user>) and retries a 502, 503, 504 or a transport error with
// the same key, waiting a random time up to what Retry-After says (at least
// 50 ms, at most 5 s, longer the more it has failed), within -retries
// attempts and -retry-for: the retries happen in the tap, before hey is
// answered, so hey's latency is the buyer's whole wait. Each buyer's last
// answer is reported (final_statuses): answered (2xx or 4xx) or unanswered
// (still 5xx or a transport error when the bound is reached). -rate R caps
// the buyers started per second over all workers (hey gives each worker
// R/c), so that a sale lasts long enough for a fault to land mid-sale.
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
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

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
	Answered      int            `json:"answered"`   // last answer 2xx or 4xx
	Unanswered    int            `json:"unanswered"` // last answer 5xx or a transport error
	Retries       int            `json:"retries"`    // attempts after the first, in all
	FinalStatuses map[string]int `json:"final_statuses"`
}

func parse(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.StringVar(&o.scenario, "scenario", "sellout", "sellout, hotsku, read, hotread or absent")
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
	fs.BoolVar(&o.retry, "retry", false, "retry 502, 503, 504 and transport errors with the buyer's Idempotency-Key, honouring Retry-After")
	fs.IntVar(&o.retries, "retries", 30, "-retry: the most attempts per buyer")
	fs.DurationVar(&o.retryFor, "retry-for", 90*time.Second, "-retry: no attempt starts later than this after a buyer's first")
	fs.Float64Var(&o.rate, "rate", 0, "the most buyers started per second, over all workers (0: no limit)")
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
	case "hotsku", "read", "hotread", "absent":
		if o.n <= 0 {
			o.n = 1000
		}
	default:
		return o, fmt.Errorf("-scenario %q: want sellout, hotsku, read, hotread or absent", o.scenario)
	}
	if o.n <= 0 || o.skus <= 0 || o.buyers <= 0 || o.distinct <= 0 || o.firstUser <= 0 {
		return o, errors.New("-n, -skus, -buyers, -distinct and -first-user must be positive")
	}
	if o.concurrency <= 0 {
		return o, errors.New("-c must be positive")
	}
	if o.retries <= 0 || o.retryFor <= 0 || o.timeout <= 0 {
		return o, errors.New("-retries, -retry-for and -timeout must be positive")
	}
	if o.rate < 0 {
		return o, errors.New("-rate must not be negative")
	}
	o.concurrency = min(o.concurrency, o.n)
	// hey gives each worker n/c requests and drops the remainder.
	for o.n%o.concurrency != 0 {
		o.concurrency--
	}
	return o, nil
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
			req.Header.Set("Idempotency-Key", fmt.Sprintf("lt-%d-%d", sku, user))
		}
		return req
	}
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
		return err
	}
	// Each worker holds a connection to the tap, whose end is in this
	// process too; the tap's own connections to the service are capped.
	if err := raiseFileLimit(uint64(2*o.concurrency + len(o.urls)*tapConnsPerHost + 256)); err != nil {
		return fmt.Errorf("%w: lower -c", err)
	}
	policy := retryPolicy{attempts: 1, budget: o.timeout, timeout: o.timeout}
	if o.retry {
		policy.attempts, policy.budget = o.retries, o.retryFor
	}
	tp, err := newTap(policy)
	if err != nil {
		return err
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
		Timeout:   int(math.Ceil((policy.wait() + 5*time.Second).Seconds())),
		ProxyAddr: proxy,
		Output:    summary,
		Writer:    &report,
	}
	w.Init()

	fmt.Fprintf(stderr, "loadtest: %s, %d requests, %d at once, to %s\n", o.scenario, o.n, o.concurrency, strings.Join(o.urls, ", "))
	finished := make(chan struct{})
	go progress(ctx, tp, o.n, finished, stderr, w)
	w.Run()
	close(finished)
	tp.close(10 * time.Second) // buyers whose hey request gave up are still counted

	res := Result{Scenario: o.scenario, URLs: o.urls, Requests: o.n, Concurrency: o.concurrency, Rate: o.rate, Retry: o.retry}
	printSummary(report.String(), stdout, &res)
	tl := tp.snapshot()
	tl.fill(&res)
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
	if o.jsonPath != "" {
		data, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(o.jsonPath, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
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
	res.Retries = tl.retries
	res.FinalStatuses = tl.finals
	for key, n := range tl.finals {
		res.Buyers += n
		if code, err := strconv.Atoi(key); err == nil && code < 500 {
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
func progress(ctx context.Context, tp *tap, total int, finished <-chan struct{}, w io.Writer, work *requester.Work) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case <-finished:
			return
		case <-ctx.Done():
			work.Stop()
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
