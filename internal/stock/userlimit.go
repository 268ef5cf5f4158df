package stock

import (
	"context"
	"database/sql"
	"fmt"
	"slices"

	"gorm.io/gorm"

	"shop/internal/mysqldb"
)

// The per-user limit (Settings.UserLimit) must hold whatever replica or
// batch an order goes through: two orders of one user for different SKUs
// run under different SKU locks, on different replicas, at the same time,
// so counting the user's orders and then inserting one is wrong. Each user
// has a counter, a row of user_orders, that every order transaction locks
// (after the product, FOR UPDATE), checks against the limit and raises in
// the same transaction as the order's INSERT: the orders of one user are
// serialized on that row, and only there.
//
// The row is made before the order takes its SKU lock, outside the order
// transaction (ensureCounter), so that the order transaction only ever
// locks rows that exist: record locks, taken in index order by one
// statement, never the gap locks and S→X upgrades that concurrent INSERT
// IGNOREs or upserts inside it would take and deadlock on.

// ensureCounter makes sure user's counter exists, holding the orders the
// user has now, before an order of product sku. With the limit off it does
// nothing; when the row exists it is one read. When it does not, and sku
// is no product, it makes none: the order is refused ErrNotFound, and a
// refused order leaves no row behind (made-up products and buyers would
// otherwise fill the table).
//
// A missing row is made in one short transaction at READ COMMITTED that
// counts the user's active orders with a locking read and then inserts the
// row holding that count. A plain read would count a return that has
// taken the order off (its UPDATE of user_orders found no row yet) but not
// committed: the row would be made one too high, and stay so. The locking
// read waits for that return's COMMIT and counts what it left. It also
// holds the orders it counted until this transaction commits, so that a
// reseed cannot delete them between the count and the insert and leave a
// counter of orders that are gone: its DELETE waits, and then deletes the
// new row too; one that deleted them first has the count wait for its
// COMMIT, and the count sees none. A row another process inserts meanwhile
// is left to it (INSERT IGNORE): it was counted the same way. Until its
// INSERT the transaction holds only order rows, so a return, which holds
// its orders and then updates the counter, never waits for it while it
// waits for the return: no cycle of waits.
func (s *Service) ensureCounter(ctx context.Context, user, sku int64) error {
	if s.set.UserLimit <= 0 {
		return nil
	}
	db := s.reads.WithContext(ctx)
	var n int64
	if _, err := read(db, &n, sqlCounterExists, user); err != nil {
		return classify(ctx, "order counter", err)
	}
	if n > 0 {
		return nil
	}
	var p Product
	if found, err := read(db, &p, sqlStock, sku); err != nil || !found {
		return classify(ctx, "order counter", err)
	}
	// The user's first orders, on several replicas at once, each come
	// here. Their counts lock the user's orders in one order (see
	// sqlLockActiveOrdersOf), but one may still wait for the row another
	// made, which an order transaction now holds, while that order waits
	// for an order this one locked (its unique check): InnoDB rolls one
	// back. Nothing of this one was written: it tries again, and finds the
	// row (INSERT IGNORE) or makes it.
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = newCounter(db, user); !mysqldb.Deadlock(err) {
			break
		}
	}
	return classify(ctx, "order counter", err)
}

// newCounter makes user's counter, holding the orders the user has now,
// unless the row exists (ensureCounter).
func newCounter(db *gorm.DB, user int64) error {
	return db.Transaction(func(tx *gorm.DB) error {
		var orders int64
		if _, err := read(tx, &orders, sqlLockActiveOrdersOf, user); err != nil {
			return err
		}
		_, _, err := run(tx, sqlNewCounter, user, orders)
		return err
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// lockCounters locks the counters of users, in the order transaction, and
// returns what they hold. A user without a counter (a reseed deleted it
// after ensureCounter) is not in the map.
func lockCounters(tx *gorm.DB, users []int64) (map[int64]int, error) {
	var rows []struct {
		UserID int64 `gorm:"column:user_id"`
		Orders int   `gorm:"column:orders"`
	}
	// Through the primary key, in key order: see sqlLockCounters.
	if _, err := read(tx, &rows, sqlLockCounters, users); err != nil {
		return nil, err
	}
	counts := make(map[int64]int, len(rows))
	for _, r := range rows {
		counts[r.UserID] = r.Orders
	}
	return counts, nil
}

// limitReached is the verdict of the limit on user, whose counter holds
// counts[user]: ErrUserLimit at the limit, ErrBusy without a counter (a
// retry makes it again), nil when the user may buy or the limit is off.
func (s *Service) limitReached(counts map[int64]int, user int64) error {
	n, ok := counts[user]
	switch {
	case s.set.UserLimit <= 0:
		return nil
	case !ok:
		return fmt.Errorf("%w: user %d has no order counter (the catalog was reseeded meanwhile)", ErrBusy, user)
	case n >= s.set.UserLimit:
		return fmt.Errorf("%w: user %d holds %d orders, the most one user may", ErrUserLimit, user, n)
	}
	return nil
}

// countOrders adds one order to the counter of each of users, in one
// conditional UPDATE that raises only counters under the limit (through the
// primary key: see lockCounters). When fewer
// are raised than there are users — one of them is at the limit, or has no
// counter (a reseed deleted it) — it returns short: errCareful for the fast
// attempt, which did not look; nil for the careful one, which locked and
// checked every counter (lockCounters), where it is a failure.
func (s *Service) countOrders(tx *gorm.DB, users []int64, short error) error {
	n, _, err := run(tx, sqlCountOrders, users, s.set.UserLimit)
	switch {
	case err != nil:
		return err
	case n == int64(len(users)):
		return nil
	case short != nil:
		return short
	}
	return fmt.Errorf("stock: %d order counters raised for %d buyers", n, len(users))
}

// limitCandidates are the users of batch whose counters the transaction
// must lock: those who may still buy, once replays (by key) and users who
// hold an order of the SKU are set aside. Sorted and without repeats.
func limitCandidates(batch []*ticket, h *held) []int64 {
	var users []int64
	for _, t := range batch {
		if _, replay := h.byKey(heldKey{t.user, t.key}); (t.key != "" && replay) || t.ctx.Err() != nil {
			continue
		}
		if !h.byUser(t.user) {
			users = append(users, t.user)
		}
	}
	slices.Sort(users)
	return slices.Compact(users)
}

// sellersOf are the users of orders.
func sellersOf(orders []Order) []int64 {
	users := make([]int64, len(orders))
	for i, o := range orders {
		users[i] = o.UserID
	}
	return users
}
