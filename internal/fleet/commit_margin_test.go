package fleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/warehouse"
)

// TestTheCommitsOwnWriteChecksTheSafetyMargin: with the local warehouse's
// batch fence and the worker's commit check (pipeline.ExecuteChecked, as
// jobs.Worker runs it), the lease check before a warehouse commit is the
// fenced write inside that transaction, not a statement of its own. The
// term is cut to 5 min left (under a 6 min margin) by the database inside
// the transaction, after the load's first lease check and just before its
// last statement: at the load, nothing commits; at the publication, the
// load's commit stands and nothing of the publication does, so the batch
// is left Running, resumable. With 20 min left both commit and the batch
// succeeds. Without the margin in the write, the 5 min terms committed.
func TestTheCommitsOwnWriteChecksTheSafetyMargin(t *testing.T) {
	t.Parallel()
	const margin = 6 * time.Minute
	for _, tc := range []struct {
		name, table string // the table whose insert cuts the term
		left        time.Duration
	}{
		{"load inside the margin", "fleet_slices", 5 * time.Minute},
		{"publication inside the margin", "fleet_publications", 5 * time.Minute},
		{"load with time to spare", "fleet_slices", 20 * time.Minute},
		{"publication with time to spare", "fleet_publications", 20 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			wh := warehouse.NewPostgres(e.pool).WithBatchFence()
			registry := pipeline.Registry{batch.SourceTypeFleetS3: &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh}}
			_, err := e.pool.Exec(ctx, fmt.Sprintf(`
				CREATE FUNCTION curated.cut_term() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					UPDATE public.ingestion_batches SET execution_lease_expires_at = now() + interval '%d seconds'
					WHERE id = NEW.batch_id;
					RETURN NEW;
				END $$;
				CREATE TRIGGER cut_term BEFORE INSERT ON curated.%s
				FOR EACH ROW EXECUTE FUNCTION curated.cut_term();`, int(tc.left.Seconds()), tc.table))
			require.NoError(t, err)

			r, err := lease.NewRenewer(e.leases, lease.RenewerConfig{
				TTL: time.Hour, Every: 50 * time.Minute, SafetyMargin: margin, Logger: slog.New(slog.DiscardHandler),
			})
			require.NoError(t, err)
			b := e.reserve("tenant-margin", e.folder(sampleFiles))
			_, h, err := r.Acquire(ctx, b.ID, "holder")
			require.NoError(t, err)
			require.NotNil(t, h)
			t.Cleanup(func() { h.Close() })
			res, err := pipeline.ExecuteChecked(h.Context(), e.store, h.Lease(), h.Verify, h, registry, nil)
			require.NoError(t, err)

			st, found, err := wh.Stamp(ctx, "tenant-margin", b.Scope())
			require.NoError(t, err)
			got, d := e.details(b.ID)
			pubs, _ := e.publications(b.Scope())
			switch {
			case tc.left > margin:
				require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
				require.True(t, found)
				require.Equal(t, b.ID, st.BatchID)
				require.NotNil(t, st.PublishedAt)
				require.Equal(t, 1, pubs)
				require.Equal(t, batch.StatusSucceeded, got.Status)
			case tc.table == "fleet_slices":
				require.Equal(t, pipeline.LeaseLost, res.Outcome, "%v", res.Err)
				require.ErrorIs(t, res.Err, batch.ErrStaleLease)
				require.False(t, found, "the load committed nothing")
				total, _, _ := e.sliceRecords("tenant-margin", b.Scope())
				require.Zero(t, total)
				require.Equal(t, batch.StatusRunning, got.Status, "the batch stays Running for a successor")
				require.False(t, d.RedshiftCommitted)
			default:
				require.Equal(t, pipeline.LeaseLost, res.Outcome, "%v", res.Err)
				require.ErrorIs(t, res.Err, batch.ErrStaleLease)
				require.True(t, found, "the load's commit stands")
				require.Equal(t, b.ID, st.BatchID)
				require.Nil(t, st.PublishedAt, "the publication committed nothing")
				require.Zero(t, pubs)
				require.Equal(t, batch.StatusRunning, got.Status, "the batch stays Running, resumable")
				require.True(t, d.RedshiftCommitted)
				require.False(t, d.Publication.Completed)
			}
		})
	}
}
