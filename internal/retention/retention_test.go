package retention_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/retention"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

const (
	old       = 40 * 24 * time.Hour
	young     = 26 * time.Hour
	olderThan = 30 * 24 * time.Hour
)

// row describes one batch a test inserts as the table owner.
type row struct {
	tenant, folder string // folder "" is a date-scoped batch (no source scope)
	status         batch.Status
	completedAgo   time.Duration // 0: completed_at NULL
	phase          batch.Phase
	committedAgo   time.Duration // > 0: committed to the warehouse that long ago
	retryOf        string        // the name of the batch this one retries
	parked         bool
}

// insert inserts the rows in order (ids increase) and returns their ids by
// name.
func insert(t *testing.T, pool *pgxpool.Pool, names []string, rows map[string]row) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	ids := map[string]int64{}
	for _, name := range names {
		r := rows[name]
		folder := "s3://fleet-uploads/tenants/" + r.tenant + "/db/c/" + r.folder
		d := batch.NewDetails(folder)
		d.Phase = r.phase
		if r.committedAgo > 0 {
			at := time.Now().Add(-r.committedAgo)
			d.RedshiftCommitted, d.CommittedAt = true, &at
		}
		if r.retryOf != "" {
			d.RetryOf = ids[r.retryOf]
			require.NotZero(t, d.RetryOf, name)
		}
		raw, err := d.Marshal()
		require.NoError(t, err)
		var scope *string
		if r.folder != "" {
			s := "fleet_s3:" + folder
			scope = &s
		}
		var completed *time.Time
		if r.completedAgo > 0 {
			at := time.Now().Add(-r.completedAgo)
			completed = &at
		}
		var parkedAt *time.Time
		var parkedReason *string
		if r.parked {
			now, reason := time.Now(), "test"
			parkedAt, parkedReason = &now, &reason
		}
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `
			INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage,
			                               status, details, source_scope, completed_at, started_at, parked_at, parked_reason)
			VALUES ('c', $1, 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', $2, $3, $4, $5, now() - interval '60 days', $6, $7)
			RETURNING id`, r.tenant, r.status, string(raw), scope, completed, parkedAt, parkedReason).Scan(&id))
		ids[name] = id
	}
	return ids
}

