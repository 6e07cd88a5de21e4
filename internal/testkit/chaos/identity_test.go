package chaos_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// stamp writes a folder's slice stamp and a publication, naming the batch
// by id and uid.
func stamp(t *testing.T, pool *pgxpool.Pool, tenant, scope string, id int64, uid string) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO curated.fleet_slices (tenant_id, source_scope, batch_id, batch_uid, lease_generation, record_count, committed_at, published_at)
		VALUES ($1, $2, $3, $4, 1, 3, now(), now())
		ON CONFLICT (tenant_id, source_scope) DO UPDATE SET batch_id = excluded.batch_id, batch_uid = excluded.batch_uid`, tenant, scope, id, uid)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO curated.fleet_publications (tenant_id, source_scope, batch_id, batch_uid, record_count, published_at) VALUES ($1, $2, $3, $4, 3, now())`,
		tenant, scope, id, uid)
	require.NoError(t, err)
}

func uidOf(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var uid string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT batch_uid::text FROM ingestion_batches WHERE id = $1`, id).Scan(&uid))
	return uid
}

// TestIdentityCheckerFindsViolations feeds CheckIdentity a database that
// went back in time behind its warehouse: a slice stamped with the newest
// batch's id but a forgotten batch's uid, an id the warehouse names with
// two uids, and a clean folder.
func TestIdentityCheckerFindsViolations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	const forgotten = "00000000-0000-4000-8000-000000000001"

	clean := insertBatch(t, pool, "t", "fleet_s3:s3://b/clean", "Succeeded", goodDetails, goodTerms)
	stamp(t, pool, "t", "fleet_s3:s3://b/clean", clean, uidOf(t, pool, clean))
	r, err := chaos.CheckIdentity(ctx, pool, pool, []chaos.Expectation{{TenantID: "t", Scope: "fleet_s3:s3://b/clean", Records: 3}}, true)
	require.NoError(t, err)
	require.Empty(t, r.Skipped)
	require.Empty(t, r.Violations)

	// A batch the rewind forgot loaded and published the folder under the
	// id the new batch was then handed again.
	reused := insertBatch(t, pool, "t", "fleet_s3:s3://b/reused", "Succeeded", goodDetails, goodTerms)
	stamp(t, pool, "t", "fleet_s3:s3://b/reused", reused, forgotten)
	r, err = chaos.CheckIdentity(ctx, pool, pool, []chaos.Expectation{
		{TenantID: "t", Scope: "fleet_s3:s3://b/clean", Records: 3},
		{TenantID: "t", Scope: "fleet_s3:s3://b/reused", Records: 3},
	}, true)
	require.NoError(t, err)
	require.Equal(t, 1, r.Forgotten)
	all := strings.Join(r.Violations, "\n")
	require.Contains(t, all, "not with its newest batch")
	require.Contains(t, all, "published 0 times under its uid")

	// The new batch then loaded and published it too: the warehouse names
	// one id with two uids.
	_, err = pool.Exec(ctx, `UPDATE curated.fleet_slices SET batch_uid = $1 WHERE source_scope = 'fleet_s3:s3://b/reused'`, uidOf(t, pool, reused))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO curated.fleet_publications (tenant_id, source_scope, batch_id, batch_uid, record_count, published_at) VALUES ('t', 'fleet_s3:s3://b/reused', $1, $2, 3, now())`,
		reused, uidOf(t, pool, reused))
	require.NoError(t, err)
	reusedOnly := []chaos.Expectation{{TenantID: "t", Scope: "fleet_s3:s3://b/reused", Records: 3}}
	r, err = chaos.CheckIdentity(ctx, pool, pool, reusedOnly, true)
	require.NoError(t, err)
	require.Equal(t, 1, r.Reused)
	require.Len(t, r.Violations, 1)
	require.Contains(t, r.Violations[0], "with 2 uids")
	// Where ids may repeat (a lost tail no step followed), it is counted,
	// not a violation.
	r, err = chaos.CheckIdentity(ctx, pool, pool, reusedOnly, false)
	require.NoError(t, err)
	require.Equal(t, 1, r.Reused)
	require.Empty(t, r.Violations)
}
