package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
)

type fixture struct {
	pool     *pgxpool.Pool
	metrics  *metrics.Metrics
	worker   *IngestWorker
	enqueuer *Enqueuer
	tw       *rivertest.Worker[IngestArgs, pgx.Tx]
}

var memSeq atomic.Int64

func newFixture(t *testing.T, p pipeline.Pipeline) *fixture {
	t.Helper()
	return newFixtureOn(t, pgtest.NewPool(t), p)
}

// newFixtureOn is newFixture on a given database.
func newFixtureOn(t *testing.T, pool *pgxpool.Pool, p pipeline.Pipeline) *fixture {
	t.Helper()
	m := metrics.New()
	if p == nil {
		p = &fleet.Pipeline{AllowLocalFolders: true, Warehouse: warehouse.NewPostgres(pool), Logger: slog.New(slog.DiscardHandler)}
	}
	w, err := NewIngestWorker(WorkerConfig{
		Store: batch.NewStore(pool), Leases: lease.NewStore(pool),
		Pipelines: pipeline.Registry{batch.SourceTypeFleetS3: p},
		// A term a loaded machine cannot let run out between renewals (a
		// 2 s term once did, under make test: the delivery's context was
		// cancelled before it read its batch).
		LeaseTTL: 10 * time.Second, RenewEvery: 200 * time.Millisecond,
		Metrics: m, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	client, err := NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return &fixture{
		pool: pool, metrics: m, worker: w,
		enqueuer: &Enqueuer{Pool: pool, River: client, Metrics: m, Logger: slog.New(slog.DiscardHandler),
			Verifier: warehouse.Verifier(warehouse.NewPostgres(pool))},
		tw: rivertest.NewWorker(t, riverpgxv5.New(pool), &river.Config{}, w),
	}
}

func memFolder(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("jobs-test-%d", memSeq.Add(1))
	require.NoError(t, folder.MemBucket(name).WriteAll(context.Background(), "f/a.csv", []byte("k,v\n1,a\n2,b\n"), nil))
	require.NoError(t, folder.MemBucket(name).WriteAll(context.Background(), "f/_SUCCESS", nil, nil))
	return "mem://" + name + "/f"
}

// work runs one delivery of a job for id in a rolled-back River transaction.
func (f *fixture) work(t *testing.T, id int64) *rivertest.WorkResult {
	t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	res, err := f.tw.Work(ctx, t, tx, IngestArgs{BatchID: id}, nil)
	require.NoError(t, err)
	return res
}

func (f *fixture) importBatch(t *testing.T, tenant string) int64 {
	t.Helper()
	res, err := f.enqueuer.Import(context.Background(), ImportRequest{TenantID: tenant, TenantDatabase: "db", CompanyID: "c", Folder: memFolder(t)})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, res.Outcome)
	return res.BatchID
}

func TestWorkerDeliveryOutcomes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()

	t.Run("works a batch to success and releases the lease", func(t *testing.T) {
		id := f.importBatch(t, "tenant-a")
		res := f.work(t, id)
		require.Equal(t, river.EventKindJobCompleted, res.EventKind)
		b, err := batch.NewStore(f.pool).Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, batch.StatusSucceeded, b.Status)
		require.Nil(t, b.LeaseID)
	})

	t.Run("terminal batch completes with no work", func(t *testing.T) {
		id := f.importBatch(t, "tenant-b")
		_, err := f.pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Failed' WHERE id = $1`, id)
		require.NoError(t, err)
		res := f.work(t, id)
		require.Equal(t, river.EventKindJobCompleted, res.EventKind)
		b, err := batch.NewStore(f.pool).Get(ctx, id)
		require.NoError(t, err)
		require.Zero(t, b.LeaseGeneration)
		require.Equal(t, float64(1), counterValue(t, f.metrics, "ingest_deliveries_total", "skipped_terminal"))
	})

	t.Run("missing batch cancels the job", func(t *testing.T) {
		res := f.work(t, 99999999)
		require.Equal(t, river.EventKindJobCancelled, res.EventKind)
	})

	t.Run("live lease held elsewhere snoozes until about its expiry", func(t *testing.T) {
		id := f.importBatch(t, "tenant-c")
		a, err := lease.NewStore(f.pool).Acquire(ctx, id, "someone-else", 30*time.Second)
		require.NoError(t, err)
		res := f.work(t, id)
		require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
		require.WithinDuration(t, a.Lease.ExpiresAt.Add(time.Second), res.Job.ScheduledAt, 2*time.Second)
		require.Equal(t, 0, res.Job.Attempt, "snoozing gives the attempt back")
	})
}

