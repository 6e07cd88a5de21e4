package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
)

// TestReconcileSilencedIsVisible runs "enqueue reconcile --every 1s" as a
// login of its own (a member of fleet_enqueue) while a session of the
// door's login holds the checkpoint row (FOR UPDATE; any login with UPDATE
// on the table can): every period skips, and the process says so — its
// log names the holding session (pid, login, application name) and
// ingest_reconcile_periods_skipped_consecutive climbs past the alert's 3.
// Once the row is released, a period scans and the gauge is 0. Then the
// door's login moves the checkpoint past every key; the next period
// ignores the move, counts it in ingest_reconcile_checkpoints_foreign_total
// and finds the folder a notification missed.
func TestReconcileSilencedIsVisible(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	applyRoles(t, admin)
	door := pgtest.Pool(t, loginAs(t, admin, dbURL, "fleet_enqueue"))
	reconcileURL := loginAs(t, admin, dbURL, "fleet_enqueue")

	s3 := s3test.Start(t)
	const bucket = "fleet-silenced"
	s3.CreateBucket(t, bucket)
	putFolders(t, s3, bucket, 3)
	env := append([]string{"DATABASE_URL=" + reconcileURL}, s3.Env()...)
	args := []string{"reconcile", "--bucket", bucket, "--prefix", "tenants/", "--every", "1s", "--admin-listen", "127.0.0.1:0"}

	// The row exists (reconcile's first period creates it; here the door's
	// login does), and the door's session holds it.
	_, err := door.Exec(ctx, `INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ($1, 'tenants/')`, bucket)
	require.NoError(t, err)
	conn, err := door.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	holder, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SET LOCAL application_name = 'door-holding-the-row'`)
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
	require.Equal(t, "door-holding-the-row", logged.Holders[0].Application)
	require.True(t, strings.HasPrefix(logged.Holders[0].User, "test_fleet_enqueue_"), line)
	require.Equal(t, "row", logged.Holders[0].Lock)
	require.GreaterOrEqual(t, p.metric(`ingest_reconcile_periods_skipped_consecutive`), 3.0)
	require.Zero(t, p.metric(`ingest_reconcile_scans_total{outcome="scanned"}`))
	batches, _ := batchCounts(t, admin)
	require.Zero(t, batches)

	require.NoError(t, holder.Rollback(ctx))
	require.Eventually(t, func() bool { return p.metric(`ingest_reconcile_scans_total{outcome="scanned"}`) >= 1 },
		30*time.Second, 100*time.Millisecond, p.logs.String())
	require.Zero(t, p.metric(`ingest_reconcile_periods_skipped_consecutive`))
	require.Equal(t, 1.0, p.metric(`ingest_reconcile_checkpoints_foreign_total`), "the row the door created is the door's move")
	batches, _ = batchCounts(t, admin)
	require.Equal(t, 3, batches)

	// The door moves the checkpoint past every key, covered as of now; a
	// notification of a new folder is lost meanwhile.
	putFolders(t, s3, bucket, 4) // folder 3 is new
	_, err = door.Exec(ctx, `
		UPDATE ingest_reconcile_checkpoints
		SET start_after = 'zzz', pass_started_at = now(), covered_since = now(), last_run_at = now() - interval '1 hour'
		WHERE bucket = $1`, bucket)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.metric(`ingest_reconcile_checkpoints_foreign_total`) >= 2 },
		30*time.Second, 100*time.Millisecond, p.logs.String())
	p.waitLog(`it was moved by someone other than reconcile`, 5*time.Second)
	require.Eventually(t, func() bool { b, _ := batchCounts(t, admin); return b == 4 }, 30*time.Second, 100*time.Millisecond,
		"the folder behind the door's checkpoint was not found")
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.wait(15*time.Second))
}
