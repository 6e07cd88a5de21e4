package e2e

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func TestDuplicateJobsExecuteOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	workers := []*workerProc{startWorker(t, dbURL, fastLease...), startWorker(t, dbURL, fastLease...), startWorker(t, dbURL, fastLease...)}

	release := blockLoads(t, pool)
	folderURL := writeFolder(t, sample)
	id := enqueueBatch(t, dbURL, "tenant-a", folderURL)
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	for range 4 { // duplicate deliveries of the same batch
		_, err := client.Insert(ctx, jobs.IngestArgs{BatchID: id}, nil)
		require.NoError(t, err)
	}
	waitLoadBlocked(t, pool, id, "w")
	contended := func() float64 {
		var n float64
		for _, w := range workers {
			n += w.metric(`ingest_lease_acquisitions_total{outcome="contended"}`)
		}
		return n
	}
	require.Eventually(t, func() bool { return contended() >= 4 }, 20*time.Second, 100*time.Millisecond,
		"the four duplicates find the live lease")
	release()

	b := waitStatus(t, pool, id, batch.StatusSucceeded, 30*time.Second)
	require.Equal(t, int64(1), b.LeaseGeneration, "exactly one delivery ever acquired the lease")
	total, distinct := recordCopies(t, pool, b.Scope())
	require.Equal(t, sampleRecords, total)
	require.Equal(t, sampleRecords, distinct)
	var pubs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_publications WHERE batch_id = $1`, id).Scan(&pubs))
	require.Equal(t, 1, pubs)

	// The snoozed duplicates wake, find the batch terminal and complete.
	require.Eventually(t, func() bool { return jobStates(t, pool, id)["completed"] == 5 }, 30*time.Second, 100*time.Millisecond,
		"all five jobs complete: %v", jobStates(t, pool, id))
	var worked, skipped float64
	for _, w := range workers {
		worked += w.metric(`ingest_deliveries_total{outcome="worked"}`)
		skipped += w.metric(`ingest_deliveries_total{outcome="skipped_terminal"}`)
	}
	require.Equal(t, float64(1), worked)
	require.Equal(t, float64(4), skipped)
}

func TestTerminalOrMissingBatchGetsNoWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	w := startWorker(t, dbURL, fastLease...)
	id := enqueueBatch(t, dbURL, "tenant-a", writeFolder(t, sample))
	before := waitStatus(t, pool, id, batch.StatusSucceeded, 30*time.Second)

	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, err = client.Insert(ctx, jobs.IngestArgs{BatchID: id}, nil)
	require.NoError(t, err)
	missing, err := client.Insert(ctx, jobs.IngestArgs{BatchID: 987654}, nil)
	require.NoError(t, err)

	require.Eventually(t, func() bool { return jobStates(t, pool, id)["completed"] == 2 }, 20*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		var state string
		require.NoError(t, pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, missing.Job.ID).Scan(&state))
		return state == "cancelled"
	}, 20*time.Second, 50*time.Millisecond, "a job for a missing batch is cancelled")
	after, _ := getBatch(t, pool, id)
	require.Equal(t, before.LeaseGeneration, after.LeaseGeneration, "no lease was taken")
	require.Equal(t, before.UpdatedAt, after.UpdatedAt, "nothing was written")
	require.Equal(t, float64(1), w.metric(`ingest_deliveries_total{outcome="skipped_terminal"}`))
	require.Equal(t, float64(1), w.metric(`ingest_lease_acquisitions_total{outcome="not_found"}`))
}

// TestKilledWorkerIsTakenOver SIGKILLs the worker holding a batch mid-load
// and expects another worker process to finish it within TTL + 15 s.
func TestKilledWorkerIsTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	const ttl = 3 * time.Second

	victim := startWorker(t, dbURL, fastLease...)
	release := blockLoads(t, pool)
	folderURL := writeFolder(t, sample)
	id := enqueueBatch(t, dbURL, "tenant-a", folderURL)
	held := waitLoadBlocked(t, pool, id, victim.name+"/")
	survivor := startWorker(t, dbURL, fastLease...)

	victim.signal(syscall.SIGKILL)
	killed := time.Now()
	victim.wait(10 * time.Second)

	// The survivor's sweeper re-delivers the batch once the lease expires and
	// the survivor takes it over.
	var taken batch.Batch
	require.Eventually(t, func() bool {
		taken, _ = getBatch(t, pool, id)
		return taken.LeaseGeneration > held.LeaseGeneration && taken.LeaseID != nil && strings.HasPrefix(*taken.LeaseID, survivor.name+"/")
	}, ttl+15*time.Second, 50*time.Millisecond, "no takeover within TTL + 15 s")
	takeover := time.Since(killed)
	release()
	done := waitStatus(t, pool, id, batch.StatusSucceeded, ttl+15*time.Second-takeover)
	finished := time.Since(killed)
	t.Logf("SIGKILL → takeover %.1fs, → Succeeded %.1fs (lease TTL %s)", takeover.Seconds(), finished.Seconds(), ttl)
	require.Less(t, finished, ttl+15*time.Second)

	require.Equal(t, int64(2), done.LeaseGeneration)
	total, distinct := recordCopies(t, pool, done.Scope())
	require.Equal(t, sampleRecords, total, "exactly one copy of each record")
	require.Equal(t, sampleRecords, distinct)
	require.Equal(t, float64(1), survivor.metric(`ingest_lease_acquisitions_total{outcome="taken_over"}`))
	require.GreaterOrEqual(t, survivor.metric(`ingest_sweep_redeliveries_total{outcome="redelivered"}`), float64(1))

	// The dead worker's job, which River would show running until its
	// rescuer (an hour by default), is finalized within one sweep (1 s here)
	// of the takeover: River's view and the queue gauge follow the batch.
	// The bound is TTL + one sweep after the successor finished.
	var (
		running int
		errs    string
	)
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE state = 'running'),
			       COALESCE(string_agg(errors[array_upper(errors, 1)]->>'error', '|') FILTER (WHERE state = 'cancelled'), '')
			FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id).Scan(&running, &errs))
		return running == 0
	}, ttl+time.Second+2*time.Second, 50*time.Millisecond, "no running job for the finished batch")
	require.Contains(t, errs, "superseded: this delivery's lease on batch", "the dead delivery's job is cancelled, saying why")
	require.Eventually(t, func() bool {
		return survivor.metric(`ingest_queue_jobs{state="running"}`) == 0
	}, 5*time.Second, 100*time.Millisecond, "the queue gauge shows no running job")
	require.Equal(t, float64(1), survivor.metric(`ingest_superseded_jobs_finalized_total`))
}

// TestPausedWorkerWritesNothingAfterTakeover SIGSTOPs the lease holder past
// its expiry, lets another worker finish, then SIGCONTs it.
func TestPausedWorkerWritesNothingAfterTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)

	paused := startWorker(t, dbURL, fastLease...)
	release := blockLoads(t, pool)
	folderURL := writeFolder(t, sample)
	id := enqueueBatch(t, dbURL, "tenant-a", folderURL)
	held := waitLoadBlocked(t, pool, id, paused.name+"/")
	paused.signal(syscall.SIGSTOP)
	other := startWorker(t, dbURL, fastLease...)

	require.Eventually(t, func() bool {
		b, _ := getBatch(t, pool, id)
		return b.LeaseGeneration > held.LeaseGeneration
	}, 20*time.Second, 50*time.Millisecond, "no takeover of the paused worker's batch")
	release()
	done := waitStatus(t, pool, id, batch.StatusSucceeded, 20*time.Second)

	var pubsBefore int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_publications`).Scan(&pubsBefore))
	paused.signal(syscall.SIGCONT)
	// The woken worker finds its lease lost (heartbeat or fenced write) and
	// stops without writing.
	paused.waitLog(`lease`, 10*time.Second)
	require.Eventually(t, func() bool {
		logs := paused.logs.String()
		return strings.Contains(logs, "lease heartbeat failed") || strings.Contains(logs, "lease lost") ||
			strings.Contains(logs, "interrupted") || strings.Contains(logs, "transient failure")
	}, 15*time.Second, 100*time.Millisecond, "the paused worker never noticed it lost its lease:\n%s", paused.logs.String())
	time.Sleep(2 * time.Second) // give a stale write every chance to land

	after, _ := getBatch(t, pool, id)
	require.Equal(t, done.UpdatedAt, after.UpdatedAt, "the stale worker wrote nothing")
	require.Equal(t, done.Details, after.Details)
	require.Equal(t, batch.StatusSucceeded, after.Status)
	total, distinct := recordCopies(t, pool, done.Scope())
	require.Equal(t, sampleRecords, total)
	require.Equal(t, sampleRecords, distinct)
	var pubsAfter int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_publications`).Scan(&pubsAfter))
	require.Equal(t, pubsBefore, pubsAfter)
	require.Equal(t, 1, pubsAfter)
	_ = other
}

// TestSIGTERMLeavesBatchResumable stops a worker mid-load: it exits 0 after
// its grace period, releases the lease, and another worker finishes the batch.
// The load given up is no failure: its job is snoozed, which gives River's
// attempt back, so a delivery interrupted on its last attempt is delivered
// again (before, it was discarded and the batch waited for the sweeper).
func TestSIGTERMLeavesBatchResumable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	w := startWorker(t, dbURL, append([]string{"--shutdown-grace", "1s"}, fastLease...)...)
	release := blockLoads(t, pool)
	folderURL := writeFolder(t, sample)
	id := enqueueBatch(t, dbURL, "tenant-a", folderURL)
	waitLoadBlocked(t, pool, id, w.name+"/")
	// This delivery is the job's last attempt.
	_, err := pool.Exec(ctx, `UPDATE river_job SET max_attempts = attempt WHERE (args->>'batch_id')::bigint = $1`, id)
	require.NoError(t, err)

	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait(20*time.Second), "a clean exit")
	b, d := getBatch(t, pool, id)
	require.Equal(t, batch.StatusRunning, b.Status, "left resumable, not failed")
	require.Nil(t, b.LeaseID, "lease released on shutdown")
	require.Equal(t, batch.PhaseLoading, d.Phase)
	require.Contains(t, w.logs.String(), "draining: giving the load up", "a blocked load shows no progress: given up when the grace ends")
	require.Contains(t, w.logs.String(), "the attempt is given back")
	var (
		state             string
		attempt, maxTries int
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT state, attempt, max_attempts FROM river_job WHERE (args->>'batch_id')::bigint = $1`, id).
		Scan(&state, &attempt, &maxTries))
	require.Contains(t, []string{"scheduled", "available"}, state, "the interrupted job waits for the next worker, not discarded")
	require.Less(t, attempt, maxTries, "the interrupted delivery used up no attempt")

	release()
	startWorker(t, dbURL, fastLease...)
	done := waitStatus(t, pool, id, batch.StatusSucceeded, 30*time.Second)
	total, distinct := recordCopies(t, pool, done.Scope())
	require.Equal(t, sampleRecords, total)
	require.Equal(t, sampleRecords, distinct)
}

