package lease_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
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
	elapsed = 59*time.Minute + 10*time.Second // more than a period since the last renewal, by the local clock, and before the deadline (TTL less the default 30 s margin)
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
// revoked is fenced (its context carries ErrLost) but is not lost either:
// it is counted "revoked" and logged as a warning, not an error, whether a
// renewal round or a lease check (Verify) finds it. Before, a cancel that
// a renewal round saw before its delivery did was logged "lease lost" at
// ERROR and counted lost.
func TestRenewerDoesNotReportATermEndedByItsOwnTerminalWriteAsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := lease.NewStore(pool)
	var (
		obs  observed
		logs testproc.SyncBuffer
	)
	r, err := lease.NewRenewer(store, lease.RenewerConfig{TTL: time.Hour, Every: 50 * time.Minute, Observe: obs.observe,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)

	done := reserve(t, pool, "tenant-a", "s3://bucket/ended")
	_, finished, err := r.Acquire(ctx, done.ID, "delivery-finished")
	require.NoError(t, err)
	d, err := batch.ParseDetails(done.Details)
	require.NoError(t, err)
	d.Phase = batch.PhasePublished
	_, err = batch.NewStore(pool).MarkSucceeded(ctx, finished.Lease().Fence(), d)
	require.NoError(t, err)

	cancel := func(folder, delivery string) *lease.Holding {
		b := reserve(t, pool, "tenant-a", folder)
		_, h, err := r.Acquire(ctx, b.ID, delivery)
		require.NoError(t, err)
		res, err := batch.NewStore(pool).Cancel(ctx, batch.CancelRequest{BatchID: b.ID, TenantID: "tenant-a", By: "ops"})
		require.NoError(t, err)
		require.Equal(t, batch.Cancelled, res.Outcome)
		return h
	}
	revoked := cancel("s3://bucket/revoked", "delivery-revoked")

	require.NoError(t, r.RenewAll(ctx))
	lost, _ := obs.get(lease.RenewalLost)
	require.Zero(t, lost, "neither the finished term nor the cancelled one is lost")
	n, _ := obs.get(lease.RenewalRevoked)
	require.Equal(t, 1, n, "the cancelled term is counted revoked")
	require.ErrorIs(t, context.Cause(revoked.Context()), lease.ErrLost, "the cancelled term's work is fenced")
	require.Error(t, context.Cause(finished.Context()), "the finished term is no longer renewed")
	require.NotErrorIs(t, context.Cause(finished.Context()), lease.ErrLost)
	finished.Close()
	revoked.Close()

	// A lease check finds the next cancel first.
	checked := cancel("s3://bucket/revoked-at-a-check", "delivery-checked")
	require.ErrorIs(t, checked.Verify(ctx), batch.ErrStaleLease)
	require.ErrorIs(t, context.Cause(checked.Context()), lease.ErrLost)
	checked.Close()
	n, _ = obs.get(lease.RenewalRevoked)
	require.Equal(t, 2, n, "the term a check found cancelled is counted revoked")
	lost, _ = obs.get(lease.RenewalLost)
	require.Zero(t, lost)

	out := logs.String()
	require.Contains(t, out, `"level":"WARN","msg":"lease revoked: the batch was cancelled by an operator; stopping work on the batch"`)
	require.NotContains(t, out, `"level":"ERROR"`, "a cancel is an operator's decision, not an error")
}