// history is one table with every kind of batch prune must keep, and the
// ones it deletes (prunable).
func history(t *testing.T, pool *pgxpool.Pool) (ids map[string]int64, prunable []string) {
	t.Helper()
	names := []string{
		"a1", "a2", "a3",
		"b1", "b2", "b3",
		"d1", "d2",
		"e0", "e1", "e2",
		"f0", "f1", "f2", "f3", "f4",
		"g1", "g2", "g3", "g4",
		"h1", "h2",
		"legacy",
	}
	rows := map[string]row{
		// Folder a: an old failure (pruned), the newest Succeeded (kept:
		// reconcile's already_succeeded) and the newest batch (kept).
		"a1": {tenant: "t1", folder: "a", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit},
		"a2": {tenant: "t1", folder: "a", status: batch.StatusSucceeded, completedAgo: old, phase: batch.PhasePublished, committedAgo: old},
		"a3": {tenant: "t1", folder: "a", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit},
		// Folder b: an older success (pruned), the newest success, and a
		// Running reimport.
		"b1": {tenant: "t1", folder: "b", status: batch.StatusSucceeded, completedAgo: old, phase: batch.PhasePublished, committedAgo: old},
		"b2": {tenant: "t1", folder: "b", status: batch.StatusSucceeded, completedAgo: old, phase: batch.PhasePublished, committedAgo: old},
		"b3": {tenant: "t1", folder: "b", status: batch.StatusRunning, phase: batch.PhaseLoading},
		// Folder d: a parked Running batch that once completed long ago
		// (a resume) and is not the newest: never deleted.
		"d1": {tenant: "t1", folder: "d", status: batch.StatusRunning, completedAgo: old, phase: batch.PhaseLoading, parked: true},
		"d2": {tenant: "t1", folder: "d", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit},
		// Folder e: an expired failed publication (pruned), one that can
		// still be resumed (kept, though not the newest), the newest.
		"e0": {tenant: "t2", folder: "e", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPublication, committedAgo: old},
		"e1": {tenant: "t2", folder: "e", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPublication, committedAgo: time.Hour},
		"e2": {tenant: "t2", folder: "e", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit},
		// Folder f: old failures that a young retry chain still names
		// (f1 ← f2 ← f3, f3 young): kept; f0, not retried, pruned.
		"f0": {tenant: "t2", folder: "f", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit},
		"f1": {tenant: "t2", folder: "f", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseCancelled},
		"f2": {tenant: "t2", folder: "f", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit, retryOf: "f1"},
		"f3": {tenant: "t2", folder: "f", status: batch.StatusFailed, completedAgo: young, phase: batch.PhaseFailedPreCommit, retryOf: "f2"},
		"f4": {tenant: "t2", folder: "f", status: batch.StatusSucceeded, completedAgo: young, phase: batch.PhasePublished, committedAgo: young, retryOf: "f3"},
		// Folder g: a retry chain that nothing kept names (g1 ← g2), and
		// an older success: all pruned.
		"g1": {tenant: "t3", folder: "g", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit},
		"g2": {tenant: "t3", folder: "g", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit, retryOf: "g1"},
		"g3": {tenant: "t3", folder: "g", status: batch.StatusSucceeded, completedAgo: old, phase: batch.PhasePublished, committedAgo: old},
		"g4": {tenant: "t3", folder: "g", status: batch.StatusSucceeded, completedAgo: young, phase: batch.PhasePublished, committedAgo: young},
		// Folder h: a young failure: kept.
		"h1": {tenant: "t3", folder: "h", status: batch.StatusFailed, completedAgo: young, phase: batch.PhaseFailedPreCommit},
		"h2": {tenant: "t3", folder: "h", status: batch.StatusSucceeded, completedAgo: young, phase: batch.PhasePublished, committedAgo: young},
		// A date-scoped batch of another pipeline: not this program's.
		"legacy": {tenant: "t1", status: batch.StatusSucceeded, completedAgo: old},
	}
	return insert(t, pool, names, rows), []string{"a1", "b1", "e0", "f0", "g1", "g2", "g3"}
}

