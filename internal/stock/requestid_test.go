package stock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"shop/internal/notify"
	"shop/internal/requestid"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// failingCache refuses every announcement.
type failingCache struct{}

func (failingCache) Announce(context.Context, notify.Event) error { return errors.New("cache down") }

// What an order logs for its one buyer carries the buyer's request id:
// here the failed invalidation after its COMMIT, whether the order placed
// itself (Batch 1) or its SKU's queue placed it alone.
func TestOrderLogsCarryTheRequestID(t *testing.T) {
	for _, batch := range []int{1, stock.DefaultBatch} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			log := &testenv.Log{}
			logger := slog.New(requestid.LogHandler(slog.NewJSONHandler(log, nil)))
			s, _, _ := seeded(t, 1, 5, options{Settings: stock.Settings{Batch: batch}, Announcer: failingCache{}, Logger: logger})
			ctx := requestid.NewContext(context.Background(), "buyer-1")
			if _, err := s.PlaceOrder(ctx, 1, 1, ""); err != nil {
				t.Fatal(err)
			}
			var found bool
			for line := range strings.Lines(log.String()) {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("%v: %q", err, line)
				}
				if rec["msg"] == "invalidate cached product" {
					found = true
					if rec["request_id"] != "buyer-1" {
						t.Errorf("request_id = %v, want buyer-1: %s", rec["request_id"], line)
					}
				}
			}
			if !found {
				t.Errorf("no failed invalidation logged:\n%s", log)
			}
		})
	}
}