// stealingPipeline lets another delivery take the lease over mid-run and
// then waits for the heartbeat to notice.
type stealingPipeline struct {
	pool  *pgxpool.Pool
	wrote chan error
}

func (s *stealingPipeline) Execute(ctx context.Context, run *pipeline.Run) error {
	// Expire our term and take it over, as a successor would after a pause.
	_, err := s.pool.Exec(ctx, `UPDATE ingestion_batches SET execution_lease_expires_at = now() - interval '1 second' WHERE id = $1`, run.Batch.ID)
	if err != nil {
		return err
	}
	a, err := lease.NewStore(s.pool).Acquire(ctx, run.Batch.ID, "successor", time.Minute)
	if err != nil || a.Outcome != lease.Acquired {
		return fmt.Errorf("takeover failed: %v %v", a.Outcome, err)
	}
	<-ctx.Done() // the heartbeat must cancel us
	d := run.Details
	d.Phase = batch.PhaseCommitted
	s.wrote <- run.Checkpoint(context.WithoutCancel(ctx), d)
	return ctx.Err()
}

func TestHeartbeatSelfFencesWhenTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	sp := &stealingPipeline{pool: pool, wrote: make(chan error, 1)}
	f := newFixtureOn(t, pool, sp)

	id := f.importBatch(t, "tenant-a")
	res := f.work(t, id)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind, "a lost lease snoozes the job to look again")
	require.ErrorIs(t, <-sp.wrote, batch.ErrStaleLease, "a write after the loss is rejected by the fence")
	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "successor", *b.LeaseID, "the successor keeps its lease")
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	require.Equal(t, batch.PhaseReserved, d.Phase)
	require.Equal(t, float64(1), counterValue(t, f.metrics, "ingest_lease_renewals_total", "lost"))
}

func TestSweeperRedeliversExpiredLeasesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	id := f.importBatch(t, "tenant-a")
	other := f.importBatch(t, "tenant-b")
	a, err := lease.NewStore(f.pool).Acquire(ctx, id, "dead/job-424242/attempt-1/abc", 10*time.Millisecond)
	require.NoError(t, err)
	_, err = lease.NewStore(f.pool).Acquire(ctx, other, "alive", time.Hour)
	require.NoError(t, err)
	// Both jobs were taken by their (now dead or alive) deliveries before
	// they took their leases.
	_, err = f.pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempted_at = now() - interval '1 hour', attempt = 1`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var expired bool
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT now() > $1`, a.Lease.ExpiresAt).Scan(&expired))
		return expired
	}, 5*time.Second, 5*time.Millisecond)

	sweepers := make([]*Sweeper, 4)
	for i := range sweepers {
		sweepers[i] = &Sweeper{Pool: f.pool, River: f.enqueuer.River, Metrics: f.metrics}
	}
	var wg sync.WaitGroup
	counts := make([]int, len(sweepers))
	for i, s := range sweepers {
		wg.Go(func() {
			n, err := s.Sweep(ctx)
			require.NoError(t, err)
			counts[i] = n
		})
	}
	wg.Wait()
	total := 0
	for _, n := range counts {
		total += n
	}
	require.Equal(t, 1, total, "concurrent sweepers re-deliver an expiry once")
	n, err := sweepers[0].Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a later sweep of the same expiry inserts nothing")

	var jobs int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE (args->>'batch_id')::bigint = $1 AND (args->>'redelivery_of')::bigint = $2`, id, a.Lease.Generation).Scan(&jobs))
	require.Equal(t, 1, jobs)
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE (args->>'batch_id')::bigint = $1 AND args ? 'redelivery_of'`, other).Scan(&jobs))
	require.Zero(t, jobs, "a live lease is never re-delivered")
}

