package stock

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"shop/internal/mysqldb"
)

// transaction runs fn as one transaction on ctx. When fn succeeded and the
// connection failed under the COMMIT, MySQL may have committed or not, and
// no answer of this connection can tell: transaction returns unknown
// (ErrOutcomeUnknown or an error that wraps it) with what the transaction
// was about. A COMMIT that MySQL answered with an error, and any failure
// before it, is a rollback, returned as it came.
func (s *Service) transaction(ctx context.Context, unknown error, about string, fn func(tx *gorm.DB) error) error {
	committing := false
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := fn(tx); err != nil {
			return err
		}
		committing = true // what fails now is the COMMIT
		return nil
	})
	if err != nil && committing && mysqldb.ReplyLost(err) {
		return fmt.Errorf("%w: %s: connection lost at COMMIT: %w", unknown, about, err)
	}
	return err
}
