package stock

import (
	"context"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// A failure of MySQL that may pass is ErrBusy, with its cause kept; a
// domain answer and any other failure are not.
func TestClassify(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		busy bool
	}{
		{"deadlock", context.Background(), &mysql.MySQLError{Number: 1213}, true},
		{"lost connection", context.Background(), mysql.ErrInvalidConn, true},
		{"the request ended", canceled, errors.New("boom"), true},
		{"duplicate", context.Background(), &mysql.MySQLError{Number: 1062}, false},
		{"sold out", context.Background(), soldOutError(7), false},
		{"something else", context.Background(), errors.New("boom"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := classify(tt.ctx, "test", tt.err)
			if got := errors.Is(err, ErrBusy); got != tt.busy {
				t.Errorf("classify(%v) = %v: busy %v, want %v", tt.err, err, got, tt.busy)
			}
			if tt.ctx.Err() == nil && !errors.Is(err, tt.err) {
				t.Errorf("classify(%v) = %v: lost the cause", tt.err, err)
			}
		})
	}
}
