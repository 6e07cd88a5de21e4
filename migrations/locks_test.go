package migrations_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/migrations"
)

// alterBatches is a migration set of the tests' own that alters
// ingestion_batches, as a real upgrade would.
var alterBatches = fstest.MapFS{
	"00001_alter_batches.sql": {Data: []byte("-- +goose Up\nALTER TABLE ingestion_batches ADD COLUMN lock_test_note text;\n")},
}

// holdAccessShare opens a session named application_name that reads
// ingestion_batches in a transaction it keeps open (a dashboard query, an
// idle psql): it holds ACCESS SHARE until release is called.
func holdAccessShare(t *testing.T, url, applicationName string) (release func()) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = applicationName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM ingestion_batches`)
	require.NoError(t, err)
	done := false
	release = func() {
		if !done {
			done = true
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, conn.Close(ctx))
		}
	}
	t.Cleanup(release)
	return release
}

// waitForAlterWaiting returns once a session of this database waits for a
// lock with an ALTER TABLE: the migration queued behind the blocker.
func waitForAlterWaiting(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query ILIKE '%ALTER TABLE ingestion_batches%'`).Scan(&n))
		return n > 0
	}, 10*time.Second, 5*time.Millisecond)
}

func insertBatch(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details)
		VALUES ('c', 't', 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Running', '{}')
		RETURNING id`).Scan(&id))
	return id
}

// TestMigrationGivesWayToAReaderInsteadOfQueueingRenewals: an open
// transaction holds ACCESS SHARE on ingestion_batches while a migration
// that ALTERs it runs. Lease renewals (UPDATE ingestion_batches) keep
// completing promptly, well under the lease period, instead of queueing
// behind the waiting ALTER; the migration gives way, logs the session it
// waited for, and completes once that session commits. Without a lock
// timeout every renewal waited for the blocker.
func TestMigrationGivesWayToAReaderInsteadOfQueueingRenewals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, url)
	id := insertBatch(t, pool)
	release := holdAccessShare(t, url, "dashboard-test")

	var logs testproc.SyncBuffer
	cfg := migrations.Config{LockTimeout: 200 * time.Millisecond, LockAttempts: 1000, LockBackoff: 50 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	type result struct {
		report migrations.Report
		err    error
	}
	done := make(chan result, 1)
	go func() {
		r, err := cfg.ApplyFS(ctx, pool, alterBatches, "lock_test_migrations")
		done <- result{r, err}
	}()
	waitForAlterWaiting(t, pool)

	// Renewals while the blocker holds and the migration keeps trying.
	var slowest time.Duration
	for range 10 {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		_, err := pool.Exec(rctx, `UPDATE ingestion_batches SET updated_at = now() WHERE id = $1`, id)
		cancel()
		require.NoError(t, err, "a renewal queued behind the migration")
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("slowest of 10 renewals during the migration: %s (lock_timeout %s)", slowest, cfg.LockTimeout)
	require.Less(t, slowest, 2*time.Second, "renewals complete well under the lease period (30 s)")
	require.Eventually(t, func() bool { return len(logs.String()) > 0 }, 5*time.Second, 5*time.Millisecond)
	require.Contains(t, logs.String(), `"msg":"migration gave way to a lock held by another session; retrying"`)
	require.Contains(t, logs.String(), `"blocker_application_name":"dashboard-test"`)
	require.Contains(t, logs.String(), `"blocker_state":"idle in transaction"`)
	require.Contains(t, logs.String(), `"relation":"ingestion_batches"`)
	select {
	case r := <-done:
		t.Fatalf("the migration finished while the blocker held: %+v", r)
	default:
	}

	release()
	r := <-done
	require.NoError(t, r.err)
	require.Len(t, r.report.Project, 1)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT FROM information_schema.columns WHERE table_name = 'ingestion_batches' AND column_name = 'lock_test_note')`).Scan(&exists))
	require.True(t, exists)
}

// TestMigrationFailsNamingTheBlockerWhenItNeverLetsGo: a blocker that never
// lets go makes the migration fail after its attempts with a
// *LockTimeoutError naming the session (pid, application_name, state, the
// relation), having logged each time it gave way.
func TestMigrationFailsNamingTheBlockerWhenItNeverLetsGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, url)
	holdAccessShare(t, url, "idle-psql-test")
	var logs testproc.SyncBuffer
	cfg := migrations.Config{LockTimeout: 100 * time.Millisecond, LockAttempts: 3, LockBackoff: 10 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	start := time.Now()
	report, err := cfg.ApplyFS(ctx, pool, alterBatches, "lock_test_migrations")
	t.Logf("gave up after %s: %v", time.Since(start), err)
	var lte *migrations.LockTimeoutError
	require.ErrorAs(t, err, &lte)
	require.Empty(t, report.Project)
	require.Equal(t, 3, lte.Attempts)
	require.NotEmpty(t, lte.Blockers)
	b := lte.Blockers[0]
	require.Equal(t, "idle-psql-test", b.ApplicationName)
	require.Equal(t, "idle in transaction", b.State)
	require.Equal(t, "ingestion_batches", b.Relation)
	require.Equal(t, "AccessExclusiveLock", b.Mode)
	require.NotNil(t, b.XactStart)
	require.Contains(t, err.Error(), `application_name "idle-psql-test"`)
	require.Contains(t, err.Error(), "gave way 3 times")
	require.Equal(t, 2, strings.Count(logs.String(), "migration gave way"), "a warning for each attempt but the last")
	require.False(t, errors.Is(err, context.DeadlineExceeded))
}
