package retention_test

import (
	"context"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/retention"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// named returns a pool on dbURL whose sessions carry application_name
// name, so a test can see them wait in pg_stat_activity.
func named(t *testing.T, dbURL, name string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return pgtest.Pool(t, u.String())
}

// waitsForALock reports whether a session named application waits for a
// lock in admin's database.
func waitsForALock(t *testing.T, admin *pgxpool.Pool, application string) bool {
	t.Helper()
	var waiting bool
	require.NoError(t, admin.QueryRow(context.Background(), `
		SELECT EXISTS (SELECT FROM pg_stat_activity
		               WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock')`,
		application).Scan(&waiting))
	return waiting
}

// retryFixture is one folder with an old pre-commit failure r1 (prunable:
// not the folder's newest) and a newer failure r2, and an enqueuer that
// retries r1.
func retryFixture(t *testing.T) (dbURL string, admin *pgxpool.Pool, ids map[string]int64, enq *jobs.Enqueuer) {
	t.Helper()
	dbURL = pgtest.NewDatabaseURL(t)
	admin = pgtest.Pool(t, dbURL)
	ids = insert(t, admin, []string{"r1", "r2"}, map[string]row{
		"r1": {tenant: "t1", folder: "r", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit},
		"r2": {tenant: "t1", folder: "r", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit},
	})
	pool := named(t, dbURL, "retry")
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return dbURL, admin, ids, &jobs.Enqueuer{Pool: pool, River: client, Logger: slog.New(slog.DiscardHandler)}
}

// danglingRetries counts batches whose retryOf names a batch that is gone.
func danglingRetries(t *testing.T, admin *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), `
		SELECT count(*) FROM ingestion_batches r
		WHERE r.details ? 'retryOf'
		  AND NOT EXISTS (SELECT FROM ingestion_batches b WHERE b.id::text = r.details->>'retryOf')`).Scan(&n))
	return n
}

type retried struct {
	res jobs.Result
	err error
}

// TestRetryWaitsForAPruneOfItsBatch: a prune's DELETE holds the batch a
// retry names (uncommitted). The retry waits for it (its FOR KEY SHARE),
// then finds the batch gone and answers not_found: no batch names a
// deleted one. Before, the retry reserved its batch at once and named
// the batch the prune then deleted (a dangling retry_of).
func TestRetryWaitsForAPruneOfItsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, admin, ids, enq := retryFixture(t)

	prune, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = prune.Rollback(ctx) }()
	tag, err := prune.Exec(ctx, `DELETE FROM ingestion_batches WHERE id = $1`, ids["r1"])
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	done := make(chan retried, 1)
	go func() {
		res, err := enq.Retry(ctx, jobs.RetryRequest{BatchID: ids["r1"], TenantID: "t1", By: "test"})
		done <- retried{res, err}
	}()
	require.Eventually(t, func() bool { return waitsForALock(t, admin, "retry") }, 30*time.Second, 20*time.Millisecond,
		"the retry did not wait for the prune that holds its batch")
	require.NoError(t, prune.Commit(ctx))

	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, jobs.OutcomeNotFound, r.res.Outcome, "%+v", r.res)
	require.Zero(t, danglingRetries(t, admin))
	require.Equal(t, []int64{ids["r2"]}, remaining(t, admin), "the retry reserved nothing")
}

// TestPruneKeepsABatchRetriedWhileItWaited: a retry holds the batch it
// retries (FOR KEY SHARE) and has reserved its new batch, not yet
// committed (its job insert waits). Prune lists the batch as prunable
// (the retry is not visible to it) and its DELETE waits for the retry;
// once the retry commits, prune sees the new batch name it, rolls the
// round back and keeps the batch (r2, no longer the newest, goes). Before,
// prune did not wait, and deleted the batch the committed retry names.
func TestPruneKeepsABatchRetriedWhileItWaited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, admin, ids, enq := retryFixture(t)

	// The retry's job insert waits behind this lock, its transaction open.
	jobsLock, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = jobsLock.Rollback(ctx) }()
	_, err = jobsLock.Exec(ctx, `LOCK TABLE river_job IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	done := make(chan retried, 1)
	go func() {
		res, err := enq.Retry(ctx, jobs.RetryRequest{BatchID: ids["r1"], TenantID: "t1", By: "test"})
		done <- retried{res, err}
	}()
	require.Eventually(t, func() bool { return waitsForALock(t, admin, "retry") }, 30*time.Second, 20*time.Millisecond)

	pruned := make(chan error, 1)
	var res retention.Result
	go func() {
		var err error
		res, err = retention.Prune(ctx, retention.Config{
			Pool: named(t, dbURL, "prune"), OlderThan: olderThan, Apply: true, LockTimeout: time.Minute,
		})
		pruned <- err
	}()
	require.Eventually(t, func() bool { return waitsForALock(t, admin, "prune") }, 30*time.Second, 20*time.Millisecond,
		"prune did not wait for the retry that holds the batch")
	require.NoError(t, jobsLock.Commit(ctx))

	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, jobs.OutcomeEnqueued, r.res.Outcome, "%+v", r.res)
	require.Equal(t, ids["r1"], r.res.RetryOf)
	require.NoError(t, <-pruned)
	require.Zero(t, danglingRetries(t, admin))
	require.EqualValues(t, 1, res.KeptForRetries)
	// r2, no longer the folder's newest once the retry committed, is an
	// old failure like any other: the walk's next round deletes it.
	require.Equal(t, []int64{ids["r1"], r.res.BatchID}, remaining(t, admin), "prune deleted the batch a committed retry names")
	require.EqualValues(t, 1, res.Batches)
}
