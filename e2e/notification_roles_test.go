package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// TestSQSAndReconcileAsTheEnqueueRole runs "enqueue sqs" and "enqueue
// reconcile" (one-shot and --every, which keeps its checkpoint) logged in
// as a member of fleet_enqueue, with only the grants of
// deploy/postgres/roles.sql: 20 completed folders, 12 notified through
// SQS, the other 8 found by reconcile; every folder one batch. Then the
// checkpoint table's grant is revoked, and the periodic reconcile reports
// "permission denied" for it in its log and its failed-scan counter: a
// grant missing from roles.sql fails this test with the database's own
// words.
func TestSQSAndReconcileAsTheEnqueueRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	applyRoles(t, admin)
	enqueueURL := loginAs(t, admin, dbURL, "fleet_enqueue")

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

	out, summary, code := runReconcile(t, enqueueURL, s3.Env(), "--bucket", bucket, "--prefix", "tenants/")
	require.Equal(t, 0, code, "summary %v", summary)
	require.Len(t, out["enqueued"], 8, "the folders no notification imported")
	require.Len(t, out["running"], 12)

	// Periodic: the checkpoint is read and written as the enqueue role.
	env := append([]string{"DATABASE_URL=" + enqueueURL}, s3.Env()...)
	args := []string{"reconcile", "--bucket", bucket, "--prefix", "tenants/", "--every", "1s", "--admin-listen", "127.0.0.1:0"}
	p := startProcess(t, "reconcile-as-enqueue", "enqueue", args, env, `"msg":"reconciling periodically"`)
	require.Eventually(t, func() bool {
		return p.metric(`ingest_reconcile_scans_total{outcome="scanned"}`) >= 1
	}, 30*time.Second, 100*time.Millisecond, "no period scanned: %s", p.logs.String())
	require.Zero(t, p.metric(`ingest_reconcile_scans_total{outcome="failed"}`), p.logs.String())
	var covered *time.Time
	require.NoError(t, admin.QueryRow(ctx, `SELECT covered_since FROM ingest_reconcile_checkpoints WHERE bucket = $1`, bucket).Scan(&covered))
	require.NotNil(t, covered, "the pass was recorded")
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.wait(15*time.Second))

	batches, scopes := batchCounts(t, admin)
	require.Equal(t, 20, batches)
	require.Equal(t, 20, scopes)

	// A grant missing: the failure names the table.
	_, err := admin.Exec(ctx, `REVOKE ALL ON ingest_reconcile_checkpoints FROM fleet_enqueue`)
	require.NoError(t, err)
	p = startProcess(t, "reconcile-without-grant", "enqueue", args, env, `"msg":"reconciling periodically"`)
	line := p.waitLog(`"msg":"reconcile period failed"`, 30*time.Second)
	require.True(t, strings.Contains(line, "permission denied for table ingest_reconcile_checkpoints"), line)
	require.Positive(t, p.metric(`ingest_reconcile_scans_total{outcome="failed"}`))
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.wait(15*time.Second))
}
