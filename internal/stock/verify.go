package stock

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

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

// Report is what Verify found.
type Report struct {
	Products     int64   `json:"products"`
	InitialStock int64   `json:"initial_stock"`
	Stock        int64   `json:"stock"`
	Orders       int64   `json:"orders"`
	Acks         int     `json:"acks"`
	Oversold     int64   `json:"oversold_units"` // orders beyond a SKU's initial stock, summed
	Checks       []Check `json:"checks"`
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
	for _, c := range r.Checks {
		if c.Violations == 0 {
			fmt.Fprintf(&b, "ok    %s\n", c.Name)
			continue
		}
		fmt.Fprintf(&b, "FAIL  %s: %d violations, first: %s\n", c.Name, c.Violations, strings.Join(c.Examples, "; "))
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

// Verify checks the invariants of the sale against MySQL:
//
//   - every SKU has stock >= 0;
//   - every SKU has initial_stock == stock + its orders;
//   - no user holds two orders of one SKU;
//   - no order names a SKU that does not exist;
//   - every acknowledged order in acks exists;
//   - every acknowledged order that names its SKU and user is that user's
//     order of that SKU in MySQL (checked only when some ack names them).
//
// It returns an error only when it could not check; broken invariants are in
// the Report.
func Verify(ctx context.Context, db *gorm.DB, acks []Ack) (Report, error) {
	db = db.WithContext(ctx)
	var r Report
	err := db.Raw(`SELECT COUNT(*), COALESCE(SUM(initial_stock), 0), COALESCE(SUM(stock), 0),
		(SELECT COUNT(*) FROM orders) FROM products`).Row().Scan(&r.Products, &r.InitialStock, &r.Stock, &r.Orders)
	if err != nil {
		return r, fmt.Errorf("stock: verify: %w", err)
	}
	err = db.Raw(`SELECT COALESCE(SUM(GREATEST(n - initial_stock, 0)), 0) FROM
		(SELECT p.initial_stock, COUNT(o.id) AS n FROM products p JOIN orders o ON o.sku_id = p.id GROUP BY p.id) t`).
		Row().Scan(&r.Oversold)
	if err != nil {
		return r, fmt.Errorf("stock: verify: %w", err)
	}

	queries := []struct{ name, count, examples string }{
		{
			"stock >= 0",
			`SELECT COUNT(*) FROM products WHERE stock < 0`,
			`SELECT CONCAT('sku ', id, ' stock ', stock) FROM products WHERE stock < 0 ORDER BY id`,
		},
		{
			"initial_stock == stock + orders",
			`SELECT COUNT(*) FROM products p LEFT JOIN (SELECT sku_id, COUNT(*) n FROM orders GROUP BY sku_id) o
				ON o.sku_id = p.id WHERE p.initial_stock <> p.stock + COALESCE(o.n, 0)`,
			`SELECT CONCAT('sku ', p.id, ' initial ', p.initial_stock, ' stock ', p.stock, ' orders ', COALESCE(o.n, 0))
				FROM products p LEFT JOIN (SELECT sku_id, COUNT(*) n FROM orders GROUP BY sku_id) o
				ON o.sku_id = p.id WHERE p.initial_stock <> p.stock + COALESCE(o.n, 0) ORDER BY p.id`,
		},
		{
			"one order per (user, sku)",
			`SELECT COUNT(*) FROM (SELECT 1 FROM orders GROUP BY user_id, sku_id HAVING COUNT(*) > 1) d`,
			`SELECT CONCAT('user ', user_id, ' sku ', sku_id, ' orders ', COUNT(*)) FROM orders
				GROUP BY user_id, sku_id HAVING COUNT(*) > 1 ORDER BY sku_id, user_id`,
		},
		{
			"every order names a product",
			`SELECT COUNT(*) FROM orders o LEFT JOIN products p ON p.id = o.sku_id WHERE p.id IS NULL`,
			`SELECT CONCAT('order ', o.id, ' sku ', o.sku_id) FROM orders o LEFT JOIN products p ON p.id = o.sku_id
				WHERE p.id IS NULL ORDER BY o.id`,
		},
	}
	for _, q := range queries {
		c, err := runCheck(db, q.name, q.count, q.examples)
		if err != nil {
			return r, err
		}
		r.Checks = append(r.Checks, c)
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

// VerifyUserLimit checks that no user holds more than limit orders over all
// products: the invariant of Options.UserLimit, for a report of Verify when
// the limit is on. It returns an error only when it could not check.
func VerifyUserLimit(ctx context.Context, db *gorm.DB, limit int) (Check, error) {
	return runCheck(db.WithContext(ctx), fmt.Sprintf("orders per user <= %d", limit),
		`SELECT COUNT(*) FROM (SELECT user_id FROM orders GROUP BY user_id HAVING COUNT(*) > ?) u`,
		`SELECT CONCAT('user ', user_id, ' orders ', COUNT(*)) FROM orders GROUP BY user_id HAVING COUNT(*) > ? ORDER BY user_id`,
		limit)
}

// The checks of acknowledged orders.
const (
	checkAckExists  = "every acknowledged order exists"
	checkAckMatches = "every acknowledged order has its sku and user"
)

// verifyAcks checks that every acknowledged order exists and, for the acks
// that name them, that it has the SKU and user the buyer was told.
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
