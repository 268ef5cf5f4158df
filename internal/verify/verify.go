// Package verify checks a sale's invariants in MySQL: what `shop verify`
// reports, and what the tests and the demo judge a sale by. It reads the
// tables as they are, whatever wrote them, and changes nothing.
package verify

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"shop/internal/stock"

	"gorm.io/gorm"
)

// Ack is one order a buyer was told it has (a 201), as the load test
// recorded it. SKUID and UserID are those the answer named, or zero when the
// record holds the order id alone.
type Ack struct {
	OrderID int64 `json:"order_id"`
	SKUID   int64 `json:"sku_id,omitempty"`
	UserID  int64 `json:"user_id,omitempty"`
}

// hasIDs reports whether the ack names the order's SKU and user.
func (a Ack) hasIDs() bool { return a.SKUID != 0 || a.UserID != 0 }

// ParseAck parses one line of an acks file: "order_id", or "order_id sku_id
// user_id" separated by spaces or tabs. Every id must be a positive integer.
func ParseAck(line string) (Ack, error) {
	f := strings.Fields(line)
	if len(f) != 1 && len(f) != 3 {
		return Ack{}, fmt.Errorf("want \"order_id\" or \"order_id sku_id user_id\", have %d fields: %q", len(f), line)
	}
	names := [...]string{"order_id", "sku_id", "user_id"}
	ids := make([]int64, len(f))
	for i, v := range f {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			return Ack{}, fmt.Errorf("%s %q is not a positive integer: %q", names[i], v, line)
		}
		ids[i] = id
	}
	a := Ack{OrderID: ids[0]}
	if len(ids) == 3 {
		a.SKUID, a.UserID = ids[1], ids[2]
	}
	return a, nil
}

// ReadAcks reads an acks file, one ack per line (see ParseAck); blank lines
// are skipped. An error names the line it is about.
func ReadAcks(r io.Reader) ([]Ack, error) {
	acks := []Ack{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		a, err := ParseAck(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		acks = append(acks, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read acks: %w", err)
	}
	return acks, nil
}

// Check is the outcome of one invariant.
type Check struct {
	Name       string   `json:"name"`
	Violations int64    `json:"violations"`
	Examples   []string `json:"examples,omitempty"` // the first offenders
}

// StatusCounts counts orders by status.
type StatusCounts struct {
	Reserved  int64 `json:"reserved"`
	Paid      int64 `json:"paid"`
	Cancelled int64 `json:"cancelled"`
	Expired   int64 `json:"expired"`
}

// Active is how many orders hold a unit: reserved and paid ones.
func (s StatusCounts) Active() int64 { return s.Reserved + s.Paid }

// Report is what Sale found.
type Report struct {
	Products     int64 `json:"products"`
	InitialStock int64 `json:"initial_stock"`
	Stock        int64 `json:"stock"`
	// Orders counts every order, whatever its status; ByStatus splits them.
	Orders   int64        `json:"orders"`
	ByStatus StatusCounts `json:"orders_by_status"`
	// Refunds counts the refunds owed, in any state of being paid back:
	// payments that came after their order had expired or been cancelled,
	// with the wrong amount, twice, or for no order.
	Refunds int64 `json:"refunds_owed"`
	// PaidWithoutPayment counts the paid orders that carry no payment id:
	// those paid when placed (no payment step), by the migration that gave
	// orders a status (00006), or whose payment id migration 00008 left
	// to an earlier order of the same id, owing it back. Not a violation;
	// the report says so.
	PaidWithoutPayment int64 `json:"paid_without_payment_id"`
	// Payments counts the payments ledger by outcome, and RefundsByState
	// the refunds owed by how far they are paid back.
	Payments       PaymentCounts `json:"payments_by_outcome"`
	RefundsByState RefundCounts  `json:"refunds_by_state"`
	// PaidBeforeLedger counts the paid orders from before amounts whose
	// payment id the ledger does not have: paid on a buyer's word, before
	// payments were confirmed by the provider. Not a violation, and
	// nothing to compare their payment with; the report says so.
	PaidBeforeLedger int64 `json:"paid_before_ledger"`
	// Events is whether events are on and the outbox's events by state;
	// its checks are made only once they are on (checkEvents).
	Events   EventFigures `json:"events"`
	Acks     int          `json:"acks"`
	Oversold int64        `json:"oversold_units"` // active orders beyond a SKU's initial stock, summed
	Checks   []Check      `json:"checks"`
	// Warnings are what is not a broken invariant but wants an operator:
	// reservations lapsed far past pay_by (warnLapsed). They do not make
	// the report fail.
	Warnings []Check `json:"warnings,omitempty"`
}

// OK reports whether every invariant holds.
func (r Report) OK() bool {
	for _, c := range r.Checks {
		if c.Violations > 0 {
			return false
		}
	}
	return true
}

// String renders the report for a terminal.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "products %d, initial stock %d, stock %d, orders %d, oversold units %d\n",
		r.Products, r.InitialStock, r.Stock, r.Orders, r.Oversold)
	s := r.ByStatus
	fmt.Fprintf(&b, "orders by status: reserved %d, paid %d, cancelled %d, expired %d; refunds owed %d\n",
		s.Reserved, s.Paid, s.Cancelled, s.Expired, r.Refunds)
	p, f := r.Payments, r.RefundsByState
	fmt.Fprintf(&b, "payments by outcome: applied %d, owed %d, conflict %d; refunds by state: owed %d, requested %d, refunded %d, failed %d\n",
		p.Applied, p.Owed, p.Conflict, f.Owed, f.Requested, f.Refunded, f.Failed)
	fmt.Fprintf(&b, "info  %d paid orders carry no payment id (paid when placed, or by the migration)\n", r.PaidWithoutPayment)
	fmt.Fprintf(&b, "info  %d paid orders carry a payment id from before the payments ledger, and no amount to check it by\n", r.PaidBeforeLedger)
	fmt.Fprintf(&b, "info  %s\n", r.Events)
	for _, c := range r.Checks {
		if c.Violations == 0 {
			fmt.Fprintf(&b, "ok    %s\n", c.Name)
			continue
		}
		fmt.Fprintf(&b, "FAIL  %s: %d violations, first: %s\n", c.Name, c.Violations, strings.Join(c.Examples, "; "))
	}
	for _, c := range r.Warnings {
		if c.Violations > 0 {
			fmt.Fprintf(&b, "WARN  %s: %d, first: %s\n", c.Name, c.Violations, strings.Join(c.Examples, "; "))
		}
	}
	if r.OK() {
		b.WriteString("verdict: all invariants hold\n")
	} else {
		b.WriteString("verdict: INVARIANTS BROKEN\n")
	}
	return b.String()
}

