package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The lifecycle rows: a sale does not end at the order. One SKU with
// -life-units units and -life-buyers buyers; every order is a reservation
// that must be paid within -pay-window (SHOP_PAY_WINDOW). Payments are the
// payment provider's signed events (bin/loadtest -webhook-secret, with the
// stack's SHOP_PAYMENT_WEBHOOK_SECRET), carrying what each order owes. A
// share of the orders (-pay-frac) is paid at once, another (-late-frac) a
// second after its pay_by, too late on purpose, and the rest never. Once
// the first wave's orders and payments in time are done, a second wave of
// new buyers (-resale-buyers, bin/loadtest -first-user -until K) waits for
// the units the lapsed reservations give back, buys exactly those K, and
// pays every one. The sale must end with every unit paid, every lapsed
// unit returned once and resold, every late payment a refund owed in
// MySQL (order_expired, of what its order owes) and no other refund, and
// `shop verify` correct. The refunds are settled before the next seed
// (refunds.go).

// The lifecycle rows' variants.
const (
	lifeAsIs       = "as-is"
	lifeSweepKill  = "sweep-kill"  // a replica killed inside its sweep's transaction, MariaDB restarted
	lifeJWT        = "jwt"         // SHOP_AUTH=jwt
	lifeStripe     = "stripe"      // SHOP_PAYMENTS=stripe on stripe-mock: late payments refunded through the Refund API
	lifeRefundKill = "refund-kill" // the same, a replica killed between a Refund API call and its record
	// lifeEvents (events.go) is the sale with events on, the receiver
	// down and a relay killed between a POST and its mark.
)

// lifeRows are the lifecycle rows: as is, a replica killed in the middle of
// its sweep with MariaDB restarted after it (buyers and payers retrying),
// and with the buyers' identity from a JWT. The Stripe rows (stripeRows)
// are lifecycle rows too.
func lifeRows(o options) []row {
	life := func(v, shows string) row { return lifeRow(o, v, shows) }
	kill := life(lifeSweepKill, "the same sale; the first sweep to return the lapsed units is stopped before its COMMIT "+
		"(the shopSweepStall failpoint), its replica is killed there (SIGKILL) and MariaDB restarted: the transaction "+
		"rolls back whole, another replica returns the units, and buyers and payers retry through it")
	kill.Retry, kill.Stall = true, o.stall
	jwt := life(lifeJWT, "the same sale with SHOP_AUTH=jwt: each buyer is the sub of an HS256 token; payments are the provider's signed events")
	jwt.Auth, jwt.JWTSecret = "jwt", o.jwtSecret
	return []row{
		life(lifeAsIs, "reservations that must be paid, by the provider's signed payment events: half are paid, some late "+
			"and owed back (refunds in MySQL), the rest lapse; their units return once and a second wave of new buyers buys and pays them"),
		kill,
		jwt,
	}
}

// lifeRow is a lifecycle row of variant v, on the service's defaults with
// the lifecycle's pay window, that must sell every unit.
func lifeRow(o options, v, shows string) row {
	return row{Lock: "redis", Update: "guarded", Fencing: true, Replicas: 3, Life: v, PayWindow: o.payWindow,
		MustHold: true, WantSold: int64(o.lifeUnits), Shows: shows}
}

// stripeRows are the Stripe rows (stripe.go): the lifecycle sale paid
// through Stripe on stripe-mock, its late payments refunded by the
// replicas' refunders through the Refund API, and again with a replica
// killed between a Refund API call and its record (buyers and payers
// retrying).
func stripeRows(o options) []row {
	stripe := lifeRow(o, lifeStripe, "the same sale with SHOP_PAYMENTS=stripe on stripe-mock: each payment is a checkout (a PaymentIntent) "+
		"and Stripe's signed payment_intent.succeeded; the late ones are owed back and the replicas' refunders pay them back "+
		"through the Refund API, each refund under one Idempotency-Key, its refund_id")
	stripe.Payments = payStripe
	refundKill := lifeRow(o, lifeRefundKill, "the Stripe sale; the first refund called for is stopped between the Refund API call "+
		"and its record (the shopRefundKill failpoint), its replica is killed there (SIGKILL) and started again: once the "+
		"claim's lease runs out a refunder calls again under the same Idempotency-Key, and the refund is refunded once")
	refundKill.Payments, refundKill.RefundStall, refundKill.Retry = payStripe, refundStall, true
	return []row{stripe, refundKill}
}

