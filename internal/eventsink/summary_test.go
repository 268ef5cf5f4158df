package eventsink_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"shop/internal/eventsink"
)

// t0 is the base of the hand-written records' clocks.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// at is t0 plus ms milliseconds.
func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// dlv is a delivery of the event stream/seq that arrived at ms and was
// answered status 5 ms later; the event occurred at 0.
func dlv(stream string, seq int64, ms, status int) eventsink.Delivery {
	return eventsink.Delivery{
		WebhookID:  fmt.Sprintf("evt-%s-%d", stream, seq),
		Type:       "order.reserved",
		Stream:     stream,
		Sequence:   seq,
		OccurredAt: t0,
		Arrived:    at(ms),
		Answered:   at(ms + 5),
		Status:     status,
		Data:       json.RawMessage(fmt.Sprintf(`{"sequence":%d}`, seq)),
	}
}

func TestSummarize(t *testing.T) {
	paid := dlv("order:1", 2, 20, 200)
	paid.Type = "order.paid"
	held := dlv("order:1", 1, 10, 0)
	held.Answered = at(100) // held until its sender gave up
	byType := func(n int) map[string]int { return map[string]int{"order.reserved": n} }
	cases := []struct {
		name     string
		record   []eventsink.Delivery
		want     eventsink.Summary
		examples []string
	}{{
		name: "ordered",
		record: []eventsink.Delivery{
			dlv("order:1", 1, 10, 200),
			paid,
			// Stream order:2 begins at 4: events were turned on mid-life.
			dlv("order:2", 4, 12, 200),
			dlv("order:2", 5, 30, 200),
		},
		want: eventsink.Summary{Deliveries: 4, Acknowledged: 4, Streams: 2, LagP50Ms: 12, LagMaxMs: 30,
			ByType: map[string]int{"order.reserved": 3, "order.paid": 1}, OK: true},
	}, {
		name: "duplicated and failed",
		record: []eventsink.Delivery{
			dlv("order:1", 1, 10, 500),
			dlv("order:1", 1, 20, 0),
			dlv("order:1", 1, 30, 200),
			// Acknowledged again, twice: one duplicated event.
			dlv("order:1", 1, 40, 200),
			dlv("order:1", 1, 50, 204),
			dlv("order:1", 2, 60, 200),
			// Delivered and never acknowledged.
			dlv("order:1", 3, 70, 503),
			// Refused: counted apart and out of the streams' analysis.
			{WebhookID: "evt-order:1-1", Arrived: at(80), Answered: at(81), Status: 401},
			{WebhookID: "evt-order:1-9", Arrived: at(90), Answered: at(91), Status: 400},
		},
		want: eventsink.Summary{Deliveries: 7, Rejected: 2, Failed: 3, Acknowledged: 2, Unacknowledged: 1,
			Duplicates: 1, Streams: 1, LagP50Ms: 30, LagMaxMs: 60, ByType: byType(2), OK: true},
	}, {
		name: "out of order",
		record: []eventsink.Delivery{
			// Arrival decides, not the order of the lines.
			dlv("order:2", 1, 45, 200),
			dlv("order:1", 2, 20, 200),
			dlv("order:1", 3, 30, 200),
			// 2 again after 3: delivered late, out of order, and a duplicate.
			dlv("order:1", 2, 40, 200),
			// A failed delivery of 1 counts too: the receiver saw it.
			dlv("order:1", 1, 50, 500),
			dlv("order:1", 1, 10, 200),
		},
		want: eventsink.Summary{Deliveries: 6, Failed: 1, Acknowledged: 4, Duplicates: 1, OutOfOrder: 2, Streams: 2,
			LagP50Ms: 20, LagMaxMs: 45, ByType: byType(4)},
		examples: []string{"out of order: order:1 sequence 2", "out of order: order:1 sequence 1"},
	}, {
		name: "gap",
		record: []eventsink.Delivery{
			dlv("order:1", 1, 10, 200),
			// 2 was delivered but not acknowledged when 3 was: a gap.
			dlv("order:1", 2, 20, 500),
			dlv("order:1", 3, 30, 200),
			// The first event of a stream is no gap, at any sequence, and
			// neither is its retry; 8 after 7 is none either.
			dlv("refund:01J", 7, 12, 500),
			dlv("refund:01J", 7, 22, 200),
			dlv("refund:01J", 8, 32, 200),
			// 10 without 9 is.
			dlv("refund:01J", 10, 42, 200),
		},
		want: eventsink.Summary{Deliveries: 7, Failed: 2, Acknowledged: 5, Unacknowledged: 1, Gaps: 2, Streams: 2,
			LagP50Ms: 30, LagMaxMs: 42, ByType: byType(5)},
		examples: []string{"gap: order:1 sequence 3", "gap: refund:01J sequence 10"},
	}, {
		name: "concurrent",
		record: []eventsink.Delivery{
			held,
			// Arrived while the first was held: two senders at once.
			dlv("order:1", 1, 50, 200),
			// And a third: the event is counted once.
			dlv("order:1", 1, 60, 200),
			// Deliveries one after another are not concurrent, even when
			// the next arrives the instant the last was answered.
			dlv("order:2", 1, 10, 500),
			dlv("order:2", 1, 15, 200),
		},
		want: eventsink.Summary{Deliveries: 5, Failed: 2, Acknowledged: 2, Duplicates: 1, Concurrent: 1, Streams: 2,
			LagP50Ms: 15, LagMaxMs: 50, ByType: byType(2)},
		examples: []string{"concurrent: event evt-order:1-1"},
	}, {
		name: "empty",
		want: eventsink.Summary{ByType: map[string]int{}, OK: true},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := eventsink.Summarize(c.record)
			assertSummary(t, got, c.want)
			for _, prefix := range c.examples {
				assertExample(t, got, prefix)
			}
		})
	}
}

// assertSummary compares all but the examples, as JSON for a readable
// failure.
func assertSummary(t *testing.T, got, want eventsink.Summary) {
	t.Helper()
	got.Examples = nil
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("summary:\n got %s\nwant %s", g, w)
	}
}

func assertExample(t *testing.T, s eventsink.Summary, prefix string) {
	t.Helper()
	for _, e := range s.Examples {
		if strings.HasPrefix(e, prefix) {
			return
		}
	}
	t.Errorf("no example begins %q: %q", prefix, s.Examples)
}
