package handler_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"shop/internal/stock"
)

// patch sends PATCH /api/v1/admin/products/{id} with body and the admin
// token.
func (a *api) patch(t *testing.T, id, body string) response {
	t.Helper()
	return a.do(t, "PATCH", "/api/v1/admin/products/"+id, "application/json", strings.NewReader(body),
		map[string][]string{"Authorization": {"Bearer " + adminToken}})
}

// row is product id as MySQL has it.
func (a *api) row(t *testing.T, id int64) stock.Product {
	t.Helper()
	var p stock.Product
	if err := a.db.Gorm.Take(&p, id).Error; err != nil {
		t.Fatal(err)
	}
	return p
}

// keysOf returns the sorted keys of a JSON object.
func keysOf(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

func TestChangeProduct(t *testing.T) {
	a := newAPI(t, adminToken)
	// Cached before the change: the change must show at once.
	if r := a.do(t, "GET", "/api/v1/products/1", "", nil, nil); r.status != 200 ||
		!slices.Equal(keysOf(r.body), []string{"currency", "name", "price_cents", "sale_ends_at", "sale_starts_at", "sku_id", "stock"}) ||
		r.body["sale_starts_at"] != nil || r.body["sale_ends_at"] != nil {
		t.Fatalf("product 1 before any window: %d %s; want both window keys, null", r.status, r.raw)
	}

	r := a.patch(t, "1", `{"add_stock":3}`)
	want := []string{"currency", "initial_stock", "name", "price_cents", "sale_ends_at", "sale_starts_at", "sku_id", "stock"}
	if r.status != 200 || !slices.Equal(keysOf(r.body), want) || r.body["sku_id"] != 1.0 || r.body["stock"] != 8.0 ||
		r.body["initial_stock"] != 8.0 || r.body["sale_starts_at"] != nil || r.body["name"] != "Product 1" {
		t.Fatalf("add_stock 3 to 5 units: %d %s; want 200 with stock and initial_stock 8, keys %v", r.status, r.raw, want)
	}
	if p := a.row(t, 1); p.Stock != 8 || p.InitialStock != 8 {
		t.Errorf("MySQL after add_stock: stock %d, initial %d; want 8, 8", p.Stock, p.InitialStock)
	}

	// A new price shows at once, and leaves orders placed before it as
	// they were.
	placed := a.order(t, `{"sku_id":1,"user_id":99}`, nil)
	if placed.status != 201 || placed.body["amount_cents"] != 137.0 || placed.body["currency"] != "USD" {
		t.Fatalf("order at the old price: %d %s; want 137 USD", placed.status, placed.raw)
	}
	if r := a.patch(t, "1", `{"price_cents":999}`); r.status != 200 || r.body["price_cents"] != 999.0 || r.body["stock"] != 7.0 {
		t.Fatalf("price 999: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "GET", "/api/v1/products/1", "", nil, nil); r.body["price_cents"] != 999.0 {
		t.Errorf("product page right after the price change: %s; want 999", r.raw)
	}
	var owed int64
	if err := a.db.Gorm.Raw("SELECT amount_cents FROM orders WHERE user_id = 99").Scan(&owed).Error; err != nil || owed != 137 {
		t.Errorf("the earlier order owes %d, %v; want 137 still", owed, err)
	}
	for _, bad := range []string{`{"price_cents":0}`, `{"price_cents":-5}`, `{"price_cents":1.5}`} {
		if r := a.patch(t, "1", bad); r.status != 400 || errorCode(t, r) != "invalid_argument" {
			t.Errorf("%s: %d %s; want 400", bad, r.status, r.raw)
		}
	}

	// Any offset in, UTC out, to the microsecond as MySQL keeps it.
	r = a.patch(t, "1", `{"sale_starts_at":"2030-01-02T03:04:05.1234567+01:00","sale_ends_at":"2030-01-03T00:00:00Z"}`)
	if r.status != 200 || r.body["sale_starts_at"] != "2030-01-02T02:04:05.123456Z" || r.body["sale_ends_at"] != "2030-01-03T00:00:00Z" ||
		r.body["stock"] != 7.0 {
		t.Fatalf("set the window: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "GET", "/api/v1/products/1", "", nil, nil); r.body["sale_starts_at"] != "2030-01-02T02:04:05.123456Z" ||
		r.body["sale_ends_at"] != "2030-01-03T00:00:00Z" {
		t.Errorf("product page right after the change: %s; want the new window", r.raw)
	}

	// A key left out stays; null clears.
	r = a.patch(t, "1", `{"sale_ends_at":null}`)
	if r.status != 200 || r.body["sale_starts_at"] != "2030-01-02T02:04:05.123456Z" || r.body["sale_ends_at"] != nil {
		t.Fatalf("clear the end only: %d %s; want the start kept, the end null", r.status, r.raw)
	}
	if p := a.row(t, 1); p.SaleStartsAt == nil || p.SaleEndsAt != nil {
		t.Errorf("MySQL after clearing the end: %v .. %v", p.SaleStartsAt, p.SaleEndsAt)
	}
	if r := a.do(t, "GET", "/api/v1/products/1", "", nil, nil); r.body["sale_starts_at"] != "2030-01-02T02:04:05.123456Z" || r.body["sale_ends_at"] != nil {
		t.Errorf("product page after clearing the end: %s", r.raw)
	}

	// Orders outside the window: 403 with the window's code.
	if r := a.order(t, `{"sku_id":1,"user_id":1}`, nil); r.status != 403 || errorCode(t, r) != "sale_not_started" {
		t.Errorf("order before the sale: %d %s; want 403 sale_not_started", r.status, r.raw)
	}
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if r := a.patch(t, "1", `{"sale_starts_at":null,"sale_ends_at":"`+past+`"}`); r.status != 200 {
		t.Fatalf("end the sale: %d %s", r.status, r.raw)
	}
	if r := a.order(t, `{"sku_id":1,"user_id":1}`, nil); r.status != 403 || errorCode(t, r) != "sale_ended" {
		t.Errorf("order after the sale: %d %s; want 403 sale_ended", r.status, r.raw)
	}
	if r := a.patch(t, "1", `{"sale_ends_at":null}`); r.status != 200 {
		t.Fatalf("reopen the sale: %d %s", r.status, r.raw)
	}
	if r := a.order(t, `{"sku_id":1,"user_id":1}`, nil); r.status != 201 {
		t.Errorf("order once the window is open again: %d %s", r.status, r.raw)
	}
	if s := a.state(t); !s.OK() || s.Orders != 2 || s.InitialStock != 18 {
		t.Errorf("after the changes: %+v", s)
	}
}

// Every refused PATCH answers its status and code and changes nothing.
func TestChangeProductRefused(t *testing.T) {
	a := newAPI(t, adminToken)
	if r := a.patch(t, "2", `{"sale_starts_at":"2030-01-01T00:00:00Z","sale_ends_at":"2030-01-02T00:00:00Z"}`); r.status != 200 {
		t.Fatalf("set a window: %d %s", r.status, r.raw)
	}
	before := fmt.Sprintf("%+v", a.state(t))
	beforeRow := a.row(t, 2)
	token := map[string][]string{"Authorization": {"Bearer " + adminToken}}
	tests := []struct {
		name, id, contentType, body string
		header                      map[string][]string
		status                      int
		code                        string
	}{
		{"not JSON", "2", "application/json", `{"add_stock":`, token, 400, "invalid_argument"},
		{"not an object", "2", "application/json", `[1]`, token, 400, "invalid_argument"},
		{"unknown key", "2", "application/json", `{"stock":5}`, token, 400, "invalid_argument"},
		{"key in other case", "2", "application/json", `{"ADD_STOCK":5}`, token, 400, "invalid_argument"},
		{"key twice", "2", "application/json", `{"add_stock":1,"add_stock":2}`, token, 400, "invalid_argument"},
		{"empty object", "2", "application/json", `{}`, token, 400, "invalid_argument"},
		{"null body", "2", "application/json", `null`, token, 400, "invalid_argument"},
		{"add_stock 0", "2", "application/json", `{"add_stock":0}`, token, 400, "invalid_argument"},
		{"add_stock negative", "2", "application/json", `{"add_stock":-1}`, token, 400, "invalid_argument"},
		{"add_stock too large", "2", "application/json", `{"add_stock":1000000001}`, token, 400, "invalid_argument"},
		{"add_stock beyond int64", "2", "application/json", `{"add_stock":99999999999999999999}`, token, 400, "invalid_argument"},
		{"add_stock fractional", "2", "application/json", `{"add_stock":1.5}`, token, 400, "invalid_argument"},
		{"add_stock a string", "2", "application/json", `{"add_stock":"3"}`, token, 400, "invalid_argument"},
		{"add_stock null", "2", "application/json", `{"add_stock":null}`, token, 400, "invalid_argument"},
		{"date without time", "2", "application/json", `{"sale_ends_at":"2030-01-03"}`, token, 400, "invalid_argument"},
		{"time without zone", "2", "application/json", `{"sale_ends_at":"2030-01-03T00:00:00"}`, token, 400, "invalid_argument"},
		{"time a number", "2", "application/json", `{"sale_ends_at":1893456000}`, token, 400, "invalid_argument"},
		{"start after end", "2", "application/json", `{"sale_starts_at":"2030-01-03T00:00:00Z"}`, token, 400, "invalid_argument"},
		{"start at end", "2", "application/json", `{"sale_ends_at":"2030-01-01T00:00:00Z"}`, token, 400, "invalid_argument"},
		{"bad id", "02", "application/json", `{"add_stock":1}`, token, 400, "invalid_argument"},
		{"no such product", "99", "application/json", `{"add_stock":1}`, token, 404, "not_found"},
		{"no token", "2", "application/json", `{"add_stock":1}`, nil, 401, "unauthorized"},
		{"wrong token", "2", "application/json", `{"add_stock":1}`, map[string][]string{"Authorization": {"Bearer " + adminToken + "x"}}, 401, "unauthorized"},
		{"not JSON content", "2", "text/plain", `{"add_stock":1}`, token, 415, "unsupported_media_type"},
		{"too large", "2", "application/json", `{"add_stock":1` + strings.Repeat(" ", 5000) + `}`, token, 413, "too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := a.do(t, "PATCH", "/api/v1/admin/products/"+tt.id, tt.contentType, strings.NewReader(tt.body), tt.header)
			if r.status != tt.status || errorCode(t, r) != tt.code {
				t.Errorf("%d %s; want %d %s", r.status, r.raw, tt.status, tt.code)
			}
		})
	}
	if after := fmt.Sprintf("%+v", a.state(t)); after != before {
		t.Errorf("refused PATCHes changed the catalog:\nbefore %s\nafter  %s", before, after)
	}
	if after := a.row(t, 2); after.Stock != beforeRow.Stock || after.InitialStock != beforeRow.InitialStock || after.Fence != beforeRow.Fence ||
		!after.SaleStartsAt.Equal(*beforeRow.SaleStartsAt) || !after.SaleEndsAt.Equal(*beforeRow.SaleEndsAt) {
		t.Errorf("refused PATCHes changed product 2: %+v, was %+v", after, beforeRow)
	}
}

// With no token configured the admin API does not exist: 404 for PATCH as
// for the seed, whatever the body.
func TestChangeProductAdminOff(t *testing.T) {
	a := newAPI(t, "")
	for _, header := range []map[string][]string{nil, {"Authorization": {"Bearer " + adminToken}}} {
		r := a.do(t, "PATCH", "/api/v1/admin/products/1", "application/json", strings.NewReader(`{"add_stock":1}`), header)
		if r.status != 404 || errorCode(t, r) != "not_found" {
			t.Errorf("PATCH with the admin API off: %d %s; want 404", r.status, r.raw)
		}
	}
	if p := a.row(t, 1); p.Stock != 5 || p.InitialStock != 5 {
		t.Errorf("product 1 after refused PATCHes: %+v", p)
	}
}

// The admin seed takes an optional window for every product.
func TestAdminSeedWindow(t *testing.T) {
	a := newAPI(t, adminToken)
	seed := func(body string) response {
		return a.do(t, "POST", "/api/v1/admin/seed", "application/json", strings.NewReader(body),
			map[string][]string{"Authorization": {"Bearer " + adminToken}})
	}
	if r := seed(`{"products":2,"stock":1,"sale_starts_at":"2030-01-01T00:00:00Z","sale_ends_at":null}`); r.status != 200 {
		t.Fatalf("seed with a window: %d %s", r.status, r.raw)
	}
	for _, id := range []string{"1", "2"} {
		if r := a.do(t, "GET", "/api/v1/products/"+id, "", nil, nil); r.body["sale_starts_at"] != "2030-01-01T00:00:00Z" || r.body["sale_ends_at"] != nil {
			t.Errorf("product %s after the seed: %s", id, r.raw)
		}
	}
	for _, body := range []string{
		`{"products":2,"stock":1,"sale_starts_at":"soon"}`,
		`{"products":2,"stock":1,"sale_starts_at":"2030-01-02T00:00:00Z","sale_ends_at":"2030-01-01T00:00:00Z"}`,
	} {
		if r := seed(body); r.status != 400 || errorCode(t, r) != "invalid_argument" {
			t.Errorf("seed %s: %d %s; want 400", body, r.status, r.raw)
		}
	}
	if r := a.do(t, "GET", "/api/v1/products/1", "", nil, nil); r.body["sale_starts_at"] != "2030-01-01T00:00:00Z" {
		t.Errorf("a refused seed changed the window: %s", r.raw)
	}
}