// exampleLimit is how many offenders a Check lists.
const exampleLimit = 10

// The checks Sale makes, by name. An offender is counted by one check
// only: a paid order with returned_at set is an order both paid and
// returned, not also one whose returned_at is out of place.
const (
	checkStock       = "stock >= 0"
	checkUnits       = "initial_stock == stock + active orders"
	checkOneActive   = "one active order per (user, sku)"
	checkProduct     = "every order names a product"
	checkStatus      = "every order is reserved, paid, cancelled or expired"
	checkPaidAndGone = "no order both paid and cancelled or expired"
	checkReturned    = "returned_at set exactly on cancelled and expired orders"
	checkPaymentID   = "every order paid by a payment has its payment id"
	checkAckExists   = "every acknowledged order exists"
	checkAckMatches  = "every acknowledged order has its sku and user"
	// warnLapsed names the reservations whose payment window ended more
	// than lapsedWarnAfter ago and whose unit is not back in the sale: the
	// sweep, which returns them within seconds, is behind or failing on
	// their SKUs (docs/lifecycle.md). The alert on
	// shop_oldest_lapsed_reservation_seconds fires at the same age.
	warnLapsed      = "reservations lapsed more than 10 minutes past pay_by, their units not back in the sale (the sweep is behind or failing)"
	lapsedWarnAfter = "INTERVAL 10 MINUTE"
)

