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
	m.raise(1, 0)
	m.mark(1, stale)
	if m.has(1) {
		t.Error("a finding older than the restock was kept")
	}
	m.mark(1, m.generation())
	m.mark(2, m.generation())
	m.raise(0, 0)
	if m.has(1) || m.has(2) {
		t.Error("a raise of every product left entries")
	}

	off := newSoldOut(-1, time.Now)
	off.mark(1, off.generation())
	if off.has(1) {
		t.Error("a negative ttl must turn the memory off")
	}
}

// Another replica's finding is believed unless a raise heard before it
// came after it: one with a later fencing token, or one without a token
// that was heard less than quiet ago (of the product, or of every product).
func TestSoldOutHeardFromElsewhere(t *testing.T) {
	now := time.Unix(1000, 0)
	m := newSoldOut(time.Minute, func() time.Time { return now })

	m.heard(1, 10)
	if !m.has(1) {
		t.Fatal("a finding heard from elsewhere was not believed")
	}
	// Units returned under token 20: the finding at 10 is gone, and a late
	// copy of it, or any older one, is not believed again.
	m.raise(1, 20)
	now = now.Add(time.Hour)
	for _, fence := range []int64{10, 19, 20} {
		if m.heard(1, fence); m.has(1) {
			t.Fatalf("a finding under token %d, older than the raise under 20, was believed", fence)
		}
	}
	if m.heard(1, 21); !m.has(1) {
		t.Error("a finding under a later token than the raise was not believed")
	}

	// A restock (no token): findings heard within quiet of it are dropped,
	// later ones believed.
	m.raise(2, 0)
	if m.heard(2, 5); m.has(2) {
		t.Error("a finding heard right after a raise without a token was believed")
	}
	now = now.Add(soldOutQuiet)
	if m.heard(2, 5); !m.has(2) {
		t.Error("a finding heard quiet after a raise without a token was not believed")
	}

	// A seed or a resubscription raises every product.
	m.raise(0, 0)
	if m.has(1) || m.has(2) {
		t.Error("a raise of every product left entries")
	}
	if m.heard(3, 7); m.has(3) {
		t.Error("a finding heard right after a raise of every product was believed")
	}
	now = now.Add(soldOutQuiet)
	if m.heard(3, 7); !m.has(3) {
		t.Error("a finding heard quiet after a raise of every product was not believed")
	}

	off := newSoldOut(-1, time.Now)
	if off.heard(1, 1); off.has(1) {
		t.Error("a negative ttl must turn the memory off")
	}
}

// Another replica's finding lapses after heardTTL, a few seconds: a raise
// not heard, or a finding heard late, costs no more than that. This
// replica's own finding keeps its ttl, and a finding heard does not shorten
// it.
func TestSoldOutHeardLapsesSoon(t *testing.T) {
	now := time.Unix(1000, 0)
	m := newSoldOut(time.Minute, func() time.Time { return now })
	if m.heardTTL <= 0 || m.heardTTL > 10*time.Second {
		t.Fatalf("heardTTL = %v, want a few seconds", m.heardTTL)
	}
	m.heard(1, 10)
	m.mark(2, m.generation())
	m.heard(2, 10)
	now = now.Add(m.heardTTL)
	if m.has(1) {
		t.Errorf("a finding heard from elsewhere was believed past %v", m.heardTTL)
	}
	if !m.has(2) {
		t.Error("a finding heard from elsewhere shortened this replica's own")
	}
	// A memory shorter than heardTTL bounds heard findings too.
	short := newSoldOut(time.Second, func() time.Time { return now })
	short.heard(1, 10)
	now = now.Add(time.Second)
	if short.has(1) {
		t.Error("a finding heard from elsewhere outlived the memory's ttl")
	}
}
