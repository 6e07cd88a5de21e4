package e2e

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// TestSQSAndReconcileAsTheirOwnRoles runs "enqueue sqs" logged in as a
// member of fleet_enqueue and "enqueue reconcile" (one-shot and --every,
// which keeps its checkpoint) as a member of its own role, fleet_reconcile
// (issue 44), each with only the grants of deploy/postgres/roles.sql: 20
// completed folders, 12 notified through SQS, the other 8 found by
// reconcile; every folder one batch; the checkpoint records reconcile's
// login as its mover. Reconcile started under the doors' login (an install
// upgraded without giving it a login of its own) does not start: it exits
// cli.ExitMissingGrants naming the checkpoint grants it lacks and
// fleet_reconcile; and so does reconcile's own login once the checkpoint
// table's grant is revoked, as when roles.sql is not re-run after an
// upgrade (a grant missing from roles.sql fails this test at the first
// start, by name).
func TestSQSAndReconcileAsTheirOwnRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	applyRoles(t, admin)
	enqueueURL := loginAs(t, admin, dbURL, "fleet_enqueue")
	reconcileURL := loginAs(t, admin, dbURL, "fleet_reconcile")

	s3 := s3test.Start(t)
	const bucket = sqsBucket
	s3.CreateBucket(t, bucket)
	putFolders(t, s3, bucket, 20)

	srv := sqstest.Start(t)
	queue := srv.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "30"})
	var bodies []string
	for i := range 12 {
		bodies = append(bodies, sqstest.SNSEnvelope(sqstest.S3Event(bucket, folderKey(i)+"/_SUCCESS")))
	}
	bodies = append(bodies, sqstest.TestEvent(bucket))
	c := startSQSConsumer(t, "sqs-as-enqueue", enqueueURL, srv, queue)
	srv.Send(t, queue, bodies...)
	waitDrained(t, srv, queue, 60*time.Second)
	require.Equal(t, 12.0, c.metric(`ingest_sqs_messages_deleted_total{outcome="imported"}`), c.logs.String())
	require.Zero(t, c.metric(`ingest_sqs_messages_left_total{reason="database_unavailable"}`), "a refused statement: %s", c.logs.String())
	require.Zero(t, c.metric(`ingest_sqs_messages_left_total{reason="enqueue_failed"}`), c.logs.String())
	c.signal(syscall.SIGTERM)
	require.Equal(t, 0, c.wait(15*time.Second), c.logs.String())

	out, summary, code := runReconcile(t, reconcileURL, s3.Env(), "--bucket", bucket, "--prefix", "tenants/")
	require.Equal(t, 0, code, "summary %v", summary)
	require.Len(t, out["enqueued"], 8, "the folders no notification imported")
	require.Len(t, out["running"], 12)

	// Periodic: the checkpoint is read and written as reconcile's role.
	env := append([]string{"DATABASE_URL=" + reconcileURL}, s3.Env()...)
	args := []string{"reconcile", "--bucket", bucket, "--prefix", "tenants/", "--every", "1s", "--admin-listen", "127.0.0.1:0"}
	p := startProcess(t, "reconcile-as-its-own", "enqueue", args, env, `"msg":"reconciling periodically"`)
	require.Eventually(t, func() bool {
		return p.metric(`ingest_reconcile_scans_total{outcome="scanned"}`) >= 1
	}, 30*time.Second, 100*time.Millisecond, "no period scanned: %s", p.logs.String())
	require.Zero(t, p.metric(`ingest_reconcile_scans_total{outcome="failed"}`), p.logs.String())
	var covered *time.Time
	var movedBy string
	require.NoError(t, admin.QueryRow(ctx, `SELECT covered_since, moved_by FROM ingest_reconcile_checkpoints WHERE bucket = $1`, bucket).Scan(&covered, &movedBy))
	require.NotNil(t, covered, "the pass was recorded")
	u, err := url.Parse(reconcileURL)
	require.NoError(t, err)
	require.Equal(t, u.User.Username(), movedBy, "reconcile's own login moved the checkpoint")
	require.Zero(t, p.metric(`ingest_reconcile_checkpoints_foreign_total`), p.logs.String())
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.wait(15*time.Second))

	batches, scopes := batchCounts(t, admin)
	require.Equal(t, 20, batches)
	require.Equal(t, 20, scopes)

	refused := func(databaseURL string, want ...string) {
		t.Helper()
		runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(runCtx, filepath.Join(binDir, "enqueue"), args...)
		cmd.Env = append(append(os.Environ(), s3.Env()...), "DATABASE_URL="+databaseURL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		require.Equal(t, cli.ExitMissingGrants, cmd.ProcessState.ExitCode(), "%s\n%s", stdout.String(), stderr.String())
		require.Contains(t, stdout.String(), `"outcome":"missing_grants"`)
		require.Contains(t, stdout.String(), `"role":"fleet_reconcile"`)
		for _, w := range append(want, "re-run deploy/postgres/roles.sql", "GRANT fleet_reconcile TO") {
			require.Contains(t, stdout.String(), w)
			require.Contains(t, stderr.String(), w)
		}
	}
	checkpoints := []string{"SELECT ON ingest_reconcile_checkpoints", "INSERT ON ingest_reconcile_checkpoints", "UPDATE ON ingest_reconcile_checkpoints"}
	// Under the doors' login: the checkpoints are not the door's.
	refused(enqueueURL, checkpoints...)
	// A grant missing (roles.sql not re-run): reconcile does not start, and
	// says which privileges of roles.sql its login lacks.
	_, err = admin.Exec(ctx, `REVOKE ALL ON ingest_reconcile_checkpoints FROM fleet_reconcile`)
	require.NoError(t, err)
	refused(reconcileURL, checkpoints...)
}
