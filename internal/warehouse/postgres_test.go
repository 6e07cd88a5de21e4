package warehouse_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// TestPostgresContract holds the local warehouse to the Warehouse contract.
func TestPostgresContract(t *testing.T) {
	t.Parallel()
	warehousetest.Exercise(t, func(t *testing.T) warehousetest.Harness {
		pool := pgtest.NewPool(t)
		wh := warehouse.NewPostgres(pool)
		records, pubs, age := warehousetest.PoolReaders(pool)
		return warehousetest.Harness{
			Warehouse: wh, Records: records, Publications: pubs, AgeCommit: age,
			// The client dies just before the commit: its context ends, and
			// the transaction goes with its session.
			DyingLoad: func(t *testing.T, s warehouse.Slice, src *folder.Source, objs []folder.Object) func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				calls := 0
				_, err := wh.Load(ctx, s, src, objs, func(context.Context) error {
					if calls++; calls == 2 {
						cancel()
					}
					return nil
				})
				require.Error(t, err)
				require.Equal(t, 2, calls, "the load reached its commit")
				return func() {}
			},
			OrphanCommits: false,
			LedgerRows:    warehousetest.PoolLedger(pool),
			ErrorRows:     warehousetest.PoolErrors(pool),
			// The client is gone at the last lease check, after the records,
			// the stamp and the ledger rows were written.
			KilledLoad: func(t *testing.T, s warehouse.Slice, src *folder.Source, objs []folder.Object) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				calls := 0
				_, err := wh.Load(ctx, s, src, objs, func(context.Context) error {
					if calls++; calls == 2 {
						written, err := uncommitted(pool, s)
						require.NoError(t, err)
						require.Zero(t, written, "nothing of the load is visible before its commit")
						cancel()
					}
					return nil
				})
				require.Error(t, err)
				require.Equal(t, 2, calls, "the load reached its commit")
			},
		}
	})
}

// uncommitted counts, from another session, the ledger rows of s's batch:
// what a load in flight has written is not visible to it.
func uncommitted(pool *pgxpool.Pool, s warehouse.Slice) (int64, error) {
	var n int64
	err := pool.QueryRow(context.Background(), `
		SELECT count(*) FROM curated.fleet_load_objects WHERE tenant_id = $1 AND source_scope = $2 AND batch_id = $3`,
		s.TenantID, s.SourceScope, s.BatchID).Scan(&n)
	return n, err
}