// SQL of the checks.
const (
	activeStatuses   = "('" + stock.StatusReserved + "', '" + stock.StatusPaid + "')"
	returnedStatuses = "('" + stock.StatusCancelled + "', '" + stock.StatusExpired + "')"
	allStatuses      = "('" + stock.StatusReserved + "', '" + stock.StatusPaid + "', '" + stock.StatusCancelled + "', '" + stock.StatusExpired + "')"
	// activeOrdersBySKU is a table of sku_id and n, its active orders.
	activeOrdersBySKU = "(SELECT sku_id, COUNT(*) n FROM orders WHERE status IN " + activeStatuses + " GROUP BY sku_id)"
	// paymentIDOutOfPlace holds for an order of the table orders that is
	// paid with only one of paid_at and payment_id (but for one whose
	// payment id migration 00008 gave to another order), or reserved with
	// either.
	paymentIDOutOfPlace = `status = 'paid' AND (paid_at IS NULL) <> (payment_id IS NULL)
			AND NOT (payment_id IS NULL AND ` + gaveUpPayment + `)
		OR status = 'reserved' AND (paid_at IS NOT NULL OR payment_id IS NOT NULL)`
)

// Sale checks the invariants of the sale against MySQL. Active orders are
// the reserved and paid ones, which hold a unit.
//
//   - every SKU has stock >= 0;
//   - every SKU has initial_stock == stock + its active orders;
//   - no user holds two active orders of one SKU (the unique key on
//     (user_id, active_sku) makes it so; checked all the same, as on a
//     database whose schema was changed);
//   - no order names a SKU that does not exist;
//   - every order has one of the four statuses (a server not in strict
//     mode stores ” for any other);
//   - no order is both paid and cancelled or expired: a cancelled or
//     expired order with paid_at or payment_id, a paid one with
//     returned_at;
//   - returned_at is set on every cancelled and expired order, and on no
//     reserved one (a paid one is the check above);
//   - paid_at and payment_id come together, on paid orders only: every
//     order paid by a payment has its payment id. Paid orders with neither
//     were paid when placed or by migration 00006, and those with paid_at
//     alone gave their payment id up to an earlier order in migration
//     00008, and owe it back: counted, not violations;
//   - the checks of refunds, payments and amounts (see moneyChecks);
//   - once events are on, the checks of events (see eventChecks);
//   - every acknowledged order in acks exists, in any status;
//   - every acknowledged order that names its SKU and user is that user's
//     order of that SKU in MySQL (checked only when some ack names them).
//
// It returns an error only when it could not check; broken invariants are in
// the Report.
func Sale(ctx context.Context, db *gorm.DB, acks []Ack) (Report, error) {
	db = db.WithContext(ctx)
	var r Report
	err := db.Raw(`SELECT COUNT(*), COALESCE(SUM(initial_stock), 0), COALESCE(SUM(stock), 0) FROM products`).
		Row().Scan(&r.Products, &r.InitialStock, &r.Stock)
	if err != nil {
		return r, fmt.Errorf("stock: verify: %w", err)
	}
	s := &r.ByStatus
	err = db.Raw(`SELECT COUNT(*),
		COALESCE(SUM(status = ?), 0), COALESCE(SUM(status = ?), 0), COALESCE(SUM(status = ?), 0), COALESCE(SUM(status = ?), 0),
		COALESCE(SUM(status = ? AND payment_id IS NULL AND (paid_at IS NULL OR `+gaveUpPayment+`)), 0),
		(SELECT COUNT(*) FROM refunds) FROM orders`,
		stock.StatusReserved, stock.StatusPaid, stock.StatusCancelled, stock.StatusExpired, stock.StatusPaid).
		Row().Scan(&r.Orders, &s.Reserved, &s.Paid, &s.Cancelled, &s.Expired, &r.PaidWithoutPayment, &r.Refunds)
	if err != nil {
		return r, fmt.Errorf("stock: verify: %w", err)
	}
	if err := countMoney(db, &r); err != nil {
		return r, err
	}
	err = db.Raw(`SELECT COALESCE(SUM(GREATEST(o.n - p.initial_stock, 0)), 0) FROM products p JOIN ` +
		activeOrdersBySKU + ` o ON o.sku_id = p.id`).Row().Scan(&r.Oversold)
	if err != nil {
		return r, fmt.Errorf("stock: verify: %w", err)
	}

	queries := []struct{ name, count, examples string }{
		{
			checkStock,
			`SELECT COUNT(*) FROM products WHERE stock < 0`,
			`SELECT CONCAT('sku ', id, ' stock ', stock) FROM products WHERE stock < 0 ORDER BY id`,
		},
		{
			checkUnits,
			`SELECT COUNT(*) FROM products p LEFT JOIN ` + activeOrdersBySKU + ` o
				ON o.sku_id = p.id WHERE p.initial_stock <> p.stock + COALESCE(o.n, 0)`,
			`SELECT CONCAT('sku ', p.id, ' initial ', p.initial_stock, ' stock ', p.stock, ' active orders ', COALESCE(o.n, 0))
				FROM products p LEFT JOIN ` + activeOrdersBySKU + ` o
				ON o.sku_id = p.id WHERE p.initial_stock <> p.stock + COALESCE(o.n, 0) ORDER BY p.id`,
		},
		{
			checkOneActive,
			`SELECT COUNT(*) FROM (SELECT 1 FROM orders WHERE status IN ` + activeStatuses + `
				GROUP BY user_id, sku_id HAVING COUNT(*) > 1) d`,
			`SELECT CONCAT('user ', user_id, ' sku ', sku_id, ' active orders ', COUNT(*), ' (', GROUP_CONCAT(id ORDER BY id), ')')
				FROM orders WHERE status IN ` + activeStatuses + `
				GROUP BY user_id, sku_id HAVING COUNT(*) > 1 ORDER BY sku_id, user_id`,
		},
		{
			checkProduct,
			`SELECT COUNT(*) FROM orders o LEFT JOIN products p ON p.id = o.sku_id WHERE p.id IS NULL`,
			`SELECT CONCAT('order ', o.id, ' sku ', o.sku_id) FROM orders o LEFT JOIN products p ON p.id = o.sku_id
				WHERE p.id IS NULL ORDER BY o.id`,
		},
		{
			checkStatus,
			`SELECT COUNT(*) FROM orders WHERE status IS NULL OR status NOT IN ` + allStatuses,
			`SELECT CONCAT('order ', id, ' status ', COALESCE(QUOTE(status), 'NULL')) FROM orders
				WHERE status IS NULL OR status NOT IN ` + allStatuses + ` ORDER BY id`,
		},
		{
			checkPaidAndGone,
			`SELECT COUNT(*) FROM orders WHERE status IN ` + returnedStatuses + ` AND (paid_at IS NOT NULL OR payment_id IS NOT NULL)
				OR status = 'paid' AND returned_at IS NOT NULL`,
			`SELECT CONCAT('order ', id, ' ', status, IF(status = 'paid', CONCAT(' returned_at ', returned_at),
					CONCAT(' paid_at ', COALESCE(paid_at, 'NULL'), ' payment_id ', COALESCE(payment_id, 'NULL'))))
				FROM orders WHERE status IN ` + returnedStatuses + ` AND (paid_at IS NOT NULL OR payment_id IS NOT NULL)
				OR status = 'paid' AND returned_at IS NOT NULL ORDER BY id`,
		},
		{
			checkReturned,
			`SELECT COUNT(*) FROM orders WHERE status IN ` + returnedStatuses + ` AND returned_at IS NULL
				OR status = 'reserved' AND returned_at IS NOT NULL`,
			`SELECT CONCAT('order ', id, ' ', status, ' returned_at ', COALESCE(returned_at, 'NULL')) FROM orders
				WHERE status IN ` + returnedStatuses + ` AND returned_at IS NULL
				OR status = 'reserved' AND returned_at IS NOT NULL ORDER BY id`,
		},
		{
			checkPaymentID,
			`SELECT COUNT(*) FROM orders WHERE ` + paymentIDOutOfPlace,
			`SELECT CONCAT('order ', id, ' ', status, ' paid_at ', COALESCE(paid_at, 'NULL'), ' payment_id ', COALESCE(payment_id, 'NULL'))
				FROM orders WHERE ` + paymentIDOutOfPlace + ` ORDER BY id`,
		},
	}
	for _, q := range queries {
		c, err := runCheck(db, q.name, q.count, q.examples)
		if err != nil {
			return r, err
		}
		r.Checks = append(r.Checks, c)
	}
	lapsed, err := runCheck(db, warnLapsed,
		`SELECT COUNT(*) FROM orders WHERE status = 'reserved' AND pay_by <= UTC_TIMESTAMP(6) - `+lapsedWarnAfter,
		`SELECT CONCAT('order ', id, ' sku ', sku_id, ' pay_by ', pay_by) FROM orders
			WHERE status = 'reserved' AND pay_by <= UTC_TIMESTAMP(6) - `+lapsedWarnAfter+` ORDER BY pay_by, id`)
	if err != nil {
		return r, err
	}
	r.Warnings = append(r.Warnings, lapsed)
	for _, q := range moneyChecks {
		c, err := q.check(db)
		if err != nil {
			return r, err
		}
		r.Checks = append(r.Checks, c)
	}
	if err := checkEvents(db, &r); err != nil {
		return r, err
	}

	if acks != nil {
		checks, err := verifyAcks(db, acks)
		if err != nil {
			return r, err
		}
		r.Acks = len(acks)
		r.Checks = append(r.Checks, checks...)
	}
	return r, nil
}

