package jobs

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestFairnessCountUsesTheLeasedIndex: the per-tenant count of leased
// batches reads ix_ingestion_batches_tenant_leased (whose predicate it
// states, source_scope IS NOT NULL included; see migration 00070), not the
// tenant's history or backlog.
func TestFairnessCountUsesTheLeasedIndex(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ids := pgtest.LeasedWithStaleStatistics(t, pool, 3000)
	plan := pgtest.PlanIndexes(t, pool, fairnessCheckSQL, ids[0], 2, Queue, IngestArgs{}.Kind())
	require.Contains(t, plan, "ix_ingestion_batches_tenant_leased", "plan reads %v", plan)
}
