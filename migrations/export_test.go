package migrations

import (
	"context"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ApplyFS runs a migration set of the test's own (fsys, recorded in table)
// through the runner Apply uses, River's migrations left out.
func (c Config) ApplyFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, table string) (Report, error) {
	return c.apply(ctx, pool, fsys, table, false)
}
