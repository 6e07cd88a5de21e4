package jobs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
)

// seedHistory writes the batches of a folder's history as the table owner,
// oldest first, with the given statuses, and returns their ids.
func seedHistory(t *testing.T, pool *pgxpool.Pool, folderURL string, statuses ...batch.Status) []int64 {
	t.Helper()
	f, err := folder.Canonicalize(folderURL)
	require.NoError(t, err)
	raw, err := batch.NewDetails(f.String()).Marshal()
	require.NoError(t, err)
	ids := make([]int64, len(statuses))
	for k, st := range statuses {
		require.NoError(t, pool.QueryRow(context.Background(), `
			INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope, completed_at)
			VALUES ('c', 'tenant-a', 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', $1::text, $2::jsonb, $3::text, CASE WHEN $1::text = 'Running' THEN NULL ELSE now() END)
			RETURNING id`, string(st), string(raw), f.Scope()).Scan(&ids[k]))
	}
	return ids
}

// TestBurstNamingAFolderWhoseRunningBatchIsNotItsNewest: a folder whose
// Running batch A is older than a Failed batch B (A failed publication, a
// new import started B, an operator cancelled B and resumed A) made every
// burst that named it fail — "gave up after 6 rounds racing finishing
// batches" — the other folders of the burst included. It now answers
// conflict with A, alone or in a burst, and the rest of the burst is
// imported.
func TestBurstNamingAFolderWhoseRunningBatchIsNotItsNewest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	ids := seedHistory(t, f.pool, "s3://bucket/resumed", batch.StatusRunning, batch.StatusFailed)
	running := ids[0]

	res, err := f.enqueuer.ImportMany(ctx, []ImportRequest{importReq("s3://bucket/other"), importReq("s3://bucket/resumed")})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res[0].Outcome, "another folder's history does not fail this one")
	require.Equal(t, OutcomeConflict, res[1].Outcome)
	require.Equal(t, running, res[1].RunningBatchID)

	one, err := f.enqueuer.Import(ctx, importReq("s3://bucket/resumed"))
	require.NoError(t, err)
	require.Equal(t, OutcomeConflict, one.Outcome)
	require.Equal(t, running, one.RunningBatchID)
}

// TestFailedEnqueueRecordCannotPoisonTheFolder is the same state reached by
// a race: a burst's job insert fails while a concurrent import of the same
// folder waits on the burst's uncommitted reservation. After the rollback
// the concurrent import reserves the folder; the burst's failed_enqueue
// record is written after it, so it is the folder's newest batch. The
// folder still answers conflict with the Running batch, in a burst or
// alone.
func TestFailedEnqueueRecordCannotPoisonTheFolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	// The first job insert waits for the test's advisory lock, then fails;
	// later ones pass (a sequence is not rolled back).
	_, err := f.pool.Exec(ctx, `
		CREATE SEQUENCE job_insert_calls;
		CREATE FUNCTION fail_first_job() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('job_insert_calls') = 1 THEN
				PERFORM pg_advisory_xact_lock(4242);
				RAISE EXCEPTION 'job queue refuses inserts (injected)';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_first_job BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION fail_first_job();`)
	require.NoError(t, err)
	gate, err := f.pool.Acquire(ctx)
	require.NoError(t, err)
	defer gate.Release()
	_, err = gate.Exec(ctx, `SELECT pg_advisory_lock(4242)`)
	require.NoError(t, err)

	burstDone := make(chan []Result, 1)
	go func() {
		res, err := f.enqueuer.ImportMany(ctx, []ImportRequest{importReq("s3://bucket/raced"), importReq("s3://bucket/bystander")})
		if err != nil {
			t.Error(err)
		}
		burstDone <- res
	}()
	waitForLockWaiters(t, f.pool, "advisory", 1)
	importDone := make(chan Result, 1)
	go func() {
		res, err := f.enqueuer.Import(ctx, importReq("s3://bucket/raced"))
		if err != nil {
			t.Error(err)
		}
		importDone <- res
	}()
	waitForLockWaiters(t, f.pool, "transactionid", 1) // on the burst's reservation
	_, err = gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
	require.NoError(t, err)
	burst, concurrent := <-burstDone, <-importDone
	require.Equal(t, OutcomeEnqueueFailed, burst[0].Outcome)
	require.Equal(t, OutcomeEnqueued, concurrent.Outcome)
	require.Greater(t, burst[0].BatchID, concurrent.BatchID, "the failed_enqueue record is the folder's newest batch")

	res, err := f.enqueuer.ImportMany(ctx, []ImportRequest{importReq("s3://bucket/raced"), importReq("s3://bucket/after")})
	require.NoError(t, err)
	require.Equal(t, OutcomeConflict, res[0].Outcome)
	require.Equal(t, concurrent.BatchID, res[0].RunningBatchID)
	require.Equal(t, OutcomeEnqueued, res[1].Outcome)
}

