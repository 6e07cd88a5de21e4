package jobs

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// TestSweeperLeavesALiveTakeoverAlone reproduces the race of a sweep that
// decided from a snapshot: a delivery fetched after the lease expired takes
// it over between the sweeper's look-up and its writes. The window is
// widened with a lock on river_job that holds the sweeper just before its
// first write. The sweep must neither cancel the live delivery nor queue a
// job beside it; it still marks the dead holder's job for cancellation.
func TestSweeperLeavesALiveTakeoverAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	id := f.importBatch(t, "tenant-a")
	var deadJob int64
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT id FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id).Scan(&deadJob))
	// The enqueued job was fetched a minute ago, took the lease and died.
	_, err := f.pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempted_at = now() - interval '1 minute', attempt = 1 WHERE id = $1`, deadJob)
	require.NoError(t, err)
	leases := lease.NewStore(f.pool)
	a, err := leases.Acquire(ctx, id, "dead/job-1/attempt-1/aa", time.Minute)
	require.NoError(t, err)
	expired, ok, err := leases.Renew(ctx, a.Lease, time.Microsecond)
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool {
		var past bool
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT now() > $1`, expired.ExpiresAt).Scan(&past))
		return past
	}, 10*time.Second, 5*time.Millisecond)
	// A duplicate job was fetched just now: its delivery is about to take
	// the expired lease over.
	live, err := f.enqueuer.River.Insert(ctx, IngestArgs{BatchID: id}, nil)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempted_at = now(), attempt = 1 WHERE id = $1`, live.Job.ID)
	require.NoError(t, err)

	// Hold every write to river_job.
	blocker, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = blocker.Exec(ctx, `LOCK TABLE river_job IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	lockWaiters := func() int {
		var n int
		require.NoError(t, f.pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		return n
	}

	s := &Sweeper{Pool: f.pool, River: f.enqueuer.River, Metrics: f.metrics, Logger: slog.New(slog.DiscardHandler)}
	type sweepResult struct {
		n   int
		err error
	}
	swept := make(chan sweepResult, 1)
	go func() {
		n, err := s.Sweep(ctx)
		swept <- sweepResult{n, err}
	}()
	require.Eventually(t, func() bool { return lockWaiters() >= 1 }, 30*time.Second, 5*time.Millisecond,
		"the sweep decided and waits to write")

	// The live delivery takes the lease over now, in the window.
	type acquireResult struct {
		a   lease.Acquisition
		err error
	}
	acquired := make(chan acquireResult, 1)
	go func() {
		a, err := lease.NewStore(f.pool).Acquire(ctx, id, "live/job-2/attempt-1/bb", time.Minute)
		acquired <- acquireResult{a, err}
	}()
	var took acquireResult
	require.Eventually(t, func() bool {
		select {
		case took = <-acquired: // no row lock held it back
			return true
		default:
			return lockWaiters() >= 2 // the sweep's row lock holds it back
		}
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, blocker.Rollback(ctx))

	res := testproc.Await(t, swept, "the sweep")
	require.NoError(t, res.err)
	if took.a.Outcome == 0 && took.err == nil {
		took = <-acquired
	}
	require.NoError(t, took.err)
	require.Equal(t, lease.Acquired, took.a.Outcome, "the live delivery holds the lease")
	require.True(t, took.a.TakenOver)

	require.Zero(t, res.n, "no job is queued beside a live takeover")
	var jobs int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id).Scan(&jobs))
	require.Equal(t, 2, jobs, "no duplicate job")
	var liveMarked, deadMarked bool
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT metadata ? 'cancel_attempted_at' FROM river_job WHERE id = $1`, live.Job.ID).Scan(&liveMarked))
	require.False(t, liveMarked, "the live delivery is not cancelled")
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT metadata ? 'cancel_attempted_at' FROM river_job WHERE id = $1`, deadJob).Scan(&deadMarked))
	require.True(t, deadMarked, "the dead holder's job is marked for cancellation")
	b, err := batch.NewStore(f.pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "live/job-2/attempt-1/bb", *b.LeaseID)
}

