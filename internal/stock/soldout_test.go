package stock

import (
	"testing"
	"time"
)

func TestSoldOutMemory(t *testing.T) {
	now := time.Unix(1000, 0)
	m := newSoldOut(time.Minute, func() time.Time { return now })

	gen := m.generation()
	m.mark(1, gen)
	if !m.has(1) || m.has(2) {
		t.Fatal("marked 1: want 1 remembered, 2 not")
	}
	now = now.Add(time.Minute)
	if m.has(1) {
		t.Error("remembered past its ttl")
	}

	// A finding made before a restock was announced must not stick.
	stale := m.generation()
	m.forget(1)
	m.mark(1, stale)
	if m.has(1) {
		t.Error("a finding older than the restock was kept")
	}
	m.mark(1, m.generation())
	m.mark(2, m.generation())
	m.forget(0)
	if m.has(1) || m.has(2) {
		t.Error("forget(All) left entries")
	}

	off := newSoldOut(-1, time.Now)
	off.mark(1, off.generation())
	if off.has(1) {
		t.Error("a negative ttl must turn the memory off")
	}
}
