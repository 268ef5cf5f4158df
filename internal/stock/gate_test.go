package stock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"shop/internal/stock"
	"shop/internal/testenv"
)

// A public read that finds its gate full is refused with ErrBusy after the
// gate's wait, not queued; once a place frees, reads go through again. An
// unknown order or key is not found, through the gate too.
func TestPublicReadsRefusedWhenTheGateIsFull(t *testing.T) {
	db := testenv.MySQL(t)
	catalog := stock.NewCatalog(db.Gorm)
	if err := catalog.Seed(context.Background(), 2, 4); err != nil {
		t.Fatal(err)
	}
	const wait = 50 * time.Millisecond
	public := catalog.Public(1, wait)
	ctx := context.Background()
	if n, err := public.Stock(ctx, 1); err != nil || n != 4 {
		t.Fatalf("stock through an empty gate: %d, %v", n, err)
	}

	// The gate's one place, taken by a read that waits for a table lock
	// held on a connection of its own.
	conn, err := db.Gorm.DB()
	if err != nil {
		t.Fatal(err)
	}
	holder, err := conn.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, "LOCK TABLES products WRITE"); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() { _, err := public.Stock(ctx, 2); held <- err }()
	time.Sleep(200 * time.Millisecond)
	reads := map[string]func() error{
		"stock":   func() error { _, err := public.Stock(ctx, 1); return err },
		"product": func() error { _, err := public.Product(ctx, 1); return err },
		"order":   func() error { _, err := public.Order(ctx, 1, 1); return err },
		"replay":  func() error { _, err := public.Replay(ctx, 1, 1, "k"); return err },
	}
	for name, read := range reads {
		start := time.Now()
		err := read()
		if took := time.Since(start); !errors.Is(err, stock.ErrBusy) || took < wait || took > wait+time.Second {
			t.Errorf("%s through a full gate: %v after %v; want ErrBusy after about %v", name, err, took, wait)
		}
	}
	if _, err := holder.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err != nil {
		t.Errorf("the read that held the gate: %v", err)
	}

	if _, err := public.Order(ctx, 1, 1); !errors.Is(err, stock.ErrOrderNotFound) {
		t.Errorf("an order that is not there: %v; want ErrOrderNotFound", err)
	}
	if _, err := public.Replay(ctx, 1, 1, "k"); !errors.Is(err, stock.ErrOrderNotFound) {
		t.Errorf("a key that placed nothing: %v; want ErrOrderNotFound", err)
	}
	// The catalog it came from is not gated.
	if _, err := catalog.Stock(ctx, 2); err != nil {
		t.Errorf("the ungated catalog: %v", err)
	}
}