// TestSweeperRedeliversADeadRedeliveryOnce: a re-delivered job whose own
// worker died before it took the lease is dead once it has been running for
// OrphanAfter; the sweep marks it cancelled and inserts one more job for the
// same expired generation, in one transaction. A sweep right after inserts
// nothing: at most one live job per (batch, expired generation).
func TestSweeperRedeliversADeadRedeliveryOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	id := f.importBatch(t, "tenant-a")
	leases := lease.NewStore(f.pool)
	a, err := leases.Acquire(ctx, id, "dead/job-1/attempt-1/aa", time.Minute)
	require.NoError(t, err)
	expired, ok, err := leases.Renew(ctx, a.Lease, time.Microsecond)
	require.NoError(t, err)
	require.True(t, ok)
	// Every job of the batch was fetched long ago and died: the enqueued
	// one (the holder) and the sweeper's first re-delivery.
	_, err = f.enqueuer.River.Insert(ctx, IngestArgs{BatchID: id, RedeliveryOf: expired.Generation}, nil)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempted_at = now() - interval '2 minutes', attempt = 1`)
	require.NoError(t, err)

	s := &Sweeper{Pool: f.pool, River: f.enqueuer.River, Metrics: f.metrics, OrphanAfter: time.Minute}
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	var live, cancelled int
	require.NoError(t, f.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE NOT metadata ? 'cancel_attempted_at'), count(*) FILTER (WHERE metadata ? 'cancel_attempted_at')
		FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id).Scan(&live, &cancelled))
	require.Equal(t, 1, live, "one live job for the expired generation")
	require.Equal(t, 2, cancelled, "both dead jobs marked for cancellation")
}

// TestTheFleetSweepsOncePerPeriod: periodic sweeps are fleet-wide, not per
// process. A sweep that finds another process's sweep less than its gap ago
// does nothing, an explicit Sweep always sweeps, and five sweepers ticking
// every 200 ms, out of phase, for two seconds sweep about once per half
// interval between them (each alone would sweep ten times).
func TestTheFleetSweepsOncePerPeriod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	quiet := slog.New(slog.DiscardHandler)
	a := &Sweeper{Pool: f.pool, River: f.enqueuer.River, Logger: quiet}
	b := &Sweeper{Pool: f.pool, River: f.enqueuer.River, Logger: quiet}

	_, swept, err := a.sweep(ctx, time.Hour)
	require.NoError(t, err)
	require.True(t, swept, "the first sweep of the fleet is due")
	_, swept, err = b.sweep(ctx, time.Hour)
	require.NoError(t, err)
	require.False(t, swept, "another process swept within the gap")
	_, err = b.Sweep(ctx)
	require.NoError(t, err)
	var at time.Time
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT swept_at FROM ingest_sweeps WHERE name = 'lease_sweeper'`).Scan(&at))
	_, swept, err = a.sweep(ctx, 300*time.Millisecond)
	require.NoError(t, err)
	require.False(t, swept, "the explicit sweep counts as the fleet's last")
	time.Sleep(350 * time.Millisecond)
	_, swept, err = a.sweep(ctx, 300*time.Millisecond)
	require.NoError(t, err)
	require.True(t, swept, "due again once the gap passed")

	m := metrics.New()
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 5 {
		s := &Sweeper{Pool: f.pool, River: f.enqueuer.River, Interval: 200 * time.Millisecond, Metrics: m, Logger: quiet}
		wg.Go(func() { s.Run(runCtx) })
		// Pods tick out of phase: ticks at the same instant would meet at
		// the advisory lock and skip, hiding how often the fleet sweeps.
		time.Sleep(40 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	stop()
	wg.Wait()
	sweeps := testutil.ToFloat64(m.Sweeps)
	require.LessOrEqual(t, sweeps, 2.0/0.1+2, "at most one sweep per half interval across the five")
	require.GreaterOrEqual(t, sweeps, 4.0, "the fleet still sweeps every interval or so")
}

// TestSweeperGivesUpOnAConnectionThatStopsAnswering: the database host
// vanishes (a failover in which nothing resets the old primary's
// connections): each sweep gives up at its Timeout and the next tick tries
// again, rather than Run waiting for ever on the connection it holds (and
// the process sweeping nothing once the new primary answers).
func TestSweeperGivesUpOnAConnectionThatStopsAnswering(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy, err := chaos.NewProxy(u.Host)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	u.Host = proxy.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	var failed sync.WaitGroup
	failed.Add(2)
	var once [2]sync.Once
	var n int
	var mu sync.Mutex
	logs := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(string(p), "lease sweep failed") && n < 2 {
			once[n].Do(failed.Done)
			n++
		}
		return len(p), nil
	}), nil))
	s := &Sweeper{Pool: pool, Interval: 200 * time.Millisecond, Timeout: 2 * time.Second, Logger: logs}
	_, err = s.Sweep(context.Background()) // a connection to hold when the host vanishes
	require.NoError(t, err)
	proxy.Blackhole(time.Minute)
	t.Cleanup(proxy.EndBlackhole) // before the pool closes: its close waits on the dead connections
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go s.Run(ctx)
	done := make(chan struct{})
	go func() { failed.Wait(); close(done) }()
	testproc.Await(t, done, "two sweeps to give up on the vanished host")
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
