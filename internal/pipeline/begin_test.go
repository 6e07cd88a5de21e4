package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pgtest"
	"github.com/fleet/ingest/internal/pipeline"
)

// starter is a Pipeline whose Start records the loading phase.
type starter struct{}

func (starter) Execute(context.Context, *pipeline.Run) error { return nil }

func (starter) Start(_ batch.Batch, d batch.Details) (batch.Details, bool) {
	d.Phase = batch.PhaseLoading
	return d, true
}

// TestBeginWritesFromTheAcquisitionsRow: Begin works on the row the
// acquisition's UPDATE returned (no read of its own) and writes the
// Starter's checkpoint fenced on the term, in the acquisition's
// transaction; given a row that is not the one the term acquired, it
// refuses and writes nothing.
func TestBeginWritesFromTheAcquisitionsRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := batch.NewStore(pool)
	registry := pipeline.Registry{batch.SourceTypeFleetS3: starter{}}
	reserve := func(folder string) batch.Batch {
		res, err := store.Reserve(ctx, batch.Reservation{
			CompanyID: "company-1", TenantID: "tenant-a", TenantDatabase: "tenant_db",
			SourceType: batch.SourceTypeFleetS3, IngestionMode: batch.IngestionModeFileUpload,
			PipelineStage: batch.PipelineStageFleet, SourceScope: "fleet_s3:" + folder,
			Details: batch.NewDetails(folder),
		})
		require.NoError(t, err)
		require.Equal(t, batch.Reserved, res.Outcome)
		return res.Batch
	}
	phase := func(id int64) batch.Phase {
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		d, err := batch.ParseDetails(got.Details)
		require.NoError(t, err)
		return d.Phase
	}

	t.Run("starts from the acquisition's row", func(t *testing.T) {
		b := reserve("s3://bucket/begin-ok")
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		a, err := lease.NewStore(tx).Acquire(ctx, b.ID, "delivery-1", time.Minute)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		started, ok, err := pipeline.Begin(ctx, tx, store, a.Lease, a.Batch, registry)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, batch.PhaseLoading, phase(b.ID))
		got, err := store.Get(ctx, b.ID)
		require.NoError(t, err)
		require.Equal(t, got, started, "the batch Begin returns is the committed row")
	})

	t.Run("refuses a row the term did not acquire", func(t *testing.T) {
		b := reserve("s3://bucket/begin-mismatch")
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		a, err := lease.NewStore(tx).Acquire(ctx, b.ID, "delivery-1", time.Minute)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		_, ok, err := pipeline.Begin(ctx, tx, store, a.Lease, b, registry) // b: the row before the acquisition
		require.Error(t, err)
		require.False(t, ok)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, batch.PhaseReserved, phase(b.ID), "nothing written")
	})
}