// newJWTSecret returns a random HS256 secret for the jwt row: 32 bytes, hex.
func newJWTSecret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// stallFor is the failpoint that stops a replica's first sweep transaction
// that returns units, after its writes and before its COMMIT, for d, and the
// binary built with it.
func stallFor(d time.Duration) []string {
	return []string{"SHOP_BINARY=" + failpointBinary, fmt.Sprintf("GOFAIL_FAILPOINTS=shopSweepStall=1*return(%d)", d.Milliseconds())}
}

// stallLine is what the shopSweepStall failpoint prints on the replica's
// standard error (its shop.log) when it stops a sweep.
const stallLine = "failpoint shopSweepStall"

// ordersDoneLine is what bin/loadtest prints on its standard error once
// every order of its wave is placed and every payment in time made.
const ordersDoneLine = "loadtest: orders done"

// lag is a spread of delays.
type lag struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50"`
	Max time.Duration `json:"max"`
}

// lagOf returns the nearest-rank median and the maximum of ds.
func lagOf(ds []time.Duration) lag {
	if len(ds) == 0 {
		return lag{}
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return lag{N: len(ds), P50: ds[(len(ds)+1)/2-1], Max: ds[len(ds)-1]}
}

func (l lag) String() string {
	if l.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s", l.P50.Round(10*time.Millisecond), l.Max.Round(10*time.Millisecond))
}

// lifeResult is what a lifecycle row measured: the two waves as the load
// test saw them, and the orders and refunds as MySQL has them.
type lifeResult struct {
	Units   int
	Buyers  int // the first wave's
	Resold  int // units the second wave set out to buy: those not paid once the first wave's payments in time were done
	Wave1   loadResult
	Wave2   loadResult
	Orders  map[string]int64 // the SKU's orders by status
	Back    map[string]int64 // by status, the orders whose unit was returned (returned_at set)
	Refunds []string         // "order_id payment_id" of the refunds the row's payments made, from MySQL
	// WrongRefunds describes the row's refunds that are not owed as
	// order_expired, of what their order owes, from MySQL.
	WrongRefunds []string
	Late         []string // "order_id payment_id" of the payments made late, from the payments files
	// ReturnLag spreads returned_at − pay_by over the lapsed orders;
	// ResaleLag pairs the k-th lapsed order by pay_by with the second
	// wave's k-th order by created_at and spreads created_at − pay_by.
	ReturnLag lag
	ResaleLag lag
	Fault     string // what was done to the fleet, and when
	Killed    bool   // the failpoint fired and its replica was killed
	// Stripe is a Stripe row's refunds and calls of Stripe's API
	// (stripe.go); nil in the other rows.
	Stripe *stripeResult
	// Events is the events row's outbox and receiver's record
	// (events.go); nil in the other rows.
	Events *eventsResult
	// Failover is the Galera row's writer failover (galera.go); nil in
	// the other rows.
	Failover *failover
}

// lapsed counts the orders whose unit went back to the sale.
func (l *lifeResult) lapsed() int64 { return l.Orders["expired"] + l.Orders["cancelled"] }

// problems lists what a lifecycle row did not do that it must.
func (r result) lifeProblems() []string {
	l := r.Life
	if l == nil {
		return []string{"no figures"}
	}
	var p []string
	if paid := l.Orders["paid"]; paid != int64(l.Units) {
		p = append(p, fmt.Sprintf("paid %d, must be %d", paid, l.Units))
	}
	if l.Back["expired"]+l.Back["cancelled"] != l.lapsed() || l.Back["reserved"]+l.Back["paid"] > 0 {
		p = append(p, fmt.Sprintf("returned_at on %v of the orders %v", l.Back, l.Orders))
	}
	// Every unit is won once, and once more for each time it lapsed: a
	// unit its buyer cancelled during the first wave (the events row) is
	// won again in that wave, the others in the second.
	if int64(l.Wave1.Acks+l.Wave2.Acks) != int64(l.Units)+l.lapsed() || l.Wave2.Acks != l.Resold {
		p = append(p, fmt.Sprintf("%d units lapsed, %d to resell, the waves won %d + %d of %d units",
			l.lapsed(), l.Resold, l.Wave1.Acks, l.Wave2.Acks, l.Units))
	}
	if r.Verify.Stock != 0 {
		p = append(p, fmt.Sprintf("%d units left unsold", r.Verify.Stock))
	}
	if !slices.Equal(l.Refunds, l.Late) {
		p = append(p, fmt.Sprintf("%d refunds owed in MySQL, %d payments made late", len(l.Refunds), len(l.Late)))
	}
	if len(l.WrongRefunds) > 0 {
		p = append(p, fmt.Sprintf("%d refunds not owed as order_expired of what their order owes (first: %s)",
			len(l.WrongRefunds), l.WrongRefunds[0]))
	}
	if pays := l.Wave1.Payments; pays != nil && pays.Late.Refused != pays.Late.Sent {
		p = append(p, fmt.Sprintf("%d of %d late payments answered owed", pays.Late.Refused, pays.Late.Sent))
	}
	if n := l.Wave1.Payments.unanswered() + l.Wave2.Payments.unanswered(); n > 0 {
		p = append(p, fmt.Sprintf("%d payments unanswered", n))
	}
	if n := l.Wave1.Unanswered + l.Wave2.Unanswered; r.Row.Retry && n > 0 {
		p = append(p, fmt.Sprintf("%d buyers unanswered", n))
	}
	if (r.Row.Life == lifeSweepKill || r.Row.Life == lifeWriterKill) && !l.Killed {
		p = append(p, "no sweep reached the failpoint")
	}
	if r.Row.Life == lifeWriterKill && l.Killed && (l.Failover == nil || !l.Failover.Committed) {
		p = append(p, "no COMMIT seen on another node after the writer was lost")
	}
	if r.Row.Life == lifeRefundKill && !l.Killed {
		p = append(p, "no refund reached the failpoint")
	}
	switch {
	case l.Stripe != nil:
		p = append(p, l.Stripe.problems(r.Row.Life == lifeRefundKill)...)
	case r.Row.stripe():
		p = append(p, "no figures of Stripe's API")
	}
	switch {
	case l.Events != nil:
		p = append(p, l.Events.problems()...)
	case r.Row.Life == lifeEvents:
		p = append(p, "no figures of the events")
	}
	return p
}

// payResult is what bin/loadtest -json says of the payments.
type payResult struct {
	InTime   payTally       `json:"in_time"`
	Late     payTally       `json:"late"`
	Retries  int            `json:"retries"`
	Statuses map[string]int `json:"statuses"` // every event delivery's answer
	Events   eventTiming    `json:"events"`
}

// eventTiming is the span over which bin/loadtest sent its payments (or
// cancels), from the first sent to the last answered.
type eventTiming struct {
	Seconds float64 `json:"seconds"`
}

// cancelResult is what bin/loadtest says of the buyers' cancels.
type cancelResult struct {
	Sent      int            `json:"sent"`
	Cancelled int            `json:"cancelled"` // last answer 200
	Statuses  map[string]int `json:"statuses"`  // every attempt's answer
	Attempts  eventTiming    `json:"attempts"`
}

type payTally struct {
	Sent       int `json:"sent"`
	Paid       int `json:"paid"`       // answered 200 applied
	Refused    int `json:"refused"`    // answered 200 owed: a refund owed
	Unanswered int `json:"unanswered"` // still 429, 5xx or a transport error at the end
}

func (p *payResult) unanswered() int {
	if p == nil {
		return 0
	}
	return p.InTime.Unanswered + p.Late.Unanswered
}

// lineWatch is an io.Writer that closes seen the first time a line written
// to it contains want.
type lineWatch struct {
	want string
	seen chan struct{}
	once sync.Once
	mu   sync.Mutex
	part []byte
}

func newLineWatch(want string) *lineWatch { return &lineWatch{want: want, seen: make(chan struct{})} }

func (w *lineWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		if bytes.Contains(w.part[:i], []byte(w.want)) {
			w.once.Do(func() { close(w.seen) })
		}
		w.part = w.part[i+1:]
	}
	return len(p), nil
}

