package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// rolesMu serialises ApplyRoles within a test binary: its roles are the
// cluster's, shared by every test database.
var rolesMu sync.Mutex

// ApplyRoles runs deploy/postgres/roles.sql on the database of admin (a
// superuser's pool), as an operator does after worker migrate.
func ApplyRoles(t testing.TB, admin *pgxpool.Pool) {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	sql, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "postgres", "roles.sql"))
	require.NoError(t, err)
	rolesMu.Lock()
	defer rolesMu.Unlock()
	_, err = admin.Exec(context.Background(), string(sql))
	require.NoError(t, err)
}

var loginSeq atomic.Int64

// LoginAs creates a login role that is a member of group (fleet_worker,
// fleet_enqueue, fleet_reconcile, fleet_operator) and returns databaseURL rewritten to
// connect as it. The role is dropped when the test ends.
func LoginAs(t testing.TB, admin *pgxpool.Pool, databaseURL, group string) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("test_%s_%d_%d", group, os.Getpid(), loginSeq.Add(1))
	_, err := admin.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN IN ROLE %s`, pgx.Identifier{name}.Sanitize(), pgx.Identifier{group}.Sanitize()))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		_, _ = admin.Exec(ctx, `DROP ROLE IF EXISTS `+pgx.Identifier{name}.Sanitize())
	})
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	u.User = url.User(name)
	return u.String()
}
