package stock

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// ErrUserLimit means the user already holds as many orders, over all
// products, as one user may (Options.UserLimit).
var ErrUserLimit = errors.New("stock: user limit reached")

// The per-user limit (Options.UserLimit) must hold whatever replica or
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
// user has now. With the limit off it does nothing; when the row exists it
// is one read.
//
// A missing row is inserted at zero and then set to the user's orders in
// one short transaction, not counted first and inserted after: a reseed
// that commits between a count and an insert would leave a counter of
// orders that are gone, and the user refused too early until the next
// seed. Here the count runs under the new row's lock, so a reseed either
// committed before the INSERT (which waited for it) and the count sees
// its empty orders, or it deletes the row once this transaction has
// committed. A row another process inserts meanwhile is left to it (INSERT
// IGNORE): it was counted the same way. The transaction holds at most this
// one row when it waits, so it closes no cycle of waits with the order
// transactions.
func (s *Service) ensureCounter(ctx context.Context, user int64) error {
	if s.opt.UserLimit <= 0 {
		return nil
	}
	db := s.reads.WithContext(ctx)
	var n int64
	if err := db.Raw("SELECT COUNT(*) FROM user_orders WHERE user_id = ?", user).Scan(&n).Error; err != nil {
		return classify(ctx, "order counter", err)
	}
	if n > 0 {
		return nil
	}
	err := db.Transaction(func(tx *gorm.DB) error {
		res := tx.Exec("INSERT IGNORE INTO user_orders (user_id, orders) VALUES (?, 0)", user)
		if res.Error != nil || res.RowsAffected == 0 {
			return res.Error
		}
		var orders int64
		if err := tx.Raw("SELECT COUNT(*) FROM orders WHERE user_id = ?", user).Scan(&orders).Error; err != nil || orders == 0 {
			return err
		}
		return tx.Exec("UPDATE user_orders SET orders = ? WHERE user_id = ?", orders, user).Error
	})
	return classify(ctx, "order counter", err)
}

// lockCounters locks the counters of users, in the order transaction, and
// returns what they hold. A user without a counter (a reseed deleted it
// after ensureCounter) is not in the map.
func lockCounters(tx *gorm.DB, users []int64) (map[int64]int, error) {
	var rows []struct {
		UserID int64 `gorm:"column:user_id"`
		Orders int   `gorm:"column:orders"`
	}
	err := tx.Table("user_orders").Select("user_id", "orders").Where("user_id IN ?", users).
		Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).Find(&rows).Error
	if err != nil {
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
	case s.opt.UserLimit <= 0:
		return nil
	case !ok:
		return fmt.Errorf("%w: user %d has no order counter (the catalog was reseeded meanwhile)", ErrBusy, user)
	case n >= s.opt.UserLimit:
		return fmt.Errorf("%w: user %d holds %d orders, the most one user may", ErrUserLimit, user, n)
	}
	return nil
}

// countOrders adds one order to the counter of each of users, which the
// transaction has locked (lockCounters) and found under the limit.
func countOrders(tx *gorm.DB, users []int64) error {
	res := tx.Exec("UPDATE user_orders SET orders = orders + 1 WHERE user_id IN ?", users)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != int64(len(users)) {
		return fmt.Errorf("stock: %d order counters raised for %d buyers", res.RowsAffected, len(users))
	}
	return nil
}

// countOrder adds the one order of a transaction to user's counter if the
// user is under the limit: the conditional UPDATE locks the row, checks
// and raises it in one statement. Refused, a locking read tells the limit
// from a counter a reseed deleted.
func (s *Service) countOrder(tx *gorm.DB, user int64) error {
	res := tx.Exec("UPDATE user_orders SET orders = orders + 1 WHERE user_id = ? AND orders < ?", user, s.opt.UserLimit)
	if res.Error != nil || res.RowsAffected == 1 {
		return res.Error
	}
	counts, err := lockCounters(tx, []int64{user})
	if err != nil {
		return err
	}
	if err := s.limitReached(counts, user); err != nil {
		return err
	}
	return fmt.Errorf("stock: order counter of user %d under the limit, yet not raised", user)
}

// limitCandidates are the users of batch whose counters the transaction
// must lock: those who may still buy, once replays (by key) and users who
// hold an order of the SKU are set aside. Sorted and without repeats.
func limitCandidates(batch []*ticket, h held) []int64 {
	var users []int64
	for _, t := range batch {
		if _, replay := h.byKey[t.key]; (t.key != "" && replay) || t.ctx.Err() != nil {
			continue
		}
		if _, before := h.byUser[t.user]; !before {
			users = append(users, t.user)
		}
	}
	slices.Sort(users)
	return slices.Compact(users)
}

// sellers are the users of orders.
func sellers(orders []Order) []int64 {
	users := make([]int64, len(orders))
	for i, o := range orders {
		users[i] = o.UserID
	}
	return users
}
