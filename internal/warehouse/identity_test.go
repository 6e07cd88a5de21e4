package warehouse_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// olderReleasesStampSQL is how a release before batch uids stamps a slice
// (internal/warehouse/postgres.go before warehouse migration 00004): it
// names no uid.
const olderReleasesStampSQL = `
	INSERT INTO curated.fleet_slices
		(tenant_id, source_scope, batch_id, lease_generation, record_count, committed_at, published_at)
	VALUES ($1, $2, $3, $4, $5, now(), NULL)
	ON CONFLICT (tenant_id, source_scope) DO UPDATE
	SET batch_id = EXCLUDED.batch_id, lease_generation = EXCLUDED.lease_generation,
	    record_count = EXCLUDED.record_count, committed_at = EXCLUDED.committed_at,
	    published_at = NULL
	RETURNING batch_id, lease_generation, record_count, committed_at`

// TestAnOlderReleasesStampNamesNoUID: during a rolling upgrade a release
// that knows no uids re-stamps a slice this build stamped. Its upsert
// leaves the uid column alone; the trigger of warehouse migration 00004
// clears it, so the stamp names the older release's batch by its id (a
// legacy stamp) rather than by its id and the previous batch's uid, which
// this build would take for another batch and refuse to publish. A new
// generation of the same batch keeps its uid.
func TestAnOlderReleasesStampNamesNoUID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	wh := warehouse.NewPostgres(pool)
	scope := "fleet_s3:mem://identity/older"
	src, objs, _ := warehousetest.Source(t, map[string]string{"a.csv": "id\n1\n"})
	s := warehouse.Slice{TenantID: warehousetest.Tenant(), SourceScope: scope, BatchID: 5, BatchUID: "05000000-0000-4000-8000-000000000005", Generation: 1}
	_, err := wh.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)

	_, err = pool.Exec(ctx, olderReleasesStampSQL, s.TenantID, scope, int64(5), int64(2), int64(1))
	require.NoError(t, err)
	st, found, err := wh.Stamp(ctx, s.TenantID, scope)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, batch.Ref{ID: 5, UID: s.BatchUID}, st.Ref(), "the same batch's new generation keeps its uid")

	_, err = pool.Exec(ctx, olderReleasesStampSQL, s.TenantID, scope, int64(8), int64(1), int64(1))
	require.NoError(t, err)
	st, _, err = wh.Stamp(ctx, s.TenantID, scope)
	require.NoError(t, err)
	require.Equal(t, batch.Ref{ID: 8}, st.Ref(), "another batch's stamp without a uid is a legacy stamp")
	published, err := wh.Publish(ctx, warehouse.Slice{TenantID: s.TenantID, SourceScope: scope, BatchID: 8, BatchUID: "08000000-0000-4000-8000-000000000008", Generation: 1}, time.Hour, nil)
	require.NoError(t, err, "this build publishes batch 8's slice the older release loaded")
	require.NotNil(t, published.PublishedAt)
}
