package handler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/handler"
	"shop/internal/outbox"
)

// outboxFake is an outbox in memory behind handler.Events, which keeps
// the pages it was asked for. It lists and redelivers as outbox.Store
// does, whose own tests run on MySQL; these are about the routes: what
// they pass on, what they refuse before asking, and how they answer.
type outboxFake struct {
	mu     sync.Mutex
	events []outbox.Event // by position
	asked  []outbox.Page
}

func (f *outboxFake) List(_ context.Context, p outbox.Page) ([]outbox.Event, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, p)
	page := []outbox.Event{}
	for _, e := range f.events {
		if e.State != p.State || e.Position <= p.After {
			continue
		}
		if len(page) == p.Limit {
			return page, true, nil
		}
		page = append(page, e)
	}
	return page, false, nil
}

func (f *outboxFake) Redeliver(_ context.Context, id string) (outbox.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, e := range f.events {
		if e.EventID != id {
			continue
		}
		if e.State == outbox.StateDelivered {
			return outbox.Event{}, fmt.Errorf("%w: %s", outbox.ErrDelivered, id)
		}
		e.State, e.Attempts, e.NextAt = outbox.StatePending, 0, time.Now()
		f.events[i] = e
		return e, nil
	}
	return outbox.Event{}, fmt.Errorf("%w: %s", outbox.ErrNotFound, id)
}

// pages returns how many pages were asked for.
func (f *outboxFake) pages() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.asked)
}

// fakeEvent is event n of the fake's outbox (position n), in state.
func fakeEvent(n int64, state string) outbox.Event {
	occurred := time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC).Add(time.Duration(n) * time.Second)
	var lastError *string
	if state == outbox.StateDead {
		s := "the receiver answered 500"
		lastError = &s
	}
	return outbox.Event{
		Position: n, EventID: fmt.Sprintf("00000000-0000-4000-8000-%012d", n), Type: "order.paid",
		Stream: fmt.Sprintf("order:%d", n), Sequence: 2, OccurredAt: occurred, State: state, Attempts: 3,
		NextAt: occurred.Add(time.Minute), LastError: lastError,
		Data: json.RawMessage(fmt.Sprintf(`{"order_id":%d,"status":"paid","sequence":2}`, n)),
	}
}

// eventsAPI serves the admin API with the fake's events, each response
// checked against openapi.json.
func eventsAPI(t *testing.T, events ...outbox.Event) (*api, *outboxFake) {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	f := &outboxFake{events: events}
	srv := serve(t, both(handler.New(handler.Deps{
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Events: f,
	}, handler.Settings{AdminToken: adminToken})))
	return &api{url: srv.URL}, f
}

// A malformed query is 400 invalid_argument, in the JSON error shape, and
// the outbox is not asked.
func TestEventsRefusesBadQueries(t *testing.T) {
	a, f := eventsAPI(t, fakeEvent(1, outbox.StatePending))
	for _, q := range []string{
		"state=delivered", "state=", "state=PENDING",
		"after=-1", "after=x", "after=1.5",
		"limit=0", "limit=1001", "limit=-3", "limit=x",
	} {
		r := a.do(t, "GET", "/api/v1/admin/events?"+q, "", nil, withToken)
		if r.status != 400 || errorCode(t, r) != "invalid_argument" {
			t.Errorf("?%s: %d %s; want 400 invalid_argument", q, r.status, r.raw)
		}
	}
	if n := f.pages(); n != 0 {
		t.Errorf("the outbox was asked for %d pages by malformed queries; want none", n)
	}
}

