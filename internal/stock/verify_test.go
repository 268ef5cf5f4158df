package stock_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"shop/internal/stock"
	"shop/internal/testenv"
)

// soldTwo is a catalog of three products with two units each in which user
// 10 holds order 1 of SKU 1 and user 20 order 2 of SKU 2: a sale that holds.
func soldTwo(t *testing.T) *testenv.DB {
	t.Helper()
	db := testenv.MySQL(t)
	ctx := context.Background()
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 3, 2); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"UPDATE products SET stock = stock - 1 WHERE id IN (1, 2)",
		"INSERT INTO orders (id, sku_id, user_id) VALUES (1, 1, 10), (2, 2, 20)",
	} {
		if err := db.Gorm.WithContext(ctx).Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return db
}

// checkOf returns the report's check called name.
func checkOf(t *testing.T, r stock.Report, name string) stock.Check {
	t.Helper()
	i := slices.IndexFunc(r.Checks, func(c stock.Check) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("no check %q in %+v", name, r.Checks)
	}
	return r.Checks[i]
}

func hasCheck(r stock.Report, name string) bool {
	return slices.ContainsFunc(r.Checks, func(c stock.Check) bool { return c.Name == name })
}

const (
	ackExists  = "every acknowledged order exists"
	ackMatches = "every acknowledged order has its sku and user"
)

func TestVerifyAcks(t *testing.T) {
	db := soldTwo(t)
	tests := []struct {
		name     string
		acks     string
		lost     []string // examples of the exists check
		mismatch []string // examples of the sku-and-user check; nil: the check passes
		idsCheck bool     // whether the sku-and-user check is made
	}{
		{name: "order ids alone", acks: "1\n2\n"},
		{name: "order, sku and user", acks: "1 1 10\n2 2 20\n", idsCheck: true},
		{name: "both formats in one file", acks: "1\n2 2 20\n", idsCheck: true},
		{name: "wrong user", acks: "1 1 10\n2 2 21\n", idsCheck: true,
			mismatch: []string{"acknowledged order 2 is for sku 2 user 20 in MySQL, ack says sku 2 user 21"}},
		{name: "wrong sku", acks: "1 3 10\n", idsCheck: true,
			mismatch: []string{"acknowledged order 1 is for sku 1 user 10 in MySQL, ack says sku 3 user 10"}},
		{name: "one order told to two buyers", acks: "1 1 10\n1 1 11\n", idsCheck: true,
			mismatch: []string{"acknowledged order 1 is for sku 1 user 10 in MySQL, ack says sku 1 user 11"}},
		{name: "lost, order id alone", acks: "1\n99\n", lost: []string{"order 99"}},
		{name: "lost, with sku and user", acks: "99 1 10\n", idsCheck: true, lost: []string{"order 99"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			acks, err := stock.ReadAcks(strings.NewReader(tt.acks))
			if err != nil {
				t.Fatal(err)
			}
			r, err := stock.Verify(context.Background(), db.Gorm, acks)
			if err != nil {
				t.Fatal(err)
			}
			if r.Acks != len(acks) {
				t.Errorf("report counts %d acks, want %d", r.Acks, len(acks))
			}
			if want := tt.lost == nil && tt.mismatch == nil; r.OK() != want {
				t.Errorf("OK = %v, want %v:\n%s", r.OK(), want, r)
			}
			if c := checkOf(t, r, ackExists); c.Violations != int64(len(tt.lost)) || !slices.Equal(c.Examples, tt.lost) {
				t.Errorf("%s: %d %q, want %q", ackExists, c.Violations, c.Examples, tt.lost)
			}
			if got := hasCheck(r, ackMatches); got != tt.idsCheck {
				t.Fatalf("check %q made: %v, want %v", ackMatches, got, tt.idsCheck)
			}
			if !tt.idsCheck {
				return
			}
			if c := checkOf(t, r, ackMatches); c.Violations != int64(len(tt.mismatch)) || !slices.Equal(c.Examples, tt.mismatch) {
				t.Errorf("%s: %d %q, want %q", ackMatches, c.Violations, c.Examples, tt.mismatch)
			}
			if tt.mismatch != nil && !strings.Contains(r.String(), "FAIL  "+ackMatches+": 1 violations, first: "+tt.mismatch[0]) {
				t.Errorf("the text report does not name the mismatch:\n%s", r)
			}
		})
	}
}

func TestVerifyWithoutAcksMakesNoAckCheck(t *testing.T) {
	db := soldTwo(t)
	r, err := stock.Verify(context.Background(), db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || hasCheck(r, ackExists) || hasCheck(r, ackMatches) || r.Acks != 0 {
		t.Errorf("without acks:\n%s", r)
	}
}

func TestVerifyReadAcks(t *testing.T) {
	acks, err := stock.ReadAcks(strings.NewReader("1\n\n  2 3 4 \n5\t6\t7\n"))
	want := []stock.Ack{{OrderID: 1}, {OrderID: 2, SKUID: 3, UserID: 4}, {OrderID: 5, SKUID: 6, UserID: 7}}
	if err != nil || !slices.Equal(acks, want) {
		t.Errorf("ReadAcks = %v, %v; want %v", acks, err, want)
	}
	if acks, err := stock.ReadAcks(strings.NewReader("")); err != nil || acks == nil || len(acks) != 0 {
		t.Errorf("an empty file: %v, %v; want no acks (and not nil: the acks are checked)", acks, err)
	}
	for _, bad := range []struct{ text, want string }{
		{"1\n2 3\n", "line 2: want \"order_id\" or \"order_id sku_id user_id\", have 2 fields"},
		{"1\n2 3 4 5\n", "line 2: want \"order_id\" or \"order_id sku_id user_id\", have 4 fields"},
		{"x\n", "line 1: order_id \"x\" is not a positive integer"},
		{"1\n\n2 0 4\n", "line 3: sku_id \"0\" is not a positive integer"},
		{"2 3 -4\n", "line 1: user_id \"-4\" is not a positive integer"},
	} {
		if _, err := stock.ReadAcks(strings.NewReader(bad.text)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ReadAcks(%q) = %v, want an error with %q", bad.text, err, bad.want)
		}
	}
}
