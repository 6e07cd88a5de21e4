package jobs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/lease"
)

func badFolder(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("jobs-test-bad-%d", memSeq.Add(1))
	require.NoError(t, folder.MemBucket(name).WriteAll(context.Background(), "f/a.csv", []byte("k,v\n1\n"), nil))
	require.NoError(t, folder.MemBucket(name).WriteAll(context.Background(), "f/_SUCCESS", nil, nil))
	return "mem://" + name + "/f"
}

func TestCancelCancelsTheBatchAndItsJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	url := memFolder(t)
	res, err := f.enqueuer.Import(ctx, ImportRequest{TenantID: "tenant-a", TenantDatabase: "db", CompanyID: "c", Folder: url})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome)

	out, err := f.enqueuer.Cancel(ctx, CancelRequest{BatchID: res.BatchID, TenantID: "tenant-b", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotFound, out.Outcome, "another tenant's batch is not found")

	out, err = f.enqueuer.Cancel(ctx, CancelRequest{BatchID: res.BatchID, TenantID: "tenant-a", By: "ops", Reason: "wrong folder"})
	require.NoError(t, err)
	require.Equal(t, OutcomeCancelled, out.Outcome)
	require.Equal(t, []int64{res.JobID}, out.CancelledJobs)
	var state string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, res.JobID).Scan(&state))
	require.Equal(t, "cancelled", state, "the queued job will never run")

	// The scope is free at once.
	again, err := f.enqueuer.Import(ctx, ImportRequest{TenantID: "tenant-a", TenantDatabase: "db", CompanyID: "c", Folder: url})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, again.Outcome)

	out, err = f.enqueuer.Cancel(ctx, CancelRequest{BatchID: res.BatchID, TenantID: "tenant-a", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotCancellable, out.Outcome)
	require.Equal(t, "Failed", out.Status)
	require.Equal(t, "cancelled", out.Phase)

	// An empty By is the actor's (Actor.By()); a By that cannot be
	// recorded is refused.
	_, err = f.enqueuer.Cancel(ctx, CancelRequest{BatchID: res.BatchID, TenantID: "tenant-a", By: "two\nlines"})
	var in *InputError
	require.ErrorAs(t, err, &in)
	require.Equal(t, "by", in.Field)
}

func TestRetryStartsANewBatchForTheFolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	url := badFolder(t)
	imp, err := f.enqueuer.Import(ctx, ImportRequest{TenantID: "tenant-a", TenantDatabase: "tenant_db", CompanyID: "company-9", Folder: url})
	require.NoError(t, err)
	require.Equal(t, river.EventKindJobCompleted, f.work(t, imp.BatchID).EventKind)
	failed, err := batch.NewStore(f.pool).Get(ctx, imp.BatchID)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, failed.Status)

	res, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: imp.BatchID, TenantID: "tenant-b"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotFound, res.Outcome)

	res, err = f.enqueuer.Retry(ctx, RetryRequest{BatchID: imp.BatchID, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome)
	require.Equal(t, imp.BatchID, res.RetryOf)
	require.Equal(t, imp.SourceScope, res.SourceScope)
	require.NotZero(t, res.JobID)
	retried, err := batch.NewStore(f.pool).Get(ctx, res.BatchID)
	require.NoError(t, err)
	require.Equal(t, "tenant_db", retried.TenantDatabase)
	require.Equal(t, "company-9", retried.CompanyID)
	d, err := batch.ParseDetails(retried.Details)
	require.NoError(t, err)
	require.Equal(t, imp.BatchID, d.RetryOf)

	// The same outcomes as import: a second retry conflicts with the first.
	second, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: imp.BatchID, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeConflict, second.Outcome)
	require.Equal(t, res.BatchID, second.RunningBatchID)

	// A Running batch is not retried; a cancelled one is.
	running, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: res.BatchID, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotRetryable, running.Outcome)
	require.Equal(t, batch.ReasonRunning, running.Reason)
	c, err := f.enqueuer.Cancel(ctx, CancelRequest{BatchID: res.BatchID, TenantID: "tenant-a", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, OutcomeCancelled, c.Outcome)
	third, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: res.BatchID, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, third.Outcome)

	// A succeeded batch is not retried.
	ok := f.importBatch(t, "tenant-c")
	require.Equal(t, river.EventKindJobCompleted, f.work(t, ok).EventKind)
	done, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: ok, TenantID: "tenant-c"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotRetryable, done.Outcome)
	require.Equal(t, batch.ReasonSucceeded, done.Reason)

	_, err = f.enqueuer.Retry(ctx, RetryRequest{BatchID: 0, TenantID: "tenant-a"})
	var in *InputError
	require.ErrorAs(t, err, &in)
}

func TestResumeTakesTheFolderFromTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	url := badFolder(t)
	imp, err := f.enqueuer.Import(ctx, ImportRequest{TenantID: "tenant-a", TenantDatabase: "db", CompanyID: "c", Folder: url})
	require.NoError(t, err)
	f.work(t, imp.BatchID) // failed_pre_commit

	// Without --folder the batch's own folder is used: the resume rules
	// run (and refuse: nothing was committed).
	res, err := f.enqueuer.Resume(ctx, ResumeRequest{BatchID: imp.BatchID, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotResumable, res.Outcome)
	require.Equal(t, batch.ReasonNotCommitted, res.Reason)
	require.Equal(t, imp.SourceScope, res.SourceScope)
	// A folder that is not the batch's is a mismatch; the same folder
	// spelled differently is not.
	res, err = f.enqueuer.Resume(ctx, ResumeRequest{BatchID: imp.BatchID, TenantID: "tenant-a", Folder: "s3://elsewhere/x"})
	require.NoError(t, err)
	require.Equal(t, batch.ReasonScopeMismatch, res.Reason)
	res, err = f.enqueuer.Resume(ctx, ResumeRequest{BatchID: imp.BatchID, TenantID: "tenant-a", Folder: url + "/"})
	require.NoError(t, err)
	require.Equal(t, batch.ReasonNotCommitted, res.Reason)
	res, err = f.enqueuer.Resume(ctx, ResumeRequest{BatchID: imp.BatchID, TenantID: "tenant-b"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotFound, res.Outcome)
}

// TestRetryReloadsAPublicationThatExpired: a batch committed too long ago
// to be published (publication_expired) cannot be resumed; retry loads its
// folder again as a new batch, as the runbook says.
func TestRetryReloadsAPublicationThatExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	id := f.importBatch(t, "tenant-a")
	store := batch.NewStore(f.pool)
	a, err := lease.NewStore(f.pool).Acquire(ctx, id, "delivery", time.Minute)
	require.NoError(t, err)
	b, err := store.Get(ctx, id)
	require.NoError(t, err)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	committed := time.Now().Add(-48 * time.Hour).UTC()
	d.Phase, d.RedshiftCommitted, d.CommittedAt = batch.PhasePublishing, true, &committed
	_, err = store.MarkFailed(ctx, a.Lease.Fence(), d, batch.PhasePublicationExpired, "publication window has passed")
	require.NoError(t, err)

	res, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: id, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome)
	require.Equal(t, id, res.RetryOf)
}