// Pages follow one another by next, which is null on the last; the
// defaults are pending and 100; dead events are listed apart.
func TestEventsPages(t *testing.T) {
	a, f := eventsAPI(t, fakeEvent(1, outbox.StatePending), fakeEvent(2, outbox.StateDead),
		fakeEvent(3, outbox.StatePending), fakeEvent(4, outbox.StatePending))
	type page struct {
		Events []map[string]any `json:"events"`
		Next   *int64           `json:"next"`
	}
	get := func(q string) page {
		t.Helper()
		r := a.do(t, "GET", "/api/v1/admin/events"+q, "", nil, withToken)
		var p page
		if err := json.Unmarshal([]byte(r.raw), &p); r.status != 200 || err != nil {
			t.Fatalf("%s: %d %s", q, r.status, r.raw)
		}
		return p
	}
	first := get("?limit=2")
	if len(first.Events) != 2 || first.Next == nil || *first.Next != 3 {
		t.Fatalf("first page: %+v; want events 1 and 3, next 3", first)
	}
	e := first.Events[0]
	if e["position"] != 1.0 || e["event_id"] != "00000000-0000-4000-8000-000000000001" || e["state"] != "pending" ||
		e["occurred_at"] != "2030-01-02T03:04:06.123456Z" || e["next_at"] != "2030-01-02T03:05:06.123456Z" ||
		e["last_error"] != nil || e["data"].(map[string]any)["sequence"] != 2.0 {
		t.Errorf("first event: %v", e)
	}
	last := get(fmt.Sprintf("?limit=2&after=%d", *first.Next))
	if len(last.Events) != 1 || last.Events[0]["position"] != 4.0 || last.Next != nil {
		t.Errorf("last page: %+v; want event 4, next null", last)
	}
	dead := get("?state=dead")
	if len(dead.Events) != 1 || dead.Events[0]["position"] != 2.0 || dead.Events[0]["last_error"] != "the receiver answered 500" ||
		dead.Next != nil {
		t.Errorf("dead: %+v; want event 2 with its error", dead)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.asked[0]; got != (outbox.Page{State: outbox.StatePending, Limit: 2}) {
		t.Errorf("the first page asked for %+v", got)
	}
	if got := f.asked[2]; got != (outbox.Page{State: outbox.StateDead, Limit: 100}) {
		t.Errorf("?state=dead asked for %+v; want the default limit, 100", got)
	}
}

// A dead event is redelivered: pending, its attempts from 0. An unknown
// event is 404 not_found, a delivered one 409 event_delivered, and an id
// that is no event id 400 without asking.
func TestEventsRedeliver(t *testing.T) {
	dead, delivered := fakeEvent(1, outbox.StateDead), fakeEvent(2, outbox.StateDelivered)
	a, f := eventsAPI(t, dead, delivered)
	redeliver := func(id string) response {
		t.Helper()
		return a.do(t, "POST", "/api/v1/admin/events/"+url.PathEscape(id)+"/redeliver", "", nil, withToken)
	}
	if r := redeliver(dead.EventID); r.status != 200 || r.body["event_id"] != dead.EventID || r.body["state"] != "pending" ||
		r.body["attempts"] != 0.0 {
		t.Errorf("redeliver the dead event: %d %s; want 200, pending, 0 attempts", r.status, r.raw)
	}
	f.mu.Lock()
	state := f.events[0].State
	f.mu.Unlock()
	if state != outbox.StatePending {
		t.Errorf("the dead event is %s after its redelivery; want pending", state)
	}
	for _, c := range []struct {
		id     string
		status int
		code   string
	}{
		{"00000000-0000-4000-8000-000000000009", 404, "not_found"},
		{delivered.EventID, 409, "event_delivered"},
		{"00000000-0000-4000-8000-00000000000A", 400, "invalid_argument"},
		{"nope", 400, "invalid_argument"},
	} {
		if r := redeliver(c.id); r.status != c.status || errorCode(t, r) != c.code {
			t.Errorf("redeliver %s: %d %s; want %d %s", c.id, r.status, r.raw, c.status, c.code)
		}
	}
	if r := a.do(t, "POST", "/api/v1/admin/events/"+dead.EventID+"/redeliver", "", nil, nil); r.status != 401 ||
		errorCode(t, r) != "unauthorized" {
		t.Errorf("without the token: %d %s; want 401", r.status, r.raw)
	}
}
