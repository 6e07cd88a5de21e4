// Package migrations holds the project's SQL migrations, embedded into the
// binaries, and applies them with goose.
//
// Each migration runs in its own transaction. Concurrent callers (several
// pods running "worker migrate" at once) are serialised by a PostgreSQL
// session advisory lock, so applying migrations is safe to repeat and to race.
package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

//go:embed warehouse/*.sql
var warehouseFiles embed.FS

// TableName is the goose version table that records applied migrations.
const TableName = "ingest_schema_migrations"

// WarehouseTableName is the goose version table of the local warehouse
// schema (curated). It differs from TableName so the warehouse may share the
// operational database, as it does by default locally.
const WarehouseTableName = "ingest_warehouse_migrations"

// Applied describes one migration that was applied by Up or UpTo.
type Applied struct {
	Version  int64
	Source   string
	Duration time.Duration
}

// Up applies every pending migration and returns those it applied, in order.
// It returns an empty slice when the database is already current.
func Up(ctx context.Context, db *sql.DB) ([]Applied, error) {
	return UpTo(ctx, db, goose.MaxVersion)
}

// UpTo applies pending migrations up to and including version.
func UpTo(ctx context.Context, db *sql.DB, version int64) ([]Applied, error) {
	return upTo(ctx, db, files, TableName, version)
}

// UpWarehouse applies the local warehouse's migrations (schema curated) to
// db. Production loads into Redshift, whose schema is managed there.
func UpWarehouse(ctx context.Context, db *sql.DB) ([]Applied, error) {
	sub, err := fs.Sub(warehouseFiles, "warehouse")
	if err != nil {
		return nil, err
	}
	return upTo(ctx, db, sub, WarehouseTableName, goose.MaxVersion)
}

func upTo(ctx context.Context, db *sql.DB, fsys fs.FS, table string, version int64) ([]Applied, error) {
	provider, err := newProvider(db, fsys, table)
	if err != nil {
		return nil, err
	}
	results, err := provider.UpTo(ctx, version)
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		results = partial.Applied // applied before the one that failed
	}
	applied := make([]Applied, 0, len(results))
	for _, r := range results {
		applied = append(applied, Applied{Version: r.Source.Version, Source: r.Source.Path, Duration: r.Duration})
	}
	if err != nil {
		return applied, fmt.Errorf("applying migrations: %w", err)
	}
	return applied, nil
}

// Version reports the highest migration version applied to db, 0 if none.
func Version(ctx context.Context, db *sql.DB) (int64, error) {
	provider, err := newProvider(db, files, TableName)
	if err != nil {
		return 0, err
	}
	return provider.GetDBVersion(ctx)
}

// Latest returns the highest project migration version this build embeds:
// a database at a lower version is not migrated for this build.
func Latest() (int64, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return 0, err
	}
	var latest int64
	for _, name := range names {
		v, err := goose.NumericComponent(name)
		if err != nil {
			return 0, fmt.Errorf("migration %s: %w", name, err)
		}
		latest = max(latest, v)
	}
	return latest, nil
}

// Hash returns a digest of every embedded migration's name and content. Test
// harnesses use it to key template databases.
func Hash() (string, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return "", err
	}
	wnames, err := fs.Glob(warehouseFiles, "warehouse/*.sql")
	if err != nil {
		return "", err
	}
	names = append(names, wnames...)
	sort.Strings(names)
	h := sha256.New()
	for _, name := range names {
		var b []byte
		if strings.HasPrefix(name, "warehouse/") {
			b, err = warehouseFiles.ReadFile(name)
		} else {
			b, err = files.ReadFile(name)
		}
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func newProvider(db *sql.DB, fsys fs.FS, table string) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("creating migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(table),
		goose.WithSessionLocker(locker),
	)
	if err != nil {
		return nil, fmt.Errorf("loading migrations: %w", err)
	}
	return provider, nil
}
