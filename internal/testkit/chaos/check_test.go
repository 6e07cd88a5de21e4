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

func insertBatch(t *testing.T, pool *pgxpool.Pool, tenant, scope, status, details, terms string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope,
		                               execution_lease_terms, execution_lease_generation)
		VALUES ('c', $1, 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', $2, $3, $4, $5::jsonb,
		        COALESCE((SELECT max((e->>'generation')::bigint) FROM jsonb_array_elements($5::jsonb) e), 0)) RETURNING id`,
		tenant, status, details, scope, terms).Scan(&id))
	return id
}

func slice(t *testing.T, pool *pgxpool.Pool, tenant, scope string, batchID int64, records, copies int, publications int) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO curated.fleet_slices VALUES ($1, $2, $3, 1, $4, now(), now())`, tenant, scope, batchID, records)
	require.NoError(t, err)
	for c := range copies {
		for i := range records {
			_, err := pool.Exec(ctx, `INSERT INTO curated.fleet_records (tenant_id, source_scope, batch_id, object_key, line_number, record) VALUES ($1, $2, $3, 'k', $4, '{}')`,
				tenant, scope, batchID, i+1+0*c)
			require.NoError(t, err)
		}
	}
	for range publications {
		_, err := pool.Exec(ctx, `INSERT INTO curated.fleet_publications (tenant_id, source_scope, batch_id, record_count, published_at) VALUES ($1, $2, $3, $4, now())`, tenant, scope, batchID, records)
		if err != nil {
			break // the unique index refuses a second one; the checker must still count
		}
	}
}

const (
	goodDetails = `{"version":1,"phase":"published","redshiftCommitted":true,"publication":{"started":true,"completed":true},
	"writes":[{"phase":"published","status":"Succeeded","leaseId":"a","generation":1,"at":"2026-11-30T10:00:10Z"}]}`
	goodTerms = `[{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","releasedAt":"2026-11-30T10:00:10Z","closed":true}]`
)

// TestCheckerFindsViolations feeds the checker a database with every kind of
// violation it looks for, and a clean one.
func TestCheckerFindsViolations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	clean := pgtest.NewPool(t)
	id := insertBatch(t, clean, "t", "fleet_s3:s3://b/good", "Succeeded", goodDetails, goodTerms)
	slice(t, clean, "t", "fleet_s3:s3://b/good", id, 3, 1, 1)
	r, err := chaos.Check(ctx, clean, []chaos.Expectation{{TenantID: "t", Scope: "fleet_s3:s3://b/good", Records: 3}})
	require.NoError(t, err)
	require.Empty(t, r.Violations)
	require.Equal(t, 1, r.Succeeded)

	pool := pgtest.NewPool(t)
	// Overlapping terms and a stale write.
	insertBatch(t, pool, "t", "fleet_s3:s3://b/overlap", "Succeeded", `{"version":1,"phase":"published","redshiftCommitted":true,
		"writes":[{"phase":"committed","status":"Running","leaseId":"a","generation":1,"at":"2026-11-30T10:00:25Z"}]}`,
		`[{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","closed":true},
		  {"leaseId":"b","generation":2,"at":"2026-11-30T10:00:20Z","expiresAt":"2026-11-30T10:01:00Z","releasedAt":"2026-11-30T10:00:50Z","closed":true}]`)
	// A write after its term ended, by a generation that was taken over.
	insertBatch(t, pool, "t", "fleet_s3:s3://b/stale", "Succeeded", `{"version":1,"phase":"published","redshiftCommitted":true,
		"writes":[{"phase":"committed","status":"Running","leaseId":"a","generation":1,"at":"2026-11-30T10:00:45Z"}]}`,
		`[{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","closed":true},
		  {"leaseId":"b","generation":2,"at":"2026-11-30T10:00:40Z","expiresAt":"2026-11-30T10:01:00Z","releasedAt":"2026-11-30T10:00:50Z","closed":true}]`)
	// A term that ended without being closed: its end is unknown.
	insertBatch(t, pool, "t", "fleet_s3:s3://b/unclosed", "Succeeded", `{"version":1,"phase":"published","redshiftCommitted":true}`,
		`[{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","closed":false},
		  {"leaseId":"b","generation":2,"at":"2026-11-30T10:00:40Z","expiresAt":"2026-11-30T10:01:00Z","releasedAt":"2026-11-30T10:00:50Z","closed":true}]`)
	// Left Running; failed without a cause; slice with duplicates.
	insertBatch(t, pool, "t", "fleet_s3:s3://b/running", "Running", `{"version":1,"phase":"loading","redshiftCommitted":false}`, `[]`)
	insertBatch(t, pool, "t", "fleet_s3:s3://b/failed", "Failed", `{"version":1,"phase":"failed_publication","redshiftCommitted":true,"lastError":{"phase":"failed_publication","message":"x","at":"2026-11-30T10:00:00Z"}}`, `[]`)
	dup := insertBatch(t, pool, "t", "fleet_s3:s3://b/dup", "Succeeded", goodDetails, goodTerms)
	slice(t, pool, "t", "fleet_s3:s3://b/dup", dup, 3, 2, 0)

	r, err = chaos.Check(ctx, pool, []chaos.Expectation{
		{TenantID: "t", Scope: "fleet_s3:s3://b/running", Records: 3},
		{TenantID: "t", Scope: "fleet_s3:s3://b/failed", Records: 3},
		{TenantID: "t", Scope: "fleet_s3:s3://b/dup", Records: 3},
		{TenantID: "t", Scope: "fleet_s3:s3://b/never", Records: 3},
	})
	require.NoError(t, err)
	all := strings.Join(r.Violations, "\n")
	for _, want := range []string{
		"two holders at once",
		"a stale write was accepted",
		"term 1 (a) was never closed",
		"still Running",
		"failed (failed_publication: x) without an injected data fault",
		"want 3 records once, slice says 3, holds 6",
		"published 0 times",
		"never got a batch",
	} {
		require.Contains(t, all, want)
	}
}
