package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/notify"
)

// outcomeJobs are the notifications the outbox inserted for batch id, as
// River holds them.
func outcomeJobs(t *testing.T, pool *pgxpool.Pool, id int64) []notify.Notification {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT args FROM river_job
		WHERE kind = $1 AND queue = $2 AND (args->'notification'->>'batch_id')::bigint = $3
		ORDER BY id`, OutcomeArgs{}.Kind(), NotifyQueue, id)
	require.NoError(t, err)
	raws, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	require.NoError(t, err)
	out := make([]notify.Notification, 0, len(raws))
	for _, raw := range raws {
		var a OutcomeArgs
		require.NoError(t, json.Unmarshal(raw, &a))
		out = append(out, a.Notification)
	}
	return out
}

// TestOutboxAnnouncesOnlyCommittedOutcomes: the outcome job is inserted in
// the transaction of the terminal write: a write rolled back leaves none,
// a write refused (stale lease) none, a committed one exactly one, with
// the outcome, phase, reason and the idempotency key of the term that
// wrote it. A cancel and a first park announce too; a second park of a
// parked batch does not.
func TestOutboxAnnouncesOnlyCommittedOutcomes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	store := batch.NewStore(f.pool).WithOutbox(NewOutbox(f.enqueuer.River))
	leases := lease.NewStore(f.pool)
	acquire := func(id int64) lease.Lease {
		t.Helper()
		a, err := leases.Acquire(ctx, id, "outbox-test", time.Minute)
		require.NoError(t, err)
		require.Equal(t, lease.Acquired, a.Outcome)
		return a.Lease
	}

	id := f.importBatch(t, "tenant-a")
	l := acquire(id)

	// Rolled back: the failure and its notification go together.
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = store.WithTx(tx).MarkFailedBecause(ctx, l.Fence(), batch.Details{Version: batch.DetailsVersion}, batch.PhaseFailedPreCommit, batch.ReasonFolderIncomplete, "no marker")
	require.NoError(t, err)
	require.Len(t, outcomeJobsTx(t, tx, id), 1, "inside the transaction the job is there")
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, outcomeJobs(t, f.pool, id), "a rolled-back outcome is never announced")
	b, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, b.Status)

	// Refused: a stale term writes nothing and announces nothing.
	stale := l.Fence()
	stale.Generation++
	_, err = store.MarkSucceeded(ctx, stale, batch.Details{Version: batch.DetailsVersion})
	require.ErrorIs(t, err, batch.ErrStaleLease)
	require.Empty(t, outcomeJobs(t, f.pool, id))

	// Committed: exactly one announcement.
	_, err = store.MarkFailedBecause(ctx, l.Fence(), batch.Details{Version: batch.DetailsVersion}, batch.PhaseFailedPreCommit, batch.ReasonFolderIncomplete, "no marker")
	require.NoError(t, err)
	got := outcomeJobs(t, f.pool, id)
	require.Len(t, got, 1)
	n := got[0]
	require.Equal(t, notify.OutcomeFailed, n.Outcome)
	require.Equal(t, "Failed", n.Status)
	require.Equal(t, string(batch.PhaseFailedPreCommit), n.Phase)
	require.Equal(t, string(batch.ReasonFolderIncomplete), n.Reason)
	require.Equal(t, "no marker", n.Message)
	require.Equal(t, "tenant-a", n.TenantID)
	require.NotEmpty(t, b.UID, "a batch reserved today has a uid")
	require.Equal(t, b.UID, n.BatchUID)
	require.Equal(t, "batch-"+b.UID+"-failed-"+strconv.FormatInt(l.Generation, 10), n.IdempotencyKey,
		"the key names the batch by its uid, which no restore hands out again")
	require.Equal(t, notify.Key(b.Ref(), notify.OutcomeFailed, l.Generation), n.IdempotencyKey)
	require.True(t, strings.HasPrefix(n.Folder, "mem://"), n.Folder)
	require.False(t, n.At.IsZero())

	// A cancel (the enqueuer's door) announces its failure.
	cancelled := f.importBatch(t, "tenant-a")
	res, err := f.enqueuer.Cancel(ctx, CancelRequest{BatchID: cancelled, TenantID: "tenant-a", By: "cli:test", Reason: "not wanted"})
	require.NoError(t, err)
	require.Equal(t, OutcomeCancelled, res.Outcome)
	got = outcomeJobs(t, f.pool, cancelled)
	require.Len(t, got, 1)
	require.Equal(t, notify.OutcomeFailed, got[0].Outcome)
	require.Equal(t, string(batch.PhaseCancelled), got[0].Phase)

	// A park announces once, however many deliveries park it.
	parked := f.importBatch(t, "tenant-b")
	_, err = store.Park(ctx, acquire(parked).Fence(), "unknown details version")
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE ingestion_batches SET execution_lease_expires_at = now() - interval '1 second' WHERE id = $1`, parked)
	require.NoError(t, err)
	_, err = store.Park(ctx, acquire(parked).Fence(), "unknown details version")
	require.NoError(t, err)
	got = outcomeJobs(t, f.pool, parked)
	require.Len(t, got, 1, "the second park is no new outcome")
	require.Equal(t, notify.OutcomeParked, got[0].Outcome)
	require.Equal(t, "Running", got[0].Status)
	require.Equal(t, "unknown details version", got[0].Message)
}