// wave is one bin/loadtest run of a lifecycle row.
type wave struct {
	base   string // its files' path, without the extension
	done   *lineWatch
	exited chan error
}

// startWave starts bin/loadtest with args, writing its files next to base
// (.json, .acks, .payments, .log).
func startWave(ctx context.Context, o options, base string, args []string, stderr io.Writer) (*wave, error) {
	w := &wave{base: base, done: newLineWatch(ordersDoneLine), exited: make(chan error, 1)}
	args = append(args, "-json", base+".json", "-acks", base+".acks", "-payments", base+".payments")
	logFile, err := os.Create(base + ".log")
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, o.loadtest, args...)
	cmd.Stdout, cmd.Stderr = logFile, io.MultiWriter(logFile, stderr, w.done)
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		if err != nil {
			err = fmt.Errorf("loadtest: %w (see %s.log)", err, base)
		}
		w.exited <- err
	}()
	return w, nil
}

// ordersDone waits until the wave's orders and payments in time are done,
// or it ended (an error if it failed).
func (w *wave) ordersDone(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-w.done.seen:
		return nil
	case err := <-w.exited:
		w.exited <- err
		if err == nil {
			err = fmt.Errorf("loadtest ended without %q (see %s.log)", ordersDoneLine, w.base)
		}
		return err
	}
}

