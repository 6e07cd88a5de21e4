package reconcile_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/reconcile"
)

// TestReconcileIgnoresACheckpointAheadOfTheDatabaseClock: no login may
// write a checkpoint dated after the database clock (migration 00080's
// trigger refuses it, SQLSTATE 23514), and one already in the table (from
// before that migration, or a clock that stepped back) would make every
// period skip: reconcile ignores it, counts it for the alert and starts a
// new pass, which enqueues every folder and replaces the checkpoint with
// one the clock allows.
func TestReconcileIgnoresACheckpointAheadOfTheDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 5)
	const every = time.Minute

	for _, sql := range []string{
		`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix, last_run_at) VALUES ($1, '', '9999-01-01')`,
		`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix, covered_since) VALUES ($1, '', now() + interval '1 second')`,
		`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix, pass_started_at, start_after) VALUES ($1, '', '9999-01-01', 'zzz')`,
	} {
		_, err := f.pool.Exec(ctx, sql, bucket)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", sql, err)
		require.Equal(t, "23514", pgErr.Code, sql)
		require.Equal(t, "ingest_reconcile_checkpoints_clock", pgErr.ConstraintName, sql)
	}

	// A checkpoint written before the trigger existed: every time in the
	// future, its key past every marker.
	require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil { // no triggers
			return err
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO ingest_reconcile_checkpoints (bucket, prefix, start_after, pass_started_at, covered_since, last_run_at)
			VALUES ($1, '', 'zzz', '9999-01-01', '9999-01-01', '9999-01-01')`, bucket)
		return err
	}))
	p, err := reconcile.RunPeriod(ctx, f.cfg, every)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome, "a checkpoint from the future silenced the period")
	require.True(t, p.CheckpointIgnored)
	require.Empty(t, p.StartAfter, "a new pass starts from the first key")
	require.True(t, p.Since.IsZero(), "no marker is skipped")
	require.Equal(t, 5, p.Summary.Outcomes["enqueued"])
	require.Equal(t, 1.0, testutil.ToFloat64(f.cfg.Metrics.ReconcileCheckpointsIgnored))

	var covered, lastRun time.Time
	var now time.Time
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT covered_since, last_run_at, now() FROM ingest_reconcile_checkpoints`).Scan(&covered, &lastRun, &now))
	require.False(t, covered.After(now), "the pass replaced the checkpoint")
	require.False(t, lastRun.After(now))

	// The next period reads its own checkpoint: nothing ignored.
	due(t, f.pool, time.Hour)
	p, err = reconcile.RunPeriod(ctx, f.cfg, every)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	require.False(t, p.CheckpointIgnored)
	require.Equal(t, 1.0, testutil.ToFloat64(f.cfg.Metrics.ReconcileCheckpointsIgnored))
}