// TestALockedRowDelaysOnlyItsOwnTerm: a process holds four terms; another
// transaction holds the row lock of one batch (an operator's open
// transaction) for longer than the TTL, and of a second one for a few
// renewal periods. Every other term keeps being renewed (its expiry moves
// forward in the database) and keeps working; the term whose row is locked
// past the TTL is not reported lost while its deadline has not passed, and
// self-fences only at that deadline; the term whose lock ends in time is
// renewed again and keeps working.
func TestALockedRowDelaysOnlyItsOwnTerm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := lease.NewStore(pool)
	var obs observed
	const (
		ttl   = 3 * time.Second
		every = 200 * time.Millisecond
	)
	r, err := lease.NewRenewer(store, lease.RenewerConfig{TTL: ttl, Every: every, Observe: obs.observe, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var holdings []*lease.Holding
	for i := range 4 {
		b := reserve(t, pool, "tenant-a", fmt.Sprintf("s3://bucket/locked-row-%d", i))
		_, h, err := r.Acquire(ctx, b.ID, fmt.Sprintf("delivery-%d", i))
		require.NoError(t, err)
		require.NotNil(t, h)
		defer h.Close()
		holdings = append(holdings, h)
	}
	lockedPastTTL, lockedBriefly, free := holdings[0], holdings[1], holdings[2:]

	lock := func(h *lease.Holding) pgx.Tx {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
		_, err = tx.Exec(ctx, `SELECT 1 FROM ingestion_batches WHERE id = $1 FOR UPDATE`, h.Lease().BatchID)
		require.NoError(t, err)
		return tx
	}
	long, brief := lock(lockedPastTTL), lock(lockedBriefly)
	expiryOf := func(h *lease.Holding) time.Time {
		var at time.Time
		// A plain read: never blocked by the row locks.
		require.NoError(t, pool.QueryRow(ctx, `SELECT execution_lease_expires_at FROM ingestion_batches WHERE id = $1`, h.Lease().BatchID).Scan(&at))
		return at
	}
	lockedExpiry := expiryOf(lockedPastTTL)
	snapshot := map[*lease.Holding]time.Time{}
	for _, h := range holdings {
		snapshot[h] = expiryOf(h)
	}
	// renewedPast reports whether each term's expiry moved past both its
	// own expiry when the locks were taken and at.
	renewedPast := func(hs []*lease.Holding, at time.Time) func() bool {
		return func() bool {
			for _, h := range hs {
				if e := expiryOf(h); !e.After(at) || !e.After(snapshot[h]) {
					return false
				}
			}
			return true
		}
	}

	// The free terms are renewed while both rows stay locked.
	require.Eventually(t, renewedPast(free, lockedExpiry), 10*time.Second, 10*time.Millisecond, "the free terms were not renewed while another row was locked")
	require.True(t, time.Now().Before(lockedPastTTL.Deadline()), "the test observed the locked term before its deadline")
	require.NoError(t, lockedPastTTL.Context().Err(), "a term whose row is locked is unknown, not lost, before its deadline")
	lost, _ := obs.get(lease.RenewalLost)
	require.Zero(t, lost, "no term was reported lost")
	require.Eventually(t, func() bool { busy, _ := obs.get(lease.RenewalBusy); return busy > 0 }, 10*time.Second, 10*time.Millisecond, "the locked terms were counted busy")

	// Two more periods; then the brief lock ends and its term is renewed.
	time.Sleep(2 * every)
	require.NoError(t, brief.Rollback(ctx))
	require.Eventually(t, renewedPast([]*lease.Holding{lockedBriefly}, lockedExpiry), 10*time.Second, 10*time.Millisecond, "the term whose lock ended was not renewed")

	// Past the locked term's expiry, by the database clock.
	require.Eventually(t, func() bool {
		var past bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT now() > $1::timestamptz + $2 * interval '1 microsecond'`, lockedExpiry, every.Microseconds()).Scan(&past))
		return past
	}, 10*time.Second, 10*time.Millisecond)
	select {
	case <-lockedPastTTL.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the term whose row stayed locked did not self-fence at its deadline")
	}
	require.ErrorIs(t, context.Cause(lockedPastTTL.Context()), lease.ErrLost)
	for _, h := range append([]*lease.Holding{lockedBriefly}, free...) {
		require.NoError(t, h.Context().Err(), "term of batch %d was fenced", h.Lease().BatchID)
	}
	require.True(t, renewedPast(append([]*lease.Holding{lockedBriefly}, free...), lockedExpiry)(), "the other terms outlived the locked one's expiry in the database")
	lost, _ = obs.get(lease.RenewalLost)
	require.Equal(t, 1, lost, "only the locked term, at its own deadline")
	require.NoError(t, long.Rollback(ctx))
}

// TestDeadlineIsTheReportedExpiryLessTheSafetyMargin: on a local clock that
// stands still, a term's local deadline is the time its request was sent
// plus the time the database said was left, less the safety margin, after
// the acquisition and after every renewal; a renewer without a margin gets
// the default one.
func TestDeadlineIsTheReportedExpiryLessTheSafetyMargin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := lease.NewStore(pool)
	var (
		mu  sync.Mutex
		now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	const margin = 6 * time.Minute
	r, err := lease.NewRenewer(store, lease.RenewerConfig{TTL: time.Hour, Every: 50 * time.Minute, SafetyMargin: margin, Clock: clock})
	require.NoError(t, err)
	b := reserve(t, pool, "tenant-a", "s3://bucket/margin-deadline")
	a, h, err := r.Acquire(ctx, b.ID, "delivery")
	require.NoError(t, err)
	defer h.Close()
	require.Equal(t, time.Hour, a.Lease.Remaining())
	require.Equal(t, clock().Add(a.Lease.Remaining()-margin), h.Deadline(), "acquired: reported expiry less the margin")

	mu.Lock()
	now = now.Add(10 * time.Minute)
	mu.Unlock()
	require.NoError(t, r.RenewAll(ctx))
	require.Equal(t, clock().Add(h.Lease().Remaining()-margin), h.Deadline(), "renewed: reported expiry less the margin")
	require.Equal(t, clock().Add(time.Hour-margin), h.Deadline())

	require.Equal(t, 3*time.Second, lease.DefaultSafetyMargin(30*time.Second, 10*time.Second), "a tenth of the TTL")
	require.Equal(t, 300*time.Millisecond, lease.DefaultSafetyMargin(3*time.Second, time.Second))
	require.Equal(t, 250*time.Millisecond, lease.DefaultSafetyMargin(2*time.Second, time.Second), "at least the renewal retry delay")
	require.Equal(t, 50*time.Millisecond, lease.DefaultSafetyMargin(time.Second, 900*time.Millisecond), "at most half of TTL − period")
	for _, bad := range []time.Duration{-time.Second, 10 * time.Minute, 20 * time.Minute} {
		_, err := lease.NewRenewer(store, lease.RenewerConfig{TTL: time.Hour, Every: 50 * time.Minute, SafetyMargin: bad})
		require.Error(t, err, "margin %s", bad)
	}
}

// TestRenewerDoesNotFenceATermBeforeItsTransactionCommits: a term acquired
// in a transaction (AcquireOn) is invisible to other sessions until the
// commit, so a renewal round in between would find the batch as it was and
// fence the term as lost (under load, make test saw such fresh deliveries
// cancelled: "loading batch N: context canceled"). Renewal rounds of other
// terms run while the transaction is held open; the term survives them,
// and once Committed it is renewed with the others.
func TestRenewerDoesNotFenceATermBeforeItsTransactionCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	var obs observed
	// The period is also each renewal statement's timeout: at 50 ms a
	// loaded machine (load average ~15) timed every round out, and no
	// round counted as renewed within 10 s.
	const every = time.Second
	r, err := lease.NewRenewer(lease.NewStore(pool), lease.RenewerConfig{TTL: 20 * time.Second, Every: every, Observe: obs.observe, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	// Another term keeps the renewal rounds running.
	other := reserve(t, pool, "tenant-a", "s3://bucket/renewer-other")
	_, oh, err := r.Acquire(ctx, other.ID, "delivery-other")
	require.NoError(t, err)
	defer oh.Close()

	b := reserve(t, pool, "tenant-a", "s3://bucket/renewer-in-tx")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	a, h, err := r.AcquireOn(ctx, tx, b.ID, "delivery-in-tx")
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, a.Outcome)
	defer h.Close()
	rounds := func() int { _, calls := obs.get(lease.RenewalRenewed); return calls }
	before := rounds()
	require.Eventually(t, func() bool { return rounds() >= before+3 }, time.Minute, every/5, "renewal rounds ran while the acquisition was uncommitted")
	require.NoError(t, h.Context().Err(), "fenced before its transaction committed: %v", context.Cause(h.Context()))
	lost, _ := obs.get(lease.RenewalLost)
	require.Zero(t, lost)

	require.NoError(t, tx.Commit(ctx))
	h.Committed()
	acquired := h.Lease().ExpiresAt
	require.Eventually(t, func() bool { return h.Lease().ExpiresAt.After(acquired) }, time.Minute, every/5, "renewed once committed")
	require.NoError(t, h.Context().Err())
}