// wait waits for the wave to end and reads its result.
func (w *wave) wait(ctx context.Context) (loadResult, error) {
	var res loadResult
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case err := <-w.exited:
		if err != nil {
			return res, err
		}
	}
	return res, readJSON(w.base+".json", &res)
}

// runLifeRow runs a lifecycle row: the replicas in its settings, one SKU
// with o.lifeUnits units, the first wave, and the second once the first's
// orders and payments in time are done; in the sweep-kill row the fault
// beside them; then verify and MySQL's figures.
func runLifeRow(ctx context.Context, o options, url string, adminPorts []string, n int, r row, stderr io.Writer) (result, error) {
	res := result{Row: r, Life: &lifeResult{Units: o.lifeUnits, Buyers: o.lifeBuyers}}
	l := res.Life
	if _, err := commandEnv(ctx, topologyEnv(r), stderr, o.stack, replicaArgs(o, r)...); err != nil {
		return res, err
	}
	if err := seed(ctx, o, r.stripe(), 1, o.lifeUnits, stderr); err != nil {
		return res, err
	}
	db, err := openStackDB(o.state)
	if err != nil {
		return res, err
	}
	defer db.Close()
	base := filepath.Join(o.out, "rows", fmt.Sprintf("%d-%s", n, r.slug()))
	var rc *receiver
	var lastEvent int64
	if r.Life == lifeEvents {
		l.Events = &eventsResult{Record: base + ".events"}
		if rc, lastEvent, err = startEvents(ctx, o, r, db, base, stderr); err != nil {
			return res, err
		}
		defer rc.stop()
	}
	// The row's refunds are those received from now on, by MySQL's clock:
	// a seed keeps the settled refunds of the rows before.
	var since time.Time
	if err := db.QueryRowContext(ctx, "SELECT NOW(6)").Scan(&since); err != nil {
		return res, fmt.Errorf("MySQL's clock: %w", err)
	}
	logs := replicaLogSizes(o.state, r.Replicas)
	if r.stripe() {
		// The row's calls of Stripe's API are those the recording proxy
		// logs from now on (its clock and this process's are one).
		l.Stripe = &stripeResult{From: time.Now()}
	}

	common := waveArgs(o, url, r)
	first := append(slices.Clone(common), "-n", strconv.Itoa(o.lifeBuyers),
		"-pay-frac", strconv.FormatFloat(o.payFrac, 'f', -1, 64), "-late-frac", strconv.FormatFloat(o.lateFrac, 'f', -1, 64),
		"-late-by", "1s")
	if r.Life == lifeEvents {
		first = append(first, "-cancel-frac", strconv.FormatFloat(eventsCancelFrac, 'f', -1, 64))
	}
	start := time.Now()
	w1, err := startWave(ctx, o, base+".wave1", first, stderr)
	if err != nil {
		return res, err
	}
	// The fault waits for the first sweep that returns units, or the
	// first refund called for, whenever it comes, beside both waves.
	faultCtx, stopFault := context.WithCancel(ctx)
	defer stopFault()
	faultDone := make(chan error, 1)
	switch r.Life {
	case lifeSweepKill:
		go func() { faultDone <- killInSweep(faultCtx, o, l, logs, start, stderr) }()
	case lifeRefundKill:
		go func() { faultDone <- killInRefund(faultCtx, o, l, logs, start, stderr) }()
	case lifeEvents:
		go func() { faultDone <- killInEvent(faultCtx, o, l, logs, start, stderr) }()
	case lifeWriterKill:
		go func() { faultDone <- killWriterInSweep(faultCtx, o, l, logs, start, stderr) }()
	default:
		faultDone <- nil
	}

	if err := w1.ordersDone(ctx); err != nil {
		return res, err
	}
	if rc != nil {
		// Mid-sale: the payments in time are made, the lapses, the
		// late payments and the second wave are still to come.
		l.Events.Down = time.Since(start)
		if err := rc.down(ctx, eventsDown); err != nil {
			return res, err
		}
		fmt.Fprintf(stderr, "demo: the receiver is down for %s\n", eventsDown)
	}
	var paid int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM orders WHERE sku_id = 1 AND status = 'paid'").Scan(&paid); err != nil {
		return res, fmt.Errorf("paid orders: %w", err)
	}
	l.Resold = o.lifeUnits - int(paid)
	fmt.Fprintf(stderr, "demo: the first wave's orders are placed and %d paid; the second wave waits for the other %d units\n", paid, l.Resold)
	var w2 *wave
	if l.Resold > 0 {
		w2, err = startWave(ctx, o, base+".wave2", append(slices.Clone(common), "-n", strconv.Itoa(o.resaleBuyers),
			"-first-user", strconv.Itoa(o.lifeBuyers+1), "-until", strconv.Itoa(l.Resold),
			"-until-for", (r.PayWindow+2*time.Minute).String(), "-pay-frac", "1"), stderr)
		if err != nil {
			return res, err
		}
	}
	if l.Wave1, err = w1.wait(ctx); err != nil {
		return res, err
	}
	res.Load = l.Wave1
	if w2 != nil {
		if l.Wave2, err = w2.wait(ctx); err != nil {
			return res, err
		}
	}
	// A sweep that has not stopped by now will not: the row says so. The
	// first refund is called for within a refunder's interval of the
	// first late payment, long before the waves end; it is given as long
	// as the refunds are all the same.
	if r.Life == lifeRefundKill {
		defer time.AfterFunc(refundsWithin(r), stopFault).Stop()
	} else {
		stopFault()
	}
	if err := <-faultDone; err != nil {
		return res, err
	}
	if res.Busy, err = busyCauses(ctx, adminPorts); err != nil {
		return res, err
	}
	if r.stripe() {
		if err := stripeFigures(ctx, o, db, since, refundsWithin(r), l.Stripe, stderr); err != nil {
			return res, err
		}
		if err := l.Stripe.writeRefunds(base + ".refunds"); err != nil {
			return res, err
		}
	}

	acks, waves := base+".acks", []string{base + ".wave1.acks"}
	if w2 != nil {
		waves = append(waves, base+".wave2.acks")
	}
	if err := concatFiles(acks, waves...); err != nil {
		return res, err
	}
	if l.Late, err = latePayments(base+".wave1.payments", base+".wave2.payments"); err != nil {
		return res, err
	}
	if err := lifeFigures(ctx, db, o.lifeBuyers, since, l); err != nil {
		return res, err
	}
	if rc != nil {
		if err := eventsFigures(ctx, db, rc, lastEvent, since, l.Events, stderr); err != nil {
			return res, err
		}
	}
	res.Verify, err = verifySale(ctx, o.stack, acks, base+".verify.json", stderr)
	if l.Events != nil {
		l.Events.Verify = eventChecks(res.Verify)
	}
	return res, err
}

