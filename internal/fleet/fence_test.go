package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
)

// verifier is what the worker's heartbeat gives a pipeline as its lease
// check: renew the exact term now, or report it lost.
func (e *env) verifier(l lease.Lease, after func(calls int)) func(context.Context) error {
	calls := 0
	return func(ctx context.Context) error {
		_, ok, err := e.leases.Renew(ctx, l, time.Minute)
		if err != nil {
			return err
		}
		if !ok {
			return batch.ErrStaleLease
		}
		calls++
		if after != nil {
			after(calls)
		}
		return nil
	}
}

// TestCancelDuringLoadAbortsBeforeCommit: an operator cancels a batch while
// its load runs (here: right after the load's first lease check). The load's
// lease check just before the warehouse commit fails, so nothing commits,
// and the delivery writes nothing more.
func TestCancelDuringLoadAbortsBeforeCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	b := e.reserve("tenant-a", e.folder(sampleFiles))
	a, err := e.leases.Acquire(ctx, b.ID, "holder", time.Minute)
	require.NoError(t, err)
	verify := e.verifier(a.Lease, func(calls int) {
		if calls == 1 {
			res, err := e.store.Cancel(ctx, batch.CancelRequest{BatchID: b.ID, TenantID: "tenant-a", By: "ops"})
			require.NoError(t, err)
			require.Equal(t, batch.Cancelled, res.Outcome)
		}
	})
	res, err := pipeline.Execute(ctx, e.store, a.Lease, verify, pipeline.Registry{batch.SourceTypeFleetS3: e.pipeline})
	require.NoError(t, err)
	require.Equal(t, pipeline.LeaseLost, res.Outcome, "%v", res.Err)

	_, found, err := e.wh.Stamp(ctx, "tenant-a", b.Scope())
	require.NoError(t, err)
	require.False(t, found, "the load never committed")
	total, _, _ := e.sliceRecords("tenant-a", b.Scope())
	require.Zero(t, total)
	got, d := e.details(b.ID)
	require.Equal(t, batch.StatusFailed, got.Status)
	require.Equal(t, batch.PhaseCancelled, d.Phase)
}

// gatedPublish holds Publish until released, then publishes for real with
// the caller's lease check.
type gatedPublish struct {
	*warehouse.Postgres
	entered, release chan struct{}
}

func (g *gatedPublish) Publish(ctx context.Context, s warehouse.Slice, window time.Duration, before func(context.Context) error) (warehouse.Stamp, error) {
	close(g.entered)
	<-g.release
	return g.Postgres.Publish(ctx, s, window, before)
}

// TestStaleHolderCannotPublishAfterItsSuccessorFailed reproduces the hole
// reported against the unfenced Publish: a holder paused on its way into the
// publication outlives its lease; its successor fails the publication and
// records failed_publication; the paused holder wakes and publishes. The
// publication's lease check just before its commit refuses it now.
func TestStaleHolderCannotPublishAfterItsSuccessorFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	b := e.reserve("tenant-a", e.folder(sampleFiles))

	a, err := e.leases.Acquire(ctx, b.ID, "paused-holder", time.Minute)
	require.NoError(t, err)
	gate := &gatedPublish{Postgres: e.wh, entered: make(chan struct{}), release: make(chan struct{})}
	stale := make(chan pipeline.Result, 1)
	go func() {
		res, err := pipeline.Execute(ctx, e.store, a.Lease, e.verifier(a.Lease, nil),
			pipeline.Registry{batch.SourceTypeFleetS3: &fleet.Pipeline{AllowLocalFolders: true, Warehouse: gate}})
		require.NoError(t, err)
		stale <- res
	}()
	testproc.Await(t, gate.entered, "the stale holder's publication") // committed, recorded publishing, now "paused"

	// Its term runs out while it is paused.
	short, ok, err := e.leases.Renew(ctx, a.Lease, time.Microsecond)
	require.NoError(t, err)
	require.True(t, ok)
	e.waitExpired(short)

	// The successor takes over and its publication fails.
	e.failPublications(true)
	res := e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Failed, res.Outcome)
	require.Equal(t, batch.PhaseFailedPublication, res.Phase)
	e.failPublications(false)

	close(gate.release) // the paused holder wakes and publishes
	got := testproc.Await(t, stale, "the stale holder's delivery to end")
	require.Equal(t, pipeline.LeaseLost, got.Outcome, "%v", got.Err)
	n, _ := e.publications(b.Scope())
	require.Zero(t, n, "the stale holder published nothing")
	st, found, err := e.wh.Stamp(ctx, "tenant-a", b.Scope())
	require.NoError(t, err)
	require.True(t, found)
	require.Nil(t, st.PublishedAt)
	after, d := e.details(b.ID)
	require.Equal(t, batch.StatusFailed, after.Status)
	require.Equal(t, batch.PhaseFailedPublication, d.Phase, "the successor's record stands")

	// It stays resumable: the slice is still this batch's and unpublished.
	rr, err := e.store.Resume(ctx, batch.ResumeRequest{BatchID: b.ID, TenantID: "tenant-a", SourceType: batch.SourceTypeFleetS3, SourceScope: b.Scope()}, warehouse.Verifier(e.wh))
	require.NoError(t, err)
	require.Equal(t, batch.Resumed, rr.Outcome, rr.Reason)
}

