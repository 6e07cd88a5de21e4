package lease_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func reserve(t testing.TB, pool *pgxpool.Pool, tenant, folder string) batch.Batch {
	t.Helper()
	res, err := batch.NewStore(pool).Reserve(context.Background(), batch.Reservation{
		CompanyID: "company-1", TenantID: tenant, TenantDatabase: "tenant_db",
		SourceType: batch.SourceTypeFleetS3, IngestionMode: batch.IngestionModeFileUpload,
		PipelineStage: batch.PipelineStageFleet, SourceScope: "fleet_s3:" + folder,
		Details: batch.NewDetails(folder),
	})
	require.NoError(t, err)
	require.Equal(t, batch.Reserved, res.Outcome)
	return res.Batch
}

// waitExpired blocks until the database clock has passed the lease expiry.
// It polls the database rather than sleeping a guessed amount.
func waitExpired(t *testing.T, pool *pgxpool.Pool, l lease.Lease) {
	t.Helper()
	require.Eventually(t, func() bool {
		var expired bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT now() >= $1`, l.ExpiresAt).Scan(&expired))
		return expired
	}, 10*time.Second, 5*time.Millisecond)
}

func TestAcquire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)

	t.Run("fresh acquisition uses the database clock", func(t *testing.T) {
		b := reserve(t, pool, "tenant-a", "s3://bucket/fresh")
		var before time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT now()`).Scan(&before))
		a, err := leases.Acquire(ctx, b.ID, "delivery-1", 30*time.Second)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		require.False(t, a.TakenOver)
		require.Equal(t, int64(1), a.Lease.Generation)
		require.WithinDuration(t, a.Now.Add(30*time.Second), a.Lease.ExpiresAt, time.Millisecond)
		require.True(t, !a.Now.Before(before))

		got, err := batch.NewStore(pool).Get(ctx, b.ID)
		require.NoError(t, err)
		require.Equal(t, "delivery-1", *got.LeaseID)
		require.Equal(t, int64(1), got.LeaseGeneration)
	})

	t.Run("the acquisition returns the batch row it left", func(t *testing.T) {
		// pipeline.Begin works on Acquisition.Batch instead of reading
		// the batch again: it must be exactly what a read returns, for a
		// fresh acquisition and for a takeover (a new term in the trail,
		// the generation moved on).
		b := reserve(t, pool, "tenant-a", "s3://bucket/returns-row")
		for i, holder := range []string{"delivery-1", "delivery-2"} {
			if i > 0 {
				_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET execution_lease_expires_at = now() - interval '1 second' WHERE id = $1`, b.ID)
				require.NoError(t, err)
			}
			a, err := leases.Acquire(ctx, b.ID, holder, 30*time.Second)
			require.NoError(t, err)
			require.Equal(t, lease.Acquired, a.Outcome)
			require.Equal(t, i > 0, a.TakenOver)
			got, err := batch.NewStore(pool).Get(ctx, b.ID)
			require.NoError(t, err)
			require.Equal(t, got, a.Batch)
			require.Equal(t, holder, *a.Batch.LeaseID)
			require.Equal(t, int64(i+1), a.Batch.LeaseGeneration)
			require.Equal(t, a.Lease.Generation, a.Batch.LeaseGeneration)
			require.True(t, a.Lease.ExpiresAt.Equal(*a.Batch.LeaseExpiresAt))
			require.True(t, a.Now.Equal(*a.Batch.LeaseRenewedAt))
			require.Equal(t, b.TenantID, a.TenantID)
		}
	})

	t.Run("not found", func(t *testing.T) {
		a, err := leases.Acquire(ctx, 987654321, "delivery-1", time.Second)
		require.NoError(t, err)
		require.Equal(t, lease.NotFound, a.Outcome)
	})

	t.Run("terminal batches cannot acquire", func(t *testing.T) {
		for _, status := range []batch.Status{batch.StatusSucceeded, batch.StatusFailed} {
			b := reserve(t, pool, "tenant-a", "s3://bucket/terminal-"+string(status))
			_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET status = $2 WHERE id = $1`, b.ID, status)
			require.NoError(t, err)
			a, err := leases.Acquire(ctx, b.ID, "delivery-1", time.Minute)
			require.NoError(t, err)
			require.Equal(t, lease.Terminal, a.Outcome)
			require.Equal(t, status, a.Status)
			got, err := batch.NewStore(pool).Get(ctx, b.ID)
			require.NoError(t, err)
			require.Nil(t, got.LeaseID)
			require.Zero(t, got.LeaseGeneration)
		}
	})

	t.Run("a lease finished with a terminal write cannot be reacquired", func(t *testing.T) {
		b := reserve(t, pool, "tenant-a", "s3://bucket/finished")
		a, err := leases.Acquire(ctx, b.ID, "delivery-1", time.Minute)
		require.NoError(t, err)
		_, err = batch.NewStore(pool).MarkSucceeded(ctx, a.Lease.Fence(), batch.NewDetails("f"))
		require.NoError(t, err)
		again, err := leases.Acquire(ctx, b.ID, "delivery-2", time.Minute)
		require.NoError(t, err)
		require.Equal(t, lease.Terminal, again.Outcome)
	})

	t.Run("invalid arguments", func(t *testing.T) {
		_, err := leases.Acquire(ctx, 1, "", time.Second)
		require.Error(t, err)
		_, err = leases.Acquire(ctx, 1, "holder", 0)
		require.ErrorIs(t, err, lease.ErrInvalidTTL)
	})
}

