package jobs

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
)

// commitThenLose commits every load and then reports a transient error, as
// a warehouse statement that committed after its client stopped waiting.
type commitThenLose struct{ warehouse.Warehouse }

func (c commitThenLose) Load(ctx context.Context, s warehouse.Slice, src *folder.Source, objs []folder.Object, before func(context.Context) error) (warehouse.Stamp, error) {
	if _, err := c.Warehouse.Load(ctx, s, src, objs, before); err != nil {
		return warehouse.Stamp{}, err
	}
	return warehouse.Stamp{}, context.DeadlineExceeded
}

// TestGivingUpReadsTheCommitBack: when the last attempt's load committed
// but the delivery never learned it, the batch that exhausted its retries
// is recorded failed_publication with the commit (resumable), not
// failed_pre_commit: the stamp is read back, never assumed.
func TestGivingUpReadsTheCommitBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: commitThenLose{warehouse.NewPostgres(pool)}, Logger: slog.New(slog.DiscardHandler)}
	f := newFixtureOn(t, pool, p)
	id := f.importBatch(t, "tenant-a")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	res, err := f.tw.Work(ctx, t, tx, IngestArgs{BatchID: id}, &river.InsertOpts{MaxAttempts: 1})
	require.NoError(t, err)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind, "the batch is recorded failed; the job is done")

	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	require.Equal(t, batch.PhaseFailedPublication, d.Phase, "the slice is stamped with the batch: it committed")
	require.True(t, d.RedshiftCommitted)
	require.NotNil(t, d.CommittedAt)
	require.Positive(t, d.RecordCount)
}

// slowStampAfterFailedLoad fails every load transiently without loading,
// and, once a load has failed, runs onStamp before each stamp read: the
// give-up's read of the commit back, slowed or interfered with.
type slowStampAfterFailedLoad struct {
	warehouse.Warehouse
	failed  atomic.Bool
	onStamp func(ctx context.Context)
}

func (s *slowStampAfterFailedLoad) Load(context.Context, warehouse.Slice, *folder.Source, []folder.Object, func(context.Context) error) (warehouse.Stamp, error) {
	s.failed.Store(true)
	return warehouse.Stamp{}, context.DeadlineExceeded
}

func (s *slowStampAfterFailedLoad) Stamp(ctx context.Context, tenantID, scope string) (warehouse.Stamp, bool, error) {
	if s.failed.Load() {
		s.onStamp(ctx)
	}
	return s.Warehouse.Stamp(ctx, tenantID, scope)
}

// leaseOf reads a batch's lease: holder, generation, expiry and whether it
// has expired, by the database clock.
func leaseOf(t *testing.T, pool *pgxpool.Pool, id int64) (holder *string, gen int64, expiresAt *time.Time, expired bool) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT execution_lease_id, execution_lease_generation, execution_lease_expires_at,
		       coalesce(execution_lease_expires_at <= now(), true)
		FROM ingestion_batches WHERE id = $1`, id).Scan(&holder, &gen, &expiresAt, &expired))
	return holder, gen, expiresAt, expired
}

// TestGivingUpSurvivesASlowStampRead: the last attempt fails transiently and
// the give-up's read of the warehouse stamp takes longer than the lease TTL
// (2 s), by the database clock. The give-up's term is renewed like any
// other while it reads, so the batch is still recorded failed (the scope is
// not left reserved by a batch nobody retries), within its term.
func TestGivingUpSurvivesASlowStampRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	wh := &slowStampAfterFailedLoad{Warehouse: warehouse.NewPostgres(pool)}
	var giveUpGen int64
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Logger: slog.New(slog.DiscardHandler)}
	f := newFixtureOn(t, pool, p)
	id := f.importBatch(t, "tenant-a")
	wh.onStamp = func(ctx context.Context) {
		_, gen, exp, _ := leaseOf(t, pool, id)
		require.NotNil(t, exp, "the give-up holds the lease while it reads")
		giveUpGen = gen
		// Slow: until the database clock is past the term's expiry at
		// the start of the read, plus a renewal period.
		require.Eventually(t, func() bool {
			var past bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT now() > $1::timestamptz + interval '200 milliseconds'`, *exp).Scan(&past))
			return past
		}, 20*time.Second, 20*time.Millisecond)
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, workErr := f.tw.Work(ctx, t, tx, IngestArgs{BatchID: id}, &river.InsertOpts{MaxAttempts: 1})

	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status, "the give-up's write landed although its read outlasted the TTL (delivery error: %v)", workErr)
	require.NoError(t, workErr)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	require.Equal(t, batch.PhaseFailedPreCommit, d.Phase)
	last := d.Writes[len(d.Writes)-1]
	require.Equal(t, giveUpGen, last.Generation, "written by the give-up's own term")
	require.Equal(t, batch.StatusFailed, last.Status)
}

// TestGivingUpWritesNothingOnceItsTermIsLost settles the suspicion that the
// give-up's lease could write after its term ended: while the give-up reads
// the warehouse stamp, its term expires behind its back and a successor
// takes the batch over. The give-up's fenced MarkFailed is refused by the
// database: the batch stays Running under the successor, and no write of
// the give-up's generation is recorded.
func TestGivingUpWritesNothingOnceItsTermIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	wh := &slowStampAfterFailedLoad{Warehouse: warehouse.NewPostgres(pool)}
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Logger: slog.New(slog.DiscardHandler)}
	f := newFixtureOn(t, pool, p)
	id := f.importBatch(t, "tenant-a")
	var giveUpGen int64
	wh.onStamp = func(ctx context.Context) {
		_, gen, _, _ := leaseOf(t, pool, id)
		giveUpGen = gen
		_, err := pool.Exec(context.WithoutCancel(ctx), `UPDATE ingestion_batches SET execution_lease_expires_at = now() WHERE id = $1`, id)
		require.NoError(t, err)
		a, err := lease.NewStore(pool).Acquire(context.WithoutCancel(ctx), id, "successor", time.Minute)
		require.NoError(t, err)
		require.True(t, a.TakenOver)
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = f.tw.Work(ctx, t, tx, IngestArgs{BatchID: id}, &river.InsertOpts{MaxAttempts: 1})
	require.ErrorIs(t, err, context.DeadlineExceeded, "the give-up did not record the batch: the delivery ends with the last attempt's error")

	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, b.Status, "the successor's batch stays Running")
	require.Equal(t, "successor", *b.LeaseID)
	require.Equal(t, giveUpGen+1, b.LeaseGeneration)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	for _, w := range d.Writes {
		require.NotEqual(t, giveUpGen, w.Generation, "no write of the give-up's term after it was lost")
	}
}
