package sqsconsumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/sqsconsumer"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

const bucket = "fleet-uploads"

func marker(tenant, upload string) string {
	return fmt.Sprintf("tenants/%s/db_%s/company-1/%s/_SUCCESS", tenant, tenant, upload)
}

type fixture struct {
	pool     *pgxpool.Pool
	sqs      *sqstest.Server
	queue    string
	dlq      string
	metrics  *metrics.Metrics
	consumer *sqsconsumer.Consumer
}

// newFixture starts an SQS server with a queue (visibility timeout vis,
// redrive to a DLQ after maxReceives) and a consumer on a fresh database.
func newFixture(t *testing.T, vis, maxReceives int) *fixture {
	t.Helper()
	f := &fixture{pool: pgtest.NewPool(t), sqs: sqstest.Start(t), metrics: metrics.New()}
	f.dlq = f.sqs.CreateQueue(t, "uploads-dlq", nil)
	f.queue = f.sqs.CreateQueue(t, "uploads", map[string]string{
		"VisibilityTimeout": fmt.Sprint(vis),
		"RedrivePolicy":     fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"%d"}`, f.sqs.QueueARN(t, f.dlq), maxReceives),
	})
	client, err := jobs.NewInsertClient(f.pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	enq := &jobs.Enqueuer{Pool: f.pool, River: client, Metrics: f.metrics, Logger: slog.New(slog.DiscardHandler)}
	f.consumer, err = sqsconsumer.New(sqsconsumer.Config{
		Queue: f.sqs.Client(), QueueURL: f.queue, Importer: enq,
		Mapping:  folder.Mapping{Buckets: []string{bucket}},
		WaitTime: -1, // short polls: the test server waits the whole poll even when messages are waiting
		Metrics:  f.metrics, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	return f
}

func (f *fixture) batches(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	return n
}

// TestSQSConsumerReadsEveryEnvelope sends an S3 event, the same inside an
// SNS envelope, a raw SNS delivery (the S3 event itself), an EventBridge
// "Object Created" event and two s3:TestEvents (plain and inside SNS): four
// folders are imported in the round, every message is deleted, the test
// events are counted, and a non-marker object completes nothing.
func TestSQSConsumerReadsEveryEnvelope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 30, 3)
	f.sqs.Send(t, f.queue,
		sqstest.S3Event(bucket, marker("acme", "u1")),
		sqstest.SNSEnvelope(sqstest.S3Event(bucket, marker("acme", "u2"))),
		sqstest.S3Event(bucket, marker("globex", "with space")), // raw SNS delivery is the S3 event
		sqstest.EventBridgeObjectCreated(bucket, marker("globex", "u4")),
		sqstest.TestEvent(bucket),
		sqstest.SNSEnvelope(sqstest.TestEvent(bucket)),
		sqstest.S3Event(bucket, "tenants/acme/db_acme/company-1/u1/part-0.csv"),
	)
	res, err := f.consumer.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, sqsconsumer.RoundResult{Received: 7, Deleted: 7, Folders: 4}, res)
	require.Equal(t, 4, f.batches(t))
	var folders []string
	rows, err := f.pool.Query(ctx, `SELECT details->>'sourceFolder' FROM ingestion_batches ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		folders = append(folders, s)
	}
	require.NoError(t, rows.Err())
	require.Contains(t, folders, "s3://fleet-uploads/tenants/globex/db_globex/company-1/with space")
	visible, inFlight := f.sqs.Counts(t, f.queue)
	require.Equal(t, [2]int{0, 0}, [2]int{visible, inFlight})
	require.Equal(t, 2.0, testutil.ToFloat64(f.metrics.SQSMessagesDeleted.WithLabelValues("test_event")))
	require.Equal(t, 4.0, testutil.ToFloat64(f.metrics.SQSMessagesDeleted.WithLabelValues("imported")))
	require.Equal(t, 1.0, testutil.ToFloat64(f.metrics.SQSMessagesDeleted.WithLabelValues("ignored")))
	require.Equal(t, 7.0, testutil.ToFloat64(f.metrics.SQSMessagesReceived))

	// The same notifications again (SQS delivers at least once): nothing
	// new, every message deleted.
	f.sqs.Send(t, f.queue, sqstest.S3Event(bucket, marker("acme", "u1")), sqstest.EventBridgeObjectCreated(bucket, marker("globex", "u4")))
	res, err = f.consumer.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Deleted)
	require.Equal(t, 4, f.batches(t))
}

