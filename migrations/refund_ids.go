package migrations

import (
	"context"
	"crypto/rand"
	"database/sql"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/pressly/goose/v3"
)

// refundIDs is migration 00009: it names every refund from before refund_id
// (00008 added the column, 00010 makes it the key) with a ULID of the time
// it was received, so that the ids of old and new refunds sort by time.
// SQL cannot make a ULID, hence Go.
func refundIDs() *goose.Migration {
	return goose.NewGoMigration(9, &goose.GoFunc{RunTx: nameRefunds}, &goose.GoFunc{RunTx: noop})
}

func nameRefunds(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx,
		// received_at is UTC, to the microsecond, whatever the session's zone.
		"SELECT order_id, payment_id, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', received_at) FROM refunds WHERE refund_id IS NULL")
	if err != nil {
		return err
	}
	type row struct {
		order    int64
		payment  string
		received time.Time
	}
	var unnamed []row
	for rows.Next() {
		var r row
		var micros int64
		if err := rows.Scan(&r.order, &r.payment, &micros); err != nil {
			rows.Close()
			return err
		}
		r.received = time.UnixMicro(micros)
		unnamed = append(unnamed, r)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range unnamed {
		id, err := ulid.New(ulid.Timestamp(r.received), rand.Reader)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE refunds SET refund_id = ? WHERE order_id = ? AND payment_id = ?",
			id.String(), r.order, r.payment); err != nil {
			return err
		}
	}
	return nil
}

// noop is 00009's down: 00008's down drops the column.
func noop(context.Context, *sql.Tx) error { return nil }
