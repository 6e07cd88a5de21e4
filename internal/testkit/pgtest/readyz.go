package pgtest

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/migrations"
)

// RequireReadyzFollowsSchema checks the readiness probe at readyzURL of a
// process on the database of pool, which it asks at every probe: ready
// (200) at first; 503 saying why once the database's schema falls behind
// this build (its latest migration marked not applied, as a database
// restored from an old backup or a connection string pointed elsewhere
// would be); ready again once it is migrated.
func RequireReadyzFollowsSchema(t testing.TB, pool *pgxpool.Pool, readyzURL string) {
	t.Helper()
	get := func() (int, string) {
		resp, err := http.Get(readyzURL)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	code, body := get()
	require.Equal(t, http.StatusOK, code, body)

	markLatestMigration(t, pool, false)
	code, body = get()
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "not ready: the database schema is at migration")
	require.Contains(t, body, "run `worker migrate` first")

	markLatestMigration(t, pool, true)
	code, body = get()
	require.Equal(t, http.StatusOK, code, body)
}

// markLatestMigration marks this build's latest migration applied or not
// in the database of pool.
func markLatestMigration(t testing.TB, pool *pgxpool.Pool, applied bool) {
	t.Helper()
	latest, err := migrations.Latest()
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `UPDATE `+migrations.TableName+` SET is_applied = $1 WHERE version_id = $2`, applied, latest)
	require.NoError(t, err)
}
