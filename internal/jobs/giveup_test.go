package jobs

import (
	"context"
	"log/slog"
	"testing"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
)

// commitThenLose commits every load and then reports a transient error, as
// a warehouse statement that committed after its client stopped waiting.
type commitThenLose struct{ warehouse.Warehouse }

func (c commitThenLose) Load(ctx context.Context, s warehouse.Slice, src *folder.Source, objs []folder.Object, before func(context.Context) error) (warehouse.Stamp, error) {
	if _, err := c.Warehouse.Load(ctx, s, src, objs, before); err != nil {
		return warehouse.Stamp{}, err
	}
	return warehouse.Stamp{}, context.DeadlineExceeded
}

// TestGivingUpReadsTheCommitBack: when the last attempt's load committed
// but the delivery never learned it, the batch that exhausted its retries
// is recorded failed_publication with the commit (resumable), not
// failed_pre_commit: the stamp is read back, never assumed.
func TestGivingUpReadsTheCommitBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: commitThenLose{warehouse.NewPostgres(pool)}, Logger: slog.New(slog.DiscardHandler)}
	f := newFixtureOn(t, pool, p)
	id := f.importBatch(t, "tenant-a")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	res, err := f.tw.Work(ctx, t, tx, IngestArgs{BatchID: id}, &river.InsertOpts{MaxAttempts: 1})
	require.NoError(t, err)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind, "the batch is recorded failed; the job is done")

	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	require.Equal(t, batch.PhaseFailedPublication, d.Phase, "the slice is stamped with the batch: it committed")
	require.True(t, d.RedshiftCommitted)
	require.NotNil(t, d.CommittedAt)
	require.Positive(t, d.RecordCount)
}
