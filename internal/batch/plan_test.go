package batch_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestFencedWriteUsesThePrimaryKey: with statistics taken before 3,000
// batches were leased, a fenced write still finds its batch by its primary
// key (with a safety margin too), not by scanning the fairness index over
// every leased batch (see migration 00070 and
// lease.TestLeaseStatementsUseThePrimaryKey).
func TestFencedWriteUsesThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ids := pgtest.LeasedWithStaleStatistics(t, pool, 3000)
	id := ids[len(ids)/2]
	plan := pgtest.PlanIndexes(t, pool, batch.FencedUpdate, id, "holder-"+strconv.FormatInt(id, 10), int64(1), "Running", `{"version": 1, "phase": "loading"}`, int64(60_000_000))
	require.Equal(t, []string{"ingestion_batches_pkey"}, plan)
}