// TestConcurrentDeliveriesOneHolder releases 32 acquisitions of one batch
// together, each on its own connection, for 20 rounds: exactly one wins each
// round and the others see it as the live holder.
func TestConcurrentDeliveriesOneHolder(t *testing.T) {
	t.Parallel()
	const (
		clients = 32
		rounds  = 20
	)
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	conns := make([]*pgxpool.Conn, clients)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns[i] = c
		t.Cleanup(c.Release)
	}

	for round := range rounds {
		b := reserve(t, pool, "tenant-a", fmt.Sprintf("s3://bucket/deliveries-%d", round))
		results := make([]lease.Acquisition, clients)
		errs := make([]error, clients)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				<-start
				results[i], errs[i] = lease.NewStore(conns[i]).Acquire(ctx, b.ID, fmt.Sprintf("delivery-%d-%d", round, i), time.Minute)
			})
		}
		close(start)
		wg.Wait()

		winner := ""
		for i := range clients {
			require.NoError(t, errs[i])
			if results[i].Outcome == lease.Acquired {
				require.Empty(t, winner, "round %d: two holders", round)
				winner = results[i].Lease.HolderID
				require.Equal(t, int64(1), results[i].Lease.Generation)
			}
		}
		require.NotEmpty(t, winner, "round %d: nobody acquired", round)
		for i := range clients {
			if results[i].Outcome != lease.Acquired {
				require.Equal(t, lease.Held, results[i].Outcome)
				require.Equal(t, winner, results[i].PreviousHolder)
			}
		}
	}
}

