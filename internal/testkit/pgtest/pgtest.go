// Package pgtest gives each test its own migrated PostgreSQL database, so
// database tests can run with t.Parallel() and commit, race and crash freely.
//
// The server comes from TEST_DATABASE_URL when it is set (an administrative
// connection string, e.g. postgres://postgres@127.0.0.1:5432/postgres). When it
// is not, a PostgreSQL container is started with testcontainers-go, once per
// test binary. When neither works the test fails with instructions; it is
// skipped only under go test -short.
//
// Databases are cloned from a template migrated once per migration set
// (pgtestdb), so a fresh database costs tens of milliseconds. A passing test's
// database is dropped; a failing test's is kept and its URL logged. The
// templates are dropped after make test (DropTemplates; see templates.go).
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/peterldowns/pgtestdb"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/fleet/ingest/migrations"
)

// EnvURL is the environment variable naming the test server.
const EnvURL = "TEST_DATABASE_URL"

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
)

// ServerURL returns the administrative URL of the test server, starting a
// container if TEST_DATABASE_URL is unset. It fails t when no server can be
// had, and skips it under -short.
func ServerURL(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			serverURL = u
			return
		}
		serverURL, serverErr = startContainer()
	})
	if serverErr != nil {
		if testing.Short() {
			t.Skipf("no PostgreSQL for this test under -short: %v", serverErr)
		}
		t.Fatalf("this test needs PostgreSQL: set %s=postgres://USER@HOST:PORT/postgres?sslmode=disable "+
			"(a role that may create databases), or run a Docker engine for testcontainers-go. "+
			"Starting a container failed: %v", EnvURL, serverErr)
	}
	return serverURL
}

func startContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("5432/tcp").WithStartupTimeout(time.Minute)),
	)
	if err != nil {
		return "", err
	}
	// The container is removed by testcontainers' reaper when the test
	// binary exits.
	return c.ConnectionString(ctx, "sslmode=disable")
}

// Migrator migrates a template database. With UpToVersion 0 it applies
// everything "worker migrate" applies (project, River and local warehouse
// migrations, the warehouse sharing the database as it does by default);
// otherwise only the project's migrations up to that version.
type Migrator struct {
	UpToVersion int64
}

// Hash identifies the template: the migration contents and the target version.
func (m Migrator) Hash() (string, error) {
	h, err := migrations.Hash()
	if err != nil {
		return "", err
	}
	return h + "-" + strconv.FormatInt(m.UpToVersion, 10), nil
}

// Migrate applies the migrations to a new template database.
func (m Migrator) Migrate(ctx context.Context, db *sql.DB, conf pgtestdb.Config) error {
	if m.UpToVersion > 0 {
		_, err := migrations.UpTo(ctx, db, m.UpToVersion)
		return err
	}
	pool, err := pgxpool.New(ctx, conf.URL())
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err = migrations.Apply(ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	_, err = migrations.ApplyWarehouse(ctx, pool)
	return err
}

// NewDatabaseURL returns the URL of a fresh database holding every migration.
func NewDatabaseURL(t testing.TB) string {
	t.Helper()
	return newDatabase(t, Migrator{})
}

// NewDatabaseURLAt returns the URL of a fresh database migrated only up to
// version, for upgrade tests.
func NewDatabaseURLAt(t testing.TB, version int64) string {
	t.Helper()
	return newDatabase(t, Migrator{UpToVersion: version})
}

// EmptyDatabaseURL returns the URL of a fresh database without any
// migration, as an operator would have before "worker migrate" (the
// Redshift Data API double also keeps its warehouse in one).
func EmptyDatabaseURL(t testing.TB) string {
	t.Helper()
	return newDatabase(t, empty{})
}

// empty is a migrator that applies nothing.
type empty struct{}

func (empty) Hash() (string, error) { return "empty", nil }

func (empty) Migrate(context.Context, *sql.DB, pgtestdb.Config) error { return nil }

func newDatabase(t testing.TB, m pgtestdb.Migrator) string {
	t.Helper()
	server := ServerURL(t)
	if err := useTemplates(server); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgconn.ParseConfig(server)
	if err != nil {
		t.Fatalf("parsing %s: %v", EnvURL, err)
	}
	conf := pgtestdb.Config{
		DriverName: "pgx",
		Host:       cfg.Host,
		Port:       strconv.Itoa(int(cfg.Port)),
		User:       cfg.User,
		Password:   cfg.Password,
		Database:   cfg.Database,
		Options:    "sslmode=disable",
		// Test databases are owned by the server's own role so tests may
		// create roles and terminate backends; crash tests leave child
		// connections behind, which cleanup terminates.
		TestRole:                  &pgtestdb.Role{Username: cfg.User, Password: cfg.Password},
		ForceTerminateConnections: true,
	}
	inst := pgtestdb.Custom(t, conf, m)
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(inst.User, inst.Password),
		Host:     fmt.Sprintf("%s:%s", inst.Host, inst.Port),
		Path:     "/" + inst.Database,
		RawQuery: "sslmode=disable",
	}
	if inst.Password == "" {
		u.User = url.User(inst.User)
	}
	return u.String()
}

// NewPool returns a pool on a fresh, fully migrated database, closed when
// the test ends.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, NewDatabaseURL(t))
}

// Pool opens a pool on databaseURL, closed when the test ends.
func Pool(t testing.TB, databaseURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("parsing database URL: %v", err)
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