// TestSQSConsumerLeavesWhatCannotSucceed sends messages that can never be
// imported — an unmapped folder, a bucket not on the allow-list, a body
// that is no notification, an SNS subscription confirmation — next to one
// that can: that one is imported and deleted, the others stay in the queue,
// counted by reason, and after maxReceiveCount receives the queue's
// redrive policy moves them to the dead-letter queue.
func TestSQSConsumerLeavesWhatCannotSucceed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1, 2)
	f.sqs.Send(t, f.queue,
		sqstest.S3Event(bucket, "elsewhere/acme/u1/_SUCCESS"),
		sqstest.S3Event("other-bucket", marker("acme", "u1")),
		`{"hello":"world"}`,
		sqstest.SNSSubscriptionConfirmation(),
		sqstest.S3Event(bucket, marker("acme", "good")),
	)
	res, err := f.consumer.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, sqsconsumer.RoundResult{Received: 5, Deleted: 1, Left: 4, Folders: 1}, res)
	require.Equal(t, 1, f.batches(t))
	for reason, n := range map[string]float64{"unmapped": 1, "bucket_not_allowed": 1, "malformed": 1, "sns_control": 1} {
		require.Equal(t, n, testutil.ToFloat64(f.metrics.SQSMessagesLeft.WithLabelValues(reason)), reason)
	}
	// They come back after the visibility timeout, are left again, and
	// then move to the DLQ.
	require.Eventually(t, func() bool {
		_, err := f.consumer.Round(ctx)
		require.NoError(t, err)
		visible, inFlight := f.sqs.Counts(t, f.queue)
		dlq, _ := f.sqs.Counts(t, f.dlq)
		return visible == 0 && inFlight == 0 && dlq == 4
	}, 15*time.Second, 200*time.Millisecond)
	require.Equal(t, 1, f.batches(t))
}

// failing is an Importer whose database is down.
type failing struct{}

func (failing) ImportMany(context.Context, []jobs.ImportRequest) ([]jobs.Result, error) {
	return nil, fmt.Errorf("connect: connection refused")
}

// TestSQSConsumerDatabaseDownLeavesMessages fails the burst: no message
// with a folder is deleted (the test event is), the round reports the
// error for the back-off, and the messages come back and are imported
// once the database answers.
func TestSQSConsumerDatabaseDownLeavesMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1, 10)
	down, err := sqsconsumer.New(sqsconsumer.Config{
		Queue: f.sqs.Client(), QueueURL: f.queue, Importer: failing{}, WaitTime: -1,
		Mapping: folder.Mapping{Buckets: []string{bucket}}, Metrics: f.metrics, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	f.sqs.Send(t, f.queue, sqstest.S3Event(bucket, marker("acme", "a")), sqstest.S3Event(bucket, marker("acme", "b")), sqstest.TestEvent(bucket))
	res, err := down.Round(ctx)
	require.ErrorContains(t, err, "connection refused")
	require.Equal(t, sqsconsumer.RoundResult{Received: 3, Deleted: 1, Left: 2, Folders: 2}, res)
	require.Equal(t, 2.0, testutil.ToFloat64(f.metrics.SQSMessagesLeft.WithLabelValues("database_unavailable")))
	require.Eventually(t, func() bool {
		_, err := f.consumer.Round(ctx)
		require.NoError(t, err)
		visible, inFlight := f.sqs.Counts(t, f.queue)
		return visible == 0 && inFlight == 0
	}, 10*time.Second, 100*time.Millisecond)
	require.Equal(t, 2, f.batches(t))
}

// TestSQSConsumerRunStopsAfterTheRoundInHand cancels Run's context while a
// round waits between its commit and its delete: Run returns only after
// the messages were deleted.
func TestSQSConsumerRunStopsAfterTheRoundInHand(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 30, 10)
	client, err := jobs.NewInsertClient(f.pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	enq := &jobs.Enqueuer{Pool: f.pool, River: client, Metrics: f.metrics, Logger: slog.New(slog.DiscardHandler)}
	slow, err := sqsconsumer.New(sqsconsumer.Config{
		Queue: f.sqs.Client(), QueueURL: f.queue, Importer: enq, WaitTime: -1, DelayAfterCommit: time.Second,
		Mapping: folder.Mapping{Buckets: []string{bucket}}, Metrics: f.metrics, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	f.sqs.Send(t, f.queue, sqstest.S3Event(bucket, marker("acme", "a")))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- slow.Run(ctx) }()
	require.Eventually(t, func() bool { return f.batches(t) == 1 }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	visible, inFlight := f.sqs.Counts(t, f.queue)
	require.Equal(t, [2]int{0, 0}, [2]int{visible, inFlight})
}

// TestSQSConsumerConfig refuses settings SQS would refuse.
func TestSQSConsumerConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg     sqsconsumer.Config
		setting string
	}{
		{sqsconsumer.Config{}, "QueueURL"},
		{sqsconsumer.Config{QueueURL: "q", WaitTime: 21 * time.Second}, "WaitTime"},
		{sqsconsumer.Config{QueueURL: "q", MaxMessages: 11}, "MaxMessages"},
		{sqsconsumer.Config{QueueURL: "q", VisibilityTimeout: 500 * time.Millisecond}, "VisibilityTimeout"},
		{sqsconsumer.Config{QueueURL: "q", Mapping: folder.Mapping{Pattern: "tenants/{tenant_id}/"}}, "Mapping"},
		{sqsconsumer.Config{QueueURL: "q", Mapping: folder.Mapping{Buckets: []string{"Not_A_Bucket"}}}, "Mapping"},
	} {
		err := c.cfg.Validate()
		var ce *sqsconsumer.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, c.setting, ce.Setting)
	}
}

