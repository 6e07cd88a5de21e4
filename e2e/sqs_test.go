package e2e

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

const sqsBucket = "fleet-uploads"

// startSQSConsumer starts "enqueue sqs" on queue (short long polls: the
// test server waits a whole poll unless ten messages arrived) and waits
// until it consumes.
func startSQSConsumer(t *testing.T, name, dbURL string, srv *sqstest.Server, queue string, args ...string) *workerProc {
	t.Helper()
	return startProcess(t, name, "enqueue",
		append([]string{"sqs", "--queue-url", queue, "--bucket", sqsBucket, "--wait-time", "1s", "--admin-listen", "127.0.0.1:0", "--backoff-max", "2s"}, args...),
		append([]string{"DATABASE_URL=" + dbURL}, srv.Env()...), `"msg":"consuming upload notifications"`)
}

func sqsMarker(tenant string, n int) string {
	return fmt.Sprintf("tenants/%s/db_%s/company-1/upload-%04d/_SUCCESS", tenant, tenant, n)
}

// batchCounts returns the number of batches and of distinct scopes.
func batchCounts(t *testing.T, pool *pgxpool.Pool) (batches, scopes int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT (tenant_id, source_scope)) FROM ingestion_batches`).Scan(&batches, &scopes))
	return batches, scopes
}

// waitDrained waits until the queue holds no message, visible or in flight.
func waitDrained(t *testing.T, srv *sqstest.Server, queue string, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		visible, inFlight := srv.Counts(t, queue)
		return visible == 0 && inFlight == 0
	}, timeout, 100*time.Millisecond, "queue never drained")
}

// TestSQSFiveHundredNotificationsTwoHundredFolders sends 500 notifications
// for 200 folders — each folder notified two or three times, in turn as an
// S3 event, an SNS envelope and an EventBridge event — and three
// s3:TestEvents, to a queue two "enqueue sqs" processes share: 200
// batches, one per folder, every message deleted; SIGTERM then stops both
// with exit 0.
func TestSQSFiveHundredNotificationsTwoHundredFolders(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	srv := sqstest.Start(t)
	queue := srv.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "30"})

	var bodies []string
	for i := 0; len(bodies) < 500; i++ {
		f := i % 200
		key := sqsMarker([]string{"acme", "globex", "initech", "umbrella"}[f%4], f)
		switch i % 3 {
		case 0:
			bodies = append(bodies, sqstest.S3Event(sqsBucket, key))
		case 1:
			bodies = append(bodies, sqstest.SNSEnvelope(sqstest.S3Event(sqsBucket, key)))
		default:
			bodies = append(bodies, sqstest.EventBridgeObjectCreated(sqsBucket, key))
		}
	}
	bodies = append(bodies, sqstest.TestEvent(sqsBucket), sqstest.SNSEnvelope(sqstest.TestEvent(sqsBucket)), sqstest.TestEvent(sqsBucket))
	start := time.Now()
	a := startSQSConsumer(t, "sqs-a", dbURL, srv, queue)
	b := startSQSConsumer(t, "sqs-b", dbURL, srv, queue)
	srv.Send(t, queue, bodies...)
	waitDrained(t, srv, queue, 60*time.Second)
	t.Logf("503 messages, 200 folders, 2 consumers: drained in %s", time.Since(start).Round(time.Millisecond))

	batches, scopes := batchCounts(t, pool)
	require.Equal(t, 200, batches)
	require.Equal(t, 200, scopes)
	deleted := func(outcome string) float64 {
		return a.metric(`ingest_sqs_messages_deleted_total{outcome="`+outcome+`"}`) + b.metric(`ingest_sqs_messages_deleted_total{outcome="`+outcome+`"}`)
	}
	require.Equal(t, 500.0, deleted("imported"))
	require.Equal(t, 3.0, deleted("test_event"))
	for _, reason := range []string{"malformed", "unmapped", "database_unavailable", "delete_failed"} {
		require.Zero(t, a.metric(`ingest_sqs_messages_left_total{reason="`+reason+`"}`)+b.metric(`ingest_sqs_messages_left_total{reason="`+reason+`"}`), reason)
	}
	require.Equal(t, 200.0, a.metric(`ingest_reservations_total{outcome="reserved",source_type="FleetS3"}`)+b.metric(`ingest_reservations_total{outcome="reserved",source_type="FleetS3"}`))

	a.signal(syscall.SIGTERM)
	b.signal(syscall.SIGTERM)
	require.Equal(t, 0, a.wait(15*time.Second))
	require.Equal(t, 0, b.wait(15*time.Second))
}

// TestSQSConsumerKilledBetweenCommitAndDelete SIGKILLs a consumer after
// its burst committed and before it deleted the messages (a hidden test
// flag holds it there): the messages come back after the visibility
// timeout, a second consumer finds their folders' batches Running
// (conflict) and deletes them; no folder has two batches.
func TestSQSConsumerKilledBetweenCommitAndDelete(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	srv := sqstest.Start(t)
	queue := srv.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "3"})
	var bodies []string
	for i := range 10 {
		bodies = append(bodies, sqstest.S3Event(sqsBucket, sqsMarker("acme", i)))
	}
	srv.Send(t, queue, bodies...)

	a := startSQSConsumer(t, "sqs-killed", dbURL, srv, queue, "--test-delay-after-commit", "60s")
	a.waitLog(`"msg":"test delay between commit and delete"`, 30*time.Second)
	batches, _ := batchCounts(t, pool)
	require.Equal(t, 10, batches, "the burst committed")
	a.signal(syscall.SIGKILL)
	a.wait(10 * time.Second)
	_, inFlight := srv.Counts(t, queue)
	require.Equal(t, 10, inFlight, "nothing was deleted")

	b := startSQSConsumer(t, "sqs-after", dbURL, srv, queue)
	waitDrained(t, srv, queue, 30*time.Second)
	batches, scopes := batchCounts(t, pool)
	require.Equal(t, 10, batches)
	require.Equal(t, 10, scopes)
	require.Equal(t, 10.0, b.metric(`ingest_sqs_messages_deleted_total{outcome="imported"}`))
	require.Equal(t, 10.0, b.metric(`ingest_reservations_total{outcome="conflict",source_type="FleetS3"}`))
	require.Equal(t, 0.0, b.metric(`ingest_reservations_total{outcome="reserved",source_type="FleetS3"}`))
	require.GreaterOrEqual(t, b.metric(`ingest_sqs_message_receives_sum`), 20.0, "every message was a redelivery")
	// The consumer exports its own metrics, not the worker's gauges frozen
	// at zero.
	body := httpGet(t, "http://"+b.addr+"/metrics")
	for _, workerOnly := range []string{"ingest_leases_held", "ingest_lease_acquisitions_total", "ingest_running_batches", "ingest_queue_jobs", "ingest_deliveries_total"} {
		require.NotContains(t, body, workerOnly+"{", "enqueue sqs exports no %s", workerOnly)
		require.NotContains(t, body, workerOnly+" ", "enqueue sqs exports no %s", workerOnly)
	}
}

// TestSQSDatabaseUnreachableWhileMessagesArrive points a consumer at
// PostgreSQL through a TCP proxy, stalls the proxy for 8 s while 30
// notifications arrive (the consumer's rounds time out, leave their
// messages and back off), then lets it through: every folder is imported
// once and every message deleted; none is lost.
func TestSQSDatabaseUnreachableWhileMessagesArrive(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy, err := chaos.NewProxy(u.Host)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	u.Host = proxy.Addr()

	srv := sqstest.Start(t)
	queue := srv.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "4"})
	c := startSQSConsumer(t, "sqs-outage", u.String(), srv, queue, "--timeout", "2s")

	proxy.Stall(8 * time.Second)
	proxy.Cut()
	var bodies []string
	for i := range 30 {
		bodies = append(bodies, sqstest.SNSEnvelope(sqstest.S3Event(sqsBucket, sqsMarker("globex", i))))
	}
	srv.Send(t, queue, bodies...)
	require.Eventually(t, func() bool {
		return c.metric(`ingest_sqs_messages_left_total{reason="database_unavailable"}`) > 0
	}, 20*time.Second, 100*time.Millisecond, "the outage was never seen")

	waitDrained(t, srv, queue, 60*time.Second)
	// Every folder has exactly one Running batch. A round whose job insert
	// timed out in the outage may also have recorded its reservations as
	// Failed failed_enqueue batches (enqueue_failed: the scope free, the
	// message left and imported on redelivery); nothing else may exist.
	var running, runningScopes, scopes, other int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE status = 'Running'),
		       count(DISTINCT source_scope) FILTER (WHERE status = 'Running'),
		       count(DISTINCT source_scope),
		       count(*) FILTER (WHERE status <> 'Running' AND NOT (status = 'Failed' AND details->>'phase' = 'failed_enqueue'))
		FROM ingestion_batches`).Scan(&running, &runningScopes, &scopes, &other))
	require.Equal(t, 30, running, "one Running batch per folder")
	require.Equal(t, 30, runningScopes)
	require.Equal(t, 30, scopes, "no other folder")
	require.Zero(t, other, "besides them, only failed enqueues")
	// Messages redelivered after the stall (visibility 4 s < 8 s) are
	// deleted once per receive.
	require.GreaterOrEqual(t, c.metric(`ingest_sqs_messages_deleted_total{outcome="imported"}`), 30.0)
	require.True(t, strings.Contains(c.logs.String(), `"msg":"sqs round failed: backing off"`))
}