// waveArgs are bin/loadtest's arguments common to both waves of row r,
// through url: the buyers of SKU 1, retrying if the row says so, with a
// token if it authenticates them, and paying by events signed with the
// provider's secret; in the Stripe rows, each payment a checkout and
// Stripe's event, signed with the Stripe endpoint's secret.
func waveArgs(o options, url string, r row) []string {
	secret := o.webhookSecret
	if r.stripe() {
		secret = o.stripeSecret
	}
	args := []string{"-scenario", "hotsku", "-url", url, "-sku", "1", "-c", strconv.Itoa(o.lifeWorkers), "-src-n", strconv.Itoa(o.srcN),
		"-webhook-secret", secret}
	if r.stripe() {
		args = append(args, "-stripe")
	}
	if r.Retry {
		args = append(args, "-retry")
	}
	if r.Auth == "jwt" {
		args = append(args, "-jwt-secret", r.JWTSecret)
	}
	return args
}

// openStackDB opens the stack's MariaDB, database shop.
func openStackDB(state string) (*sql.DB, error) {
	path := filepath.Join(state, "ports.env")
	ports, err := readEnvFile(path)
	if err != nil {
		return nil, err
	}
	if ports["MYSQL_PORT"] == "" {
		return nil, fmt.Errorf("%s: no MYSQL_PORT", path)
	}
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName, cfg.ParseTime = "root", "tcp", "127.0.0.1:"+ports["MYSQL_PORT"], "shop", true
	return sql.Open("mysql", cfg.FormatDSN())
}

