package jobs

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
)

// cappedFixture is newFixture with --max-running-per-tenant n.
func cappedFixture(t *testing.T, n int) *fixture {
	t.Helper()
	f := newFixtureOn(t, pgtest.NewPool(t), nil)
	w, err := NewIngestWorker(WorkerConfig{
		Store: batch.NewStore(f.pool), Leases: lease.NewStore(f.pool),
		Pipelines: pipeline.Registry{batch.SourceTypeFleetS3: &fleet.Pipeline{
			AllowLocalFolders: true, Warehouse: warehouse.NewPostgres(f.pool), Logger: slog.New(slog.DiscardHandler)}},
		LeaseTTL: 10 * time.Second, RenewEvery: 200 * time.Millisecond, // see newFixtureOn
		MaxRunningPerTenant: n, FairnessDB: f.pool,
		Metrics: f.metrics, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	f.worker = w
	f.tw = rivertest.NewWorker(t, riverpgxv5.New(f.pool), &river.Config{}, w)
	return f
}

// fetchOrder is the tenants of the available jobs in River's fetch order.
func fetchOrder(t *testing.T, f *fixture) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `
		SELECT b.tenant_id FROM river_job j JOIN ingestion_batches b ON b.id = (j.args->>'batch_id')::bigint
		WHERE j.state = 'available' AND j.scheduled_at <= now() ORDER BY j.priority, j.scheduled_at, j.id`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func jobPriorities(t *testing.T, f *fixture, tenant string) []int {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `
		SELECT j.priority FROM river_job j JOIN ingestion_batches b ON b.id = (j.args->>'batch_id')::bigint
		WHERE b.tenant_id = $1 ORDER BY j.id`, tenant)
	require.NoError(t, err)
	var out []int
	for rows.Next() {
		var p int
		require.NoError(t, rows.Scan(&p))
		out = append(out, p)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestTenantCapSnoozesOnlyWhileAnotherTenantWaits: with a cap of 2, a third
// batch of tenant A is snoozed (the attempt given back, the lease not
// taken) while tenant B's job waits, and A's queued jobs drop to the lowest
// priority so B's are fetched first. Once B runs too, nothing waits and
// A's third batch runs: the cap is work-conserving. Without a cap it runs
// at once.
func TestTenantCapSnoozesOnlyWhileAnotherTenantWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := cappedFixture(t, 2)
	a1, a2, a3 := f.importBatch(t, "tenant-a"), f.importBatch(t, "tenant-a"), f.importBatch(t, "tenant-a")
	b1 := f.importBatch(t, "tenant-b")
	leases := lease.NewStore(f.pool)
	for _, id := range []int64{a1, a2} {
		a, err := leases.Acquire(ctx, id, "elsewhere-"+time.Now().Format("150405.000000"), time.Minute)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
	}

	res := f.work(t, a3)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind, "over the cap while B waits")
	require.Equal(t, 0, res.Job.Attempt, "a deferral is not an attempt")
	got, err := batch.NewStore(f.pool).Get(ctx, a3)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, got.Status)
	require.Nil(t, got.LeaseID, "a deferred delivery takes no lease")
	require.Equal(t, []string{"tenant-b", "tenant-a", "tenant-a", "tenant-a"}, fetchOrder(t, f),
		"A's queued jobs moved behind B's, still available")
	require.Equal(t, []int{1}, jobPriorities(t, f, "tenant-b"), "B's job keeps its priority")
	schedule := func() (s string) {
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT string_agg(id || '@' || scheduled_at || '/' || priority, ',' ORDER BY id) FROM river_job`).Scan(&s))
		return s
	}
	before := schedule()
	require.Equal(t, river.EventKindJobSnoozed, f.work(t, a3).EventKind, "still over the cap")
	require.Equal(t, before, schedule(), "nothing of A is ahead of B any more: no job moves")
	require.Equal(t, float64(2), counterValue(t, f.metrics, "ingest_tenant_cap_deferrals_total", ""))

	// B's batch runs now: nothing of another tenant waits.
	_, err = leases.Acquire(ctx, b1, "elsewhere-b", time.Minute)
	require.NoError(t, err)
	res = f.work(t, a3)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind, "no one waits: A may use the worker")
	got, err = batch.NewStore(f.pool).Get(ctx, a3)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, got.Status)

	// A tenant under its cap is never deferred, and neither is any tenant
	// without a cap.
	b2 := f.importBatch(t, "tenant-b")
	a4 := f.importBatch(t, "tenant-a")
	require.Equal(t, river.EventKindJobCompleted, f.work(t, b2).EventKind, "B holds one lease: under its cap")
	uncapped := newFixtureOn(t, f.pool, nil)
	require.Equal(t, river.EventKindJobCompleted, uncapped.work(t, a4).EventKind, "no cap")
}

// TestTenantCapHoldsAcrossConcurrentAcquisitions: eight deliveries of one
// tenant's batches race for the lease at once, from as many connections,
// while another tenant waits; the cap (2) is decided under the tenant's
// lock in PostgreSQL, so exactly two acquire.
func TestTenantCapHoldsAcrossConcurrentAcquisitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := cappedFixture(t, 2)
	ids := make([]int64, 8)
	for i := range ids {
		ids[i] = f.importBatch(t, "tenant-a")
	}
	f.importBatch(t, "tenant-b")

	var (
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		acquired, deferred int
	)
	start := make(chan struct{})
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a, held, over, err := f.worker.acquireFair(ctx, id, "racer-"+time.Now().Format("150405.000000000"))
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case over != nil:
				deferred++
			case a.Outcome == lease.Acquired:
				acquired++
				held.Close()
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Equal(t, 2, acquired, "exactly the cap acquired")
	require.Equal(t, 6, deferred)
	var leased int
	require.NoError(t, f.pool.QueryRow(ctx, `
		SELECT count(*) FROM ingestion_batches WHERE tenant_id = 'tenant-a' AND execution_lease_id IS NOT NULL`).Scan(&leased))
	require.Equal(t, 2, leased)
}

// TestCappedAcquisitionStampsItsTermAfterTheTenantsLock is the audit's
// repro of a capped acquisition whose lease expired before its holder
// thought: the acquisition waits on the tenant's lock inside its
// transaction, and the term used to be stamped from the transaction's
// start (now()) while the holder's local deadline ran from after the
// wait. Here the wait (3 s) is longer than the safety margin (1 s of a
// 10 s term), so the old stamp put the local deadline about 2 s after the
// database's expiry. The holder's local deadline must never be later than
// the database's expiry (both read on this machine's clock).
func TestCappedAcquisitionStampsItsTermAfterTheTenantsLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := cappedFixture(t, 1)
	id := f.importBatch(t, "acme")

	// Another acquisition of the tenant holds its lock (an injected hold).
	holder, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = holder.Exec(ctx, fairnessLockSQL, id)
	require.NoError(t, err)

	type acquired struct {
		a    lease.Acquisition
		held *lease.Holding
		err  error
	}
	done := make(chan acquired, 1)
	go func() {
		a, held, _, err := f.worker.acquireFair(ctx, id, "capped-holder")
		done <- acquired{a, held, err}
	}()
	waitForLockWaiters(t, f.pool, "advisory", 1)
	const wait = 3 * time.Second
	time.Sleep(wait) // the hold: longer than the margin
	require.NoError(t, holder.Commit(ctx))

	var got acquired
	select {
	case got = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the capped acquisition did not return after the tenant's lock was released")
	}
	require.NoError(t, got.err)
	require.Equal(t, lease.Acquired, got.a.Outcome)
	require.NotNil(t, got.held)
	defer got.held.Close()
	deadline := got.held.Deadline()

	var expires time.Time
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT execution_lease_expires_at FROM ingestion_batches WHERE id = $1`, id).Scan(&expires))
	require.False(t, deadline.After(got.a.Lease.ExpiresAt),
		"the holder's local deadline %s is later than the expiry the acquisition stamped %s (by %s)",
		deadline.Format(time.RFC3339Nano), got.a.Lease.ExpiresAt.Format(time.RFC3339Nano), deadline.Sub(got.a.Lease.ExpiresAt))
	require.False(t, deadline.After(expires), "the holder's local deadline is later than the database's expiry")
	// The term runs from after the wait: a full term is left, not one
	// shortened by the wait.
	require.Greater(t, got.a.Lease.ExpiresAt.Sub(got.a.Now), 10*time.Second-time.Millisecond)
}