func TestExpiredLeaseTakenOverLiveRenewedLeaseNot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	b := reserve(t, pool, "tenant-a", "s3://bucket/takeover")

	// The TTL is long enough that a renewal delayed by a loaded machine
	// still finds its term live; the test lasts about one TTL.
	const ttl = 3 * time.Second
	first, err := leases.Acquire(ctx, b.ID, "delivery-1", ttl)
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, first.Outcome)

	// Renewed like a heartbeat until the database clock is past the first
	// term's expiry, the lease stays live and cannot be taken.
	l := first.Lease
	for {
		var ok bool
		l, ok, err = leases.Renew(ctx, l, ttl)
		require.NoError(t, err)
		require.True(t, ok)
		var past bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT now() >= $1`, first.Lease.ExpiresAt).Scan(&past))
		if past {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	held, err := leases.Acquire(ctx, b.ID, "delivery-2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, lease.Held, held.Outcome, "a live renewed lease is never taken")
	require.Equal(t, "delivery-1", held.PreviousHolder)
	require.WithinDuration(t, l.ExpiresAt, held.PreviousExpiresAt, time.Microsecond)

	// Once it expires unrenewed, another delivery takes it over.
	waitExpired(t, pool, l)
	taken, err := leases.Acquire(ctx, b.ID, "delivery-2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, taken.Outcome)
	require.True(t, taken.TakenOver)
	require.Equal(t, "delivery-1", taken.PreviousHolder)
	require.Equal(t, l.Generation+1, taken.Lease.Generation)
	require.GreaterOrEqual(t, taken.TakeoverDelay(), time.Duration(0))

	// The old holder can neither renew nor release the new term.
	_, ok, err := leases.Renew(ctx, l, time.Minute)
	require.NoError(t, err)
	require.False(t, ok)
	released, err := leases.Release(ctx, l)
	require.NoError(t, err)
	require.False(t, released)
	got, err := batch.NewStore(pool).Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, "delivery-2", *got.LeaseID)
}

func TestExpiredLeaseCannotBeRenewed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	b := reserve(t, pool, "tenant-a", "s3://bucket/expired-renew")
	a, err := leases.Acquire(ctx, b.ID, "delivery-1", 50*time.Millisecond)
	require.NoError(t, err)
	waitExpired(t, pool, a.Lease)
	_, ok, err := leases.Renew(ctx, a.Lease, time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "an expired term is lost even if nobody took it over")
	_, err = batch.NewStore(pool).WriteDetails(ctx, a.Lease.Fence(), batch.NewDetails("f"))
	require.ErrorIs(t, err, batch.ErrStaleLease)
}

func TestReleaseLetsASuccessorInAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	b := reserve(t, pool, "tenant-a", "s3://bucket/release")
	a, err := leases.Acquire(ctx, b.ID, "delivery-1", time.Hour)
	require.NoError(t, err)
	released, err := leases.Release(ctx, a.Lease)
	require.NoError(t, err)
	require.True(t, released)
	next, err := leases.Acquire(ctx, b.ID, "delivery-2", time.Hour)
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, next.Outcome)
	require.False(t, next.TakenOver, "a released lease is free, not taken over")
	require.Equal(t, int64(2), next.Lease.Generation)
}

func TestStaleHolderWriteRejectedAfterTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	store := batch.NewStore(pool)
	b := reserve(t, pool, "tenant-a", "s3://bucket/stale")

	stale, err := leases.Acquire(ctx, b.ID, "delivery-paused", 50*time.Millisecond)
	require.NoError(t, err)
	waitExpired(t, pool, stale.Lease)
	fresh, err := leases.Acquire(ctx, b.ID, "delivery-successor", time.Minute)
	require.NoError(t, err)
	require.True(t, fresh.TakenOver)

	d := batch.NewDetails("f")
	d.Phase = batch.PhaseLoading
	_, err = store.WriteDetails(ctx, fresh.Lease.Fence(), d)
	require.NoError(t, err)

	// Every kind of write by the paused holder is rejected.
	stalePhase := batch.NewDetails("f")
	stalePhase.Phase = batch.PhaseCommitted
	_, err = store.WriteDetails(ctx, stale.Lease.Fence(), stalePhase)
	require.ErrorIs(t, err, batch.ErrStaleLease)
	_, err = store.MarkSucceeded(ctx, stale.Lease.Fence(), stalePhase)
	require.ErrorIs(t, err, batch.ErrStaleLease)
	_, err = store.MarkFailed(ctx, stale.Lease.Fence(), stalePhase, batch.PhaseFailedPreCommit, "late")
	require.ErrorIs(t, err, batch.ErrStaleLease)
	// A forged fence with the right holder id but an old generation fails too.
	forged := fresh.Lease.Fence()
	forged.Generation--
	_, err = store.WriteDetails(ctx, forged, stalePhase)
	require.ErrorIs(t, err, batch.ErrStaleLease)

	got, err := store.Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, got.Status)
	gotDetails, err := batch.ParseDetails(got.Details)
	require.NoError(t, err)
	require.Equal(t, batch.PhaseLoading, gotDetails.Phase, "the successor's write stands")
	require.Equal(t, "delivery-successor", *got.LeaseID)
}

// TestAuditTrail checks the lease terms (execution_lease_terms) and the
// accepted writes (details.writes) the database records, which the chaos
// invariant checker reads.
func TestAuditTrail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	store := batch.NewStore(pool)
	b := reserve(t, pool, "tenant-a", "s3://bucket/audit")

	// Long terms, so nothing below races a loaded machine's clock; the last
	// renewal shortens the term so that it runs out.
	first, err := leases.Acquire(ctx, b.ID, "delivery-1", time.Minute)
	require.NoError(t, err)
	trail, err := leases.Trail(ctx, b.ID)
	require.NoError(t, err)
	require.Len(t, trail.Terms, 1)
	require.False(t, trail.Terms[0].Closed, "the held term is open")
	_, ok, err := leases.Renew(ctx, first.Lease, time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	// A write from a stale in-memory copy of details must not erase the
	// database's write trail.
	d := batch.NewDetails("f")
	d.Phase = batch.PhaseLoading
	_, err = store.WriteDetails(ctx, first.Lease.Fence(), d)
	require.NoError(t, err)
	renewed, ok, err := leases.Renew(ctx, first.Lease, time.Microsecond)
	require.NoError(t, err)
	require.True(t, ok)
	waitExpired(t, pool, renewed)
	second, err := leases.Acquire(ctx, b.ID, "delivery-2", time.Minute)
	require.NoError(t, err)
	require.True(t, second.TakenOver)
	d.Phase = batch.PhaseCommitted
	_, err = store.WriteDetails(ctx, second.Lease.Fence(), d)
	require.NoError(t, err)
	_, err = store.WriteDetails(ctx, first.Lease.Fence(), d)
	require.ErrorIs(t, err, batch.ErrStaleLease, "rejected writes leave no audit entry")
	_, err = store.MarkSucceeded(ctx, second.Lease.Fence(), d)
	require.NoError(t, err)

	trail, err = leases.Trail(ctx, b.ID)
	require.NoError(t, err)
	require.Len(t, trail.Terms, 2)
	t1, t2 := trail.Terms[0], trail.Terms[1]
	require.Equal(t, "delivery-1", t1.LeaseID)
	require.Equal(t, int64(1), t1.Generation)
	require.True(t, t1.Closed, "the takeover closed the first term")
	require.WithinDuration(t, renewed.ExpiresAt, t1.ExpiresAt, time.Microsecond, "the takeover recorded the term's final expiry")
	require.Nil(t, t1.ReleasedAt, "the first term expired")
	require.Equal(t, "delivery-2", t2.LeaseID)
	require.Equal(t, int64(2), t2.Generation)
	require.True(t, t2.Closed)
	require.NotNil(t, t2.ReleasedAt, "the terminal write released the second term")
	require.False(t, t2.At.Before(t1.End()), "terms never overlap")
	require.Nil(t, trail.ExpiresAt)

	got, err := store.Get(ctx, b.ID)
	require.NoError(t, err)
	details, err := batch.ParseDetails(got.Details)
	require.NoError(t, err)
	require.NotContains(t, string(got.Details), `"leases"`, "the lease trail is not in the details")
	require.Len(t, details.Writes, 3)
	require.Equal(t, []int64{1, 2, 2}, []int64{details.Writes[0].Generation, details.Writes[1].Generation, details.Writes[2].Generation})
	require.Equal(t, batch.PhaseLoading, details.Writes[0].Phase)
	require.Equal(t, batch.StatusSucceeded, details.Writes[2].Status)
	require.Equal(t, batch.PhasePublished, details.Writes[2].Phase)
	for _, w := range details.Writes {
		term := trail.Terms[w.Generation-1]
		require.False(t, w.At.Before(term.At), "a write lies within its term")
		require.False(t, w.At.After(term.End()), "a write lies within its term")
	}

	// Release closes the term with its release time and last expiry.
	c := reserve(t, pool, "tenant-a", "s3://bucket/audit-release")
	a, err := leases.Acquire(ctx, c.ID, "delivery-3", time.Minute)
	require.NoError(t, err)
	later, ok, err := leases.Renew(ctx, a.Lease, 2*time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = leases.Release(ctx, a.Lease)
	require.NoError(t, err)
	trail, err = leases.Trail(ctx, c.ID)
	require.NoError(t, err)
	require.Len(t, trail.Terms, 1)
	require.True(t, trail.Terms[0].Closed)
	require.NotNil(t, trail.Terms[0].ReleasedAt)
	require.WithinDuration(t, later.ExpiresAt, trail.Terms[0].ExpiresAt, time.Microsecond)
	require.Equal(t, *trail.Terms[0].ReleasedAt, trail.Terms[0].End())
}

func TestAuditTrailIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	b := reserve(t, pool, "tenant-a", "s3://bucket/audit-bounded")
	for i := range batch.AuditLimit + 10 {
		a, err := leases.Acquire(ctx, b.ID, fmt.Sprintf("d-%d", i), time.Minute)
		require.NoError(t, err)
		_, err = leases.Release(ctx, a.Lease)
		require.NoError(t, err)
	}
	trail, err := leases.Trail(ctx, b.ID)
	require.NoError(t, err)
	require.Len(t, trail.Terms, batch.AuditLimit)
	require.Equal(t, int64(batch.AuditLimit+10), trail.Terms[len(trail.Terms)-1].Generation)
	require.Equal(t, int64(11), trail.Terms[0].Generation, "the oldest terms are dropped first")
}

// TestLeaseOperationsNeverTouchDetails: acquiring, renewing and releasing a
// lease leave the batch details byte for byte as they were, whatever they
// hold — a document of a version this build does not know, or a large one —
// and a renewal does not touch the term trail either.
func TestLeaseOperationsNeverTouchDetails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	for _, doc := range []string{
		`{"version": 99, "phase": "from-the-future", "leases": "not ours"}`,
		`{"version": 1, "phase": "loading", "padding": "` + strings.Repeat("x", 64<<10) + `"}`,
	} {
		b := reserve(t, pool, "tenant-a", fmt.Sprintf("s3://bucket/untouched-%d", len(doc)))
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = $2::jsonb WHERE id = $1`, b.ID, doc)
		require.NoError(t, err)
		details := func() string {
			var s string
			require.NoError(t, pool.QueryRow(ctx, `SELECT details::text FROM ingestion_batches WHERE id = $1`, b.ID).Scan(&s))
			return s
		}
		before := details()

		a, err := leases.Acquire(ctx, b.ID, "delivery-1", time.Minute)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		require.Equal(t, before, details())
		trail, err := leases.Trail(ctx, b.ID)
		require.NoError(t, err)
		renewed, ok, err := leases.Renew(ctx, a.Lease, 2*time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, before, details())
		after, err := leases.Trail(ctx, b.ID)
		require.NoError(t, err)
		require.Equal(t, trail.Terms, after.Terms, "a renewal leaves the term trail alone")
		require.WithinDuration(t, renewed.ExpiresAt, *after.ExpiresAt, time.Microsecond)
		_, err = leases.RenewMany(ctx, []lease.Lease{renewed}, 3*time.Minute)
		require.NoError(t, err)
		require.Equal(t, before, details())
		released, err := leases.Release(ctx, renewed)
		require.NoError(t, err)
		require.True(t, released)
		require.Equal(t, before, details())
	}
}

