package migrations

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// applyLockKey is the advisory lock that serialises Apply across processes
// (River's migrator takes none of its own).
const applyLockKey int64 = 0x666c656574_01 // "fleet" + 1

// Report lists what Apply did.
type Report struct {
	// Project lists the project migrations applied, in order.
	Project []Applied
	// River lists River's migration versions applied, in order.
	River []rivermigrate.MigrateVersion
	// Warehouse lists the local warehouse migrations applied, in order.
	Warehouse []Applied
}

// Apply brings the database to the current schema: the project's migrations
// (goose), then River's (rivermigrate). It holds a session advisory lock for
// the whole run, so concurrent callers apply each migration once. It is
// idempotent: on a current database it applies nothing and returns an empty
// report.
func Apply(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (Report, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("connecting: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, applyLockKey); err != nil {
		return Report{}, fmt.Errorf("taking migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, applyLockKey) //nolint:errcheck

	var report Report
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if report.Project, err = Up(ctx, db); err != nil {
		return report, err
	}

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return report, fmt.Errorf("creating River migrator: %w", err)
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return report, fmt.Errorf("applying River migrations: %w", err)
	}
	report.River = res.Versions
	return report, nil
}

// ApplyWarehouse brings the local warehouse (schema curated) to the current
// schema, under the same advisory lock as Apply, and returns what it applied.
func ApplyWarehouse(ctx context.Context, pool *pgxpool.Pool) ([]Applied, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting to warehouse: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, applyLockKey+1); err != nil {
		return nil, fmt.Errorf("taking warehouse migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, applyLockKey+1) //nolint:errcheck
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return UpWarehouse(ctx, db)
}

// ErrNotMigrated is wrapped by RequireCurrent's error for a database whose
// schema is behind this build.
var ErrNotMigrated = errors.New("run `worker migrate` first")

// RequireCurrent checks that the project's migrations this build embeds are
// all applied, so a worker never starts against an unmigrated database (it
// would fail later, job by job, with undefined tables or columns). A
// database ahead of this build is accepted: migrations only add. A role that
// may not read the version table (see deploy/postgres/roles.sql) cannot
// check; then nothing is refused here.
func RequireCurrent(ctx context.Context, pool *pgxpool.Pool) error {
	latest, err := Latest()
	if err != nil {
		return err
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, TableName).Scan(&exists); err != nil {
		return fmt.Errorf("checking the schema version: %w", err)
	}
	if !exists {
		return fmt.Errorf("the database has no schema (no %s table): %w", TableName, ErrNotMigrated)
	}
	var v int64
	err = pool.QueryRow(ctx, `SELECT COALESCE(max(version_id), 0) FROM `+TableName+` WHERE is_applied`).Scan(&v)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient privilege
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking the schema version: %w", err)
	}
	if v < latest {
		return fmt.Errorf("the database schema is at migration %d, this build needs %d: %w", v, latest, ErrNotMigrated)
	}
	return nil
}
