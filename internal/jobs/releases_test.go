package jobs

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
)

// Two releases run side by side during every deploy. These tests play the
// older one with this build: it meets documents a newer build wrote.

// releaseWorker is a worker of this build on pool, whose deliveries that
// leave a batch to a newer release snooze for snooze.
func releaseWorker(t *testing.T, pool *pgxpool.Pool, m *metrics.Metrics, snooze time.Duration) *IngestWorker {
	t.Helper()
	w, err := NewIngestWorker(WorkerConfig{
		Store: batch.NewStore(pool), Leases: lease.NewStore(pool),
		Pipelines: pipeline.Registry{batch.SourceTypeFleetS3: &fleet.Pipeline{
			AllowLocalFolders: true, Warehouse: warehouse.NewPostgres(pool), Logger: slog.New(slog.DiscardHandler)}},
		LeaseTTL: 10 * time.Second, RenewEvery: 200 * time.Millisecond, NewerReleaseSnooze: snooze,
		Metrics: m, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	return w
}

// runClient starts a River client working ingest jobs with w and returns
// its stream of job events and a function that stops it (once the
// deliveries it runs ended), called when the test ends too.
func runClient(t *testing.T, pool *pgxpool.Pool, w *IngestWorker) (<-chan *river.Event, func()) {
	t.Helper()
	client, err := NewWorkerClient(pool, w, ClientConfig{Concurrency: 2, FetchPollInterval: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	events, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobSnoozed, river.EventKindJobCancelled, river.EventKindJobFailed)
	ctx := context.Background()
	require.NoError(t, client.Start(ctx))
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			stopCtx, done := context.WithTimeout(ctx, time.Minute)
			defer done()
			require.NoError(t, client.Stop(stopCtx))
		})
	}
	t.Cleanup(stop)
	return events, stop
}

// nextEvent returns the next event of job jobID.
func nextEvent(t *testing.T, events <-chan *river.Event, jobID int64) *river.Event {
	t.Helper()
	for {
		e := testproc.Await(t, events, "an event of the batch's job")
		if e.Job.ID == jobID {
			return e
		}
	}
}

// jobOf returns the id of batch id's only job.
func jobOf(t *testing.T, pool *pgxpool.Pool, id int64) int64 {
	t.Helper()
	var job int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT id FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id).Scan(&job))
	return job
}