// TestLongBatchOutlivesRiverTimeoutsAndRunsOnce keeps a batch loading for
// longer than River's default job timeout (1 min) and its rescue interval
// (set to 5 s here): the heartbeat keeps the lease alive, nothing times the
// job out, nothing re-delivers it, and it completes once.
func TestLongBatchOutlivesRiverTimeoutsAndRunsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for more than a minute; skipped under -short")
	}
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	w := startWorker(t, dbURL, append([]string{"--rescue-stuck-jobs-after", "5s"}, fastLease...)...)
	other := startWorker(t, dbURL, fastLease...)

	release := blockLoads(t, pool)
	id := enqueueBatch(t, dbURL, "tenant-a", writeFolder(t, sample))
	held := waitLoadBlocked(t, pool, id, "w")
	time.Sleep(65 * time.Second) // longer than River's default JobTimeout; the batch must not be interrupted
	b, d := getBatch(t, pool, id)
	require.Equal(t, batch.StatusRunning, b.Status)
	require.Equal(t, batch.PhaseLoading, d.Phase)
	require.Equal(t, held.LeaseGeneration, b.LeaseGeneration, "nobody took the lease of the long batch")
	release()

	done := waitStatus(t, pool, id, batch.StatusSucceeded, 30*time.Second)
	require.Equal(t, int64(1), done.LeaseGeneration, "one delivery from start to end")
	total, distinct := recordCopies(t, pool, done.Scope())
	require.Equal(t, sampleRecords, total)
	require.Equal(t, sampleRecords, distinct)
	renewed := w.metric(`ingest_lease_renewals_total{outcome="renewed"}`) + other.metric(`ingest_lease_renewals_total{outcome="renewed"}`)
	require.GreaterOrEqual(t, renewed, float64(60), "the heartbeat renewed the lease every second")
	require.Eventually(t, func() bool { return jobStates(t, pool, id)["completed"] == 1 }, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, map[string]int{"completed": 1}, jobStates(t, pool, id), "one job, never rescued or retried")
}

