package lease_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pgtest"
)

// observed counts what a Renewer reports.
type observed struct {
	mu     sync.Mutex
	counts map[string]int
	calls  map[string]int
}

func (o *observed) observe(outcome string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counts == nil {
		o.counts, o.calls = map[string]int{}, map[string]int{}
	}
	o.counts[outcome] += n
	o.calls[outcome]++
}

func (o *observed) get(outcome string) (terms, calls int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[outcome], o.calls[outcome]
}

// TestRenewerRenewsEveryHeldTermInOneStatementAndFencesTheLostOne holds
// three terms through one renewer; one of them is taken over behind its
// back. One renewal round renews the two that are still held (one
// statement) and cancels exactly the lost one's work with ErrLost.
func TestRenewerRenewsEveryHeldTermInOneStatementAndFencesTheLostOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := lease.NewStore(pool)
	var obs observed
	// A period far longer than the test: only the explicit rounds renew.
	r, err := lease.NewRenewer(store, lease.RenewerConfig{TTL: time.Hour, Every: 50 * time.Minute, Observe: obs.observe})
	require.NoError(t, err)

	var holdings []*lease.Holding
	for i := range 3 {
		b := reserve(t, pool, "tenant-a", fmt.Sprintf("s3://bucket/renewer-%d", i))
		a, h, err := r.Acquire(ctx, b.ID, fmt.Sprintf("delivery-%d", i))
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		require.NotNil(t, h)
		holdings = append(holdings, h)
	}
	require.NoError(t, r.RenewAll(ctx))
	n, calls := obs.get(lease.RenewalRenewed)
	require.Equal(t, 3, n)
	require.Equal(t, 1, calls, "one statement renews every held term")

	// The middle term runs out and is taken over.
	lost := holdings[1].Lease()
	short, ok, err := store.Renew(ctx, lost, time.Microsecond)
	require.NoError(t, err)
	require.True(t, ok)
	waitExpired(t, pool, short)
	successor, err := store.Acquire(ctx, lost.BatchID, "successor", time.Hour)
	require.NoError(t, err)
	require.True(t, successor.TakenOver)

	before := holdings[0].Lease()
	require.NoError(t, r.RenewAll(ctx))
	select {
	case <-holdings[1].Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lost term's work was not cancelled")
	}
	require.ErrorIs(t, context.Cause(holdings[1].Context()), lease.ErrLost)
	require.NoError(t, holdings[0].Context().Err())
	require.NoError(t, holdings[2].Context().Err())
	require.True(t, holdings[0].Lease().ExpiresAt.After(before.ExpiresAt), "the held terms were renewed")
	n, _ = obs.get(lease.RenewalLost)
	require.Equal(t, 1, n)
	require.ErrorIs(t, holdings[1].Verify(ctx), batch.ErrStaleLease, "a lost term never verifies")
	require.NoError(t, holdings[0].Verify(ctx))

	// The next round leaves the lost term out; closing ends the others.
	require.NoError(t, r.RenewAll(ctx))
	n, _ = obs.get(lease.RenewalRenewed)
	require.Equal(t, 3+2+2, n, "the first round, then two rounds of two; a verify of a fresh term renews nothing")
	for _, h := range holdings {
		l := h.Close()
		require.Error(t, h.Context().Err())
		_, err := store.Release(ctx, l)
		require.NoError(t, err)
	}
	got, err := batch.NewStore(pool).Get(ctx, lost.BatchID)
	require.NoError(t, err)
	require.Equal(t, "successor", *got.LeaseID, "the fenced holder's release did not free its successor's lease")
}

// TestVerifyReadsAFreshTermAndRenewsAnOldOne: Verify proves a term renewed
// within the last period with a read (nothing written), renews one that is
// older, and refuses a term whose batch was ended behind its back.
func TestVerifyReadsAFreshTermAndRenewsAnOldOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := lease.NewStore(pool)
	var (
		obs     observed
		mu      sync.Mutex
		start   = time.Now()
		elapsed time.Duration
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return start.Add(elapsed) }
	r, err := lease.NewRenewer(store, lease.RenewerConfig{TTL: time.Hour, Every: 59 * time.Minute, Clock: clock, Observe: obs.observe})
	require.NoError(t, err)
	b := reserve(t, pool, "tenant-a", "s3://bucket/verify")
	_, h, err := r.Acquire(ctx, b.ID, "delivery")
	require.NoError(t, err)
	defer h.Close()
	renewedAt := func() time.Time {
		var at time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT execution_lease_renewed_at FROM ingestion_batches WHERE id = $1`, b.ID).Scan(&at))
		return at
	}
	acquired := renewedAt()

	require.NoError(t, h.Verify(ctx))
	require.Equal(t, acquired, renewedAt(), "a fresh term is checked, not renewed")
	n, _ := obs.get(lease.RenewalRenewed)
	require.Zero(t, n)

	mu.Lock()
	elapsed = 59*time.Minute + 30*time.Second // more than a period since the last renewal, by the local clock
	mu.Unlock()
	require.NoError(t, h.Verify(ctx))
	require.True(t, renewedAt().After(acquired), "an old term is renewed")
	n, _ = obs.get(lease.RenewalRenewed)
	require.Equal(t, 1, n)
	require.Greater(t, h.Deadline().Sub(clock()), 59*time.Minute, "the renewal moved the local deadline")

	// The batch ends behind the holder's back (as an operator's cancel
	// would): the next check refuses and fences the term.
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Failed', execution_lease_id = NULL, execution_lease_expires_at = NULL WHERE id = $1`, b.ID)
	require.NoError(t, err)
	require.ErrorIs(t, h.Verify(ctx), batch.ErrStaleLease)
	require.ErrorIs(t, context.Cause(h.Context()), lease.ErrLost)
}