// runCheck counts the violations of one invariant with the query count and,
// when there are any, lists the first offenders with the query examples;
// both take args.
func runCheck(db *gorm.DB, name, count, examples string, args ...any) (Check, error) {
	c := Check{Name: name}
	if err := db.Raw(count, args...).Row().Scan(&c.Violations); err != nil {
		return c, fmt.Errorf("stock: verify %s: %w", name, err)
	}
	if c.Violations > 0 {
		if err := db.Raw(examples+fmt.Sprintf(" LIMIT %d", exampleLimit), args...).Scan(&c.Examples).Error; err != nil {
			return c, fmt.Errorf("stock: verify %s: %w", name, err)
		}
	}
	return c, nil
}

// UserLimit checks that no user holds more than limit active
// (reserved or paid) orders over all products: the invariant of
// Options.UserLimit, for a report of Sale when the limit is on. Cancelled
// and expired orders do not count. It returns an error only when it could
// not check.
func UserLimit(ctx context.Context, db *gorm.DB, limit int) (Check, error) {
	return runCheck(db.WithContext(ctx), fmt.Sprintf("orders per user <= %d", limit),
		`SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE status IN `+activeStatuses+`
			GROUP BY user_id HAVING COUNT(*) > ?) u`,
		`SELECT CONCAT('user ', user_id, ' orders ', COUNT(*)) FROM orders WHERE status IN `+activeStatuses+`
			GROUP BY user_id HAVING COUNT(*) > ? ORDER BY user_id`,
		limit)
}

