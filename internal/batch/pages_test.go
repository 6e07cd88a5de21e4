package batch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// insertFinished inserts n finished (Succeeded) batches of tenant's folder
// scope in one statement, reserved a second apart ending at end.
func insertFinished(t *testing.T, pool *pgxpool.Pool, tenant, scope string, n int, end time.Time) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
		                               pipeline_stage, status, details, source_scope, started_at, completed_at)
		SELECT 'company-1', $1, 'db', 'FileUpload', 'FleetS3', 'Fleet', 'Succeeded',
		       '{"version":1,"phase":"published","redshiftCommitted":true,"publication":{"started":true,"completed":true}}',
		       $2, $3::timestamptz - (g * interval '1 second'), $3::timestamptz - (g * interval '1 second') + interval '1 second'
		FROM generate_series(1, $4) g`, tenant, scope, end, n)
	require.NoError(t, err)
}

// TestPagesSeeEachBatchOnceWhileBatchesArrive pages through 1,000 batches
// of one folder, 37 at a time, while two more batches of the folder are
// reserved between pages: each of the 1,000 is seen once, in order, newest
// first, none of the newcomers is (they sort before the first page), and a
// time window keeps only what it names.
func TestPagesSeeEachBatchOnceWhileBatchesArrive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := batch.NewStore(pool)
	const scope = "fleet_s3:s3://fleet-uploads/tenants/acme/db/company-1/daily"
	end := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	insertFinished(t, pool, "acme", scope, 1000, end)
	insertFinished(t, pool, "acme", scope+"-other", 50, end)

	var firstNew int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(id) + 1 FROM ingestion_batches`).Scan(&firstNew))
	arrived := 0
	seen := map[int64]bool{}
	var prev batch.Batch
	var cursor *batch.Cursor
	pages := 0
	for {
		page, next, err := store.Page(ctx, batch.PageFilter{TenantID: "acme", SourceScope: scope, After: cursor, Limit: 37})
		require.NoError(t, err)
		pages++
		// Batches of the folder arrive between pages.
		insertFinished(t, pool, "acme", scope, 2, time.Now().Add(time.Second))
		arrived += 2
		for _, b := range page {
			require.False(t, seen[b.ID], "batch %d on two pages", b.ID)
			require.Less(t, b.ID, firstNew, "a batch reserved after the first page sorts before it")
			seen[b.ID] = true
			require.Equal(t, scope, b.Scope())
			if prev.ID != 0 {
				require.True(t, b.StartedAt.Before(prev.StartedAt) || (b.StartedAt.Equal(prev.StartedAt) && b.ID < prev.ID), "newest first")
			}
			prev = b
		}
		if next == nil {
			break
		}
		// The cursor travels as text.
		c, err := batch.ParseCursor(next.String())
		require.NoError(t, err)
		cursor = &c
	}
	t.Logf("%d batches of the folder reserved while paging", arrived)
	require.Len(t, seen, 1000)
	require.Equal(t, 28, pages, "1,000 in pages of 37")

	// A window: the 100 reserved in the last 100 seconds before end.
	page, next, err := store.Page(ctx, batch.PageFilter{TenantID: "acme", SourceScope: scope, Since: end.Add(-100 * time.Second), Until: end, Limit: 1000})
	require.NoError(t, err)
	require.Nil(t, next)
	require.Len(t, page, 100)
	// Another tenant sees none of them.
	page, _, err = store.Page(ctx, batch.PageFilter{TenantID: "globex", SourceScope: scope})
	require.NoError(t, err)
	require.Empty(t, page)
	_, err = batch.ParseCursor("not-a-cursor")
	require.ErrorIs(t, err, batch.ErrBadCursor)
}

