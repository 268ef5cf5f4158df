package handler

import (
	"fmt"
	"testing"

	"shop/internal/lock"
	"shop/internal/stock"
)

func TestBusyCause(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: sku 1: %w", stock.ErrBusy, fmt.Errorf("%w: waited 2s", lock.ErrNotObtained)), "lock_wait"},
		{fmt.Errorf("%w: %w", stock.ErrBusy, fmt.Errorf("%w: lease ran out", lock.ErrNotHeld)), "lease_lost"},
		{fmt.Errorf("%w: %w: sku 1: token 5, row has 6", stock.ErrBusy, stock.ErrStaleFence), "stale_fence"},
		{fmt.Errorf("%w: connection refused", stock.ErrBusy), "other"},
	}
	for _, tt := range tests {
		if got := busyCause(tt.err); got != tt.want {
			t.Errorf("busyCause(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