// waitForLockWaiters waits until n backends of this test's database wait
// on a lock of the type (pg_locks is the whole cluster's: other tests'
// waiters must not count).
func waitForLockWaiters(t *testing.T, pool *pgxpool.Pool, lockType string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND l.locktype = $1 AND a.datname = current_database()`, lockType).Scan(&waiting))
		if waiting >= n {
			return
		}
		require.True(t, time.Now().Before(deadline), "no backend waits on a %s lock", lockType)
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBurstNamingOneFolderManyTimes: a burst naming one folder seven times
// or more (equivalent spellings included) failed as a whole, each round
// sending one copy; now the folder is reserved once and every other copy
// answers conflict with that batch — or, for a re-import after a copy that
// found the folder succeeded, is decided in a round of its own.
func TestBurstNamingOneFolderManyTimes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	spellings := []string{"s3://bucket/many", "s3://Bucket/many/", "s3://bucket//many", "S3://BUCKET/many//"}
	var reqs []ImportRequest
	for i := range 12 {
		reqs = append(reqs, importReq(spellings[i%len(spellings)]))
	}
	reqs = append(reqs, importReq("s3://bucket/beside"))
	res, err := f.enqueuer.ImportMany(ctx, reqs)
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res[0].Outcome)
	for i := 1; i < 12; i++ {
		require.Equal(t, OutcomeConflict, res[i].Outcome, i)
		require.Equal(t, res[0].BatchID, res[i].RunningBatchID, i)
	}
	require.Equal(t, OutcomeEnqueued, res[12].Outcome)
	var batches int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&batches))
	require.Equal(t, 2, batches)

	// A succeeded folder named many times, re-imports among the copies.
	seedHistory(t, f.pool, "s3://bucket/done-many", batch.StatusSucceeded)
	var mixed []ImportRequest
	for i := range 9 {
		r := importReq(spellings[i%len(spellings)] + "-done")
		r.Folder = strings.Replace(r.Folder, "many", "done-many", 1)
		r.Folder = strings.TrimSuffix(strings.TrimSuffix(r.Folder, "/"), "-done")
		r.Reimport = i >= 5
		mixed = append(mixed, r)
	}
	res, err = f.enqueuer.ImportMany(ctx, mixed)
	require.NoError(t, err)
	for i := range 5 {
		require.Equal(t, OutcomeAlreadySucceeded, res[i].Outcome, i)
	}
	require.Equal(t, OutcomeEnqueued, res[5].Outcome, "the first re-import starts a batch")
	for i := 6; i < 9; i++ {
		require.Equal(t, OutcomeConflict, res[i].Outcome, i)
		require.Equal(t, res[5].BatchID, res[i].RunningBatchID, i)
	}
}

// TestRolledBackBurstNamesNoBatchThatDoesNotExist: after a failed job
// insert, a later copy of a folder in the burst answered conflict naming
// the rolled-back reservation, a batch that never existed. It now shares
// the first copy's enqueue_failed answer, and every batch an answer names
// exists.
func TestRolledBackBurstNamesNoBatchThatDoesNotExist(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	held, err := f.enqueuer.Import(ctx, importReq("s3://bucket/held-dup"))
	require.NoError(t, err)
	f.beforeInsert(t, "river_job", "refuse_jobs", `RAISE EXCEPTION 'job queue refuses inserts (injected)';`)
	res, err := f.enqueuer.ImportMany(ctx, []ImportRequest{
		importReq("s3://bucket/dup"), importReq("s3://bucket/held-dup"), importReq("s3://Bucket//dup/"), importReq("s3://bucket/held-dup/"),
	})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueueFailed, res[0].Outcome)
	require.Equal(t, res[0], res[2], "the duplicate shares the first copy's failure")
	require.Equal(t, OutcomeConflict, res[1].Outcome)
	require.Equal(t, held.BatchID, res[1].RunningBatchID)
	require.Equal(t, res[1], res[3])
	for i, r := range res {
		for _, id := range []int64{r.BatchID, r.RunningBatchID} {
			if id == 0 {
				continue
			}
			_, err := batch.NewStore(f.pool).Get(ctx, id)
			require.NoError(t, err, "answer %d names batch %d", i, id)
		}
	}
}

// TestConcurrentBurstsRetryADeadlock: a burst rolled back by a deadlock
// (40P01) is tried again as a whole instead of failing every request in
// it. The deadlock is forced: each burst's reservations take two advisory
// locks in opposite orders, held until it ends.
func TestConcurrentBurstsRetryADeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	_, err := f.pool.Exec(ctx, `
		CREATE SEQUENCE deadlock_calls;
		CREATE FUNCTION cross_locks() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.source_scope LIKE '%/dl-a' AND nextval('deadlock_calls') <= 2 THEN
				PERFORM pg_advisory_xact_lock(1); PERFORM pg_sleep(0.2); PERFORM pg_advisory_xact_lock(2);
			ELSIF NEW.source_scope LIKE '%/dl-b' AND nextval('deadlock_calls') <= 2 THEN
				PERFORM pg_advisory_xact_lock(2); PERFORM pg_sleep(0.2); PERFORM pg_advisory_xact_lock(1);
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER cross_locks BEFORE INSERT ON ingestion_batches FOR EACH ROW EXECUTE FUNCTION cross_locks();`)
	require.NoError(t, err)
	var wg sync.WaitGroup
	results := make([][]Result, 2)
	errs := make([]error, 2)
	for i, folderURL := range []string{"s3://bucket/dl-a", "s3://bucket/dl-b"} {
		wg.Go(func() {
			results[i], errs[i] = f.enqueuer.ImportMany(ctx, []ImportRequest{importReq(folderURL), importReq(folderURL + "-beside")})
		})
	}
	wg.Wait()
	for i := range 2 {
		require.NoError(t, errs[i])
		require.Equal(t, OutcomeEnqueued, results[i][0].Outcome)
		require.Equal(t, OutcomeEnqueued, results[i][1].Outcome)
	}
	var calls int64
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT last_value FROM deadlock_calls`).Scan(&calls))
	require.GreaterOrEqual(t, calls, int64(2), "both bursts took the crossing locks")
}