// TestRenewManyReportsExactlyTheLostTerms renews five terms in one
// statement: the two still held are renewed, and the expired, taken-over
// and released ones come back lost, each in its place.
func TestRenewManyReportsExactlyTheLostTerms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	acquire := func(name string, ttl time.Duration) lease.Lease {
		b := reserve(t, pool, "tenant-a", "s3://bucket/many-"+name)
		a, err := leases.Acquire(ctx, b.ID, name, ttl)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		return a.Lease
	}
	kept1, expired, takenOver, released, kept2 := acquire("kept1", time.Minute), acquire("expired", time.Minute),
		acquire("taken-over", time.Minute), acquire("released", time.Minute), acquire("kept2", time.Minute)
	short, ok, err := leases.Renew(ctx, expired, time.Microsecond)
	require.NoError(t, err)
	require.True(t, ok)
	waitExpired(t, pool, short)
	gone, ok, err := leases.Renew(ctx, takenOver, time.Microsecond)
	require.NoError(t, err)
	require.True(t, ok)
	waitExpired(t, pool, gone)
	successor, err := leases.Acquire(ctx, takenOver.BatchID, "successor", time.Minute)
	require.NoError(t, err)
	require.True(t, successor.TakenOver)
	_, err = leases.Release(ctx, released)
	require.NoError(t, err)

	in := []lease.Lease{kept1, expired, takenOver, released, kept2}
	res, err := leases.RenewMany(ctx, in, 5*time.Minute)
	require.NoError(t, err)
	require.Len(t, res, len(in))
	for i, want := range []bool{true, false, false, false, true} {
		require.Equal(t, want, res[i].Held, "term %s", in[i].HolderID)
		require.Equal(t, in[i].BatchID, res[i].Lease.BatchID)
		if want {
			require.WithinDuration(t, res[i].Lease.RenewedAt.Add(5*time.Minute), res[i].Lease.ExpiresAt, time.Microsecond)
			require.Equal(t, 5*time.Minute, res[i].Lease.Remaining())
		}
	}
	got, err := batch.NewStore(pool).Get(ctx, takenOver.BatchID)
	require.NoError(t, err)
	require.Equal(t, "successor", *got.LeaseID, "the lost term's renewal did not touch its successor")

	empty, err := leases.RenewMany(ctx, nil, time.Minute)
	require.NoError(t, err)
	require.Empty(t, empty)
}