func remaining(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id FROM ingestion_batches ORDER BY id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

func without(all []int64, gone ...int64) []int64 {
	drop := map[int64]bool{}
	for _, g := range gone {
		drop[g] = true
	}
	var out []int64
	for _, id := range all {
		if !drop[id] {
			out = append(out, id)
		}
	}
	return out
}

func idsOf(ids map[string]int64, names []string) []int64 {
	out := make([]int64, len(names))
	for i, n := range names {
		out[i] = ids[n]
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// TestPruneKeepsWhatIsNeededAndDeletesTheRest: a dry run counts exactly the
// prunable batches and deletes nothing; --apply deletes exactly them and
// keeps Running and parked batches, the newest batch and the newest
// Succeeded batch of every folder, a resumable failed publication, old
// batches a kept batch's retry chain names, young batches and date-scoped
// batches; a second run finds nothing.
func TestPruneKeepsWhatIsNeededAndDeletesTheRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	ids, prunable := history(t, pool)
	before := remaining(t, pool)
	want := idsOf(ids, prunable)

	dry, err := retention.Prune(ctx, retention.Config{Pool: pool, OlderThan: olderThan})
	require.NoError(t, err)
	require.False(t, dry.Applied)
	require.Equal(t, int64(len(want)), dry.Batches)
	require.Equal(t, map[string]int64{"Failed": 5, "Succeeded": 2}, dry.ByStatus)
	require.Equal(t, want[0], dry.MinID)
	require.Equal(t, want[len(want)-1], dry.MaxID)
	require.Equal(t, int64(2), dry.KeptForRetries, "f1 and f2")
	require.WithinDuration(t, time.Now().Add(-olderThan), dry.Cutoff, time.Minute)
	require.Equal(t, before, remaining(t, pool), "a dry run deletes nothing")

	res, err := retention.Prune(ctx, retention.Config{Pool: pool, OlderThan: olderThan, Apply: true})
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.Equal(t, dry.Batches, res.Batches)
	require.Equal(t, dry.ByStatus, res.ByStatus)
	require.Equal(t, dry.MinID, res.MinID)
	require.Equal(t, dry.MaxID, res.MaxID)
	require.Equal(t, without(before, want...), remaining(t, pool), "exactly the prunable batches are gone")

	// What is left is what the read API and reconcile start from.
	latest, err := batch.NewStore(pool).LatestMany(ctx, []batch.ScopeOf{
		{TenantID: "t1", SourceScope: "fleet_s3:s3://fleet-uploads/tenants/t1/db/c/a"},
		{TenantID: "t3", SourceScope: "fleet_s3:s3://fleet-uploads/tenants/t3/db/c/g"},
	})
	require.NoError(t, err)
	require.Len(t, latest, 2)
	by, err := batch.NewStore(pool).RetriedBy(ctx, []int64{ids["f1"], ids["f2"]})
	require.NoError(t, err)
	require.Equal(t, map[int64][]int64{ids["f1"]: {ids["f2"]}, ids["f2"]: {ids["f3"]}}, by, "the retry chain is whole")

	again, err := retention.Prune(ctx, retention.Config{Pool: pool, OlderThan: olderThan, Apply: true})
	require.NoError(t, err)
	require.Zero(t, again.Batches)
	require.Equal(t, without(before, want...), remaining(t, pool))

	// A shorter retention reaches the young failure, never the newest
	// batch, nor the chain the newest batch retries (f4 ← f3 ← f2 ← f1).
	res, err = retention.Prune(ctx, retention.Config{Pool: pool, OlderThan: retention.MinOlderThan, Apply: true})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Batches)
	require.Equal(t, ids["h1"], res.MinID)
	require.Equal(t, int64(3), res.KeptForRetries)
	require.Equal(t, without(before, append(want, ids["h1"])...), remaining(t, pool))
}

// TestPruneDeletesInTransactionsOfBatchSize: more candidates than one
// transaction takes are deleted in several, each logged.
func TestPruneDeletesInTransactionsOfBatchSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	names, rows := []string{}, map[string]row{}
	for i := range 11 {
		name := string(rune('a' + i))
		names = append(names, name)
		rows[name] = row{tenant: "t1", folder: "x", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit}
	}
	ids := insert(t, pool, names, rows)
	var logs bytes.Buffer
	res, err := retention.Prune(ctx, retention.Config{
		Pool: pool, OlderThan: olderThan, Apply: true, BatchSize: 3,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Batches)
	require.Equal(t, 4, res.Transactions, "10 candidates, 3 a transaction")
	require.Equal(t, []int64{ids["k"]}, remaining(t, pool), "the newest batch stays")
	require.Equal(t, 4, bytes.Count(logs.Bytes(), []byte(`"msg":"prune progress"`)), logs.String())
	require.Contains(t, logs.String(), `"msg":"prune finished"`)
}

// TestPruneGivesWayToLocks: a candidate locked by another transaction makes
// its transaction meet lock_timeout; it is tried again, then skipped, and
// the run still ends, within a bound, having deleted the rest. The next
// run deletes what was skipped.
func TestPruneGivesWayToLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	names := []string{"x1", "x2", "x3", "x4", "x5", "newest"}
	rows := map[string]row{}
	for _, n := range names {
		rows[n] = row{tenant: "t1", folder: "x", status: batch.StatusFailed, completedAgo: old, phase: batch.PhaseFailedPreCommit}
	}
	ids := insert(t, pool, names, rows)

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT id FROM ingestion_batches WHERE id = $1 FOR UPDATE`, ids["x3"])
	require.NoError(t, err)

	var logs bytes.Buffer
	start := time.Now()
	res, err := retention.Prune(ctx, retention.Config{
		Pool: pool, OlderThan: olderThan, Apply: true, BatchSize: 2,
		LockTimeout: 100 * time.Millisecond, LockRetries: 2,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	require.NoError(t, err)
	require.Less(t, time.Since(start), 5*time.Second, "bounded: 3 attempts of 100 ms and their pauses")
	require.Equal(t, int64(3), res.Batches, "x1, x2 and x5")
	require.Equal(t, int64(2), res.SkippedLocked, "x3 and x4 shared the locked transaction")
	require.Equal(t, idsOf(ids, []string{"x3", "x4", "newest"}), remaining(t, pool))
	require.Equal(t, 2, bytes.Count(logs.Bytes(), []byte(`"msg":"prune met a lock; trying again"`)), logs.String())
	require.Contains(t, logs.String(), `"msg":"prune skipped locked batches"`)

	require.NoError(t, holder.Rollback(ctx))
	res, err = retention.Prune(ctx, retention.Config{Pool: pool, OlderThan: olderThan, Apply: true})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Batches)
	require.Equal(t, []int64{ids["newest"]}, remaining(t, pool))
}

// TestPruneGivesUpOnALockedTable: a migration holding the table (ACCESS
// EXCLUSIVE) makes prune fail within its lock timeout, not queue behind it.
func TestPruneGivesUpOnALockedTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	ddl, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ddl.Rollback(ctx) }()
	_, err = ddl.Exec(ctx, `LOCK TABLE ingestion_batches IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	start := time.Now()
	_, err = retention.Prune(ctx, retention.Config{Pool: pool, OlderThan: olderThan, Apply: true, LockTimeout: 100 * time.Millisecond})
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "55P03", pgErr.Code)
	require.Less(t, time.Since(start), 5*time.Second)
}

