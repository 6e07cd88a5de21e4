package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/miniotest"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestMinIONotifiesTheDoorAndTheWorkerReadsIt: a real MinIO server, its
// bucket notifications sent by its own webhook target (configured by its
// environment, the bucket's configuration set through the S3 API) to
// enqueue serve's POST /v1/events/s3 with the import token; objects
// uploaded through its S3 API (PutObject, a marker written by CopyObject);
// a worker reading the folders from MinIO (--s3-path-style, the endpoint
// by host name). Every folder with its marker ends Succeeded with exactly
// its records; the folder without one has no batch; the data objects'
// events are ignored as data_object and a removal as not_created, each
// counted by reason; an event of an unknown shape answers ignored with
// its reason and moves its counter; reconcile lists the bucket at MinIO's
// endpoint and finds nothing missed.
func TestMinIONotifiesTheDoorAndTheWorkerReadsIt(t *testing.T) {
	t.Parallel()
	miniotest.Require(t)
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	const (
		bucket = "fleet-minio"
		token  = "minio-door-token"
		target = "FLEET"
	)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))
	serve, base := startServe(t, dbURL, nil, "--auth-token-file", tokenFile, "--bucket", bucket)
	admin := "http://" + adminAddr(t, serve)

	start := time.Now()
	store := miniotest.Start(t, miniotest.WebhookEnv(target, base+"/v1/events/s3", token)...)
	t.Logf("minio ready in %s", time.Since(start).Round(time.Millisecond))
	store.CreateBucket(t, bucket)
	store.Notify(t, bucket, target, types.EventS3ObjectCreated, types.EventS3ObjectRemoved)
	startWorkerEnv(t, dbURL, store.Env(), "--s3-path-style", "--bucket", bucket)

	type upload struct {
		tenant, prefix string
		objects        map[string]string
		records        int
		marker         bool
	}
	prefix := func(tenant, company, name string) string {
		return fmt.Sprintf("tenants/%s/db_%s/%s/%s", tenant, tenant, company, name)
	}
	uploads := []upload{
		{tenant: "acme", prefix: prefix("acme", "company-1", "upload-1"), objects: sample, records: sampleRecords, marker: true},
		// A space and a plus: MinIO escapes the key as a form value.
		{tenant: "globex", prefix: prefix("globex", "company-1", "upload 2+b"), objects: map[string]string{"trips.csv": "vehicle,km\nV7,70\nV8,80\n"}, records: 2, marker: true},
		// Its marker is a copy (s3:ObjectCreated:Copy).
		{tenant: "acme", prefix: prefix("acme", "company-2", "upload-3"), objects: map[string]string{"part-0.ndjson": "{\"vehicle\":\"V9\"}\n"}, records: 1, marker: true},
		// No marker: no batch.
		{tenant: "acme", prefix: prefix("acme", "company-1", "upload-4"), objects: map[string]string{"trips.csv": "vehicle,km\nV0,1\n"}},
	}
	dataObjects := 0
	for _, u := range uploads {
		for name, body := range u.objects {
			if name == "_SUCCESS" {
				continue
			}
			store.Put(t, bucket, u.prefix+"/"+name, []byte(body))
			dataObjects++
		}
	}
	store.Put(t, bucket, uploads[0].prefix+"/_SUCCESS", nil)
	store.Put(t, bucket, uploads[1].prefix+"/_SUCCESS", nil)
	_, err := store.Client().CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String(bucket), Key: aws.String(uploads[2].prefix + "/_SUCCESS"),
		CopySource: aws.String(bucket + "/" + uploads[0].prefix + "/_SUCCESS")})
	require.NoError(t, err)
	_, err = store.Client().DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(uploads[3].prefix + "/trips.csv")})
	require.NoError(t, err)

	batches := batch.NewStore(pool)
	for _, u := range uploads {
		if !u.marker {
			continue
		}
		f, err := folder.Canonicalize("s3://" + bucket + "/" + u.prefix)
		require.NoError(t, err)
		var b batch.Batch
		require.Eventually(t, func() bool {
			b, err = batches.Latest(ctx, u.tenant, f.Scope())
			return err == nil
		}, 60*time.Second, 100*time.Millisecond, "no batch for %s: MinIO's notification of its marker was not imported", f)
		b = waitStatus(t, pool, b.ID, batch.StatusSucceeded, 60*time.Second)
		total, distinct := recordCopies(t, pool, f.Scope())
		require.Equal(t, u.records, total, "%s: exactly its records", f)
		require.Equal(t, u.records, distinct, f.String())
		t.Logf("%s: batch %d Succeeded with %d records, %s after MinIO was started", f, b.ID, total, time.Since(start).Round(time.Millisecond))
	}

	// MinIO sends each object's event once it is written: the door saw
	// every data object (ignored, data_object) and the removal
	// (not_created), and imported nothing else.
	ignored := func(reason string) string {
		return fmt.Sprintf(`ingest_events_ignored_total{door="events_s3",reason=%q}`, reason)
	}
	require.Eventually(t, func() bool {
		series := scrapeSeries(t, admin)
		return series[ignored("data_object")] == float64(dataObjects) && series[ignored("not_created")] == 1
	}, 30*time.Second, 100*time.Millisecond, "every data object's and the removal's event ignored and counted")
	series := scrapeSeries(t, admin)
	require.Zero(t, series[ignored("unknown_event")], "MinIO's events are of a known shape")
	require.Zero(t, series[ignored("unknown_source")])
	require.Equal(t, 3.0, series[`ingest_http_request_outcomes_total{outcome="enqueued",route="POST /v1/events/s3"}`])
	n, _ := batchCounts(t, pool)
	require.Equal(t, 3, n, "one batch per folder with its marker, none for the folder without")

	// An event of a shape nobody expected: answered ignored, with why,
	// and counted.
	status, out := postJSON(t, base+"/v1/events/s3", token, map[string]any{"Records": []any{map[string]any{
		"eventSource": "minio:s3", "eventName": "s3:ObjectTeleported:Put",
		"s3": map[string]any{"bucket": map[string]any{"name": bucket}, "object": map[string]any{"key": uploads[3].prefix + "/_SUCCESS"}},
	}}})
	require.Equal(t, http.StatusOK, status, out)
	res := out["results"].([]any)[0].(map[string]any)
	require.Equal(t, "ignored", res["outcome"])
	require.Equal(t, "unknown_event", res["ignored_reason"])
	require.Contains(t, res["reason"], "s3:ObjectTeleported:Put")
	require.Equal(t, 1.0, scrapeSeries(t, admin)[ignored("unknown_event")])
	n, _ = batchCounts(t, pool)
	require.Equal(t, 3, n)

	// Reconcile lists the bucket at MinIO's endpoint too (the same
	// --s3-path-style): every completed folder published, none missed.
	byOutcome, summary, code := runReconcile(t, dbURL, store.Env(), "--bucket", bucket, "--prefix", "tenants/", "--s3-path-style")
	require.Equal(t, 0, code)
	require.Len(t, byOutcome["already_succeeded"], 3, "%v", byOutcome)
	require.Empty(t, byOutcome["enqueued"])
	require.Equal(t, 3.0, summary["folders"])
}
