package e2e

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
)

// TestReconcileSilencedIsVisible runs "enqueue reconcile --every 1s" as a
// login of its own role (fleet_reconcile). The door's login cannot create,
// lock or move the checkpoint (42501, issue 44), even naming itself
// fleet-ingest-reconcile. A login that still can (here the tables'
// owner; any login with UPDATE on the table) holds the checkpoint row
// (FOR UPDATE): every period skips, and the process says so — its log
// names the holding session (pid, login, application name) and
// ingest_reconcile_periods_skipped_consecutive climbs past the alert's 3.
// Once the row is released, a period scans and the gauge is 0. Then that
// login moves the checkpoint past every key, naming itself
// fleet-ingest-reconcile; the next period ignores the move (not a login of
// fleet_reconcile), counts it in ingest_reconcile_checkpoints_foreign_total
// and finds the folder a notification missed.
func TestReconcileSilencedIsVisible(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	applyRoles(t, admin)
	door := pgtest.Pool(t, loginAs(t, admin, dbURL, "fleet_enqueue"))
	reconcileURL := loginAs(t, admin, dbURL, "fleet_reconcile")

	s3 := s3test.Start(t)
	const bucket = "fleet-silenced"
	s3.CreateBucket(t, bucket)
	putFolders(t, s3, bucket, 3)
	env := append([]string{"DATABASE_URL=" + reconcileURL}, s3.Env()...)
	args := []string{"reconcile", "--bucket", bucket, "--prefix", "tenants/", "--every", "1s", "--admin-listen", "127.0.0.1:0"}

	// The door's login, posing as reconcile, may not create the row, lock
	// it or move it.
	for _, sql := range []string{
		`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ($1, 'tenants/')`,
		`SELECT * FROM ingest_reconcile_checkpoints WHERE bucket = $1 FOR UPDATE`,
		`UPDATE ingest_reconcile_checkpoints SET start_after = 'zzz' WHERE bucket = $1`,
	} {
		err := pgx.BeginFunc(ctx, door, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL application_name = 'fleet-ingest-reconcile'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql, bucket)
			return err
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		require.Equal(t, "42501", pgErr.Code, sql)
	}

	// The row exists (reconcile's first period creates it; here the
	// owner's login does), and a session of the owner holds it.
	_, err := admin.Exec(ctx, `INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ($1, 'tenants/')`, bucket)
	require.NoError(t, err)
	var owner string
	require.NoError(t, admin.QueryRow(ctx, `SELECT current_user`).Scan(&owner))
	conn, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	holder, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SET LOCAL application_name = 'holding-the-row'`)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = holder.Exec(ctx, `SELECT * FROM ingest_reconcile_checkpoints WHERE bucket = $1 FOR UPDATE`, bucket)
	require.NoError(t, err)

	p := startProcess(t, "reconcile-silenced", "enqueue", args, env, `"msg":"reconciling periodically"`)
	line := p.waitLog(`"msg":"reconcile period skipped again: unless another replica scans, reconcile is silenced"`, 30*time.Second)
	var logged struct {
		Reason  string `json:"reason"`
		Holders []struct {
			PID         int32  `json:"pid"`
			User        string `json:"user"`
			Application string `json:"application_name"`
			Lock        string `json:"lock"`
		} `json:"holders"`
	}
	require.NoError(t, json.Unmarshal([]byte(line), &logged), line)
	require.Equal(t, "locked", logged.Reason)
	require.Len(t, logged.Holders, 1, line)
	require.Equal(t, pid, logged.Holders[0].PID)
	require.Equal(t, "holding-the-row", logged.Holders[0].Application)
	require.Equal(t, owner, logged.Holders[0].User, line)
	require.Equal(t, "row", logged.Holders[0].Lock)
	require.GreaterOrEqual(t, p.metric(`ingest_reconcile_periods_skipped_consecutive`), 3.0)
	require.Zero(t, p.metric(`ingest_reconcile_scans_total{outcome="scanned"}`))
	batches, _ := batchCounts(t, admin)
	require.Zero(t, batches)

	require.NoError(t, holder.Rollback(ctx))
	require.Eventually(t, func() bool { return p.metric(`ingest_reconcile_scans_total{outcome="scanned"}`) >= 1 },
		30*time.Second, 100*time.Millisecond, p.logs.String())
	require.Zero(t, p.metric(`ingest_reconcile_periods_skipped_consecutive`))
	require.Equal(t, 1.0, p.metric(`ingest_reconcile_checkpoints_foreign_total`), "the row the owner created is not reconcile's move")
	batches, _ = batchCounts(t, admin)
	require.Equal(t, 3, batches)

	// The owner's login moves the checkpoint past every key, covered as
	// of now, naming itself reconcile; a notification of a new folder is
	// lost meanwhile.
	putFolders(t, s3, bucket, 4) // folder 3 is new
	require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL application_name = 'fleet-ingest-reconcile'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
			UPDATE ingest_reconcile_checkpoints
			SET start_after = 'zzz', pass_started_at = now(), covered_since = now(), last_run_at = now() - interval '1 hour'
			WHERE bucket = $1`, bucket)
		return err
	}))
	require.Eventually(t, func() bool { return p.metric(`ingest_reconcile_checkpoints_foreign_total`) >= 2 },
		30*time.Second, 100*time.Millisecond, p.logs.String())
	p.waitLog(`it was moved by someone other than reconcile`, 5*time.Second)
	require.Eventually(t, func() bool { b, _ := batchCounts(t, admin); return b == 4 }, 30*time.Second, 100*time.Millisecond,
		"the folder behind the moved checkpoint was not found")
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.wait(15*time.Second))
}