// TestSQSCommandRefusesBadSettings: invalid_input naming the flag, exit 2,
// before anything is contacted.
func TestSQSCommandRefusesBadSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args  []string
		field string
	}{
		{[]string{"sqs"}, "queue_url"},
		{[]string{"sqs", "--queue-url", "http://127.0.0.1:1/q", "--bucket", "Bad_Bucket"}, "bucket"},
		{[]string{"sqs", "--queue-url", "http://127.0.0.1:1/q", "--wait-time", "30s"}, "wait_time"},
		{[]string{"sqs", "--queue-url", "http://127.0.0.1:1/q", "--max-messages", "11"}, "max_messages"},
		{[]string{"sqs", "--queue-url", "http://127.0.0.1:1/q", "--visibility-timeout", "10s"}, "visibility_timeout"},
		{[]string{"sqs", "--queue-url", "http://127.0.0.1:1/q", "--path-pattern", "tenants/{tenant_id}/"}, "path_pattern"},
	} {
		out, code := runEnqueue(t, "postgres://127.0.0.1:1/none", c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, out)
		o := outcome(t, out)
		require.Equal(t, "invalid_input", o["outcome"])
		require.Equal(t, c.field, o["field"], "%v", c.args)
	}
}

// TestSQSUnmappedFolderReachesTheDeadLetterQueue: an "enqueue sqs"
// process never deletes the notification of a folder outside the path
// pattern: it logs it with its message id, counts it, and the queue's
// redrive policy moves it to the DLQ after two receives; the good
// notification beside it is imported and deleted.
func TestSQSUnmappedFolderReachesTheDeadLetterQueue(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	srv := sqstest.Start(t)
	dlq := srv.CreateQueue(t, "uploads-dlq", nil)
	queue := srv.CreateQueue(t, "uploads", map[string]string{
		"VisibilityTimeout": "2",
		"RedrivePolicy":     fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"2"}`, srv.QueueARN(t, dlq)),
	})
	c := startSQSConsumer(t, "sqs-dlq", dbURL, srv, queue)
	srv.Send(t, queue, sqstest.S3Event(sqsBucket, "incoming/acme/upload-1/_SUCCESS"), sqstest.S3Event(sqsBucket, sqsMarker("acme", 1)))
	require.Eventually(t, func() bool {
		inDLQ, _ := srv.Counts(t, dlq)
		visible, inFlight := srv.Counts(t, queue)
		return inDLQ == 1 && visible == 0 && inFlight == 0
	}, 30*time.Second, 200*time.Millisecond, "the unmapped notification never reached the DLQ")
	batches, _ := batchCounts(t, pool)
	require.Equal(t, 1, batches)
	require.GreaterOrEqual(t, c.metric(`ingest_sqs_messages_left_total{reason="unmapped"}`), 2.0)
	require.Equal(t, 1.0, c.metric(`ingest_sqs_messages_deleted_total{outcome="imported"}`))
	line := c.waitLog(`"reason":"unmapped"`, time.Second)
	require.Contains(t, line, `"message_id":"`)
	require.Contains(t, line, "will reach the dead-letter queue")
}

// TestSQSConsumerSIGTERMFinishesTheRoundInHand sends SIGTERM to "enqueue
// sqs" while its round waits between commit and delete: it deletes the
// committed round's messages and then exits 0.
func TestSQSConsumerSIGTERMFinishesTheRoundInHand(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	srv := sqstest.Start(t)
	queue := srv.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "30"})
	var bodies []string
	for i := range 5 {
		bodies = append(bodies, sqstest.SNSEnvelope(sqstest.S3Event(sqsBucket, sqsMarker("initech", i))))
	}
	srv.Send(t, queue, bodies...)
	c := startSQSConsumer(t, "sqs-term", dbURL, srv, queue, "--test-delay-after-commit", "2s")
	c.waitLog(`"msg":"test delay between commit and delete"`, 30*time.Second)
	c.signal(syscall.SIGTERM)
	require.Equal(t, 0, c.wait(15*time.Second))
	visible, inFlight := srv.Counts(t, queue)
	require.Equal(t, [2]int{0, 0}, [2]int{visible, inFlight}, "the committed round's messages were deleted before exit")
	batches, _ := batchCounts(t, pool)
	require.Equal(t, 5, batches)
	require.Contains(t, c.logs.String(), `"msg":"stopped: the round in hand was finished"`)
}