// TestRenewManySkipsLockedRows: another transaction holds the row locks of
// two batches, one still held by its term and one whose term was taken
// over. RenewMany does not wait: it renews the free terms, reports the
// locked held one Busy (neither renewed nor lost) and the taken-over one
// lost, lock or not. RenewWaiting gives up on the locked row after its
// lock wait with ErrRowLocked, and renews the term once the lock is gone.
func TestRenewManySkipsLockedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	leases := lease.NewStore(pool)
	acquire := func(name string) lease.Lease {
		b := reserve(t, pool, "tenant-a", "s3://bucket/skip-"+name)
		a, err := leases.Acquire(ctx, b.ID, name, time.Minute)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		return a.Lease
	}
	free, locked, takenOver := acquire("free"), acquire("locked"), acquire("taken-over")
	gone, ok, err := leases.Renew(ctx, takenOver, time.Microsecond)
	require.NoError(t, err)
	require.True(t, ok)
	waitExpired(t, pool, gone)
	successor, err := leases.Acquire(ctx, takenOver.BatchID, "successor", time.Minute)
	require.NoError(t, err)
	require.True(t, successor.TakenOver)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT 1 FROM ingestion_batches WHERE id = ANY($1) FOR UPDATE`, []int64{locked.BatchID, takenOver.BatchID})
	require.NoError(t, err)

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second) // it must not wait for the locks
	defer cancel()
	res, err := leases.RenewMany(rctx, []lease.Lease{free, locked, takenOver}, 2*time.Minute)
	require.NoError(t, err)
	require.True(t, res[0].Held)
	require.Equal(t, 2*time.Minute, res[0].Lease.Remaining())
	require.False(t, res[1].Held)
	require.True(t, res[1].Busy, "a held term whose row is locked is busy, not lost")
	require.False(t, res[2].Held)
	require.False(t, res[2].Busy, "a lost term is lost, locked or not")

	_, _, err = leases.RenewWaiting(rctx, locked, 2*time.Minute, 100*time.Millisecond)
	require.ErrorIs(t, err, lease.ErrRowLocked)
	require.NoError(t, tx.Rollback(ctx))
	renewed, ok, err := leases.RenewWaiting(ctx, locked, 2*time.Minute, 100*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 2*time.Minute, renewed.Remaining())
	_, ok, err = leases.RenewWaiting(ctx, takenOver, 2*time.Minute, 100*time.Millisecond)
	require.NoError(t, err)
	require.False(t, ok)
}
