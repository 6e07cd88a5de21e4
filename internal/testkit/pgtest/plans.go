package pgtest

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LeasedWithStaleStatistics fills ingestion_batches as a fleet's table
// looks when its statistics are older than its leases: 20,000 finished
// batches and running ones, ANALYZEd while none was leased, then leased
// running batches (holder "holder-{id}", generation 1, an hour left),
// with autovacuum off for the table so that nothing refreshes the
// statistics behind the test's back. It returns the leased batches' ids.
// The planner then believes every partial index over leased batches to be
// empty: a statement that may use one for a primary-key look-up does.
func LeasedWithStaleStatistics(t testing.TB, pool *pgxpool.Pool, leased int) []int64 {
	t.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`ALTER TABLE ingestion_batches SET (autovacuum_enabled = false)`,
		`INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope, completed_at)
		 SELECT 'company-1', 'tenant-' || (g % 200), 'tenant_db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Succeeded',
		        '{"version": 1, "phase": "published"}', 'fleet_s3:s3://history-bucket/' || g, now()
		 FROM generate_series(1, 20000) g`,
		`INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope)
		 SELECT 'company-1', 'tenant-' || (g % 20), 'tenant_db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Running',
		        '{"version": 1, "phase": "reserved"}', 'fleet_s3:s3://running-bucket/' || g
		 FROM generate_series(1, ` + strconv.Itoa(leased) + `) g`,
		`ANALYZE ingestion_batches`,
		`UPDATE ingestion_batches SET execution_lease_id = 'holder-' || id, execution_lease_generation = 1,
		        execution_lease_expires_at = now() + interval '1 hour', execution_lease_renewed_at = now()
		 WHERE status = 'Running'`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("preparing stale statistics: %v", err)
		}
	}
	rows, err := pool.Query(ctx, `SELECT id FROM ingestion_batches WHERE status = 'Running' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// PlanIndexes returns the indexes the plan of sql with args reads (EXPLAIN,
// not executed), in plan order.
func PlanIndexes(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	var plan []map[string]any
	if err := pool.QueryRow(context.Background(), `EXPLAIN (FORMAT JSON) `+sql, args...).Scan(&plan); err != nil {
		t.Fatalf("explaining: %v", err)
	}
	var out []string
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if name, ok := n["Index Name"].(string); ok {
			out = append(out, name)
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				walk(m)
			}
		}
	}
	for _, p := range plan {
		if root, ok := p["Plan"].(map[string]any); ok {
			walk(root)
		}
	}
	return out
}
