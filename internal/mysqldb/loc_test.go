package mysqldb_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/mysqldb"
	"shop/internal/testenv"
)

// Every pool reads and writes times as UTC whatever loc the DSN names: a
// time the service writes comes back as the same instant, and MySQL's
// UTC_TIMESTAMP() is read as now.
func TestTimesAreUTCWhateverTheDSNSays(t *testing.T) {
	base, err := mysql.ParseDSN(testenv.EmptyMySQL(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	for _, zone := range []string{"Local", "Asia/Tokyo", "America/New_York"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		cfg := base.Clone()
		cfg.Loc = loc
		dsn := cfg.FormatDSN()
		openers := map[string]func() (*sql.DB, error){
			"Open": func() (*sql.DB, error) {
				g, err := mysqldb.Open(dsn, 1)
				if err != nil {
					return nil, err
				}
				return g.DB()
			},
			"OpenOrders": func() (*sql.DB, error) {
				g, err := mysqldb.OpenOrders(dsn, 1)
				if err != nil {
					return nil, err
				}
				return g.DB()
			},
			"OpenSQL": func() (*sql.DB, error) { return mysqldb.OpenSQL(dsn, 1) },
		}
		for name, open := range openers {
			t.Run(zone+"/"+name, func(t *testing.T) {
				db, err := open()
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				sent := time.Now().Truncate(time.Microsecond)
				var (
					utcNow, back time.Time
					skew         int64
				)
				// A DATETIME(6) as the tables hold them, written from a
				// time.Time and read back; the server's UTC clock, read;
				// and the two compared on the server.
				if err := db.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6), CAST(? AS DATETIME(6)), TIMESTAMPDIFF(SECOND, ?, UTC_TIMESTAMP(6))",
					sent, sent).Scan(&utcNow, &back, &skew); err != nil {
					t.Fatal(err)
				}
				if !back.Equal(sent) || back.Location() != time.UTC {
					t.Errorf("wrote %s, read back %s; want the same instant, in UTC", sent.UTC(), back)
				}
				if d := time.Since(utcNow); d < -time.Minute || d > time.Minute || utcNow.Location() != time.UTC {
					t.Errorf("UTC_TIMESTAMP() read as %s, %s from now; want now, in UTC", utcNow, d)
				}
				if skew < -60 || skew > 60 {
					t.Errorf("the server finds the time written %d s from its UTC clock; want about 0", skew)
				}
			})
		}
	}
}
