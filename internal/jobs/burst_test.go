package jobs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
)

func importReq(folder string) ImportRequest {
	return ImportRequest{TenantID: "tenant-a", TenantDatabase: "db", CompanyID: "c", Folder: folder}
}

// TestImportManyOneTransactionEachFolderItsOutcome imports a burst mixing
// new folders, a folder held by a running batch, one whose batch succeeded,
// an invalid one, a duplicate and a re-import: each keeps its own outcome,
// and every batch it reserved was committed with its job in one transaction.
func TestImportManyOneTransactionEachFolderItsOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)

	running, err := f.enqueuer.Import(ctx, importReq("s3://bucket/running"))
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, running.Outcome)
	done, err := f.enqueuer.Import(ctx, importReq("s3://bucket/done"))
	require.NoError(t, err)
	a, err := lease.NewStore(f.pool).Acquire(ctx, done.BatchID, "finisher", time.Minute)
	require.NoError(t, err)
	_, err = batch.NewStore(f.pool).MarkSucceeded(ctx, a.Lease.Fence(), batch.NewDetails("s3://bucket/done"))
	require.NoError(t, err)

	reimport := importReq("s3://bucket/done")
	reimport.Reimport = true
	reqs := []ImportRequest{
		importReq("s3://bucket/new-1"),
		importReq("s3://bucket/running"),
		importReq("s3://bucket/done"),
		importReq("s3://bucket/../escape"),
		importReq("s3://bucket/new-2/"),
		importReq("s3://Bucket//new-1"), // the same folder as the first, canonicalised
		reimport,
	}
	res, err := f.enqueuer.ImportMany(ctx, reqs)
	require.NoError(t, err)
	require.Len(t, res, len(reqs))

	require.Equal(t, OutcomeEnqueued, res[0].Outcome)
	require.Equal(t, OutcomeConflict, res[1].Outcome)
	require.Equal(t, running.BatchID, res[1].RunningBatchID)
	require.Equal(t, OutcomeAlreadySucceeded, res[2].Outcome)
	require.Equal(t, done.BatchID, res[2].BatchID)
	require.Equal(t, OutcomeInvalidInput, res[3].Outcome)
	require.Equal(t, "folder", res[3].Field)
	require.NotEmpty(t, res[3].Error)
	require.Equal(t, OutcomeEnqueued, res[4].Outcome)
	require.Equal(t, OutcomeConflict, res[5].Outcome, "a folder named twice is reserved once")
	require.Equal(t, res[0].BatchID, res[5].RunningBatchID)
	require.Equal(t, OutcomeEnqueued, res[6].Outcome)
	require.NotEqual(t, done.BatchID, res[6].BatchID)

	var reserved []int64
	for _, r := range []Result{res[0], res[4], res[6]} {
		require.Positive(t, r.JobID)
		reserved = append(reserved, r.BatchID)
		var jobBatch int64
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT (args->>'batch_id')::bigint FROM river_job WHERE id = $1`, r.JobID).Scan(&jobBatch))
		require.Equal(t, r.BatchID, jobBatch, "each job names its own batch")
	}
	// One transaction wrote every reserved batch and every job.
	var xids int
	require.NoError(t, f.pool.QueryRow(ctx, `
		SELECT count(DISTINCT x) FROM (
			SELECT xmin::text AS x FROM ingestion_batches WHERE id = ANY($1)
			UNION ALL
			SELECT xmin::text FROM river_job WHERE (args->>'batch_id')::bigint = ANY($1)) t`, reserved).Scan(&xids))
	require.Equal(t, 1, xids)
	var batches int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&batches))
	require.Equal(t, 2+3, batches, "nothing written for the conflict, the succeeded folder, the invalid one or the duplicate")
}

// TestImportManyFailedJobInsertRecordsEveryReservedBatchFailed makes the job
// insert fail inside the database: every batch the burst reserved is
// recorded Failed with failed_enqueue and its scope is free again; the
// conflict keeps its own answer.
func TestImportManyFailedJobInsertRecordsEveryReservedBatchFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	held, err := f.enqueuer.Import(ctx, importReq("s3://bucket/held"))
	require.NoError(t, err)

	f.beforeInsert(t, "river_job", "refuse_jobs", `RAISE EXCEPTION 'job queue refuses inserts (injected)';`)
	reqs := []ImportRequest{importReq("s3://bucket/f-1"), importReq("s3://bucket/held"), importReq("s3://bucket/f-2"), importReq("s3://bucket/f-3")}
	res, err := f.enqueuer.ImportMany(ctx, reqs)
	require.NoError(t, err)
	require.Equal(t, OutcomeConflict, res[1].Outcome)
	require.Equal(t, held.BatchID, res[1].RunningBatchID)
	seen := map[int64]bool{}
	for _, i := range []int{0, 2, 3} {
		require.Equal(t, OutcomeEnqueueFailed, res[i].Outcome)
		require.Contains(t, res[i].Error, "injected")
		require.False(t, seen[res[i].BatchID])
		seen[res[i].BatchID] = true
		b, err := batch.NewStore(f.pool).Get(ctx, res[i].BatchID)
		require.NoError(t, err)
		require.Equal(t, batch.StatusFailed, b.Status)
		require.Equal(t, res[i].SourceScope, b.Scope())
		d, err := batch.ParseDetails(b.Details)
		require.NoError(t, err)
		require.Equal(t, batch.PhaseFailedEnqueue, d.Phase)
		require.Contains(t, d.LastError.Message, "injected")
	}

	_, err = f.pool.Exec(ctx, `DROP TRIGGER refuse_jobs ON river_job`)
	require.NoError(t, err)
	again, err := f.enqueuer.ImportMany(ctx, []ImportRequest{reqs[0], reqs[2], reqs[3]})
	require.NoError(t, err)
	for _, r := range again {
		require.Equal(t, OutcomeEnqueued, r.Outcome, "the scopes were free")
	}
}

// TestConcurrentBurstsReserveEachFolderOnce runs eight bursts of the same
// two hundred folders at once, half of them in reverse order: no deadlock,
// no error, and each folder is reserved exactly once.
func TestConcurrentBurstsReserveEachFolderOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	const folders, bursts = 200, 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results [][]Result
		errs    []error
		start   = make(chan struct{})
	)
	for b := range bursts {
		reqs := make([]ImportRequest, folders)
		for i := range reqs {
			j := i
			if b%2 == 1 {
				j = folders - 1 - i
			}
			reqs[i] = importReq(fmt.Sprintf("s3://bucket/shared-%03d", j))
		}
		wg.Go(func() {
			<-start
			res, err := f.enqueuer.ImportMany(ctx, reqs)
			mu.Lock()
			defer mu.Unlock()
			results, errs = append(results, res), append(errs, err)
		})
	}
	close(start)
	wg.Wait()
	enqueued := 0
	for i := range results {
		require.NoError(t, errs[i])
		for _, r := range results[i] {
			switch r.Outcome {
			case OutcomeEnqueued:
				enqueued++
			case OutcomeConflict:
				require.Positive(t, r.RunningBatchID)
			default:
				t.Fatalf("unexpected outcome %+v", r)
			}
		}
	}
	require.Equal(t, folders, enqueued)
	var batches, jobs int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT source_scope) FROM ingestion_batches`).Scan(&batches, &jobs))
	require.Equal(t, folders, batches)
	require.Equal(t, folders, jobs)
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM river_job`).Scan(&jobs))
	require.Equal(t, folders, jobs)
}

// TestImportManyReturnsTheCommittedBurstsOfAFailedImport: a list longer
// than one burst whose second burst fails on an infrastructure error
// returns the error and the outcomes of the first burst, which was
// committed; nothing of the failed burst remains.
func TestImportManyReturnsTheCommittedBurstsOfAFailedImport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	f.beforeInsert(t, "ingestion_batches", "refuse_tenant", `IF NEW.tenant_id = 'tenant-boom' THEN RAISE EXCEPTION 'storage refuses (injected)'; END IF; RETURN NEW;`)
	reqs := make([]ImportRequest, 0, MaxBurst+2)
	for i := range MaxBurst + 1 {
		reqs = append(reqs, importReq(fmt.Sprintf("s3://bucket/long/%d", i)))
	}
	boom := importReq("s3://bucket/long/boom")
	boom.TenantID = "tenant-boom"
	reqs = append(reqs, boom)

	res, err := f.enqueuer.ImportMany(ctx, reqs)
	require.ErrorContains(t, err, "injected")
	require.ErrorContains(t, err, fmt.Sprintf("importing folders %d to %d of %d", MaxBurst+1, MaxBurst+2, MaxBurst+2))
	require.Len(t, res, MaxBurst, "the first burst's outcomes")
	for _, r := range res {
		require.Equal(t, OutcomeEnqueued, r.Outcome)
	}
	var n int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	require.Equal(t, MaxBurst, n, "nothing of the failed burst remains")
}

// TestATransientInsertFailureReservesNothingAndIsAnError: a job insert that
// fails because the database is unavailable (here: SQLSTATE 57P03, as a
// restarting server answers) rolls the reservations back with it; the burst
// returns the error for the caller to retry, and records no Failed batch.
// An insert the database refuses is enqueue_failed (TestBurstEnqueueFailure…).
func TestATransientInsertFailureReservesNothingAndIsAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	f.beforeInsert(t, "river_job", "unavailable_jobs", `RAISE EXCEPTION 'the database system is starting up (injected)' USING ERRCODE = '57P03';`)
	_, err := f.enqueuer.ImportMany(ctx, []ImportRequest{importReq("s3://bucket/t-1"), importReq("s3://bucket/t-2")})
	require.Error(t, err)
	require.Contains(t, err.Error(), "nothing was reserved")
	var n int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	require.Zero(t, n, "no batch reserved and none recorded Failed")

	_, err = f.pool.Exec(ctx, `DROP TRIGGER unavailable_jobs ON river_job`)
	require.NoError(t, err)
	res, err := f.enqueuer.ImportMany(ctx, []ImportRequest{importReq("s3://bucket/t-1"), importReq("s3://bucket/t-2")})
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, OutcomeEnqueued, r.Outcome, "the retry enqueues")
	}
}