// replicaLogSizes returns the size of each replica's shop.log now: the
// stack appends to them, and a row reads only what comes after.
func replicaLogSizes(state string, n int) []int64 {
	sizes := make([]int64, n)
	for i := range sizes {
		if fi, err := os.Stat(filepath.Join(state, fmt.Sprintf("replica%d", i+1), "shop.log")); err == nil {
			sizes[i] = fi.Size()
		}
	}
	return sizes
}

// replicaLine returns the first replica (from 1) whose shop.log, past its
// offset, has a line containing want, and that line; 0 and "" if none has.
func replicaLine(state string, offsets []int64, want string) (int, string) {
	for i, off := range offsets {
		f, err := os.Open(filepath.Join(state, fmt.Sprintf("replica%d", i+1), "shop.log"))
		if err != nil {
			continue
		}
		data, err := io.ReadAll(io.NewSectionReader(f, off, 1<<40))
		f.Close()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, want) {
				return i + 1, line
			}
		}
	}
	return 0, ""
}

// awaitLine waits until a replica's shop.log, past its offset, has a line
// containing want (a failpoint's), and returns that replica (from 1) and
// the line; 0 and "" when ctx ends first.
func awaitLine(ctx context.Context, state string, offsets []int64, want string) (int, string) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0, ""
		case <-tick.C:
		}
		if i, line := replicaLine(state, offsets, want); i > 0 {
			return i, line
		}
	}
}

