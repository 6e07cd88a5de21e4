package reconcile_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/reconcile"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// due makes the next period due: it backdates the checkpoint's last run as
// reconcile itself writes it (its application name, under the pool's
// login), so the period trusts it.
func due(t *testing.T, pool *pgxpool.Pool, ago time.Duration) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('application_name', $1, true)`, reconcile.ApplicationName); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE ingest_reconcile_checkpoints SET last_run_at = now() - $1 * interval '1 microsecond'`, ago.Microseconds())
		return err
	}))
}

// hold opens a session of pool named application that runs sql in a
// transaction and keeps it open until the returned function is called.
// It returns the session's pid.
func hold(t *testing.T, pool *pgxpool.Pool, application, sql string, args ...any) (pid int32, release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT set_config('application_name', $1, true)`, application)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(t, err)
	done := false
	release = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
			conn.Release()
		}
	}
	t.Cleanup(release)
	return pid, release
}

// TestReconcileLockHolderIsNamedAndCounted: the lock of a period is its
// checkpoint row. A session of another program holding that row (any login
// with UPDATE on the table can) makes every period skip — as the advisory
// lock did, silently — but now each skip names the holder (pid, login,
// application name, from pg_locks and pg_stat_activity) and adds one to
// ingest_reconcile_periods_skipped_consecutive, the gauge
// FleetIngestReconcileSilenced reads; the first period that scans sets it
// back to 0. The old advisory lock silences nothing any more, and a lock
// on the whole table is named as well.
func TestReconcileLockHolderIsNamedAndCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 3)
	gauge := f.cfg.Metrics.ReconcileSkippedConsecutive

	// The lock of the build before: any login could take it.
	_, releaseAdvisory := hold(t, f.pool, "door-impostor", `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "fleet-ingest-reconcile:"+bucket+"/")
	p, err := reconcile.RunPeriod(ctx, f.cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome, "the advisory lock of the previous build still silences reconcile")
	require.Equal(t, 3, p.Summary.Outcomes["enqueued"])
	releaseAdvisory()
	due(t, f.pool, 2*time.Hour)

	pid, release := hold(t, f.pool, "door-impostor", `SELECT * FROM ingest_reconcile_checkpoints WHERE bucket = $1 FOR UPDATE`, bucket)
	for n := 1; n <= reconcile.SkipsConsecutiveAlert; n++ {
		p, err := reconcile.RunPeriod(ctx, f.cfg, time.Hour)
		require.NoError(t, err)
		require.Equal(t, "skipped", p.Outcome)
		require.Equal(t, reconcile.SkipLocked, p.SkipReason)
		require.Len(t, p.Holders, 1, "%+v", p.Holders)
		require.Equal(t, pid, p.Holders[0].PID)
		require.Equal(t, "door-impostor", p.Holders[0].Application)
		require.Equal(t, "row", p.Holders[0].Lock)
		require.NotEmpty(t, p.Holders[0].User)
		require.Equal(t, float64(n), testutil.ToFloat64(gauge))
	}
	release()

	// A lock on the table (which NOWAIT does not cover) is waited for
	// lock_timeout, then named.
	pid, release = hold(t, f.pool, "table-locker", `LOCK TABLE ingest_reconcile_checkpoints IN EXCLUSIVE MODE`)
	p, err = reconcile.RunPeriod(ctx, f.cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "skipped", p.Outcome)
	require.Len(t, p.Holders, 1, "%+v", p.Holders)
	require.Equal(t, pid, p.Holders[0].PID)
	require.Equal(t, "table-locker", p.Holders[0].Application)
	require.Equal(t, "ExclusiveLock", p.Holders[0].Lock)
	require.Equal(t, float64(reconcile.SkipsConsecutiveAlert+1), testutil.ToFloat64(gauge))
	release()

	p, err = reconcile.RunPeriod(ctx, f.cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	require.Zero(t, testutil.ToFloat64(gauge), "a period that scans ends the run of skips")
	require.Zero(t, testutil.ToFloat64(f.cfg.Metrics.ReconcileCheckpointsForeign), "reconcile's own checkpoint is trusted")
}

