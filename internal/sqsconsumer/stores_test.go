package sqsconsumer_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/sqsconsumer"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// minioBody is a notification as MinIO writes it (its webhook envelope
// around S3 event records of its own: s3:-prefixed names, source
// minio:s3, empty region, keys escaped as form values).
func minioBody(eventName, source, escapedKey string) string {
	b, _ := json.Marshal(map[string]any{"EventName": eventName, "Key": bucket + "/…", "Records": []any{map[string]any{
		"eventVersion": "2.0", "eventSource": source, "awsRegion": "", "eventName": eventName,
		"s3": map[string]any{"bucket": map[string]any{"name": bucket}, "object": map[string]any{"key": escapedKey}},
	}}})
	return string(b)
}

// TestSQSConsumerReadsMinIOAndCountsIgnoredEvents: MinIO's notifications,
// direct or in an SNS envelope, import their folders; the events that
// complete none are deleted as ignored and counted by reason in
// ingest_events_ignored_total{door="sqs"}, those of an unknown shape too.
func TestSQSConsumerReadsMinIOAndCountsIgnoredEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 30, 3)
	f.sqs.Send(t, f.queue,
		minioBody("s3:ObjectCreated:Put", "minio:s3", "tenants%2Facme%2Fdb_acme%2Fcompany-1%2Fm+1%2F_SUCCESS"),
		sqstest.SNSEnvelope(minioBody("s3:ObjectCreated:CompleteMultipartUpload", "minio:s3", "tenants/acme/db_acme/company-1/m2/_SUCCESS")),
		minioBody("s3:ObjectCreated:Put", "minio:s3", "tenants/acme/db_acme/company-1/m3/part-0.csv"),
		minioBody("s3:ObjectRemoved:Delete", "minio:s3", "tenants/acme/db_acme/company-1/m3/_SUCCESS"),
		minioBody("s3:ObjectWarped:Put", "minio:s3", "tenants/acme/db_acme/company-1/m3/_SUCCESS"),
		minioBody("s3:ObjectCreated:Put", "minio:sqs", "tenants/acme/db_acme/company-1/m3/_SUCCESS"),
	)
	res, err := f.consumer.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, sqsconsumer.RoundResult{Received: 6, Deleted: 6, Folders: 2}, res)
	require.Equal(t, 2, f.batches(t))
	var folders []string
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT array_agg(details->>'sourceFolder' ORDER BY details->>'sourceFolder') FROM ingestion_batches`).Scan(&folders))
	require.Equal(t, []string{"s3://fleet-uploads/tenants/acme/db_acme/company-1/m 1", "s3://fleet-uploads/tenants/acme/db_acme/company-1/m2"}, folders)
	require.Equal(t, 4.0, testutil.ToFloat64(f.metrics.SQSMessagesDeleted.WithLabelValues("ignored")))
	for reason, want := range map[string]float64{"data_object": 1, "not_created": 1, "unknown_event": 1, "unknown_source": 1} {
		require.Equal(t, want, testutil.ToFloat64(f.metrics.EventsIgnored.WithLabelValues("sqs", reason)), reason)
		require.Zero(t, testutil.ToFloat64(f.metrics.EventsIgnored.WithLabelValues("events_s3", reason)), reason)
	}
}