// failpointKill is a fault a lifecycle row stages at a failpoint: the
// first replica that stops there is killed (SIGKILL), the stack mended,
// and the replica started again.
type failpointKill struct {
	line string // what the failpoint prints on the replica's standard error
	none string // the row's fault when no replica stops there
	// where says where the replica was killed, from the failpoint's line.
	where func(line string) string
	// mend are the stack script's commands run between the kill and the
	// replica's start, and mended says what they did.
	mend   [][]string
	mended string
}

// killAtFailpoint waits for a replica to stop at f's failpoint, kills
// that replica, mends the stack and starts the replica again, says in l
// what it did and when (from start), and returns the failpoint's line. It
// returns "" when ctx ends first: the row then says the failpoint never
// fired. The stack's commands run to their end even if ctx ends first:
// the stack must be whole for the verify and the next row.
func killAtFailpoint(ctx context.Context, o options, l *lifeResult, offsets []int64, start time.Time, f failpointKill,
	stderr io.Writer) (string, error) {
	i, line := awaitLine(ctx, o.state, offsets, f.line)
	if i == 0 {
		l.Fault = f.none
		return "", nil
	}
	at := func() string { return time.Since(start).Round(100 * time.Millisecond).String() }
	stopped, where, replica := at(), f.where(line), strconv.Itoa(i)
	steps := append(append([][]string{{"kill-replica", replica}}, f.mend...), []string{"start-replica", replica})
	for k, step := range steps {
		if _, err := command(context.WithoutCancel(ctx), stderr, o.stack, step...); err != nil {
			return line, fmt.Errorf("%s: %w", strings.Join(step, " "), err)
		}
		if k == 0 {
			l.Killed = true
			fmt.Fprintf(stderr, "demo: replica %d killed %s (stopped at %s)\n", i, where, stopped)
		}
	}
	l.Fault = fmt.Sprintf("replica %d killed %s at %s%s, replica back at %s", i, where, stopped, f.mended, at())
	return line, nil
}

// killInSweep waits for a replica's sweep to stop at the shopSweepStall
// failpoint (its transaction open, its writes made, its COMMIT not sent),
// kills that replica (SIGKILL), restarts MariaDB and starts the replica
// again (killAtFailpoint).
func killInSweep(ctx context.Context, o options, l *lifeResult, offsets []int64, start time.Time, stderr io.Writer) error {
	_, err := killAtFailpoint(ctx, o, l, offsets, start, failpointKill{line: stallLine, none: "no sweep stopped at the failpoint",
		where: func(string) string { return "in its sweep" }, mend: [][]string{{"restart-mariadb"}}, mended: ", MariaDB restarted"}, stderr)
	return err
}

// latePayments reads the payments files ("order_id user_id payment_id kind
// last_answer") and returns the payments made late, whatever they were
// answered, sorted, as "order_id payment_id".
func latePayments(files ...string) ([]string, error) {
	var made []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if fs := strings.Fields(line); len(fs) >= 4 && fs[3] == "late" {
				made = append(made, fs[0]+" "+fs[2])
			}
		}
	}
	slices.Sort(made)
	return made, nil
}