// TestAnOlderBuildKeepsANewerBuildsKeys: a batch whose details hold keys
// this build does not know, at the top level and inside an object it
// writes (a newer build's informational keys, as the load-ledger summary
// "objects" was to the release before it), is worked to success by a real
// worker of this build, never parked, and the keys are still there after
// every write it made. Before, the worker parked it ("$: unknown key") and
// it waited for an operator.
func TestAnOlderBuildKeepsANewerBuildsKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	m := metrics.New()
	f := newFixtureOn(t, pool, nil)
	id := f.importBatch(t, "tenant-a")
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches
		SET details = details || '{"lineage": {"upstream": "s3://bucket/raw", "hops": 2}, "publication": {"started": false, "completed": false, "channel": "fast"}}'
		WHERE id = $1`, id)
	require.NoError(t, err)

	job := jobOf(t, pool, id)
	events, _ := runClient(t, pool, releaseWorker(t, pool, m, time.Second))
	require.Equal(t, river.EventKindJobCompleted, nextEvent(t, events, job).Kind)
	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, b.Status)
	require.Nil(t, b.ParkedAt, "never parked")
	require.Zero(t, counterValue(t, m, "ingest_deliveries_total", "parked"))
	var d struct {
		Phase       string          `json:"phase"`
		Lineage     json.RawMessage `json:"lineage"`
		Publication struct {
			Completed bool   `json:"completed"`
			Channel   string `json:"channel"`
		} `json:"publication"`
		Writes []json.RawMessage `json:"writes"`
	}
	require.NoError(t, json.Unmarshal(b.Details, &d))
	require.Equal(t, "published", d.Phase)
	require.True(t, d.Publication.Completed)
	require.GreaterOrEqual(t, len(d.Writes), 2, "written more than once by this build")
	require.JSONEq(t, `{"upstream": "s3://bucket/raw", "hops": 2}`, string(d.Lineage), "the top-level key kept")
	require.Equal(t, "fast", d.Publication.Channel, "the nested key kept")
}

// TestANewerDetailsVersionIsSnoozedNotParked: a batch whose details are of
// a version newer than this build's is a newer build's to work on. Each
// delivery of this build takes the lease, sees the version, releases the
// lease and snoozes the job: never parked, nothing written to status or
// details, no attempt used (the job, allowed two attempts, is delivered
// many more times than that), no lease held afterwards, and the sweeper
// finds nothing to re-deliver. Once the version is one this build knows
// (rewritten here, as a newer build's own work would end), the next
// delivery works it. Before, the first delivery parked it for good.
func TestANewerDetailsVersionIsSnoozedNotParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	m := metrics.New()
	f := newFixtureOn(t, pool, nil)
	id := f.importBatch(t, "tenant-a")
	job := jobOf(t, pool, id)
	_, err := pool.Exec(ctx, `UPDATE river_job SET max_attempts = 2 WHERE id = $1`, job)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET details = jsonb_set(details, '{version}', '2') || '{"stages": ["load"]}' WHERE id = $1`, id)
	require.NoError(t, err)
	before, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)

	events, stop := runClient(t, pool, releaseWorker(t, pool, m, 200*time.Millisecond))
	const deliveries = 5
	for range deliveries {
		require.Equal(t, river.EventKindJobSnoozed, nextEvent(t, events, job).Kind)
	}
	stop() // the rollout's older workers, between two deliveries
	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, b.Status)
	require.Nil(t, b.ParkedAt, "never parked")
	require.Nil(t, b.LeaseID, "no lease held")
	require.Equal(t, string(before.Details), string(b.Details), "nothing written to the details")
	require.GreaterOrEqual(t, b.LeaseGeneration, int64(deliveries), "each delivery took the lease and gave it back")
	var (
		attempt, maxAttempts int
		state                string
		errs                 []byte
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempt, max_attempts, state::text, COALESCE(to_jsonb(errors), '[]') FROM river_job WHERE id = $1`, job).
		Scan(&attempt, &maxAttempts, &state, &errs))
	require.Equal(t, 2, maxAttempts)
	require.LessOrEqual(t, attempt, 1, "a snooze gives the attempt back")
	require.Contains(t, []string{"scheduled", "available", "running"}, state, "still to be delivered")
	require.JSONEq(t, `[]`, string(errs), "not counted as an error")
	require.GreaterOrEqual(t, counterValue(t, m, "ingest_deliveries_total", "left_to_newer_release"), float64(deliveries))
	require.Zero(t, counterValue(t, m, "ingest_deliveries_total", "parked"))
	// However long the batch waits, the snoozed job is its delivery: not
	// an orphan to re-deliver, and not parked, so nothing to take back.
	s := &Sweeper{Pool: pool, River: f.enqueuer.River, OrphanAfter: time.Millisecond, Pipelines: f.worker.Pipelines(), Logger: slog.New(slog.DiscardHandler)}
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing to re-deliver")

	// A newer build's work brings the version back to one this build
	// knows; the next delivery of the same job works the batch.
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET details = jsonb_set(details, '{version}', '1') WHERE id = $1`, id)
	require.NoError(t, err)
	events, _ = runClient(t, pool, releaseWorker(t, pool, m, 200*time.Millisecond))
	require.Equal(t, river.EventKindJobCompleted, nextEvent(t, events, job).Kind)
	b, err = batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, b.Status)
}