// TestPageQueriesReadIndexesAt100kBatches: over 100,000 batches of 100
// tenants, EXPLAIN of a folder's page and of a tenant's time window shows
// index scans (ix_ingestion_batches_scope, ix_ingestion_batches_tenant_started)
// and no sequential scan.
func TestPageQueriesReadIndexesAt100kBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	end := time.Now().UTC().Truncate(time.Second)
	_, err := pool.Exec(ctx, `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
		                               pipeline_stage, status, details, source_scope, started_at, completed_at)
		SELECT 'company-1', 'tenant-' || (g % 100), 'db', 'FileUpload', 'FleetS3', 'Fleet', 'Succeeded',
		       '{"version":1,"phase":"published","redshiftCommitted":true,"publication":{"started":true,"completed":true}}',
		       'fleet_s3:s3://b/tenants/tenant-' || (g % 100) || '/db/c/f-' || (g % 1000),
		       $1::timestamptz - (g * interval '1 second'), $1::timestamptz - (g * interval '1 second') + interval '1 second'
		FROM generate_series(1, 100000) g`, end)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE ingestion_batches`)
	require.NoError(t, err)

	plan := func(f batch.PageFilter) string {
		t.Helper()
		q, args := batch.PageQuery(f)
		rows, err := pool.Query(ctx, "EXPLAIN "+q, args...)
		require.NoError(t, err)
		defer rows.Close()
		var lines []string
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			lines = append(lines, l)
		}
		require.NoError(t, rows.Err())
		return strings.Join(lines, "\n")
	}
	cursor := &batch.Cursor{StartedAt: end.Add(-50_000 * time.Second), ID: 50_000}
	for name, tt := range map[string]struct {
		f     batch.PageFilter
		index string
	}{
		"a folder":                    {batch.PageFilter{TenantID: "tenant-7", SourceScope: "fleet_s3:s3://b/tenants/tenant-7/db/c/f-7"}, "ix_ingestion_batches_scope"},
		"a folder's next page":        {batch.PageFilter{TenantID: "tenant-7", SourceScope: "fleet_s3:s3://b/tenants/tenant-7/db/c/f-7", After: cursor}, "ix_ingestion_batches_scope"},
		"a tenant's window":           {batch.PageFilter{TenantID: "tenant-7", Since: end.Add(-20_000 * time.Second), Until: end.Add(-10_000 * time.Second)}, "ix_ingestion_batches_tenant_started"},
		"a tenant's window, page two": {batch.PageFilter{TenantID: "tenant-7", Since: end.Add(-90_000 * time.Second), After: cursor}, "ix_ingestion_batches_tenant_started"},
		"a tenant's newest":           {batch.PageFilter{TenantID: "tenant-7", Status: batch.StatusSucceeded}, "ix_ingestion_batches_tenant_started"},
		"folders whose newest failed": {batch.PageFilter{TenantID: "tenant-7", Status: batch.StatusFailed, Newest: true}, "ix_ingestion_batches_scope"},
		"folders' newest, page two":   {batch.PageFilter{TenantID: "tenant-7", Newest: true, After: cursor}, "ix_ingestion_batches_scope"},
	} {
		p := plan(tt.f)
		require.Contains(t, p, tt.index, "%s:\n%s", name, p)
		require.NotContains(t, p, "Seq Scan", "%s:\n%s", name, p)
		t.Logf("%s:\n%s", name, p)
	}
}

// TestNewestFailedPageReadsIndexesWithoutStatistics: on a table never
// analyzed (a fresh database, or statistics gone stale), the generic plan
// of the listing of folders whose newest batch failed (newest=true with
// status=Failed, first and later pages) walks the tenant's index in page
// order and probes the folder index (its highest id) once per row, keyed
// by the row's folder: no sequential scan, no sort of the tenant's
// batches, no scan of the tenant's whole index per row.
func TestNewestFailedPageReadsIndexesWithoutStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	end := time.Now().UTC().Truncate(time.Second)
	insertFinished(t, pool, "tenant-a", "fleet_s3:s3://b/tenants/tenant-a/db/c/f", 3, end)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	for name, f := range map[string]batch.PageFilter{
		"first page": {TenantID: "tenant-a", Status: batch.StatusFailed, Newest: true},
		"next page":  {TenantID: "tenant-a", Status: batch.StatusFailed, Newest: true, After: &batch.Cursor{StartedAt: end, ID: 2}},
	} {
		q, args := batch.PageQuery(f)
		_, err := conn.Exec(ctx, "PREPARE newest_failed AS "+q)
		require.NoError(t, err)
		lits := make([]string, len(args))
		for i, a := range args {
			switch a := a.(type) {
			case string:
				lits[i] = "'" + strings.ReplaceAll(a, "'", "''") + "'"
			case time.Time:
				lits[i] = "'" + a.Format(time.RFC3339Nano) + "'::timestamptz"
			default:
				lits[i] = fmt.Sprint(a)
			}
		}
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE newest_failed("+strings.Join(lits, ", ")+")")
		require.NoError(t, err)
		var lines []string
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			lines = append(lines, l)
		}
		require.NoError(t, rows.Err())
		_, err = conn.Exec(ctx, "DEALLOCATE newest_failed")
		require.NoError(t, err)
		require.Contains(t, strings.Join(lines, "\n"), "$1", "%s: a generic plan", name)
		p := strings.Join(lines, "\n")
		t.Logf("%s:\n%s", name, p)
		require.Contains(t, p, "ix_ingestion_batches_tenant_started", "%s:\n%s", name, p)
		require.Contains(t, p, "ix_ingestion_batches_scope", "%s:\n%s", name, p)
		require.NotContains(t, p, "Seq Scan", "%s:\n%s", name, p)
		require.NotContains(t, p, "Sort", "%s:\n%s", name, p)
		require.Contains(t, p, "source_scope = (ingestion_batches.source_scope)", "%s: one probe of the folder's index per row:\n%s", name, p)
	}
}