// verifyAcks checks that every acknowledged order exists, in any status
// (an order that expired or was cancelled was acknowledged all the same),
// and, for the acks that name them, that it has the SKU and user the buyer
// was told.
func verifyAcks(db *gorm.DB, acks []Ack) ([]Check, error) {
	exists, matches := Check{Name: checkAckExists}, Check{Name: checkAckMatches}
	withIDs := false
	for chunk := range slices.Chunk(acks, 1000) {
		ids := make([]int64, len(chunk))
		for i, a := range chunk {
			ids[i] = a.OrderID
		}
		var found []struct {
			ID     int64 `gorm:"column:id"`
			SKUID  int64 `gorm:"column:sku_id"`
			UserID int64 `gorm:"column:user_id"`
		}
		if err := db.Raw("SELECT id, sku_id, user_id FROM orders WHERE id IN ?", ids).Scan(&found).Error; err != nil {
			return nil, fmt.Errorf("stock: verify acks: %w", err)
		}
		have := make(map[int64]Ack, len(found))
		for _, o := range found {
			have[o.ID] = Ack{OrderID: o.ID, SKUID: o.SKUID, UserID: o.UserID}
		}
		for _, a := range chunk {
			withIDs = withIDs || a.hasIDs()
			o, ok := have[a.OrderID]
			switch {
			case !ok:
				exists.add(fmt.Sprintf("order %d", a.OrderID))
			case a.hasIDs() && (o.SKUID != a.SKUID || o.UserID != a.UserID):
				matches.add(fmt.Sprintf("acknowledged order %d is for sku %d user %d in MySQL, ack says sku %d user %d",
					a.OrderID, o.SKUID, o.UserID, a.SKUID, a.UserID))
			}
		}
	}
	if !withIDs {
		return []Check{exists}, nil
	}
	return []Check{exists, matches}, nil
}

// add counts one violation, keeping it as an example while there is room.
func (c *Check) add(example string) {
	c.Violations++
	if len(c.Examples) < exampleLimit {
		c.Examples = append(c.Examples, example)
	}
}
