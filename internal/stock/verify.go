package stock

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"gorm.io/gorm"
)

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
//   - every acknowledged order id in acks exists.
//
// It returns an error only when it could not check; broken invariants are in
// the Report.
func Verify(ctx context.Context, db *gorm.DB, acks []int64) (Report, error) {
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
		c := Check{Name: q.name}
		if err := db.Raw(q.count).Row().Scan(&c.Violations); err != nil {
			return r, fmt.Errorf("stock: verify %s: %w", q.name, err)
		}
		if c.Violations > 0 {
			if err := db.Raw(q.examples + fmt.Sprintf(" LIMIT %d", exampleLimit)).Scan(&c.Examples).Error; err != nil {
				return r, fmt.Errorf("stock: verify %s: %w", q.name, err)
			}
		}
		r.Checks = append(r.Checks, c)
	}

	if acks != nil {
		c, err := verifyAcks(db, acks)
		if err != nil {
			return r, err
		}
		r.Acks = len(acks)
		r.Checks = append(r.Checks, c)
	}
	return r, nil
}

// verifyAcks checks that every acknowledged order id exists.
func verifyAcks(db *gorm.DB, acks []int64) (Check, error) {
	c := Check{Name: "every acknowledged order exists"}
	for chunk := range slices.Chunk(acks, 1000) {
		var found []int64
		if err := db.Raw("SELECT id FROM orders WHERE id IN ?", chunk).Scan(&found).Error; err != nil {
			return c, fmt.Errorf("stock: verify acks: %w", err)
		}
		have := make(map[int64]bool, len(found))
		for _, id := range found {
			have[id] = true
		}
		for _, id := range chunk {
			if !have[id] {
				c.Violations++
				if len(c.Examples) < exampleLimit {
					c.Examples = append(c.Examples, fmt.Sprintf("order %d", id))
				}
			}
		}
	}
	return c, nil
}
