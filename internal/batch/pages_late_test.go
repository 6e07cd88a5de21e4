package batch_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestAReservationThatCommitsLateIsOnNoPageOfTheWalk holds the walk to what
// the README says it guarantees. A batch is reserved (its reservation time
// the start of its transaction) before the first page of a walk is read,
// and its transaction commits after that page: it sorts inside the range
// the walk has read, so it is on none of the walk's pages; a new walk (the
// first page again) shows it. Every batch that had committed is on exactly
// one page. The README once said such a batch is on exactly one page.
func TestAReservationThatCommitsLateIsOnNoPageOfTheWalk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := batch.NewStore(pool)
	const scope = "fleet_s3:s3://fleet-uploads/tenants/acme/db/company-1/late"
	// 20 batches reserved a second apart, the newest a minute from now.
	insertFinished(t, pool, "acme", scope, 20, time.Now().Add(time.Minute))

	// A reservation 2.5 s older than the newest of them (it sorts among
	// the first page's five) stays uncommitted while the first page is
	// read, as a burst's transaction still committing does.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var late int64
	require.NoError(t, tx.QueryRow(ctx, `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
		                               pipeline_stage, status, details, source_scope, started_at)
		VALUES ('company-1', 'acme', 'db', 'FileUpload', 'FleetS3', 'Fleet', 'Running', '{"version":1,"phase":"reserved"}', $1::text,
		        (SELECT max(started_at) - interval '2.5 seconds' FROM ingestion_batches WHERE source_scope = $1::text))
		RETURNING id`, scope).Scan(&late))

	walk := func(commitAfterFirst func()) map[int64]bool {
		seen := map[int64]bool{}
		var cursor *batch.Cursor
		for n := 0; ; n++ {
			page, next, err := store.Page(ctx, batch.PageFilter{TenantID: "acme", SourceScope: scope, After: cursor, Limit: 5})
			require.NoError(t, err)
			for _, b := range page {
				require.False(t, seen[b.ID], "batch %d on two pages", b.ID)
				seen[b.ID] = true
			}
			if n == 0 && commitAfterFirst != nil {
				commitAfterFirst()
			}
			if next == nil {
				return seen
			}
			cursor = next
		}
	}
	seen := walk(func() { require.NoError(t, tx.Commit(ctx)) })
	require.Len(t, seen, 20, "every batch committed before the first page is on exactly one page")
	require.False(t, seen[late], "the batch whose reservation committed after the first page sorts inside the pages read")

	seen = walk(nil)
	require.Len(t, seen, 21)
	require.True(t, seen[late], "a new walk shows it")

	// The README says so, and no longer promises it a page.
	raw, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	readme := strings.Join(strings.Fields(string(raw)), " ")
	for _, want := range []string{
		"every batch whose reservation had committed when the walk's first page was read, and that matches its filters throughout, is on exactly one page",
		"one reserved before the first page in a transaction that committed after it",
	} {
		require.True(t, strings.Contains(readme, want), "README.md does not say: %s", want)
	}
	require.False(t, strings.Contains(readme, "every batch that matches its filters throughout is on exactly one page;"),
		"README.md promises a page to every batch that matches a walk's filters")
}
