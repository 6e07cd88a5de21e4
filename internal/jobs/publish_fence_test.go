package jobs

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
)

// cancelAroundPublish is the local warehouse (fenced on the batch row, as
// the worker wires it when the warehouse shares the operational database)
// with a hook around the first publication: during, called at the last
// moment before the publication's commit that leaves its lease check
// standing — after the caller's lease check, or, where the fenced write
// inside the transaction is that check (warehouse.Record, the worker's
// case), with the transaction open just before it — or after, called once
// the publication committed and before the delivery records Succeeded.
type cancelAroundPublish struct {
	*warehouse.Postgres
	once          sync.Once
	during, after func()
}

func (c *cancelAroundPublish) Publish(ctx context.Context, s warehouse.Slice, window time.Duration, before func(context.Context) error) (warehouse.Stamp, error) {
	first := false
	c.once.Do(func() { first = true })
	called := false
	hook := func() {
		if first && c.during != nil && !called {
			called = true
			c.during()
		}
	}
	if rec := warehouse.RecordFrom(ctx); rec != nil {
		ctx = warehouse.WithRecord(ctx, func(ctx context.Context, tx pgx.Tx, st warehouse.Stamp) error {
			hook()
			return rec(ctx, tx, st)
		})
	}
	st, err := c.Postgres.Publish(ctx, s, window, func(ctx context.Context) error {
		if err := before(ctx); err != nil {
			return err
		}
		hook()
		return nil
	})
	if err == nil && first && c.after != nil {
		c.after()
	}
	return st, err
}

func publications(t *testing.T, pool *pgxpool.Pool, tenant, scope string) (total int, batches []int64) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT batch_id FROM curated.fleet_publications WHERE tenant_id = $1 AND source_scope = $2 ORDER BY batch_id`, tenant, scope)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		batches = append(batches, id)
	}
	require.NoError(t, rows.Err())
	return len(batches), batches
}

func newPublishFixture(t *testing.T) (*fixture, *cancelAroundPublish) {
	t.Helper()
	pool := pgtest.NewPool(t)
	wh := &cancelAroundPublish{Postgres: warehouse.NewPostgres(pool).WithBatchFence()}
	f := newFixtureOn(t, pool, &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Logger: slog.New(slog.DiscardHandler)})
	return f, wh
}

// TestCancelBetweenPublishLeaseCheckAndCommitAbortsThePublication: an
// operator's cancel commits after the publication's lease check passed and
// before its commit. The publication must not commit (the cancel won), and
// a retry of the cancelled batch then publishes the folder exactly once.
// Before the batch fence the cancelled batch was published, and the retry
// published the folder a second time.
func TestCancelBetweenPublishLeaseCheckAndCommitAbortsThePublication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, wh := newPublishFixture(t)
	id := f.importBatch(t, "tenant-a")
	wh.during = func() {
		res, err := f.enqueuer.Cancel(ctx, CancelRequest{BatchID: id, TenantID: "tenant-a", By: "ops", Reason: "wrong folder"})
		require.NoError(t, err)
		require.Equal(t, OutcomeCancelled, res.Outcome)
	}
	f.work(t, id)

	b, err := batch.NewStore(f.pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
	n, _ := publications(t, f.pool, "tenant-a", b.Scope())
	require.Zero(t, n, "a batch cancelled before its publication committed is not published")
	st, found, err := wh.Stamp(ctx, "tenant-a", b.Scope())
	require.NoError(t, err)
	require.True(t, found, "the load committed before the cancel and keeps its slice")
	require.Nil(t, st.PublishedAt)

	retry, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: id, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeEnqueued, retry.Outcome)
	f.work(t, retry.BatchID)
	n, batches := publications(t, f.pool, "tenant-a", b.Scope())
	require.Equal(t, 1, n, "the folder is published once: by the retry (%v)", batches)
	require.Equal(t, []int64{retry.BatchID}, batches)
}

// TestCancelAfterPublicationCommitIsRefused: the cancel arrives once the
// publication committed. The local warehouse records Succeeded in the
// publication's own transaction (warehouse.WithRecord), so the cancel finds
// the batch Succeeded: it is refused (not_cancellable) and the folder stays
// published once. Before the fence the cancel answered cancelled for a
// published batch, and a retry of it published the folder again.
func TestCancelAfterPublicationCommitIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, wh := newPublishFixture(t)
	id := f.importBatch(t, "tenant-a")
	var cancel Result
	wh.after = func() {
		var err error
		cancel, err = f.enqueuer.Cancel(ctx, CancelRequest{BatchID: id, TenantID: "tenant-a", By: "ops"})
		require.NoError(t, err)
	}
	f.work(t, id)
	require.Equal(t, OutcomeNotCancellable, cancel.Outcome, "%+v", cancel)
	require.Equal(t, string(batch.StatusSucceeded), cancel.Status, "Succeeded committed with the publication")

	b, err := batch.NewStore(f.pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, b.Status)
	retry, err := f.enqueuer.Retry(ctx, RetryRequest{BatchID: id, TenantID: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, OutcomeNotRetryable, retry.Outcome)
	n, _ := publications(t, f.pool, "tenant-a", b.Scope())
	require.Equal(t, 1, n)
}