// parkedByAnOlderBuild parks batch id as the release before the load
// ledger did when a newer worker had loaded it: the details hold the
// summary "objects" it did not know, the reason is its parser's, its
// delivery's job is cancelled, and the park is older than at.
func parkedByAnOlderBuild(t *testing.T, pool *pgxpool.Pool, id int64, at string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		UPDATE ingestion_batches
		SET details = details || '{"objects": {"count": 1, "bytes": 12, "digest": "ab"}}',
		    parked_at = now() - $2::interval, updated_at = now() - $2::interval,
		    parked_reason = 'batch details are not a valid details document: $: unknown key "objects"'
		WHERE id = $1`, id, at)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `UPDATE river_job SET state = 'cancelled', finalized_at = now() WHERE (args->>'batch_id')::bigint = $1`, id)
	require.NoError(t, err)
}

// TestSweeperTakesBackWhatAnOlderBuildParked: a batch an older build
// parked for a reason this build does not have (a key it did not know) is
// taken back by the sweep of this build without an operator: judged by
// this build's own rules, unparked and given a job in one transaction,
// counted, and then worked to success by a real worker. A batch parked
// less than OrphanAfter ago waits (an older worker may still be running:
// no fast exchange of parks and take-backs); one this build would park
// too stays parked, however many there are ahead of a workable one.
func TestSweeperTakesBackWhatAnOlderBuildParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	m := metrics.New()
	f := newFixtureOn(t, pool, nil)
	quiet := slog.New(slog.DiscardHandler)
	s := &Sweeper{Pool: pool, River: f.enqueuer.River, OrphanAfter: time.Minute, Limit: 2, Pipelines: f.worker.Pipelines(), Metrics: m, Logger: quiet}

	// Three batches this build would park too (an older details version it
	// does not know), ahead of the workable ones in id order, more than a
	// sweep's limit.
	var refused []int64
	for i := range 3 {
		id := f.importBatch(t, "tenant-old-"+string(rune('a'+i)))
		parkedByAnOlderBuild(t, pool, id, "2 minutes")
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = jsonb_set(details, '{version}', '0') WHERE id = $1`, id)
		require.NoError(t, err)
		refused = append(refused, id)
	}
	workable := f.importBatch(t, "tenant-a")
	parkedByAnOlderBuild(t, pool, workable, "2 minutes")
	recent := f.importBatch(t, "tenant-b")
	parkedByAnOlderBuild(t, pool, recent, "5 seconds")

	taken := 0
	for range 3 { // the sweeps walk the parked batches two at a time
		n, err := s.Sweep(ctx)
		require.NoError(t, err)
		taken += n
	}
	require.Equal(t, 1, taken, "the workable batch, once")
	require.Equal(t, float64(1), counterValue(t, m, "ingest_sweep_redeliveries_total", "unparked"))
	b, err := batch.NewStore(pool).Get(ctx, workable)
	require.NoError(t, err)
	require.Nil(t, b.ParkedAt, "unparked")
	require.Nil(t, b.ParkedReason)
	require.Equal(t, map[string]int{"cancelled": 1, "available": 1}, jobStatesOf(t, pool, workable), "one new job")
	for _, id := range append(refused, recent) {
		b, err := batch.NewStore(pool).Get(ctx, id)
		require.NoError(t, err)
		require.NotNil(t, b.ParkedAt, "batch %d stays parked", id)
		require.Equal(t, map[string]int{"cancelled": 1}, jobStatesOf(t, pool, id))
	}
	for range 3 {
		n, err := s.Sweep(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "a batch with a queued job is not taken back again")
	}

	var jobID int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM river_job WHERE (args->>'batch_id')::bigint = $1 AND state = 'available'`, workable).Scan(&jobID))
	events, _ := runClient(t, pool, releaseWorker(t, pool, metrics.New(), time.Second))
	require.Equal(t, river.EventKindJobCompleted, nextEvent(t, events, jobID).Kind)
	b, err = batch.NewStore(pool).Get(ctx, workable)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, b.Status, "succeeded without an operator")
}

// TestSweeperTakesBackUnderTheRowLock: the take-back decides under the
// batch's row lock, as the sweep's other decisions: a row another
// transaction holds (a delivery acquiring the lease, an operator's cancel)
// is skipped, not waited for and not decided from a stale read; the next
// sweep takes it back once the lock is gone. A parked batch with a live
// lease is left alone.
func TestSweeperTakesBackUnderTheRowLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	f := newFixtureOn(t, pool, nil)
	s := &Sweeper{Pool: pool, River: f.enqueuer.River, OrphanAfter: time.Minute, Pipelines: f.worker.Pipelines(), Logger: slog.New(slog.DiscardHandler)}
	locked := f.importBatch(t, "tenant-a")
	parkedByAnOlderBuild(t, pool, locked, "2 minutes")
	held := f.importBatch(t, "tenant-b")
	parkedByAnOlderBuild(t, pool, held, "2 minutes")
	_, err := lease.NewStore(pool).Acquire(ctx, held, "someone/job-1/attempt-1/aa", time.Hour)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT 1 FROM ingestion_batches WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the locked row is skipped; the leased one is left to its holder")
	require.NoError(t, tx.Rollback(ctx))

	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	b, err := batch.NewStore(pool).Get(ctx, locked)
	require.NoError(t, err)
	require.Nil(t, b.ParkedAt)
	b, err = batch.NewStore(pool).Get(ctx, held)
	require.NoError(t, err)
	require.NotNil(t, b.ParkedAt, "a live lease is left alone")
}

// jobStatesOf counts batch id's River jobs by state.
func jobStatesOf(t *testing.T, pool *pgxpool.Pool, id int64) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT state::text, count(*) FROM river_job WHERE (args->>'batch_id')::bigint = $1 GROUP BY state`, id)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			state string
			n     int
		)
		require.NoError(t, rows.Scan(&state, &n))
		out[state] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// TestTakeBackReadsTheParkedBatchesOnly: the sweep's read of parked
