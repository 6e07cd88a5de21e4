package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// TestEveryDoorLoadsNoFolderWithoutItsMarker: the rule "a folder is loaded
// only once its producer said it is complete" holds on every door, because
// the worker checks it where it reads the folder. A folder with data and
// no completion marker, imported through the command line, POST
// /v1/imports, an S3 event, an SQS message and reconcile (the last three
// saw a marker that was gone by the time the worker listed the folder: a
// producer that restarted its upload), ends Failed, failed_pre_commit with
// reason folder_incomplete, and nothing reaches the warehouse. The same
// folders imported with the explicit opt-out (--no-marker, "no_marker":
// true) load; the others load once their marker's own notification (or
// reconcile's next pass) brings them, with the marker there.
func TestEveryDoorLoadsNoFolderWithoutItsMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	store := s3test.Start(t)
	store.CreateBucket(t, sqsBucket)
	const tenant, database, company = "acme", "db_acme", "company-1"
	key := func(n int) string { return fmt.Sprintf("tenants/%s/%s/%s/upload-%d", tenant, database, company, n) }
	folderOf := func(n int) string { return "s3://" + sqsBucket + "/" + key(n) }
	deleteMarker := func(n int) {
		_, err := store.Client().DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(sqsBucket), Key: aws.String(key(n) + "/_SUCCESS")})
		require.NoError(t, err)
	}
	for n := 1; n <= 5; n++ {
		store.Put(t, sqsBucket, key(n)+"/trips.csv", []byte("vehicle,km\nV1,10\nV2,20\n"))
	}
	// Reconcile's folder has its marker when reconcile lists the bucket.
	store.Put(t, sqsBucket, key(5)+"/_SUCCESS", nil)

	// The five doors, the worker not running yet.
	ids := map[int]int64{}
	out, code := runEnqueue(t, dbURL, "import", "--tenant-id", tenant, "--tenant-database", database, "--company-id", company, "--folder", folderOf(1))
	require.Equal(t, 0, code, out)
	ids[1] = int64(outcome(t, out)["batch_id"].(float64))

	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("door-token\n"), 0o600))
	_, base := startServe(t, dbURL, nil, "--auth-token-file", tokenFile)
	status, body := postJSON(t, base+"/v1/imports", "door-token", map[string]any{"folder": folderOf(2)})
	require.Equal(t, http.StatusAccepted, status, body)
	ids[2] = int64(body["batch_id"].(float64))

	sendEvent := func(n int) {
		t.Helper()
		req, err := newRequest(base+"/v1/events/s3", string(s3EventBody(sqsBucket, key(n)+"/_SUCCESS")))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer door-token")
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
	}
	sendEvent(3)

	sqs := sqstest.Start(t)
	queue := sqs.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "30"})
	startSQSConsumer(t, "sqs", dbURL, sqs, queue)
	sqs.Send(t, queue, sqstest.S3Event(sqsBucket, key(4)+"/_SUCCESS"))
	waitDrained(t, sqs, queue, 60*time.Second)

	byOutcome, _, code := runReconcile(t, dbURL, store.Env(), "--bucket", sqsBucket, "--prefix", "tenants/")
	require.Equal(t, 0, code)
	require.Len(t, byOutcome["enqueued"], 1, "%v", byOutcome)
	deleteMarker(5) // the producer restarted its upload before a worker read it

	newest := func(n int) batch.Batch {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT max(id) FROM ingestion_batches WHERE source_scope = $1`, "fleet_s3:"+folderOf(n)).Scan(&id))
		b, _ := getBatch(t, pool, id)
		return b
	}
	for n := 3; n <= 5; n++ {
		ids[n] = newest(n).ID
	}
	require.Len(t, ids, 5)

	worker := startWorkerEnv(t, dbURL, store.Env(), fastLease...)
	for n, id := range ids {
		b := waitStatus(t, pool, id, batch.StatusFailed, 60*time.Second)
		_, d := getBatch(t, pool, b.ID)
		require.Equal(t, batch.PhaseFailedPreCommit, d.Phase, "door %d", n)
		require.NotNil(t, d.LastError, "door %d", n)
		require.Equal(t, batch.ReasonFolderIncomplete, d.LastError.Reason, "door %d", n)
		require.Contains(t, d.LastError.Message, `no completion marker "_SUCCESS"`, "door %d", n)
		require.False(t, d.RedshiftCommitted, "door %d", n)
		total, _ := recordCopies(t, pool, b.Scope())
		require.Zero(t, total, "door %d: nothing reached the warehouse", n)
	}
	require.Eventually(t, func() bool {
		return worker.metric(`ingest_batch_failures_total{phase="failed_pre_commit",reason="folder_incomplete"}`) == 5
	}, 30*time.Second, 200*time.Millisecond)

	// The door answers how a batch ended, the reason named; another
	// tenant's batch is not found.
	getBatchAnswer := func(id int64, tenant, token string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/batches/%d?tenant_id=%s", base, id, tenant), nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, body
	}
	status, body = getBatchAnswer(ids[2], tenant, "door-token")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "Failed", body["status"])
	require.Equal(t, "failed_pre_commit", body["phase"])
	require.Equal(t, "folder_incomplete", body["reason"])
	require.Contains(t, body["last_error"], "no completion marker")
	status, _ = getBatchAnswer(ids[2], "globex", "door-token")
	require.Equal(t, http.StatusNotFound, status)
	status, _ = getBatchAnswer(ids[2], tenant, "wrong-token")
	require.Equal(t, http.StatusUnauthorized, status)

	// The explicit opt-out loads the folder as it is.
	out, code = runEnqueue(t, dbURL, "import", "--tenant-id", tenant, "--tenant-database", database, "--company-id", company, "--folder", folderOf(1), "--no-marker")
	require.Equal(t, 0, code, out)
	optCLI := int64(outcome(t, out)["batch_id"].(float64))
	status, body = postJSON(t, base+"/v1/imports", "door-token", map[string]any{"folder": folderOf(2), "no_marker": true})
	require.Equal(t, http.StatusAccepted, status, body)
	optHTTP := int64(body["batch_id"].(float64))

	// The marker's own notification, and reconcile's next pass, load the
	// others once the marker is there.
	for n := 3; n <= 5; n++ {
		store.Put(t, sqsBucket, key(n)+"/_SUCCESS", nil)
	}
	sendEvent(3)
	sqs.Send(t, queue, sqstest.S3Event(sqsBucket, key(4)+"/_SUCCESS"))
	waitDrained(t, sqs, queue, 60*time.Second)
	byOutcome, _, code = runReconcile(t, dbURL, store.Env(), "--bucket", sqsBucket, "--prefix", "tenants/")
	require.Equal(t, 0, code)
	require.Len(t, byOutcome["enqueued"], 1, "reconcile enqueues the folder whose marker is newer than its failure: %v", byOutcome)

	loaded := []int64{optCLI, optHTTP}
	for n := 3; n <= 5; n++ {
		b := newest(n)
		require.NotEqual(t, ids[n], b.ID, "door %d: a new batch", n)
		loaded = append(loaded, b.ID)
	}
	for _, id := range loaded {
		b := waitStatus(t, pool, id, batch.StatusSucceeded, 60*time.Second)
		total, distinct := recordCopies(t, pool, b.Scope())
		require.Equal(t, 2, total, "batch %d", id)
		require.Equal(t, 2, distinct, "batch %d", id)
	}
	status, body = getBatchAnswer(loaded[2], tenant, "door-token")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "Succeeded", body["status"])
	require.Empty(t, body["reason"])
	require.EqualValues(t, 1, body["objects"].(map[string]any)["count"])
	_, d := getBatch(t, pool, optCLI)
	require.True(t, d.MarkerOptional)
	_, d = getBatch(t, pool, loaded[2])
	require.False(t, d.MarkerOptional)
	require.Equal(t, "_SUCCESS", d.Objects.Marker)

	// Reconcile again: the failed batch's marker is not newer than the
	// load that followed it, so nothing more is enqueued.
	byOutcome, _, code = runReconcile(t, dbURL, store.Env(), "--bucket", sqsBucket, "--prefix", "tenants/")
	require.Equal(t, 0, code)
	require.Empty(t, byOutcome["enqueued"], "%v", byOutcome)
}