// TestSQSConsumerReceiveFailureIsCounted: a queue that does not exist (as
// for a wrong URL or a role without sqs:ReceiveMessage) fails the round,
// for the back-off, and counts ingest_sqs_receive_errors_total.
func TestSQSConsumerReceiveFailureIsCounted(t *testing.T) {
	t.Parallel()
	srv := sqstest.Start(t)
	m := metrics.New()
	c, err := sqsconsumer.New(sqsconsumer.Config{
		Queue: srv.Client(), QueueURL: srv.URL + "/123456789012/missing", Importer: failing{}, WaitTime: -1,
		Metrics: m, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	_, err = c.Round(context.Background())
	require.Error(t, err)
	require.Equal(t, 1.0, testutil.ToFloat64(m.SQSReceiveErrors))
}

// dialCounter is a loopback TCP proxy to target that counts the
// connections its clients open.
type dialCounter struct {
	ln    net.Listener
	dials atomic.Int64
}

func newDialCounter(t *testing.T, target string) *dialCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d := &dialCounter{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.dials.Add(1)
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return d
}

// TestSQSConsumerKeepsItsConnections runs a consumer over 3,000
// notifications through a proxy that counts connections: the client of
// NewSQSClient keeps one for every request the consumer has in flight at
// once, so it opens no more than that many; with the SDK's default (10
// idle per host) the same run opened 78 to 210, the round's concurrent
// deletes beyond ten redialling.
func TestSQSConsumerKeepsItsConnections(t *testing.T) {
	t.Parallel()
	const messages = 3000
	// A short visibility timeout: a round that fails transiently on a
	// loaded machine (its messages come back after it) costs seconds, not
	// the minute the test waits. It once waited a 60 s timeout out.
	f := newFixture(t, 5, 10)
	u, err := url.Parse(f.sqs.URL)
	require.NoError(t, err)
	proxy := newDialCounter(t, u.Host)
	proxied := "http://" + proxy.ln.Addr().String()
	bodies := make([]string, messages)
	for i := range bodies {
		bodies[i] = sqstest.S3Event(bucket, marker("acme", fmt.Sprintf("conn-%04d", i)))
	}
	f.sqs.Send(t, f.queue, bodies...)

	client, err := jobs.NewInsertClient(f.pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	enq := &jobs.Enqueuer{Pool: f.pool, River: client, Metrics: f.metrics, Logger: slog.New(slog.DiscardHandler)}
	cfg := sqsconsumer.Config{
		QueueURL: f.queue, Importer: enq, WaitTime: time.Second, Linger: 50 * time.Millisecond,
		Mapping: folder.Mapping{Buckets: []string{bucket}}, Metrics: f.metrics,
		// Warnings (a failed round, a redelivery) show with a failure.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	cfg.Queue = sqsconsumer.NewSQSClient(aws.Config{
		Region: sqstest.Region, Credentials: credentials.NewStaticCredentialsProvider("sqstest", "sqstest-secret", ""),
	}, cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(proxied) })
	c, err := sqsconsumer.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return f.batches(t) == messages }, 2*time.Minute, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		visible, inFlight := f.sqs.Counts(t, f.queue)
		return visible == 0 && inFlight == 0
	}, time.Minute, 50*time.Millisecond, "every message deleted")
	cancel()
	require.NoError(t, <-done)
	bound := sqsconsumer.MaxRequestsInFlight(cfg)
	t.Logf("%d connections opened for %d messages (at most %d requests in flight)", proxy.dials.Load(), messages, bound)
	require.LessOrEqual(t, proxy.dials.Load(), int64(bound), "connections opened")
}
