package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
)

// failingPublish refuses publications while fail is set, with an error
// that is not transient: the batch ends failed_publication, resumable.
type failingPublish struct {
	*warehouse.Postgres
	fail atomic.Bool
}

func (f *failingPublish) Publish(ctx context.Context, s warehouse.Slice, window time.Duration, before func(context.Context) error) (warehouse.Stamp, error) {
	if f.fail.Load() {
		return warehouse.Stamp{}, errors.New("publication outbox refused the slice")
	}
	return f.Postgres.Publish(ctx, s, window, before)
}

// TestRetryOfAnOlderBatchRefusedWhileANewerOneIsResumable: folder F, batch
// A failed before its commit; batch B of F committed and then failed its
// publication (resumable). A retry of A must not start a batch that loads F
// again and replaces B's slice (B could never be resumed): it answers
// not_retryable, reason newer_batch_resumable, naming B. Once B is resumed
// and succeeds, a retry of A answers already_succeeded naming B, also when
// a later re-import of F failed after it. Before the rule the first retry
// was enqueued and B's resume then answered superseded.
func TestRetryOfAnOlderBatchRefusedWhileANewerOneIsResumable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	wh := &failingPublish{Postgres: warehouse.NewPostgres(pool).WithBatchFence()}
	f := newFixtureOn(t, pool, &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Logger: slog.New(slog.DiscardHandler)})
	bucket := fmt.Sprintf("jobs-test-retry-rule-%d", memSeq.Add(1))
	write := func(data string) {
		require.NoError(t, folder.MemBucket(bucket).WriteAll(ctx, "f/a.csv", []byte(data), nil))
		require.NoError(t, folder.MemBucket(bucket).WriteAll(ctx, "f/_SUCCESS", nil, nil))
	}
	imp := func(reimport bool) int64 {
		res, err := f.enqueuer.Import(ctx, ImportRequest{TenantID: "tenant-a", TenantDatabase: "db", CompanyID: "c",
			Folder: "mem://" + bucket + "/f", Reimport: reimport})
		require.NoError(t, err)
		require.Equal(t, OutcomeEnqueued, res.Outcome)
		return res.BatchID
	}
	phase := func(id int64) (batch.Status, batch.Phase) {
		b, err := batch.NewStore(pool).Get(ctx, id)
		require.NoError(t, err)
		d, err := batch.ParseDetails(b.Details)
		require.NoError(t, err)
		return b.Status, d.Phase
	}

	write("k,v\n1\n") // malformed
	a := imp(false)
	f.work(t, a)
	_, p := phase(a)
	require.Equal(t, batch.PhaseFailedPreCommit, p)

	write("k,v\n1,a\n")
	wh.fail.Store(true)
	b := imp(false)
	f.work(t, b)
	_, p = phase(b)
	require.Equal(t, batch.PhaseFailedPublication, p)

	res, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: a, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotRetryable, res.Outcome, "%+v", res)
	require.Equal(t, ReasonNewerBatchResumable, res.Reason)
	require.Equal(t, b, res.NewerBatchID)
	require.Equal(t, a, res.BatchID)

	// B is still resumable, and is resumed and published.
	wh.fail.Store(false)
	resumed, err := f.enqueuer.Resume(ctx, ResumeRequest{BatchID: b, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeResumed, resumed.Outcome, "%+v", resumed)
	require.Equal(t, 0.0, counterValue(t, f.metrics, "ingest_resumes_total", "succeeded"), "a resume request is not the resume")
	f.work(t, b)
	s, _ := phase(b)
	require.Equal(t, batch.StatusSucceeded, s)
	// The worker that published the resumed batch counts it; the failed
	// batches before it were never resumed.
	require.Equal(t, 1.0, counterValue(t, f.metrics, "ingest_resumes_total", "succeeded"))
	require.Equal(t, 0.0, counterValue(t, f.metrics, "ingest_resumes_total", "failed"))

	// A newer batch succeeded: a retry of the older failure is not a
	// re-import, even when a re-import after the success failed.
	write("k,v\n1\n")
	d := imp(true)
	f.work(t, d)
	_, p = phase(d)
	require.Equal(t, batch.PhaseFailedPreCommit, p)
	res, err = f.enqueuer.Retry(ctx, RetryRequest{BatchID: a, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeAlreadySucceeded, res.Outcome, "%+v", res)
	require.Equal(t, b, res.BatchID)
	require.Equal(t, a, res.RetryOf)
	// The newest failure itself is retried.
	write("k,v\n1,a\n")
	res, err = f.enqueuer.Retry(ctx, RetryRequest{BatchID: d, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome, "%+v", res)
}

// TestRetryGoesOnWhenTheNewerFailedPublicationIsNoLongerResumable: a newer
// failed publication committed longer ago than the publication window is
// not resumable, so it does not stand in the way of a retry of the older
// batch.
func TestRetryGoesOnWhenTheNewerFailedPublicationIsNoLongerResumable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	wh := &failingPublish{Postgres: warehouse.NewPostgres(pool).WithBatchFence()}
	f := newFixtureOn(t, pool, &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Logger: slog.New(slog.DiscardHandler)})
	f.enqueuer.PublicationWindow = time.Hour
	bucket := fmt.Sprintf("jobs-test-retry-rule-%d", memSeq.Add(1))
	write := func(data string) {
		require.NoError(t, folder.MemBucket(bucket).WriteAll(ctx, "f/a.csv", []byte(data), nil))
		require.NoError(t, folder.MemBucket(bucket).WriteAll(ctx, "f/_SUCCESS", nil, nil))
	}
	imp := func() int64 {
		res, err := f.enqueuer.Import(ctx, ImportRequest{TenantID: "tenant-a", TenantDatabase: "db", CompanyID: "c", Folder: "mem://" + bucket + "/f"})
		require.NoError(t, err)
		require.Equal(t, OutcomeEnqueued, res.Outcome)
		return res.BatchID
	}
	write("k,v\n1\n")
	a := imp()
	f.work(t, a)
	write("k,v\n1,a\n")
	wh.fail.Store(true)
	b := imp()
	f.work(t, b)
	_, err := pool.Exec(ctx, `
		UPDATE ingestion_batches SET details = jsonb_set(details, '{committedAt}', to_jsonb(now() - interval '2 hours'))
		WHERE id = $1`, b)
	require.NoError(t, err)

	res, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: a, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome, "%+v", res)
}

