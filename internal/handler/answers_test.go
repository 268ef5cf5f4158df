package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"shop/internal/auth"
	"shop/internal/stock"
)

// errorVars returns the names of the package-level error variables declared
// in dir's non-test files whose names start with prefix.
func errorVars(t *testing.T, dir, prefix string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if strings.HasPrefix(id.Name, prefix) {
						names = append(names, id.Name)
					}
				}
			}
		}
	}
	return names
}

// answerRows returns the errors the rows of answers name, as written in
// errors.go: "stock.ErrSoldOut", "errTooLarge".
func answerRows(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "errors.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "answers" {
			return true
		}
		for _, elt := range vs.Values[0].(*ast.CompositeLit).Elts {
			switch e := elt.(*ast.CompositeLit).Elts[0].(type) {
			case *ast.SelectorExpr:
				rows = append(rows, e.X.(*ast.Ident).Name+"."+e.Sel.Name)
			case *ast.Ident:
				rows = append(rows, e.Name)
			}
		}
		return false
	})
	if len(rows) != len(answers) {
		t.Fatalf("read %d rows of answers in errors.go, the table has %d", len(rows), len(answers))
	}
	return rows
}

// Every error the domain declares, and every error of the HTTP layer that
// a request can end with, has its row in the one table, once.
func TestEveryDomainErrorHasAnAnswer(t *testing.T) {
	rows := answerRows(t)
	var want []string
	for _, name := range errorVars(t, "../stock", "Err") {
		want = append(want, "stock."+name)
	}
	if len(want) < 10 {
		t.Fatalf("found %d errors in package stock: %v; the parse went wrong", len(want), want)
	}
	for _, name := range errorVars(t, "../outbox", "Err") {
		want = append(want, "outbox."+name)
	}
	for _, name := range errorVars(t, ".", "err") {
		// errInternal is the message of an error without a row.
		if name != "errInternal" {
			want = append(want, name)
		}
	}
	for _, name := range want {
		if n := strings.Count(" "+strings.Join(rows, " ")+" ", " "+name+" "); n != 1 {
			t.Errorf("%s has %d rows in answers, want 1", name, n)
		}
	}
	for _, row := range rows {
		if !slices.Contains([]string{"auth.ErrExpired", "payments.ErrMalformed", "payments.ErrSignature"}, row) && !slices.Contains(want, row) {
			t.Errorf("answers has a row for %s, which is not an error of stock, outbox, handler, auth or payments", row)
		}
	}
}

// The table's order is the precedence: what an error is answered by when
// it carries two of them.
func TestAnswerPrecedence(t *testing.T) {
	badToken := fmt.Errorf("%w: %w", errBadToken, errors.New("signature is invalid"))
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		msg    string
	}{
		{"a lost COMMIT under busy", fmt.Errorf("%w: %w", stock.ErrBusy, stock.ErrOutcomeUnknown),
			http.StatusServiceUnavailable, "outcome_unknown", "the order may or may not have been placed; retry with the same Idempotency-Key"},
		{"a cancellation's lost COMMIT", fmt.Errorf("%w: order 3: %w", stock.ErrCancelOutcomeUnknown, stock.ErrBusy),
			http.StatusServiceUnavailable, "outcome_unknown", "the cancellation may or may not have been made; send it again"},
		{"a stale write", fmt.Errorf("%w: %w", stock.ErrBusy, stock.ErrStaleFence), http.StatusServiceUnavailable, "busy", "the service is busy, retry later"},
		{"a client gone while busy", fmt.Errorf("%w: %w", errClientClosed, stock.ErrBusy), statusClientClosedRequest, "client_closed_request", "the client closed the request"},
		{"an expired token", fmt.Errorf("%w: %w", errBadToken, auth.ErrExpired), http.StatusUnauthorized, "unauthorized", "the bearer token has expired"},
		{"another bad token", badToken, http.StatusUnauthorized, "unauthorized",
			"the bearer token is not valid: malformed, not signed by a trusted key, or not for this service"},
		{"a bare ErrInvalid", invalid("send at most one Idempotency-Key"), http.StatusBadRequest, "invalid_argument",
			"invalid argument: send at most one Idempotency-Key"},
		{"no row", errors.New("boom: SELECT * FROM orders"), http.StatusInternalServerError, "internal", "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, code, msg := status(tt.err)
			if tt.msg == "" {
				tt.msg = tt.err.Error()
			}
			if status != tt.status || code != tt.code || msg != tt.msg {
				t.Errorf("status(%v) = %d %s %q, want %d %s %q", tt.err, status, code, msg, tt.status, tt.code, tt.msg)
			}
		})
	}
}

// A broken rule of the domain is told with the API's names of its fields.
func TestInvalidNamesTheAPIsFields(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{stock.CheckOrder(0, 1, ""), "invalid argument: sku_id must be a positive integer"},
		{stock.CheckOrder(1, -1, ""), "invalid argument: user_id must be a positive integer"},
		{stock.CheckIdempotencyKey("a b"), "invalid argument: Idempotency-Key must be 1-64 characters of A-Z a-z 0-9 _ -"},
		{stock.CheckPaymentID(""), "invalid argument: payment_id must be 1-64 characters of A-Z a-z 0-9 _ -"},
	}
	for _, tt := range tests {
		if _, code, msg := status(tt.err); code != "invalid_argument" || msg != tt.want {
			t.Errorf("status(%v) = %s %q, want invalid_argument %q", tt.err, code, msg, tt.want)
		}
	}
}

// A request whose client went away is answered 499 with a fixed message:
// the error chain behind it names the work's internals (a statement, an
// address), which no client is told, even one that may still read it.
func TestClientGoneAnswersAFixedMessage(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	w := httptest.NewRecorder()
	c, _ := gin.CreateTestContext(w)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.Request = httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/v1/orders/1", nil)
	writeError(c, fmt.Errorf("%w: read order: dial tcp 10.0.0.5:3306: SELECT * FROM orders: %w", stock.ErrBusy, context.Canceled))
	var body errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if w.Code != statusClientClosedRequest || body.Error.Code != "client_closed_request" || body.Error.Message != errClientClosed.Error() {
		t.Errorf("answer = %d %s %q, want %d client_closed_request %q", w.Code, body.Error.Code, body.Error.Message,
			statusClientClosedRequest, errClientClosed.Error())
	}
}
