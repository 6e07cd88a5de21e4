package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestTenantCapLetsAFreshTenantThrough: tenant A enqueues a backlog of
// trivial folders with one import --from-file; a second later tenant B
// enqueues a handful. Two worker processes with --max-running-per-tenant 2
// run B's batches ahead of A's backlog: B's slowest reservation→Succeeded
// is bounded by a few deliveries, not by A's backlog. Without the cap the
// same B batches wait for the backlog queued before them (River fetches in
// order). The bound leaves room for a loaded machine; `make bench` measures
// the case (2,000 folders, ≤ 5 s).
func TestTenantCapLetsAFreshTenantThrough(t *testing.T) {
	t.Parallel()
	const backlog, fresh = 300, 5
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	fromFile := func(tenant string, n int) string {
		var list []string
		for range n {
			list = append(list, writeFolder(t, map[string]string{"_SUCCESS": "", "a.csv": "k,v\n1,2\n"}))
		}
		file := filepath.Join(t.TempDir(), tenant+".txt")
		require.NoError(t, os.WriteFile(file, []byte(strings.Join(list, "\n")+"\n"), 0o644))
		return file
	}
	aFile, bFile := fromFile("tenant-a", backlog), fromFile("tenant-b", fresh)

	out, code := runEnqueue(t, dbURL, "import", "--tenant-id", "tenant-a", "--tenant-database", "tenant_db", "--company-id", "company-1", "--from-file", aFile)
	require.Equal(t, 0, code, out)
	w1 := startWorker(t, dbURL, "--max-running-per-tenant", "2", "--poll-interval", "200ms", "--log-level", "info")
	w2 := startWorker(t, dbURL, "--max-running-per-tenant", "2", "--poll-interval", "200ms", "--log-level", "info")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE status = 'Succeeded'`).Scan(&n))
		return n >= 20
	}, time.Minute, 50*time.Millisecond, "A's backlog is under way")
	out, code = runEnqueue(t, dbURL, "import", "--tenant-id", "tenant-b", "--tenant-database", "tenant_db", "--company-id", "company-1", "--from-file", bFile)
	require.Equal(t, 0, code, out)

	var bDone, aDone int
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE tenant_id = 'tenant-b'), count(*) FILTER (WHERE tenant_id = 'tenant-a')
			FROM ingestion_batches WHERE status = 'Succeeded'`).Scan(&bDone, &aDone))
		return bDone == fresh
	}, 2*time.Minute, 50*time.Millisecond, "B's batches succeed")
	var slowest time.Duration
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT max(completed_at - started_at) FROM ingestion_batches WHERE tenant_id = 'tenant-b'`).Scan(&slowest))
	t.Logf("B's %d batches done with %d of A's %d; B's slowest reservation→Succeeded %s", fresh, aDone, backlog, slowest.Round(time.Millisecond))
	require.Less(t, aDone, backlog-50, "B finished well before A's backlog")
	require.Less(t, slowest, 15*time.Second, "B waits for a few deliveries, not for A's backlog")

	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE status = 'Succeeded' AND tenant_id = 'tenant-a'`).Scan(&aDone))
		return aDone == backlog
	}, 3*time.Minute, 100*time.Millisecond, "A's backlog finishes: deferrals are not failures")
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT COALESCE(max(attempt), 0) FROM river_job`).Scan(&attempts))
	require.LessOrEqual(t, attempts, 1, "a deferral does not use up an attempt")
	logs := w1.logs.String() + w2.logs.String()
	require.Contains(t, logs, "tenant at its cap of running batches", "the cap bound")
	require.NotContains(t, logs, `"level":"ERROR"`)
}