// batches (id order, from where the last sweep stopped) reads the index of
// parked batches, never the batches' history (20,000 finished batches):
// with statistics taken while most batches were Running and parked (a
// young table during a long rollout), and fresh ones, custom plan or
// generic. Without the index, the first statistics made the planner walk
// the primary key (ORDER BY id) or scan the table.
func TestTakeBackReadsTheParkedBatchesOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	pgtest.LeasedWithStaleStatistics(t, pool, 300)
	for _, sql := range []string{
		`UPDATE ingestion_batches SET status = 'Running', parked_at = now() - interval '1 hour', parked_reason = 'test',
		        execution_lease_id = NULL, execution_lease_expires_at = NULL, completed_at = NULL WHERE id % 100 <> 0`,
		`ANALYZE ingestion_batches`, // autovacuum is off: these statistics stay
		`UPDATE ingestion_batches SET status = 'Succeeded', parked_at = NULL, parked_reason = NULL, completed_at = now()
		 WHERE source_scope LIKE 'fleet_s3:s3://history-bucket/%'`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	for _, stats := range []string{"stale", "fresh"} {
		if stats == "fresh" {
			_, err := pool.Exec(ctx, `ANALYZE ingestion_batches`)
			require.NoError(t, err)
		}
		requireParkedIndex(t, pool, stats)
	}
}

// requireParkedIndex checks that parkedSQL reads the batches from the index
// of parked batches only, custom plan or generic, and returns a page.
func requireParkedIndex(t *testing.T, pool *pgxpool.Pool, stats string) {
	t.Helper()
	ctx := context.Background()
	args := []any{100, time.Minute.Microseconds(), IngestArgs{}.Kind(), int64(0)}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SET plan_cache_mode = `+mode)
		require.NoError(t, err)
		var plan []map[string]any
		require.NoError(t, conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+parkedSQL, args...).Scan(&plan))
		_, err = conn.Exec(ctx, `RESET plan_cache_mode`)
		require.NoError(t, err)
		conn.Release()
		scans := batchScans(plan[0]["Plan"].(map[string]any))
		require.Equal(t, []string{"ix_ingestion_batches_parked"}, scans, "%s statistics, %s: the batches are read from %v", stats, mode, scans)
	}
	rows, err := pool.Query(ctx, parkedSQL, args...)
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 100, n)
}

// batchScans lists how a plan reads ingestion_batches: the indexes of
// the batches it scans, and "seq scan" for a sequential scan of them.
func batchScans(n map[string]any) []string {
	var out []string
	switch name, _ := n["Index Name"].(string); {
	case strings.Contains(name, "ingestion_batches"):
		out = append(out, name)
	case n["Node Type"] == "Seq Scan" && n["Relation Name"] == "ingestion_batches":
		out = append(out, "seq scan")
	}
	kids, _ := n["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok {
			out = append(out, batchScans(m)...)
		}
	}
	return out
}