// TestPruneRefusesAShortRetention: less than a day is invalid input, and
// nothing is read.
func TestPruneRefusesAShortRetention(t *testing.T) {
	t.Parallel()
	_, err := retention.Prune(context.Background(), retention.Config{OlderThan: time.Hour})
	var in *retention.InputError
	require.True(t, errors.As(err, &in), "%v", err)
	require.Equal(t, "older_than", in.Field)
}

// TestOperatorLoginPrunes: the operators' login (fleet_operator,
// deploy/postgres/roles.sql) runs prune; row-level security lets it delete
// no Running batch and no folder's newest batch even by hand; the door's
// and the worker's logins may not delete batches at all.
func TestOperatorLoginPrunes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	ids, prunable := history(t, admin)
	before := remaining(t, admin)

	for _, group := range []string{"fleet_enqueue", "fleet_reconcile", "fleet_worker"} {
		pool := pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, group))
		_, err := retention.Prune(ctx, retention.Config{Pool: pool, OlderThan: olderThan, Apply: true})
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", group, err)
		require.Equal(t, "42501", pgErr.Code, group)
	}
	require.Equal(t, before, remaining(t, admin))

	op := pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, "fleet_operator"))
	for _, keep := range []string{"a3", "b3", "d1", "legacy"} {
		tag, err := op.Exec(ctx, `DELETE FROM ingestion_batches WHERE id = $1`, ids[keep])
		require.NoError(t, err)
		require.Zero(t, tag.RowsAffected(), "row-level security keeps %s", keep)
	}
	res, err := retention.Prune(ctx, retention.Config{Pool: op, OlderThan: olderThan, Apply: true})
	require.NoError(t, err)
	require.Equal(t, int64(len(prunable)), res.Batches)
	require.Equal(t, without(before, idsOf(ids, prunable)...), remaining(t, admin))
}
