package jobs

import (
	"context"
	"encoding/json"
	"log/slog"
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

	events, _ := runClient(t, pool, releaseWorker(t, pool, m, time.Second))
	require.Equal(t, river.EventKindJobCompleted, nextEvent(t, events, jobOf(t, pool, id)).Kind)
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
	// an orphan to re-deliver.
	s := &Sweeper{Pool: pool, River: f.enqueuer.River, OrphanAfter: time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
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
