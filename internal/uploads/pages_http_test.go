package uploads

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// insertFolderBatches inserts n batches of tenant's scope in one
// statement, reserved a second apart from newest down to newest-(n-1)s:
// Succeeded, every tenth Failed, and the newest Running when running is set
// (a folder has at most one Running batch).
func insertFolderBatches(t *testing.T, pool *pgxpool.Pool, tenant, scope string, n int, newest time.Time, running bool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
		                               pipeline_stage, status, details, source_scope, started_at, completed_at)
		SELECT 'c1', $1, 'tenant_db', 'FileUpload', 'FleetS3', 'Fleet', s.status, s.details::jsonb, $2,
		       $3::timestamptz - (g * interval '1 second'),
		       CASE WHEN s.status = 'Running' THEN NULL ELSE $3::timestamptz - (g * interval '1 second') + interval '1 second' END
		FROM generate_series(0, $4 - 1) g,
		LATERAL (SELECT CASE WHEN g = 0 AND $5 THEN 'Running' WHEN g % 10 = 5 THEN 'Failed' ELSE 'Succeeded' END AS status) st,
		LATERAL (SELECT st.status,
		                CASE st.status
		                WHEN 'Running' THEN '{"version":1,"phase":"reserved","redshiftCommitted":false,"publication":{}}'
		                WHEN 'Failed' THEN '{"version":1,"phase":"failed_pre_commit","redshiftCommitted":false,"publication":{}}'
		                ELSE '{"version":1,"phase":"published","redshiftCommitted":true,"publication":{"started":true,"completed":true}}'
		                END AS details) s`,
		tenant, scope, newest, n, running)
	require.NoError(t, err)
}

// TestTenantTokenPagesAFolderWhileBatchesArrive walks, with a tenant token,
// GET /v1/batches?folder=…&since=… over 1,000 batches of one folder, 37 a
// page, following next_cursor, while a goroutine keeps reserving batches of
// the folder. Page's guarantee (batch.Cursor): pages follow (started_at,
// id) downwards, a total order, and each page holds what lies below the
// cursor when it is read. So the walk returns each of the 1,000 exactly
// once, newest first, every page 37 but the last; batches reserved after
// the first page (newer than it) are on no page, yet head a fresh first
// page; a reservation that commits late with a time still ahead of the
// cursor is on a later page, and one behind the cursor is on none. The
// window keeps only what since and until name (older batches of the folder
// and other folders never appear). Tenant B's token walking the same
// folder, naming tenant A, or reusing A's cursor gets an empty page (200),
// and A's batch by id answers B exactly as a missing one (404).
func TestTenantTokenPagesAFolderWhileBatchesArrive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	tokA, lineA, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	tokB, lineB, err := MintTenantToken("tenant-b")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"+lineB+"\n"), 0o600))
	tokens, err := LoadTenantTokens(path, nil)
	require.NoError(t, err)
	f := newServer(t, pool, func(c *Config) { c.TenantTokens = tokens })

	rawFolder := tenantFolder("tenant-a", "up/paging/") // the door canonicalizes: no trailing slash
	fo, err := folder.Canonicalize(rawFolder)
	require.NoError(t, err)
	scope := fo.Scope()
	newest := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	oldest := newest.Add(-999 * time.Second)
	// The 1,000: the newest Running, the rest terminal.
	insertFolderBatches(t, pool, "tenant-a", scope, 1000, newest, true)
	// Older batches of the folder, before since.
	insertFolderBatches(t, pool, "tenant-a", scope, 50, oldest.Add(-time.Second), false)
	// Another folder of A, and B's own folder, inside the window.
	otherScope := folder.ScopePrefix + tenantFolder("tenant-a", "up/other")
	insertFolderBatches(t, pool, "tenant-a", otherScope, 40, newest, false)
	fb, err := folder.Canonicalize(tenantFolder("tenant-b", "up/paging"))
	require.NoError(t, err)
	insertFolderBatches(t, pool, "tenant-b", fb.Scope(), 30, newest, false)

	originals := map[int64]bool{}
	rows, err := pool.Query(ctx, `SELECT id FROM ingestion_batches WHERE tenant_id = 'tenant-a' AND source_scope = $1 AND started_at >= $2`, scope, oldest)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		originals[id] = true
	}
	require.NoError(t, rows.Err())
	require.Len(t, originals, 1000)
	var newestSucceeded int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM ingestion_batches WHERE source_scope = $1 AND started_at = $2`, scope, newest.Add(-time.Second)).Scan(&newestSucceeded))

	list := func(tok string, q url.Values) (int, BatchPage) {
		t.Helper()
		status, raw := f.get(t, "/v1/batches?"+q.Encode(), map[string]string{"Authorization": "Bearer " + tok})
		var page BatchPage
		require.NoError(t, json.Unmarshal(raw, &page), string(raw))
		return status, page
	}
	const limit = 37
	walk := func(cursor string) url.Values {
		q := url.Values{"folder": {rawFolder}, "since": {oldest.Format(time.RFC3339)}, "limit": {strconv.Itoa(limit)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		return q
	}

	// The reserver: batches of the folder, reserved now (newer than every
	// one of the 1,000), one after another until the walk ends.
	var (
		mu         sync.Mutex
		arrived    = map[int64]bool{}
		reserveErr error
		nArrived   atomic.Int64
		stop       = make(chan struct{})
		stopOnce   sync.Once
		done       = make(chan struct{})
	)
	stopReserver := func() {
		stopOnce.Do(func() { close(stop) })
		<-done
	}
	reserve := func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var id int64
			err := pool.QueryRow(ctx, `
				INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
				                               pipeline_stage, status, details, source_scope, completed_at)
				VALUES ('c1', 'tenant-a', 'tenant_db', 'FileUpload', 'FleetS3', 'Fleet', 'Succeeded',
				        '{"version":1,"phase":"published","redshiftCommitted":true,"publication":{"started":true,"completed":true}}', $1, now())
				RETURNING id`, scope).Scan(&id)
			mu.Lock()
			if err != nil {
				reserveErr = err
			} else {
				arrived[id] = true
			}
			mu.Unlock()
			if err != nil {
				return
			}
			nArrived.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}
	// waitArrival waits until the reserver has reserved more than n
	// batches (no tight deadline: the box is loaded).
	waitArrival := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); nArrived.Load() <= n; time.Sleep(time.Millisecond) {
			mu.Lock()
			err := reserveErr
			mu.Unlock()
			require.NoError(t, err, "the reserver")
			require.True(t, time.Now().Before(deadline), "the reserver made no batch in a minute")
		}
	}
	// lateCommit inserts a batch of the folder reserved at at, committing
	// now.
	lateCommit := func(at time.Time) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `
			INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			                               pipeline_stage, status, details, source_scope, started_at, completed_at)
			VALUES ('c1', 'tenant-a', 'tenant_db', 'FileUpload', 'FleetS3', 'Fleet', 'Failed',
			        '{"version":1,"phase":"failed_pre_commit","redshiftCommitted":false,"publication":{}}', $1, $2, now())
			RETURNING id`, scope, at).Scan(&id))
		return id
	}

	seen := map[int64]int{}
	var (
		prevAt     time.Time
		prevID     int64
		cursor     string
		pages      int
		lateAhead  int64 // committed late, reservation time ahead of the cursor: on a later page
		lateBehind int64 // committed late, reservation time behind the cursor: on no page
	)
	for {
		status, page := list(tokA, walk(cursor))
		require.Equal(t, http.StatusOK, status)
		pages++
		require.LessOrEqual(t, pages, 30, "the walk ends")
		require.LessOrEqual(t, len(page.Batches), limit)
		if page.NextCursor != "" {
			require.Len(t, page.Batches, limit, "a page with a next page is full")
		}
		require.NotZero(t, page.LastSucceededBatchID)
		if pages == 1 {
			require.Equal(t, newestSucceeded, page.LastSucceededBatchID, "before any arrival, the folder's newest Succeeded")
			require.Equal(t, string(batch.StatusRunning), page.Batches[0].Status, "the newest of the 1,000 is its Running batch")
			require.NotEmpty(t, page.NextCursor)
		}
		for _, b := range page.Batches {
			seen[b.BatchID]++
			require.Equal(t, 1, seen[b.BatchID], "batch %d on two pages", b.BatchID)
			require.Equal(t, "tenant-a", b.TenantID)
			require.Equal(t, scope, b.SourceScope)
			require.False(t, b.StartedAt.Before(oldest), "since keeps batch %d reserved at %s out", b.BatchID, b.StartedAt)
			if prevID != 0 {
				require.True(t, b.StartedAt.Before(prevAt) || (b.StartedAt.Equal(prevAt) && b.BatchID < prevID),
					"newest first: %d (%s) after %d (%s)", b.BatchID, b.StartedAt, prevID, prevAt)
			}
			prevAt, prevID = b.StartedAt, b.BatchID
		}
		if page.NextCursor == "" {
			break
		}
		if pages == 1 {
			go reserve()
			t.Cleanup(stopReserver) // before the pool closes, if the walk fails
		}
		// Let at least one more batch arrive before the next page.
		waitArrival(nArrived.Load())
		if pages == 10 {
			// Two reservations that commit late: one reserved just before
			// this page's last batch (not read yet), one just after the
			// first page's newest (long passed).
			lateAhead = lateCommit(prevAt.Add(-500 * time.Millisecond))
			lateBehind = lateCommit(newest.Add(-500 * time.Millisecond))
		}
		cursor = page.NextCursor
	}
	stopReserver()
	mu.Lock()
	defer mu.Unlock()
	require.NoError(t, reserveErr, "the reserver")
	t.Logf("%d pages; %d batches of the folder reserved during the walk", pages, len(arrived))
	require.GreaterOrEqual(t, len(arrived), pages-1, "batches arrived between every two pages")

	for id := range originals {
		require.Equal(t, 1, seen[id], "batch %d of the 1,000 seen once", id)
	}
	for id := range arrived {
		require.Zero(t, seen[id], "batch %d reserved after the first page is on no page of the walk", id)
	}
	require.Equal(t, 1, seen[lateAhead], "a late commit ahead of the cursor is on a later page")
	require.Zero(t, seen[lateBehind], "a late commit behind the cursor is on no page")
	require.Len(t, seen, 1001, "the 1,000 and the late commit ahead, nothing else")
	require.Equal(t, 28, pages, "1,001 in pages of 37")

	// A fresh walk starts with the arrivals, above the 1,000's Running
	// batch, then the late commit behind the old cursor, then the rest.
	status, page := list(tokA, walk(""))
	require.Equal(t, http.StatusOK, status)
	require.Len(t, page.Batches, limit)
	for i, b := range page.Batches {
		switch {
		case i < len(arrived):
			require.True(t, arrived[b.BatchID], "position %d: an arrival, got %d", i, b.BatchID)
		case i == len(arrived)+1:
			require.Equal(t, lateBehind, b.BatchID, "position %d: the late commit behind the old cursor", i)
		default:
			require.True(t, originals[b.BatchID], "position %d: one of the 1,000, got %d", i, b.BatchID)
		}
	}
	require.True(t, arrived[page.LastSucceededBatchID], "the folder's newest Succeeded is now an arrival")

	// until: the 99 reserved in the 99 seconds before the Running one (and
	// the late commit behind the cursor, reserved in that span).
	status, page = list(tokA, url.Values{"folder": {rawFolder}, "since": {newest.Add(-99 * time.Second).Format(time.RFC3339)},
		"until": {newest.Format(time.RFC3339)}, "limit": {"1000"}})
	require.Equal(t, http.StatusOK, status)
	require.Empty(t, page.NextCursor)
	require.Len(t, page.Batches, 100)
	for _, b := range page.Batches {
		require.True(t, originals[b.BatchID] || b.BatchID == lateBehind, "batch %d in the window", b.BatchID)
		require.True(t, b.StartedAt.Before(newest))
	}
	// status: the Failed of the 1,000 (every tenth) and the late commit ahead.
	status, page = list(tokA, url.Values{"folder": {rawFolder}, "since": {oldest.Format(time.RFC3339)}, "status": {"Failed"}, "limit": {"1000"}})
	require.Equal(t, http.StatusOK, status)
	require.Len(t, page.Batches, 100+2)

	// Tenant B: the same folder, naming A, or A's cursor: an empty page.
	for name, q := range map[string]url.Values{
		"A's folder":                 walk(""),
		"A's folder, naming A":       {"folder": {rawFolder}, "tenant_id": {"tenant-a"}},
		"A's folder with A's cursor": walk(cursor),
	} {
		status, page := list(tokB, q)
		require.Equal(t, http.StatusOK, status, name)
		require.Empty(t, page.Batches, name)
		require.Empty(t, page.NextCursor, name)
		require.Zero(t, page.LastSucceededBatchID, name)
	}
	// B's token works: its own folder lists its own batches.
	status, page = list(tokB, url.Values{"folder": {fb.String()}, "limit": {"1000"}})
	require.Equal(t, http.StatusOK, status)
	require.Len(t, page.Batches, 30)
	// A's batch by id answers B as a missing one.
	byID := func(id int64) (int, string) {
		t.Helper()
		status, raw := f.get(t, "/v1/batches/"+strconv.FormatInt(id, 10), map[string]string{"Authorization": "Bearer " + tokB})
		return status, string(raw)
	}
	statusOther, bodyOther := byID(newestSucceeded)
	statusMissing, bodyMissing := byID(1 << 40)
	require.Equal(t, http.StatusNotFound, statusOther)
	require.Equal(t, statusMissing, statusOther)
	require.Equal(t, bodyMissing, bodyOther)
}
