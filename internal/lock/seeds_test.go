package lock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// Seed 002's lock table, as the seed writes it: INSERT … ON DUPLICATE KEY
// UPDATE lock_name = lock_name to take the lock, DELETE to free it. The
// statement succeeds for the second caller as it did for the first, so two
// "holders" hold the same lock unless each reads the affected rows (1 for
// the first, 0 for the second), which the seed does not; the row has no
// owner, so anyone's DELETE frees it. Our table lock on the same database
// refuses the second caller.
func TestMySQLSeedsStatementExcludesNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.MySQL(t).DSN
	a, b := mysqlPool(t, dsn), mysqlPool(t, dsn)
	if _, err := a.ExecContext(ctx, "CREATE TABLE lock_table (lock_name VARCHAR(64) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	const take = "INSERT INTO lock_table (lock_name) VALUES ('my_lock_name') ON DUPLICATE KEY UPDATE lock_name = lock_name"
	var affected []int64
	for _, db := range []*sql.DB{a, b} {
		res, err := db.ExecContext(ctx, take)
		if err != nil {
			t.Fatalf("the seed's statement failed, so it would have refused a holder: %v", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			t.Fatal(err)
		}
		affected = append(affected, n)
	}
	if affected[0] != 1 || affected[1] != 0 {
		t.Errorf("affected rows %v, want [1 0]: only the count tells the two callers apart", affected)
	}
	// Anyone frees it: the second "holder" deletes the first one's lock.
	if res, err := b.ExecContext(ctx, "DELETE FROM lock_table WHERE lock_name = 'my_lock_name'"); err != nil {
		t.Fatal(err)
	} else if n, _ := res.RowsAffected(); n != 1 {
		t.Errorf("DELETE by another caller removed %d rows, want 1", n)
	}

	// The table lock: the second caller is refused while the first holds.
	first := newMySQL(t, dsn, lock.MySQLOptions{})
	second := newMySQL(t, dsn, lock.MySQLOptions{})
	lease, err := first.Obtain(ctx, "my_lock_name")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.TryObtain(ctx, "my_lock_name"); !errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("a second holder of the table lock: %v, want ErrNotObtained", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