// TestReconcileIgnoresACheckpointMovedByAnotherLogin: reconcile runs under
// a login of its own role (fleet_reconcile, deploy/postgres/roles.sql). The
// door's login (fleet_enqueue) cannot move the checkpoint, lock its row or
// even read it, even naming itself fleet-ingest-reconcile: permission
// denied (42501). A login that still can (the tables' owner, a superuser)
// moves it past every key and marks the bucket covered as of now — before
// migration 00115 that ended the pass at once and hid every folder a
// notification had missed. The move is recorded as that login's
// (moved_by, moved_application), so the period ignores it, counts it
// (ingest_reconcile_checkpoints_foreign_total) and starts a new pass that
// finds every folder; one that names itself fleet-ingest-reconcile is told
// apart by its login. Another login of fleet_reconcile (a replica on
// rotated credentials) is reconcile: its checkpoints are trusted.
func TestReconcileIgnoresACheckpointMovedByAnotherLogin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	door := pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, "fleet_enqueue"))
	reconcileURL := pgtest.LoginAs(t, admin, dbURL, reconcile.Role)
	f := newFixtureOn(t, pgtest.Pool(t, reconcileURL), 5)
	u, err := url.Parse(reconcileURL)
	require.NoError(t, err)
	reconcileLogin := u.User.Username()
	foreign := f.cfg.Metrics.ReconcileCheckpointsForeign

	// A first period: reconcile's own checkpoint row exists.
	p, err := reconcile.RunPeriod(ctx, f.cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	require.Nil(t, p.Foreign)
	require.Equal(t, 5, p.Summary.Outcomes["enqueued"])
	var lastRun time.Time
	require.NoError(t, admin.QueryRow(ctx, `SELECT last_run_at FROM ingest_reconcile_checkpoints`).Scan(&lastRun))

	// The door, posing as reconcile, is refused every write and the lock.
	for _, sql := range []string{
		`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix, start_after) VALUES ('` + bucket + `', 'other/', 'zzz')`,
		`UPDATE ingest_reconcile_checkpoints SET start_after = 'zzz', covered_since = now(), last_run_at = now()`,
		`SELECT 1 FROM ingest_reconcile_checkpoints WHERE bucket = '` + bucket + `' FOR UPDATE`,
	} {
		err := pgx.BeginFunc(ctx, door, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('application_name', $1, true)`, reconcile.ApplicationName); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		require.Equal(t, "42501", pgErr.Code, "the door's login: %s", sql)
	}
	var after time.Time
	var movedBy string
	require.NoError(t, admin.QueryRow(ctx, `SELECT last_run_at, moved_by FROM ingest_reconcile_checkpoints`).Scan(&after, &movedBy))
	require.Equal(t, lastRun, after, "the door moved the checkpoint")
	require.Equal(t, reconcileLogin, movedBy)

	for i, application := range []string{"fleet-ingest-serve", reconcile.ApplicationName} {
		require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('application_name', $1, true)`, application); err != nil {
				return err
			}
			// It writes reconcile's login as the mover too: the trigger
			// records its own.
			_, err := tx.Exec(ctx, `
				UPDATE ingest_reconcile_checkpoints
				SET start_after = 'zzz', pass_started_at = now(), covered_since = now(), last_run_at = now() - interval '2 hours',
				    moved_by = $1, moved_application = $2`, reconcileLogin, reconcile.ApplicationName)
			return err
		}), application)
		var movedApp string
		require.NoError(t, admin.QueryRow(ctx, `SELECT moved_by, moved_application FROM ingest_reconcile_checkpoints`).Scan(&movedBy, &movedApp))
		require.Equal(t, application, movedApp)
		require.NotEqual(t, reconcileLogin, movedBy, "the mover was forged")

		p, err := reconcile.RunPeriod(ctx, f.cfg, time.Hour)
		require.NoError(t, err, application)
		require.Equal(t, "scanned", p.Outcome, application)
		require.NotNil(t, p.Foreign, "%s: the move of a login not reconcile's was trusted", application)
		require.Equal(t, movedBy, p.Foreign.By)
		require.Equal(t, application, p.Foreign.Application)
		require.Empty(t, p.StartAfter, "%s: a new pass starts from the first key", application)
		require.True(t, p.Since.IsZero(), "%s: the foreign covered_since hid markers", application)
		require.True(t, p.Summary.Complete)
		require.Equal(t, float64(i+1), testutil.ToFloat64(foreign), application)
		require.Equal(t, 5, p.Summary.Outcomes["running"], "every folder is checked again")
	}

	// Reconcile's own write is trusted by the next period: nothing counted.
	due(t, f.pool, 2*time.Hour)
	p, err = reconcile.RunPeriod(ctx, f.cfg, time.Hour)
	require.NoError(t, err)
	require.Nil(t, p.Foreign)
	require.False(t, p.Since.IsZero(), "the pass reconcile finished counts as coverage")

	// So is another login of reconcile's role, both ways.
	rotated := pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, reconcile.Role))
	other := f.cfg
	other.Pool = rotated
	due(t, f.pool, 2*time.Hour)
	p, err = reconcile.RunPeriod(ctx, other, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	require.Nil(t, p.Foreign, "a login of fleet_reconcile is reconcile")
	due(t, rotated, 2*time.Hour)
	p, err = reconcile.RunPeriod(ctx, f.cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	require.Nil(t, p.Foreign, "a login of fleet_reconcile is reconcile")
	require.Equal(t, 2.0, testutil.ToFloat64(foreign))
}
