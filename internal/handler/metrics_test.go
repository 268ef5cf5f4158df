package handler

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

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

// TestBusyCausesExportedAtZero: every cause busyCause gives is a series
// before the first busy order, so that a rate of them reads 0.
func TestBusyCausesExportedAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	newMetrics(reg)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var causes []string
	for _, f := range families {
		if f.GetName() != "shop_orders_busy_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("a new registry counts %v busy orders", v)
			}
			for _, l := range m.GetLabel() {
				causes = append(causes, l.GetValue())
			}
		}
	}
	for _, want := range []string{"lock_wait", "lease_lost", "stale_fence", "other"} {
		if !slices.Contains(causes, want) {
			t.Errorf("cause %q not exported before the first busy order; exported %v", want, causes)
		}
	}
}