// TestImportOfAResumableFolderAnswersItsBatch: the rule of retry holds
// for every import. Folder F's newest batch B committed its load and
// failed its publication (resumable): an import of F — alone, in a burst
// naming it twice, beside another folder — answers resumable naming B and
// reserves nothing (before, it reserved a second load of the same data,
// whose commit would have made B unresumable). A re-import asks for a new
// load and gets one; once B's commit is older than the publication window
// it is not resumable and an import loads F again.
func TestImportOfAResumableFolderAnswersItsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	wh := &failingPublish{Postgres: warehouse.NewPostgres(pool).WithBatchFence()}
	f := newFixtureOn(t, pool, &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Logger: slog.New(slog.DiscardHandler)})
	f.enqueuer.PublicationWindow = time.Hour
	bucket := fmt.Sprintf("jobs-test-resumable-%d", memSeq.Add(1))
	require.NoError(t, folder.MemBucket(bucket).WriteAll(ctx, "f/a.csv", []byte("k,v\n1,a\n"), nil))
	require.NoError(t, folder.MemBucket(bucket).WriteAll(ctx, "f/_SUCCESS", nil, nil))
	require.NoError(t, folder.MemBucket(bucket).WriteAll(ctx, "g/a.csv", []byte("k,v\n1,a\n"), nil))
	require.NoError(t, folder.MemBucket(bucket).WriteAll(ctx, "g/_SUCCESS", nil, nil))
	req := func(dir string, reimport bool) ImportRequest {
		return ImportRequest{TenantID: "tenant-a", TenantDatabase: "db", CompanyID: "c", Folder: "mem://" + bucket + "/" + dir, Reimport: reimport}
	}
	batches := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE source_scope LIKE '%' || $1 || '/f'`, bucket).Scan(&n))
		return n
	}

	wh.fail.Store(true)
	res, err := f.enqueuer.Import(ctx, req("f", false))
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome)
	b := res.BatchID
	f.work(t, b)
	got, err := batch.NewStore(pool).Get(ctx, b)
	require.NoError(t, err)
	d, err := batch.ParseDetails(got.Details)
	require.NoError(t, err)
	require.Equal(t, batch.PhaseFailedPublication, d.Phase)
	require.True(t, d.RedshiftCommitted)

	res, err = f.enqueuer.Import(ctx, req("f", false))
	require.NoError(t, err)
	require.Equal(t, OutcomeResumable, res.Outcome, "%+v", res)
	require.Equal(t, b, res.BatchID)
	require.Equal(t, string(batch.PhaseFailedPublication), res.Phase)
	require.Zero(t, res.JobID)

	results, err := f.enqueuer.ImportMany(ctx, []ImportRequest{req("f", false), req("g", false), req("f/", false)})
	require.NoError(t, err)
	require.Equal(t, OutcomeResumable, results[0].Outcome, "%+v", results[0])
	require.Equal(t, b, results[0].BatchID)
	require.Equal(t, OutcomeEnqueued, results[1].Outcome, "another folder of the burst is imported")
	require.Equal(t, OutcomeResumable, results[2].Outcome, "%+v", results[2])
	require.Equal(t, b, results[2].BatchID)
	require.Equal(t, 1, batches(), "nothing new was reserved for the resumable folder")
	require.Equal(t, 3.0, testutil.ToFloat64(f.metrics.Reservations.WithLabelValues(string(batch.SourceTypeFleetS3), "resumable")),
		"one counted per request answered resumable")

	// The resumed batch is the folder's load: it publishes.
	wh.fail.Store(false)
	resumed, err := f.enqueuer.Resume(ctx, ResumeRequest{BatchID: b, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeResumed, resumed.Outcome, "%+v", resumed)
	f.work(t, b)
	got, err = batch.NewStore(pool).Get(ctx, b)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, got.Status)

	// A failed publication older than the window is not resumable: an
	// import loads the folder again; a re-import always does.
	wh.fail.Store(true)
	res, err = f.enqueuer.Import(ctx, req("f", true))
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome)
	c := res.BatchID
	f.work(t, c)
	res, err = f.enqueuer.Import(ctx, req("f", false))
	require.NoError(t, err)
	require.Equal(t, OutcomeResumable, res.Outcome, "%+v", res)
	require.Equal(t, c, res.BatchID)
	res, err = f.enqueuer.Import(ctx, req("f", true))
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome, "a re-import asks for a new load")
	f.work(t, res.BatchID)
	_, err = pool.Exec(ctx, `
		UPDATE ingestion_batches SET details = jsonb_set(details, '{committedAt}', to_jsonb(now() - interval '2 hours'))
		WHERE id = $1`, res.BatchID)
	require.NoError(t, err)
	res, err = f.enqueuer.Import(ctx, req("f", false))
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome, "%+v", res)
}
