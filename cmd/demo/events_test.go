package main

import (
	"slices"
	"strings"
	"testing"

	"shop/internal/eventsink"
	"shop/internal/payments"
)

func TestEventsSettings(t *testing.T) {
	secret := newEventsSecret()
	if key, err := payments.DecodeSecret(secret); err != nil || len(key) != 32 {
		t.Fatalf("newEventsSecret() = %q: %d bytes, %v", secret, len(key), err)
	}
	if secret == newEventsSecret() {
		t.Error("newEventsSecret drew the same secret twice")
	}
	got := eventsSettings("http://127.0.0.1:1/events", secret)
	want := []string{"SHOP_EVENTS_URL=http://127.0.0.1:1/events", "SHOP_EVENTS_SECRET=" + secret,
		"1:SHOP_BINARY=" + failpointBinary, "1:GOFAIL_FAILPOINTS=shopEventKill=1*return(5000)"}
	if !slices.Equal(got, want) {
		t.Errorf("eventsSettings = %q, want %q", got, want)
	}
}

func TestInFlightEvent(t *testing.T) {
	line := "failpoint shopEventKill: the relay stops for 5s between the POST of event 0b4c2f1e-6a61-4f0e-9d59-0a3e2d7c1b11 and its mark"
	if got := inFlightEvent(line); got != "0b4c2f1e-6a61-4f0e-9d59-0a3e2d7c1b11" {
		t.Errorf("inFlightEvent = %q", got)
	}
	if got := inFlightEvent("something else"); got != "" {
		t.Errorf("inFlightEvent of another line = %q", got)
	}
}

func TestEventsProblems(t *testing.T) {
	good := func() *eventsResult {
		return &eventsResult{Outbox: 10, Changes: 10, Killed: "e1", KilledAcks: 2, KilledStamps: 2,
			Summary: eventsink.Summary{Acknowledged: 10, Duplicates: 1, OK: true}}
	}
	if p := good().problems(); len(p) != 0 {
		t.Fatalf("a row that did everything: %q", p)
	}
	for _, tt := range []struct {
		name  string
		spoil func(*eventsResult)
		want  string
	}{
		{"pending", func(e *eventsResult) { e.Pending = 1 }, "pending"},
		{"dead", func(e *eventsResult) { e.Dead = 1 }, "dead"},
		{"fewer acknowledged", func(e *eventsResult) { e.Summary.Acknowledged = 9; e.Missing = 1 }, "acknowledged"},
		{"foreign", func(e *eventsResult) { e.Foreign = 1 }, "not the row's"},
		{"changes without events", func(e *eventsResult) { e.Changes = 11 }, "changes in MySQL"},
		{"out of order", func(e *eventsResult) { e.Summary.OutOfOrder = 1 }, "out of order 1"},
		{"gap", func(e *eventsResult) { e.Summary.Gaps = 1 }, "gaps 1"},
		{"concurrent", func(e *eventsResult) { e.Summary.Concurrent = 1 }, "concurrent 1"},
		{"no kill", func(e *eventsResult) { e.Killed = "" }, "no relay stopped"},
		{"killed event not again", func(e *eventsResult) { e.KilledAcks = 1 }, "acknowledged 1 times"},
	} {
		e := good()
		tt.spoil(e)
		p := e.problems()
		if len(p) != 1 || !strings.Contains(p[0], tt.want) {
			t.Errorf("%s: problems %q, want one saying %q", tt.name, p, tt.want)
		}
	}
	r := result{Row: row{Life: lifeEvents, MustHold: true}, Life: &lifeResult{}}
	if !slices.Contains(r.lifeProblems(), "no figures of the events") {
		t.Errorf("an events row without figures: %q", r.lifeProblems())
	}
	if got := msDuration(1234.5); got != "1.23s" {
		t.Errorf("msDuration(1234.5) = %q", got)
	}
}
