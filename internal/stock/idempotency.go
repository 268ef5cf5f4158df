package stock

import (
	"fmt"
	"regexp"

	"gorm.io/gorm"
)

// An order may carry an idempotency key: the same user sending the same key
// again gets the order the key placed (Replayed), and nothing is created.
// A key belongs to its user. What a batch's buyers already hold — their
// active orders of the SKU, and their orders under the batch's keys — is
// read in one query when the batch needs to know (held).

var idempotencyKeyRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// CheckIdempotencyKey returns an ErrInvalid error unless k is 1–64
// characters of [A-Za-z0-9_-].
func CheckIdempotencyKey(k string) error {
	if !idempotencyKeyRE.MatchString(k) {
		return invalidf("%s must be 1-64 characters of A-Z a-z 0-9 _ -", FieldIdempotencyKey)
	}
	return nil
}

// replay finds the order user created earlier under key. ok is false when
// there is none; the error is ErrIdempotencyMismatch when it is of another
// SKU.
func replay(db *gorm.DB, sku, user int64, key string) (o Order, ok bool, err error) {
	found, err := read(db, &o, sqlOrderByKey, user, key)
	if err != nil || !found {
		return Order{}, false, err
	}
	o, err = replayOf(o, sku, user, key)
	return o, err == nil, err
}

// replayOf answers an order of user under idempotency key with o, the
// order the user made under the key before: o itself, Replayed, or
// ErrIdempotencyMismatch when o is of another SKU.
func replayOf(o Order, sku, user int64, key string) (Order, error) {
	if o.SKUID != sku || o.UserID != user {
		return Order{}, fmt.Errorf("%w: key %q", ErrIdempotencyMismatch, key)
	}
	o.Replayed = true
	return o, nil
}

// heldKey is a buyer's idempotency key: keys belong to their buyer.
type heldKey struct {
	user int64
	key  string
}

// held is what a batch's buyers already hold. A nil *held knows nothing.
type held struct {
	users map[int64]bool    // buyers with an active order of this SKU
	keys  map[heldKey]Order // orders under the batch's buyers' keys, of any SKU
}

func (h *held) byUser(user int64) bool { return h != nil && h.users[user] }

func (h *held) byKey(k heldKey) (Order, bool) {
	if h == nil {
		return Order{}, false
	}
	o, ok := h.keys[k]
	return o, ok
}

// heldOrders looks up, in one query, the batch's buyers' active orders of
// sku and their orders under the batch's idempotency keys (of any SKU, in
// any status).
func heldOrders(tx *gorm.DB, sku int64, batch []*ticket) (held, error) {
	users := make([]int64, 0, len(batch))
	var keys []string
	for _, t := range batch {
		users = append(users, t.user)
		if t.key != "" {
			keys = append(keys, t.key)
		}
	}
	q, args := sqlOrdersOfUsers, []any{users, sku}
	if len(keys) > 0 {
		q, args = sqlHeldOrders, []any{users, sku, keys}
	}
	var found []Order
	if _, err := read(tx, &found, q, args...); err != nil {
		return held{}, err
	}
	h := held{users: map[int64]bool{}, keys: map[heldKey]Order{}}
	for _, o := range found {
		if o.SKUID == sku && o.active() {
			h.users[o.UserID] = true
		}
		if o.IdempotencyKey != nil {
			h.keys[heldKey{o.UserID, *o.IdempotencyKey}] = o
		}
	}
	return h, nil
}
