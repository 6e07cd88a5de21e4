package lease_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestLeaseStatementsUseThePrimaryKey: with statistics taken before 3,000
// batches were leased (which make every partial index over leased batches
// look empty), a renewal and a lease check still find their batch by its
// primary key. Before migration 00070 both scanned the fairness index
// ix_ingestion_batches_tenant_leased, every leased batch, filtered by id:
// renewals at a fifth of a raw UPDATE in the benchmark.
func TestLeaseStatementsUseThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ids := pgtest.LeasedWithStaleStatistics(t, pool, 3000)
	id := ids[len(ids)/2]
	holder := "holder-" + strconv.FormatInt(id, 10)
	for name, plan := range map[string][]string{
		"renew": pgtest.PlanIndexes(t, pool, lease.RenewSQL, id, holder, int64(1), int64(60_000_000)),
		"check": pgtest.PlanIndexes(t, pool, lease.CheckSQL, id, holder, int64(1), int64(5_000_000)),
	} {
		require.Equal(t, []string{"ingestion_batches_pkey"}, plan, "%s reads", name)
	}
}