func TestWorkerProbesAndFlagValidation(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	w := startWorker(t, dbURL, fastLease...)
	require.Equal(t, "ok\n", httpGet(t, "http://"+w.addr+"/healthz"))
	require.Equal(t, "ready\n", httpGet(t, "http://"+w.addr+"/readyz"))
	body := httpGet(t, "http://"+w.addr+"/metrics")
	for _, name := range []string{"ingest_lease_acquisitions_total", "ingest_leases_held", "go_goroutines", "process_resident_memory_bytes"} {
		require.Contains(t, body, name)
	}
	// Tenants label one family only, bounded per pod (--metrics-max-tenants):
	// no other series names a tenant.
	for _, line := range strings.Split(body, "\n") {
		if strings.Contains(line, `tenant="`) || strings.Contains(line, "tenant_id") {
			require.True(t, strings.HasPrefix(line, "ingest_tenant_batches{"), "a tenant label outside ingest_tenant_batches: %s", line)
		}
	}
	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait(20*time.Second))

	for name, args := range map[string][]string{
		"renewal not shorter than ttl": {"run", "--lease-ttl", "5s", "--lease-renew-every", "5s"},
		"zero concurrency":             {"run", "--concurrency", "0"},
		"bad duration":                 {"run", "--lease-ttl", "soon"},
	} {
		cmd := exec.Command(filepath.Join(binDir, "worker"), args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
		out, _ := cmd.CombinedOutput()
		require.Equal(t, 2, cmd.ProcessState.ExitCode(), "%s: %s", name, out)
	}
	cmd := exec.Command(filepath.Join(binDir, "worker"), "run", "--metrics-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://postgres:sekrit-pw@127.0.0.1:1/x?connect_timeout=2")
	out, _ := cmd.CombinedOutput()
	require.Equal(t, 1, cmd.ProcessState.ExitCode(), "unreachable database: %s", out)
	require.NotContains(t, string(out), "sekrit-pw")
}