// TestFencedLoadReadsTheStampInItsTransaction: a warehouse whose loads
// commit with their record (the local one with its fence, as the worker
// runs it: warehouse.CommitRecorder) is not read back before a load; the
// load reads the stamp in its own transaction instead, under the slice's
// lock. A slice an earlier delivery of the batch stamped without recording
// it (a build before the record) is replaced, one copy of each record,
// under the new term; a slice a newer batch stamped is never overwritten,
// and the batch is superseded.
func TestFencedLoadReadsTheStampInItsTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	fenced := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: warehouse.NewPostgres(e.pool).WithBatchFence()}
	load := func(tenant string, b batch.Batch, url string, batchID, generation int64, uid ...string) {
		t.Helper()
		f, _ := folder.Canonicalize(url)
		src, err := folder.Opener{}.Open(ctx, f)
		require.NoError(t, err)
		objs, err := src.Objects(ctx)
		require.NoError(t, err)
		s := warehouse.Slice{TenantID: tenant, SourceScope: b.Scope(), BatchID: batchID, Generation: generation}
		if len(uid) > 0 {
			s.BatchUID = uid[0]
		}
		_, err = e.wh.Load(ctx, s, src, objs, nil)
		require.NoError(t, err)
	}

	t.Run("stamped by an earlier delivery of the batch", func(t *testing.T) {
		url := e.folder(sampleFiles)
		b := e.reserve("tenant-a", url)
		crashed := e.diedInLoading(b.ID, "crashed")
		load("tenant-a", b, url, b.ID, crashed.Generation)
		e.write(url, "late.csv", "vehicle,km\nV9,90\n")
		e.waitExpired(crashed)

		res := e.deliver(b.ID, fenced)
		require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
		_, d := e.details(b.ID)
		require.Equal(t, int64(6), d.RecordCount, "loaded again, with the object written since")
		total, distinct, batches := e.sliceRecords("tenant-a", b.Scope())
		require.Equal(t, 6, total)
		require.Equal(t, 6, distinct, "one copy of each record")
		require.Equal(t, []int64{b.ID}, batches)
		st, found, err := e.wh.Stamp(ctx, "tenant-a", b.Scope())
		require.NoError(t, err)
		require.True(t, found)
		require.Greater(t, st.Generation, crashed.Generation, "stamped under the new term")
		n, _ := e.publications(b.Scope())
		require.Equal(t, 1, n)
	})

	t.Run("stamped by a newer batch", func(t *testing.T) {
		url := e.folder(sampleFiles)
		b := e.reserve("tenant-b", url)
		newer := e.newerBatch(b)
		load("tenant-b", b, url, newer.ID, 1, newer.UID)

		res := e.deliver(b.ID, fenced)
		require.Equal(t, pipeline.Failed, res.Outcome, "%v", res.Err)
		require.Equal(t, batch.PhaseSuperseded, res.Phase)
		_, _, batches := e.sliceRecords("tenant-b", b.Scope())
		require.Equal(t, []int64{newer.ID}, batches, "the newer batch's slice is untouched")
		n, _ := e.publications(b.Scope())
		require.Zero(t, n)
	})

	// A stamp of a higher id that names no batch the operational database
	// knows (a restore or a failover forgot it): taken over, not a reason
	// to refuse the folder.
	t.Run("stamped by a batch the database forgot", func(t *testing.T) {
		url := e.folder(sampleFiles)
		b := e.reserve("tenant-c", url)
		const forgottenUID = "9d7e2c1a-0000-4000-8000-000000000001"
		load("tenant-c", b, url, b.ID+1000, 3, forgottenUID)

		res := e.deliver(b.ID, fenced)
		require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
		_, d := e.details(b.ID)
		require.NotNil(t, d.TookOver, "the takeover is recorded with the commit")
		require.Equal(t, batch.TakenOver{BatchID: b.ID + 1000, BatchUID: forgottenUID, Generation: 3, At: d.TookOver.At}, *d.TookOver)
		st, found, err := e.wh.Stamp(ctx, "tenant-c", b.Scope())
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, b.Ref(), st.Ref(), "stamped with the new batch, id and uid")
		n, ids := e.publications(b.Scope())
		require.Equal(t, 1, n)
		require.Equal(t, []int64{b.ID}, ids)
		var last int64
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT pg_sequence_last_value(pg_get_serial_sequence('ingestion_batches', 'id')::regclass)`).Scan(&last))
		require.GreaterOrEqual(t, last, b.ID+1000, "the id sequence moved past the forgotten batch's id")
		next := e.reserve("tenant-c", e.folder(sampleFiles))
		require.Greater(t, next.ID, b.ID+1000, "no new batch is handed the forgotten id")
	})
}
