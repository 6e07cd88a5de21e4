package migrations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
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

// Apply brings the database to the current schema with the default
// Config, logging to logger: see Config.Apply.
func Apply(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (Report, error) {
	return Config{Logger: logger}.Apply(ctx, pool)
}

// Apply brings the database to the current schema: the project's migrations
// (goose), then River's (rivermigrate), every statement under the lock
// timeout and retries of c. It holds a session advisory lock for the whole
// run, so concurrent callers apply each migration once. It is idempotent:
// on a current database it applies nothing and returns an empty report.
// When a migration gave way to locks on every attempt the error is a
// *LockTimeoutError; the report lists what was applied before.
func (c Config) Apply(ctx context.Context, pool *pgxpool.Pool) (Report, error) {
	return c.apply(ctx, pool, files, TableName, true)
}

// apply is Apply on a given set of project migrations; with river false
// River's migrations are left alone (tests run migration sets of their own
// through it).
func (c Config) apply(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, table string, river bool) (Report, error) {
	c = c.withDefaults()
	unlock, err := advisoryLock(ctx, pool, applyLockKey)
	if err != nil {
		return Report{}, err
	}
	defer unlock()

	var report Report
	err = c.withLockRetries(ctx, pool, "project", func(ctx context.Context, mp *pgxpool.Pool) error {
		db := stdlib.OpenDBFromPool(mp)
		defer db.Close()
		applied, err := upTo(ctx, db, fsys, table, goose.MaxVersion)
		report.Project = append(report.Project, applied...)
		return err
	})
	if err != nil || !river {
		return report, err
	}
	err = c.withLockRetries(ctx, pool, "river", func(ctx context.Context, mp *pgxpool.Pool) error {
		migrator, err := rivermigrate.New(riverpgxv5.New(mp), &rivermigrate.Config{Logger: c.Logger})
		if err != nil {
			return fmt.Errorf("creating River migrator: %w", err)
		}
		res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		if err != nil {
			return fmt.Errorf("applying River migrations: %w", err)
		}
		report.River = append(report.River, res.Versions...)
		return nil
	})
	return report, err
}

// ApplyWarehouse brings the local warehouse (schema curated) to the current
// schema with the default Config: see Config.ApplyWarehouse.
func ApplyWarehouse(ctx context.Context, pool *pgxpool.Pool) ([]Applied, error) {
	return Config{}.ApplyWarehouse(ctx, pool)
}

// ApplyWarehouse brings the local warehouse (schema curated) to the current
// schema, under an advisory lock of its own and the lock timeout and
// retries of c, and returns what it applied.
func (c Config) ApplyWarehouse(ctx context.Context, pool *pgxpool.Pool) ([]Applied, error) {
	unlock, err := advisoryLock(ctx, pool, applyLockKey+1)
	if err != nil {
		return nil, fmt.Errorf("warehouse: %w", err)
	}
	defer unlock()
	sub, err := fs.Sub(warehouseFiles, "warehouse")
	if err != nil {
		return nil, err
	}
	var out []Applied
	err = c.withLockRetries(ctx, pool, "warehouse", func(ctx context.Context, mp *pgxpool.Pool) error {
		db := stdlib.OpenDBFromPool(mp)
		defer db.Close()
		applied, err := upTo(ctx, db, sub, WarehouseTableName, goose.MaxVersion)
		out = append(out, applied...)
		return err
	})
	return out, err
}

// advisoryLock takes the session advisory lock key on a connection of pool
// (without lock_timeout: concurrent runs of worker migrate wait for each
// other) and returns its release.
func advisoryLock(ctx context.Context, pool *pgxpool.Pool, key int64) (func(), error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		conn.Release()
		return nil, fmt.Errorf("taking migration lock: %w", err)
	}
	return func() {
		conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, key) //nolint:errcheck
		conn.Release()
	}, nil
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