// TestSkewedWorkerClockFinishesItsBatch runs a worker whose clock is 2.5 s
// ahead of (then behind) the database's, with a 3 s lease renewed every
// second, through a load held up for longer than a lease term: its lease
// deadlines come from the database clock (the time left that each renewal
// reports, added to the local time the renewal was sent), so it keeps
// renewing, never loses its term and finishes the batch under its first
// generation.
func TestSkewedWorkerClockFinishesItsBatch(t *testing.T) {
	t.Parallel()
	for _, skew := range []string{"2500ms", "-2500ms"} {
		t.Run(skew, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dbURL := pgtest.NewDatabaseURL(t)
			pool := pgtest.Pool(t, dbURL)
			w := startWorker(t, dbURL, append(fastLease, "--test-clock-offset="+skew)...)

			release := blockLoads(t, pool)
			id := enqueueBatch(t, dbURL, "tenant-a", writeFolder(t, sample))
			held := waitLoadBlocked(t, pool, id, w.name+"/")
			// Keep the load waiting until the first term is well past its
			// expiry by the database clock: only renewals keep the lease.
			require.Eventually(t, func() bool {
				var past bool
				require.NoError(t, pool.QueryRow(ctx, `SELECT now() > $1::timestamptz + interval '2 seconds'`, *held.LeaseExpiresAt).Scan(&past))
				return past
			}, 30*time.Second, 50*time.Millisecond)
			b, _ := getBatch(t, pool, id)
			require.NotNil(t, b.LeaseID, "the skewed worker still holds its lease")
			require.Equal(t, *held.LeaseID, *b.LeaseID)
			require.Equal(t, held.LeaseGeneration, b.LeaseGeneration)
			require.True(t, b.LeaseExpiresAt.After(*held.LeaseExpiresAt), "renewals extended the term")
			release()

			done := waitStatus(t, pool, id, batch.StatusSucceeded, 30*time.Second)
			require.Equal(t, int64(1), done.LeaseGeneration, "one term from start to finish")
			require.GreaterOrEqual(t, w.metric(`ingest_lease_renewals_total{outcome="renewed"}`), float64(2))
			require.Zero(t, w.metric(`ingest_lease_renewals_total{outcome="lost"}`))
			require.Zero(t, w.metric(`ingest_lease_renewals_total{outcome="error"}`))
		})
	}
}
