package migrations

import (
	"context"
	"database/sql"

	"github.com/pressly/goose/v3"
)

// UpTo applies the migrations up to version, as a database that stopped
// there has them.
func UpTo(ctx context.Context, db *sql.DB, version int64) error {
	p, err := goose.NewProvider(goose.DialectMySQL, db, files, goose.WithGoMigrations(refundIDs()))
	if err != nil {
		return err
	}
	_, err = p.UpTo(ctx, version)
	return err
}
