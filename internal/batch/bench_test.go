package batch_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// BenchmarkReserve measures one scoped reservation (INSERT … ON CONFLICT on
// the partial index, RETURNING the row). Compare with
// BenchmarkBaselineRawInsert, a plain single-row INSERT into the same table
// on the same database in the same run.
func BenchmarkReserve(b *testing.B) {
	pool := pgtest.NewPool(b)
	s := batch.NewStore(pool)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		res, err := s.Reserve(ctx, fleetReservation("tenant-bench", fmt.Sprintf("s3://bucket/bench-%d", i)))
		if err != nil || res.Outcome != batch.Reserved {
			b.Fatalf("reserve: %v %v", res.Outcome, err)
		}
	}
}

// BenchmarkReserveConflict measures the conflict path: a reservation of a
// scope that a running batch holds.
func BenchmarkReserveConflict(b *testing.B) {
	pool := pgtest.NewPool(b)
	s := batch.NewStore(pool)
	ctx := context.Background()
	r := fleetReservation("tenant-bench", "s3://bucket/held")
	if _, err := s.Reserve(ctx, r); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		res, err := s.Reserve(ctx, r)
		if err != nil || res.Outcome != batch.Conflict {
			b.Fatalf("reserve: %v %v", res.Outcome, err)
		}
	}
}

// BenchmarkBaselineRawInsert is the physical baseline for BenchmarkReserve:
// a raw single-row INSERT of the same columns.
func BenchmarkBaselineRawInsert(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		_, err := pool.Exec(ctx, `
			INSERT INTO ingestion_batches
				(company_id, tenant_id, tenant_database, ingestion_mode, source_type,
				 pipeline_stage, status, details, source_scope)
			VALUES ('company-1', 'tenant-bench', 'tenant_db', 'FileUpload', 'FleetS3',
			        'fleet_s3_direct_to_curated', 'Running', '{"version":1,"phase":"reserved"}', $1)`,
			fmt.Sprintf("fleet_s3:s3://bucket/raw-%d", i))
		if err != nil {
			b.Fatal(err)
		}
	}
}