// lifeFigures reads SKU 1's orders and the refunds received since (the
// row's) from MySQL into l: the counts by status, the returned units, the
// refunds and those not owed as a late payment is, and the delays from
// pay_by to the return and to the resale (the second wave's buyers are the
// users after firstWave).
func lifeFigures(ctx context.Context, db *sql.DB, firstWave int, since time.Time, l *lifeResult) error {
	l.Orders, l.Back = map[string]int64{}, map[string]int64{}
	rows, err := db.QueryContext(ctx, "SELECT status, COUNT(*), COUNT(returned_at) FROM orders WHERE sku_id = 1 GROUP BY status")
	if err != nil {
		return fmt.Errorf("orders by status: %w", err)
	}
	for rows.Next() {
		var status string
		var n, back int64
		if err := rows.Scan(&status, &n, &back); err != nil {
			rows.Close()
			return err
		}
		l.Orders[status], l.Back[status] = n, back
	}
	if err := closeRows(rows); err != nil {
		return fmt.Errorf("orders by status: %w", err)
	}

	var returns, resales []time.Duration
	var lapsedPayBy []time.Time
	rows, err = db.QueryContext(ctx, `SELECT pay_by, returned_at FROM orders
		WHERE sku_id = 1 AND status IN ('expired', 'cancelled') AND pay_by IS NOT NULL AND returned_at IS NOT NULL ORDER BY pay_by`)
	if err != nil {
		return fmt.Errorf("lapsed orders: %w", err)
	}
	for rows.Next() {
		var by, back time.Time
		if err := rows.Scan(&by, &back); err != nil {
			rows.Close()
			return err
		}
		lapsedPayBy = append(lapsedPayBy, by)
		returns = append(returns, back.Sub(by))
	}
	if err := closeRows(rows); err != nil {
		return fmt.Errorf("lapsed orders: %w", err)
	}
	rows, err = db.QueryContext(ctx, "SELECT created_at FROM orders WHERE sku_id = 1 AND user_id > ? ORDER BY created_at", firstWave)
	if err != nil {
		return fmt.Errorf("second wave's orders: %w", err)
	}
	for k := 0; rows.Next(); k++ {
		var created time.Time
		if err := rows.Scan(&created); err != nil {
			rows.Close()
			return err
		}
		if k < len(lapsedPayBy) {
			resales = append(resales, created.Sub(lapsedPayBy[k]))
		}
	}
	if err := closeRows(rows); err != nil {
		return fmt.Errorf("second wave's orders: %w", err)
	}
	l.ReturnLag, l.ResaleLag = lagOf(returns), lagOf(resales)
	return rowRefunds(ctx, db, since, l)
}

// rowRefunds reads the refunds received since into l: each as "order_id
// payment_id", and those that are not owed as a late payment must be
// (reason order_expired, of exactly what the order owes) described.
func rowRefunds(ctx context.Context, db *sql.DB, since time.Time, l *lifeResult) error {
	l.Refunds, l.WrongRefunds = nil, nil
	rows, err := db.QueryContext(ctx, `SELECT r.order_id, r.payment_id, r.reason, r.amount_cents, r.currency, o.amount_cents, o.currency
		FROM refunds r LEFT JOIN orders o ON o.id = r.order_id WHERE r.received_at >= ? ORDER BY r.order_id, r.payment_id`, since)
	if err != nil {
		return fmt.Errorf("refunds: %w", err)
	}
	for rows.Next() {
		var order int64
		var payment, reason string
		var amount, owed sql.NullInt64
		var currency, owedIn sql.NullString
		if err := rows.Scan(&order, &payment, &reason, &amount, &currency, &owed, &owedIn); err != nil {
			rows.Close()
			return err
		}
		l.Refunds = append(l.Refunds, fmt.Sprintf("%d %s", order, payment))
		if reason != "order_expired" || !amount.Valid || !owed.Valid || amount != owed || !currency.Valid || currency != owedIn {
			l.WrongRefunds = append(l.WrongRefunds, fmt.Sprintf("order %d, payment %s: %s, %s %s for an order of %s %s",
				order, payment, reason, nullInt(amount), currency.String, nullInt(owed), owedIn.String))
		}
	}
	if err := closeRows(rows); err != nil {
		return fmt.Errorf("refunds: %w", err)
	}
	slices.Sort(l.Refunds)
	return nil
}

// nullInt renders a nullable integer: NULL, or its value.
func nullInt(n sql.NullInt64) string {
	if !n.Valid {
		return "NULL"
	}
	return strconv.FormatInt(n.Int64, 10)
}

func closeRows(rows *sql.Rows) error {
	err := rows.Err()
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	return err
}