// TestRenewerDeadlinesComeFromTheDatabaseClock: a process whose clock is an
// hour ahead of (or behind) the database's keeps its terms, because its
// deadlines are its own clock's reading plus the time the database says is
// left — never a database timestamp compared with its clock.
func TestRenewerDeadlinesComeFromTheDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := lease.NewStore(pool)
	for _, skew := range []time.Duration{time.Hour, -time.Hour, 2500 * time.Millisecond} {
		t.Run(skew.String(), func(t *testing.T) {
			// A wall clock off by skew, without Go's monotonic reading.
			clock := func() time.Time { return time.Now().Round(0).Add(skew) }
			const ttl = time.Minute
			r, err := lease.NewRenewer(store, lease.RenewerConfig{TTL: ttl, Every: 100 * time.Millisecond, Clock: clock})
			require.NoError(t, err)
			b := reserve(t, pool, "tenant-a", "s3://bucket/skew-"+skew.String())
			a, h, err := r.Acquire(ctx, b.ID, "delivery")
			require.NoError(t, err)
			defer h.Close()

			left := h.Deadline().Sub(clock())
			require.Greater(t, left, ttl-10*time.Second, "the local deadline is a TTL away on the local clock")
			require.LessOrEqual(t, left, ttl)
			// Renewed every 100 ms by the renewer's own loop.
			require.Eventually(t, func() bool { return h.Lease().ExpiresAt.After(a.Lease.ExpiresAt) }, 10*time.Second, 10*time.Millisecond)
			require.NoError(t, h.Context().Err(), "the term is held whatever the skew")
			require.NoError(t, h.Verify(ctx))
		})
	}
}

// TestRenewerFencesATermWhoseRenewalsFail: when the renewal statements fail
// (here the renewer's pool is closed), the term's work is cancelled with
// ErrLost at its local deadline, which falls before the database lets
// anyone take it over.
func TestRenewerFencesATermWhoseRenewalsFail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, url)
	own := pgtest.Pool(t, url)
	var obs observed
	const ttl = 2 * time.Second
	r, err := lease.NewRenewer(lease.NewStore(own), lease.RenewerConfig{TTL: ttl, Every: 200 * time.Millisecond, Observe: obs.observe, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	b := reserve(t, pool, "tenant-a", "s3://bucket/failing")
	_, h, err := r.Acquire(ctx, b.ID, "delivery")
	require.NoError(t, err)
	defer h.Close()
	own.Close()

	select {
	case <-h.Context().Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the term was not fenced at its deadline")
	}
	require.ErrorIs(t, context.Cause(h.Context()), lease.ErrLost)
	errs, _ := obs.get(lease.RenewalError)
	require.Positive(t, errs, "the failed renewals were counted")
}

// TestRenewerDoesNotReportATermEndedByItsOwnTerminalWriteAsLost: a delivery
// writes its batch's terminal state and, before it stops renewing, a
// renewal round finds the term gone. That term ended; it was not lost: no
// "lost" is counted (the renewals-failing alert reads that counter) and the
// work's context does not carry ErrLost. A term an operator's cancel
// revoked still counts as lost.
func TestRenewerDoesNotReportATermEndedByItsOwnTerminalWriteAsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := lease.NewStore(pool)
	var obs observed
	r, err := lease.NewRenewer(store, lease.RenewerConfig{TTL: time.Hour, Every: 50 * time.Minute, Observe: obs.observe})
	require.NoError(t, err)

	done := reserve(t, pool, "tenant-a", "s3://bucket/ended")
	_, finished, err := r.Acquire(ctx, done.ID, "delivery-finished")
	require.NoError(t, err)
	d, err := batch.ParseDetails(done.Details)
	require.NoError(t, err)
	d.Phase = batch.PhasePublished
	_, err = batch.NewStore(pool).MarkSucceeded(ctx, finished.Lease().Fence(), d)
	require.NoError(t, err)

	cancelled := reserve(t, pool, "tenant-a", "s3://bucket/revoked")
	_, revoked, err := r.Acquire(ctx, cancelled.ID, "delivery-revoked")
	require.NoError(t, err)
	res, err := batch.NewStore(pool).Cancel(ctx, batch.CancelRequest{BatchID: cancelled.ID, TenantID: "tenant-a", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, batch.Cancelled, res.Outcome)

	require.NoError(t, r.RenewAll(ctx))
	lost, _ := obs.get(lease.RenewalLost)
	require.Equal(t, 1, lost, "only the revoked term is lost")
	require.ErrorIs(t, context.Cause(revoked.Context()), lease.ErrLost)
	require.Error(t, context.Cause(finished.Context()), "the finished term is no longer renewed")
	require.NotErrorIs(t, context.Cause(finished.Context()), lease.ErrLost)
	finished.Close()
	revoked.Close()
}
