package fleet_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pipeline"
)

// TestALoadInsideTheSafetyMarginDoesNotCommit: two holders, each through a
// worker's lease renewer with a 6 min safety margin, reach the warehouse
// commit with their terms renewed by the database clock to 5 min and to
// 20 min (as terms whose renewals stopped would be, before their local
// deadlines). The one inside the margin fails the lease check the
// warehouse makes before its commit: nothing is committed and its delivery
// writes nothing more. The one with time to spare commits and succeeds.
func TestALoadInsideTheSafetyMarginDoesNotCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const margin = 6 * time.Minute
	r, err := lease.NewRenewer(e.leases, lease.RenewerConfig{
		TTL: time.Hour, Every: 50 * time.Minute, SafetyMargin: margin, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	registry := pipeline.Registry{batch.SourceTypeFleetS3: e.pipeline}
	deliver := func(b batch.Batch, left time.Duration) (pipeline.Result, *lease.Holding) {
		_, h, err := r.Acquire(ctx, b.ID, "holder-"+b.TenantID)
		require.NoError(t, err)
		require.NotNil(t, h)
		t.Cleanup(func() { h.Close() })
		_, ok, err := e.leases.Renew(ctx, h.Lease(), left)
		require.NoError(t, err)
		require.True(t, ok)
		require.True(t, time.Now().Before(h.Deadline()), "the holder's local deadline has not passed")
		res, err := pipeline.Execute(h.Context(), e.store, h.Lease(), h.Verify, registry)
		require.NoError(t, err)
		return res, h
	}

	inside := e.reserve("tenant-inside", e.folder(sampleFiles))
	res, h := deliver(inside, 5*time.Minute)
	require.Equal(t, pipeline.LeaseLost, res.Outcome, "%v", res.Err)
	require.ErrorIs(t, res.Err, batch.ErrStaleLease)
	require.ErrorIs(t, context.Cause(h.Context()), lease.ErrLost, "the holder stopped its work")
	_, found, err := e.wh.Stamp(ctx, "tenant-inside", inside.Scope())
	require.NoError(t, err)
	require.False(t, found, "nothing was committed")
	total, _, _ := e.sliceRecords("tenant-inside", inside.Scope())
	require.Zero(t, total)
	got, d := e.details(inside.ID)
	require.Equal(t, batch.StatusRunning, got.Status, "the batch stays Running for a successor")
	require.False(t, d.RedshiftCommitted)

	spare := e.reserve("tenant-spare", e.folder(sampleFiles))
	res, _ = deliver(spare, 20*time.Minute)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	st, found, err := e.wh.Stamp(ctx, "tenant-spare", spare.Scope())
	require.NoError(t, err)
	require.True(t, found, "the holder with time to spare committed")
	require.Equal(t, spare.ID, st.BatchID)
}