// modelScope is what the model knows of one folder: its Running batch (0:
// none) and whether its newest batch succeeded.
type modelScope struct {
	running         int64
	newest          int64
	newestSucceeded bool
}

// TestBurstOutcomesMatchAModel checks random bursts — duplicates,
// equivalent spellings, re-imports, folders with Running, Failed newer
// than Running, Succeeded, Running older than Succeeded and cancelled
// histories — against a model of Reserve's rules; then concurrent bursts
// over overlapping folders, whose every answer must be true of the
// database afterwards. No burst may fail.
func TestBurstOutcomesMatchAModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	histories := [][]batch.Status{
		nil,
		{batch.StatusRunning},
		{batch.StatusRunning, batch.StatusFailed},
		{batch.StatusSucceeded},
		{batch.StatusFailed, batch.StatusSucceeded},
		{batch.StatusRunning, batch.StatusSucceeded},
		{batch.StatusFailed},
		{batch.StatusSucceeded, batch.StatusFailed},
	}
	spell := func(base string) string {
		switch rng.IntN(4) {
		case 0:
			return base
		case 1:
			return strings.Replace(base, "s3://bucket/", "s3://Bucket//", 1) + "/"
		case 2:
			return strings.Replace(base, "s3://bucket/", "S3://BUCKET/", 1)
		}
		return base + "//"
	}
	for round := range 12 {
		concurrent := round >= 6
		model := map[string]*modelScope{}
		seededRunning := map[string]int64{}
		var bases []string
		for h, statuses := range histories {
			base := fmt.Sprintf("s3://bucket/r%d/h%d", round, h)
			bases = append(bases, base)
			ids := seedHistory(t, f.pool, base, statuses...)
			m := &modelScope{}
			for k, st := range statuses {
				if st == batch.StatusRunning {
					m.running = ids[k]
				}
				m.newest, m.newestSucceeded = ids[k], st == batch.StatusSucceeded
			}
			fc, _ := folder.Canonicalize(base)
			model[fc.Scope()] = m
			seededRunning[fc.Scope()] = m.running
		}
		bursts := 1
		if concurrent {
			bursts = 2 + rng.IntN(3)
		}
		reqs := make([][]ImportRequest, bursts)
		for b := range reqs {
			for range 1 + rng.IntN(20) {
				r := importReq(spell(bases[rng.IntN(len(bases))]))
				r.Reimport = rng.IntN(4) == 0
				reqs[b] = append(reqs[b], r)
			}
		}
		results := make([][]Result, bursts)
		errs := make([]error, bursts)
		var wg sync.WaitGroup
		for b := range bursts {
			wg.Go(func() { results[b], errs[b] = f.enqueuer.ImportMany(ctx, reqs[b]) })
		}
		wg.Wait()
		for b := range bursts {
			require.NoError(t, errs[b], "round %d burst %d: no burst fails", round, b)
			require.Len(t, results[b], len(reqs[b]))
		}

		// uidOf is the uid the database gave batch id: the receipt names
		// the batch by it too.
		uidOf := func(id int64) string {
			var uid string
			require.NoError(t, f.pool.QueryRow(ctx, `SELECT batch_uid::text FROM ingestion_batches WHERE id = $1`, id).Scan(&uid))
			return uid
		}
		if !concurrent {
			// One burst: every answer is exactly the model's.
			for i, req := range reqs[0] {
				fc, _ := folder.Canonicalize(req.Folder)
				m, got := model[fc.Scope()], results[0][i]
				switch {
				case !req.Reimport && m.newestSucceeded:
					require.Equal(t, Result{Outcome: OutcomeAlreadySucceeded, BatchID: m.newest, BatchUID: uidOf(m.newest), SourceScope: fc.Scope()}, got, "round %d request %d", round, i)
				case m.running != 0:
					require.Equal(t, Result{Outcome: OutcomeConflict, RunningBatchID: m.running, RunningBatchUID: uidOf(m.running), SourceScope: fc.Scope()}, got, "round %d request %d", round, i)
				default:
					require.Equal(t, OutcomeEnqueued, got.Outcome, "round %d request %d: %+v", round, i, got)
					require.Positive(t, got.JobID)
					m.running, m.newest, m.newestSucceeded = got.BatchID, got.BatchID, false
				}
			}
		}

		// Every answer is true of the database afterwards.
		enqueued := map[string]int{}
		for b := range bursts {
			for i, got := range results[b] {
				fc, _ := folder.Canonicalize(reqs[b][i].Folder)
				require.Equal(t, fc.Scope(), got.SourceScope)
				store := batch.NewStore(f.pool)
				switch got.Outcome {
				case OutcomeEnqueued:
					enqueued[got.SourceScope]++
					bt, err := store.Get(ctx, got.BatchID)
					require.NoError(t, err)
					require.Equal(t, batch.StatusRunning, bt.Status)
					require.Equal(t, got.SourceScope, bt.Scope())
					var jobBatch int64
					require.NoError(t, f.pool.QueryRow(ctx, `SELECT (args->>'batch_id')::bigint FROM river_job WHERE id = $1`, got.JobID).Scan(&jobBatch))
					require.Equal(t, got.BatchID, jobBatch)
				case OutcomeConflict:
					bt, err := store.Get(ctx, got.RunningBatchID)
					require.NoError(t, err)
					require.Equal(t, batch.StatusRunning, bt.Status, "round %d: conflict names the Running batch", round)
					require.Equal(t, got.SourceScope, bt.Scope())
				case OutcomeAlreadySucceeded:
					require.False(t, reqs[b][i].Reimport)
					bt, err := store.Get(ctx, got.BatchID)
					require.NoError(t, err)
					require.Equal(t, batch.StatusSucceeded, bt.Status)
					require.Equal(t, got.SourceScope, bt.Scope())
				default:
					t.Fatalf("round %d: unexpected outcome %+v", round, got)
				}
			}
		}
		for scope, n := range enqueued {
			require.Equal(t, 1, n, "round %d: %s reserved once across the bursts", round, scope)
			require.Zero(t, seededRunning[scope], "round %d: only a folder without a Running batch is reserved", round)
		}
	}
}