func TestSweeperRedeliversOrphans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	orphan := f.importBatch(t, "tenant-a")
	queued := f.importBatch(t, "tenant-b")
	// The orphan's worker took its job (now "running") and died before
	// taking the lease; the other batch's job is still queued.
	_, err := f.pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempted_at = now() - interval '2 minutes', attempt = 1 WHERE (args->>'batch_id')::bigint = $1`, orphan)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE ingestion_batches SET updated_at = now() - interval '2 minutes'`)
	require.NoError(t, err)

	s := &Sweeper{Pool: f.pool, River: f.enqueuer.River, Metrics: f.metrics, OrphanAfter: time.Minute}
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "only the orphan is re-delivered; the queued batch has its job")
	states := map[string]int{}
	rows, err := f.pool.Query(ctx, `SELECT state::text, metadata ? 'cancel_attempted_at' FROM river_job WHERE (args->>'batch_id')::bigint = $1`, orphan)
	require.NoError(t, err)
	for rows.Next() {
		var st string
		var marked bool
		require.NoError(t, rows.Scan(&st, &marked))
		if st == "running" {
			require.True(t, marked, "the dead delivery's job is marked for cancellation")
		}
		states[st]++
	}
	require.Equal(t, map[string]int{"running": 1, "available": 1}, states)
	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the new job is queued: nothing more to do")
	_ = queued
}

func TestRefreshStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	id := f.importBatch(t, "tenant-a")
	f.importBatch(t, "tenant-b")
	_, err := lease.NewStore(f.pool).Acquire(ctx, id, "dead", time.Millisecond)
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, RefreshStats(ctx, f.pool, f.metrics))
	require.Equal(t, float64(2), gaugeValue(t, f.metrics, "ingest_running_batches", ""))
	require.Equal(t, float64(1), gaugeValue(t, f.metrics, "ingest_stuck_batches", ""))
	require.Equal(t, float64(2), gaugeValue(t, f.metrics, "ingest_queue_jobs", "available"))
	require.Greater(t, gaugeValue(t, f.metrics, "ingest_oldest_running_batch_age_seconds", ""), float64(0))
}

func TestEnqueuerValidatesBeforeWriting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	_, err := f.enqueuer.Import(ctx, ImportRequest{TenantID: "t", TenantDatabase: "db", CompanyID: "c", Folder: "s3://bucket/../x"})
	var in *InputError
	require.ErrorAs(t, err, &in)
	require.Equal(t, "folder", in.Field)
	_, err = f.enqueuer.Import(ctx, ImportRequest{TenantID: "", TenantDatabase: "db", CompanyID: "c", Folder: "s3://bucket/x"})
	require.ErrorAs(t, err, &in)
	require.Equal(t, "tenant_id", in.Field)
	_, err = f.enqueuer.Resume(ctx, ResumeRequest{BatchID: 0, TenantID: "t", Folder: "s3://bucket/x"})
	require.ErrorAs(t, err, &in)
	require.Equal(t, "batch_id", in.Field)
	var n int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	require.Zero(t, n)
}

func TestNextRetryBacksOffWithACap(t *testing.T) {
	t.Parallel()
	w := &IngestWorker{}
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second, 12: 10 * time.Minute, 25: 10 * time.Minute} {
		// Bracketed by the clock on both sides, so a stalled machine cannot
		// move the figure out of bounds.
		before := time.Now()
		at := w.NextRetry(&river.Job[IngestArgs]{JobRow: &rivertype.JobRow{Attempt: attempt}})
		after := time.Now()
		require.GreaterOrEqual(t, at.Sub(after), want-after.Sub(before), "attempt %d", attempt)
		require.LessOrEqual(t, at.Sub(before), want+want/5+after.Sub(before), "attempt %d", attempt)
	}
}

// beforeInsert installs a BEFORE INSERT trigger on table, name, that runs
// the PL/pgSQL statements of body for each row (a RAISE to inject a
// failure, RETURN NEW to let the row through).
func (f *fixture) beforeInsert(t *testing.T, table, name, body string) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), fmt.Sprintf(`
		CREATE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN %[3]s END $$;
		CREATE TRIGGER %[1]s BEFORE INSERT ON %[2]s FOR EACH ROW EXECUTE FUNCTION %[1]s();`, name, table, body))
	require.NoError(t, err)
}