func outcomeJobsTx(t *testing.T, tx pgx.Tx, id int64) []int64 {
	t.Helper()
	rows, err := tx.Query(context.Background(), `
		SELECT id FROM river_job WHERE kind = $1 AND (args->'notification'->>'batch_id')::bigint = $2`, OutcomeArgs{}.Kind(), id)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// TestOutboxFailureRollsTheOutcomeBack: an outcome whose announcement
// cannot be recorded is not written either (the batch stays Running for a
// later delivery), so no outcome goes unannounced.
func TestOutboxFailureRollsTheOutcomeBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	store := batch.NewStore(f.pool).WithOutbox(failingOutbox{})
	id := f.importBatch(t, "tenant-a")
	a, err := lease.NewStore(f.pool).Acquire(ctx, id, "outbox-test", time.Minute)
	require.NoError(t, err)
	_, err = store.MarkSucceeded(ctx, a.Lease.Fence(), batch.Details{Version: batch.DetailsVersion})
	require.ErrorIs(t, err, errOutboxDown)
	b, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, b.Status)
	require.NotNil(t, b.LeaseID, "the term is still held: the write did not happen")
}

var errOutboxDown = errors.New("outbox down")

type failingOutbox struct{}

func (failingOutbox) Outcome(context.Context, pgx.Tx, batch.Batch) error { return errOutboxDown }

// TestOutboxOnlyForTenantsWithDestinations: the worker's outbox inserts
// the notification of a tenant that names a destination (tagged with the
// tenant and the batch, as its ingest jobs are, for the River UI) and
// none for a tenant that names none.
func TestOutboxOnlyForTenantsWithDestinations(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	cfg, err := notify.Parse([]byte(`{"tenants": {"tenant-a": [{"name": "hook", "kind": "webhook", "url": "https://hooks.example.com/fleet", "secret": "0123456789abcdef"}]}}`))
	require.NoError(t, err)
	store := batch.NewStore(f.pool).WithOutbox(NewOutbox(f.enqueuer.River).For(cfg))
	succeed := func(tenant string) int64 {
		t.Helper()
		id := f.importBatch(t, tenant)
		a, err := lease.NewStore(f.pool).Acquire(ctx, id, "outbox-test", time.Minute)
		require.NoError(t, err)
		_, err = store.MarkSucceeded(ctx, a.Lease.Fence(), batch.Details{Version: batch.DetailsVersion})
		require.NoError(t, err)
		return id
	}
	a, b := succeed("tenant-a"), succeed("tenant-b")
	require.Len(t, outcomeJobs(t, f.pool, a), 1)
	require.Empty(t, outcomeJobs(t, f.pool, b), "a tenant without destinations costs its batches no job")
	var tags []string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT tags FROM river_job WHERE kind = $1 AND (args->'notification'->>'batch_id')::bigint = $2`, OutcomeArgs{}.Kind(), a).Scan(&tags))
	require.Equal(t, Tags("tenant-a", a), tags)
}
