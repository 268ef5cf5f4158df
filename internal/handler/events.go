package handler

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"

	"github.com/gin-gonic/gin"

	"shop/internal/outbox"
)

// Events is the outbox, as operators see it (docs/events.md):
// *outbox.Store implements it.
type Events interface {
	List(ctx context.Context, p outbox.Page) ([]outbox.Event, bool, error)
	Redeliver(ctx context.Context, eventID string) (outbox.Event, error)
}

// outboxEventResponse is one event in GET /api/v1/admin/events and the answer of
// a redelivery. Times are RFC 3339 in UTC, to the microsecond.
type outboxEventResponse struct {
	Position   int64           `json:"position"`
	EventID    string          `json:"event_id"`
	Type       string          `json:"type"`
	Stream     string          `json:"stream"`
	Sequence   int64           `json:"sequence"`
	OccurredAt string          `json:"occurred_at"`
	State      string          `json:"state"`
	Attempts   int             `json:"attempts"`
	NextAt     string          `json:"next_at"`
	LastError  *string         `json:"last_error"`
	Data       json.RawMessage `json:"data"`
}

type outboxEventsResponse struct {
	Events []outboxEventResponse `json:"events"`
	// Next is the after= of the next page; null on the last.
	Next *int64 `json:"next"`
}

func newOutboxEventResponse(e outbox.Event) outboxEventResponse {
	return outboxEventResponse{
		Position: e.Position, EventID: e.EventID, Type: e.Type, Stream: e.Stream, Sequence: e.Sequence,
		OccurredAt: e.OccurredAt.UTC().Format(outbox.TimeFormat), State: e.State, Attempts: e.Attempts,
		NextAt: e.NextAt.UTC().Format(outbox.TimeFormat), LastError: e.LastError, Data: e.Data,
	}
}

// eventIDRE is an event id: a UUID as MySQL's UUID() writes it.
var eventIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// handleEvents lists a page of events: ?state=pending|dead (default
// pending), ?after=<position>, ?limit=1..1000 (default 100). The query is
// checked here, before the outbox is asked, so that a malformed request
// never reaches MySQL.
func handleEvents(events Events) gin.HandlerFunc {
	return func(c *gin.Context) {
		p := outbox.Page{State: c.DefaultQuery("state", outbox.StatePending), Limit: 100}
		if p.State != outbox.StatePending && p.State != outbox.StateDead {
			writeError(c, invalid("state must be pending or dead"))
			return
		}
		if v, ok := c.GetQuery("after"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				writeError(c, invalid("after must be a position: a whole number, 0 or more"))
				return
			}
			p.After = n
		}
		if v, ok := c.GetQuery("limit"); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > outbox.MaxPage {
				writeError(c, invalid("limit must be an integer between 1 and 1000"))
				return
			}
			p.Limit = n
		}
		page, more, err := events.List(c.Request.Context(), p)
		if err != nil {
			writeError(c, err)
			return
		}
		res := outboxEventsResponse{Events: make([]outboxEventResponse, 0, len(page))}
		for _, e := range page {
			res.Events = append(res.Events, newOutboxEventResponse(e))
		}
		if more {
			res.Next = &page[len(page)-1].Position
		}
		c.JSON(http.StatusOK, res)
	}
}

// handleRedeliver makes an event due again: a dead one pending, its age
// and its stream's counting from now; a pending one at once.
func handleRedeliver(events Events) gin.HandlerFunc {
	return func(c *gin.Context) {
		id := c.Param("event_id")
		if !eventIDRE.MatchString(id) {
			writeError(c, invalid("event_id must be a UUID in lower case, as events carry it"))
			return
		}
		e, err := events.Redeliver(c.Request.Context(), id)
		if err != nil {
			writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, newOutboxEventResponse(e))
	}
}
