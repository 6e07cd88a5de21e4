package sqsconsumer_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/sqsconsumer"
	"github.com/fleet/ingest/internal/testkit/sqstest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// TestSQSConsumerCountsDataObjectsOfPublishedFolders: messages naming data
// objects of a folder whose newest batch Succeeded are deleted as
// late_object, and the folder is counted and logged once per message —
// not once per object, however many records name it — with its batch; a
// message naming data objects of a folder with a running batch stays
// ignored, and a message that also completes a folder is imported.
func TestSQSConsumerCountsDataObjectsOfPublishedFolders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 30, 3)
	var logs testproc.SyncBuffer
	client, err := jobs.NewInsertClient(f.pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	f.consumer, err = sqsconsumer.New(sqsconsumer.Config{
		Queue: f.sqs.Client(), QueueURL: f.queue,
		Importer: &jobs.Enqueuer{Pool: f.pool, River: client, Metrics: f.metrics, Logger: slog.New(slog.DiscardHandler)},
		Batches:  batch.NewStore(f.pool),
		Mapping:  folder.Mapping{Buckets: []string{bucket}}, WaitTime: -1,
		Metrics: f.metrics, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	require.NoError(t, err)

	published, running := marker("acme", "u1"), marker("acme", "u2")
	f.sqs.Send(t, f.queue, sqstest.S3Event(bucket, published), sqstest.S3Event(bucket, running))
	res, err := f.consumer.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Folders)
	var id int64
	require.NoError(t, f.pool.QueryRow(ctx, `
		UPDATE ingestion_batches SET status = 'Succeeded' WHERE details->>'sourceFolder' LIKE '%/u1' RETURNING id`).Scan(&id))

	dir := strings.TrimSuffix(published, "/_SUCCESS")
	other := strings.TrimSuffix(running, "/_SUCCESS")
	f.sqs.Send(t, f.queue,
		sqstest.S3Events(bucket, dir+"/part-1.csv", dir+"/part-2.csv", dir+"/part-3.csv"),
		sqstest.SNSEnvelope(sqstest.S3Event(bucket, dir+"/part-4.csv")),
		sqstest.S3Event(bucket, other+"/part-1.csv"),
		sqstest.S3Events(bucket, dir+"/part-5.csv", marker("acme", "u3")),
	)
	res, err = f.consumer.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, sqsconsumer.RoundResult{Received: 4, Deleted: 4, Folders: 1}, res)
	require.Equal(t, 2.0, testutil.ToFloat64(f.metrics.SQSMessagesDeleted.WithLabelValues("late_object")))
	require.Equal(t, 1.0, testutil.ToFloat64(f.metrics.SQSMessagesDeleted.WithLabelValues("ignored")))
	require.Equal(t, 3.0, testutil.ToFloat64(f.metrics.SQSMessagesDeleted.WithLabelValues("imported")), "u1, u2, then u3")
	require.Equal(t, 3.0, testutil.ToFloat64(f.metrics.LateObjectEvents.WithLabelValues("sqs")), "once per folder and message")

	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["msg"] == "object events for a published folder: its slice does not hold these objects as they are now" {
			lines = append(lines, m)
		}
	}
	require.Len(t, lines, 3)
	events := map[float64]int{}
	for _, l := range lines {
		require.Equal(t, "s3://"+bucket+"/"+dir, l["folder"])
		require.Equal(t, float64(id), l["batch_id"])
		require.Equal(t, "sqs", l["door"])
		require.NotEmpty(t, l["message_id"])
		events[l["events"].(float64)]++
	}
	require.Equal(t, map[float64]int{3: 1, 1: 2}, events, "the three records of one message are one line")
}
