package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/uploads"
)

// eventBridgeBody is an EventBridge "Object Created" event from S3.
func eventBridgeBody(bucket, key string) []byte {
	b, _ := json.Marshal(map[string]any{
		"version": "0", "id": "e1", "source": "aws.s3", "detail-type": "Object Created",
		"detail": map[string]any{"bucket": map[string]any{"name": bucket}, "object": map[string]any{"key": key}},
	})
	return b
}

// snsWrapped is an S3 notification inside an SNS envelope (non-raw
// delivery), as a bearer-authenticated sender may forward it.
func snsWrapped(inner []byte) []byte {
	b, _ := json.Marshal(map[string]any{"Type": "Notification", "MessageId": "m-1", "TopicArn": "arn:aws:sns:eu-west-1:123456789012:uploads",
		"Message": string(inner), "Timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	return b
}

// TestSlashBucketCannotWriteIntoAnotherTenant replays the cross-tenant write
// of the second red-team round through a real enqueue serve without
// --bucket (the chart's old default): a notification whose bucket name is
// "rt-bucket/tenants/acme/db1/c1/evil" and whose key is
// tenants/victim/db1/c1/_SUCCESS used to be answered 202 and loaded acme's
// objects into victim's slice. In every form — a plain S3 notification with
// the bearer token, the same signed with HMAC, an EventBridge event, an SNS
// envelope — it is now refused 422 naming the bucket, and nothing is
// written. Folders and keys with invisible formatting characters are
// refused the same way.
func TestSlashBucketCannotWriteIntoAnotherTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	secretFile := filepath.Join(t.TempDir(), "hmac")
	require.NoError(t, os.WriteFile(secretFile, []byte("slash-secret"), 0o600))
	_, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok"}, "--hmac-secret-file", secretFile)

	const evil, key = "rt-bucket/tenants/acme/db1/c1/evil", "tenants/victim/db1/c1/_SUCCESS"
	requireRefused := func(form string, status int, out map[string]any, field string) {
		t.Helper()
		require.Equal(t, http.StatusUnprocessableEntity, status, "%s: %v", form, out)
		results, _ := out["results"].([]any)
		require.Len(t, results, 1, "%s: %v", form, out)
		r := results[0].(map[string]any)
		require.Equal(t, "invalid_input", r["outcome"], "%s: %v", form, r)
		require.Equal(t, field, r["field"], "%s: %v", form, r)
	}
	status, out := postJSON(t, base+"/v1/events/s3", "tok", json.RawMessage(s3EventBody(evil, key)))
	requireRefused("S3 notification, bearer", status, out, "bucket")
	signed := s3EventBody(evil, key)
	sig, ts := uploads.Sign([]byte("slash-secret"), signed, time.Now())
	status, out = postSigned(t, base, signed, sig, ts)
	requireRefused("S3 notification, HMAC", status, out, "bucket")
	status, out = postJSON(t, base+"/v1/events/s3", "tok", json.RawMessage(eventBridgeBody(evil, key)))
	requireRefused("EventBridge, bearer", status, out, "bucket")
	status, out = postJSON(t, base+"/v1/events/s3", "tok", json.RawMessage(snsWrapped(s3EventBody(evil, key))))
	requireRefused("SNS envelope, bearer", status, out, "bucket")
	for _, bucket := range []string{"RT-BUCKET", "rt-bucket:443", "rt-bucket?x=/tenants/acme"} {
		status, out = postJSON(t, base+"/v1/events/s3", "tok", json.RawMessage(eventBridgeBody(bucket, key)))
		requireRefused("EventBridge, bucket "+bucket, status, out, "bucket")
	}
	// Invisible characters in the key: a bidi override, a zero-width space.
	for _, k := range []string{"tenants/vic\u202etim/db1/c1/_SUCCESS", "tenants/victim\u200b/db1/c1/_SUCCESS", "tenants/victim\u2003/db1/c1/_SUCCESS"} {
		status, out = postJSON(t, base+"/v1/events/s3", "tok", json.RawMessage(eventBridgeBody("rt-bucket", k)))
		requireRefused(fmt.Sprintf("key %q", k), status, out, "folder")
	}
	// The same through POST /v1/imports.
	for _, f := range []string{"s3://rt-bucket/tenants/vic\u202etim/db1/c1/x", "s3://rt-bucket/tenants/victim/db1/c1\u2066/x"} {
		status, out = postJSON(t, base+"/v1/imports", "tok", map[string]any{"folder": f})
		require.Equal(t, http.StatusUnprocessableEntity, status, "%q: %v", f, out)
		require.Equal(t, "folder", out["field"], "%q: %v", f, out)
	}

	var batches int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&batches))
	require.Zero(t, batches, "nothing was reserved")

	// A real bucket: the folder is victim's own, from the canonical path.
	status, out = postJSON(t, base+"/v1/events/s3", "tok", json.RawMessage(eventBridgeBody("rt-bucket", "tenants//victim/db1/c1/_SUCCESS")))
	require.Equal(t, http.StatusAccepted, status, out)
	r := out["results"].([]any)[0].(map[string]any)
	b, _ := getBatch(t, pool, int64(r["batch_id"].(float64)))
	require.Equal(t, "victim", b.TenantID)
	require.Equal(t, "fleet_s3:s3://rt-bucket/tenants/victim/db1/c1", b.Scope())
}

// startStrictWorker starts a worker as production runs it: without
// --dev-allow-local-folders.
func startStrictWorker(t *testing.T, dbURL string, extra ...string) *workerProc {
	t.Helper()
	name := fmt.Sprintf("strict%d", workerSeq.Add(1))
	p := startProcess(t, name, "worker", append([]string{"run", "--metrics-addr", "127.0.0.1:0", "--name", name}, extra...),
		[]string{"DATABASE_URL=" + dbURL}, `"msg":"metrics listener started"`)
	p.waitLog(`"msg":"worker started"`, 30*time.Second)
	return p
}

// waitParked waits until batch id is parked and returns it.
func waitParked(t *testing.T, pool *pgxpool.Pool, id int64) batch.Batch {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := getBatchRaw(pool, id)
		require.NoError(t, err)
		if b.ParkedAt != nil || time.Now().After(deadline) {
			require.NotNil(t, b.ParkedAt, "batch %d was not parked: %+v", id, b)
			return b
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWorkerParksBatchesItWouldNotHaveAccepted: workers trust no batch row.
// With only the enqueue role's credentials the red team reserved a file://
// folder of the worker's host (its files then loaded into the attacker's
// slice) and a victim's S3 folder as tenant "attacker". Now: the enqueue
// role cannot insert an s3:// batch whose path names another tenant
// (row-level security), nor setval() a sequence; and a worker running as
// in production (the worker role, no --dev-allow-local-folders, a bucket
// allow-list) parks every batch it would not have accepted — a file://
// folder, a folder whose path names another tenant, a bucket off its list —
// with the reason, before reading a byte: nothing is loaded, no progress
// is recorded, and the reason names no host path.
func TestWorkerParksBatchesItWouldNotHaveAccepted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	applyRoles(t, admin)
	workerURL := loginAs(t, admin, dbURL, "fleet_worker")
	enqueueURL := loginAs(t, admin, dbURL, "fleet_enqueue")
	enqueuePool := pgtest.Pool(t, enqueueURL)

	// The database refuses what it can express.
	requireDenied(t, enqueuePool, "row-level security", `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope)
		VALUES ('vc', 'attacker', 'vdb', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Running', '{"version": 1, "phase": "reserved"}',
		        'fleet_s3:s3://fleet-uploads/tenants/victim/vdb/vc/up-1')`)
	for _, seq := range []string{"river_job_id_seq", "ingestion_batches_id_seq"} {
		requireDenied(t, enqueuePool, "permission denied", `SELECT setval('`+seq+`', 1)`)
		requireDenied(t, pgtest.Pool(t, workerURL), "permission denied", `SELECT setval('`+seq+`', 1)`)
	}
	out, code := runEnqueue(t, enqueueURL, "import", "--tenant-id", "attacker", "--tenant-database", "vdb", "--company-id", "vc", "--folder", "s3://fleet-uploads/tenants/victim/vdb/vc/up-1")
	require.Equal(t, 2, code, "the command line refuses it as enqueue serve does, before the database would: %s", out)
	require.Equal(t, 0, countBatches(t, dbURL), "the refused import wrote nothing")
	// An s3:// batch of its own tenant is still the enqueue role's to insert.
	out, code = runEnqueue(t, enqueueURL, "import", "--tenant-id", "acme", "--tenant-database", "adb", "--company-id", "ac", "--folder", "s3://other-bkt/tenants/acme/adb/ac/x")
	require.Equal(t, 0, code, out)
	offList := int64(outcome(t, out)["batch_id"].(float64))

	// A file:// folder of the worker's host: the enqueue role may reserve
	// it (the CLI is a development door too), the worker never reads it.
	// Its CSV is malformed, so a read would have failed the batch.
	hostDir := writeFolder(t, map[string]string{"_SUCCESS": "", "secrets.csv": "a,b\n\"unterminated\n"})
	out, code = runEnqueue(t, enqueueURL, "import", "--tenant-id", "attacker", "--tenant-database", "adb", "--company-id", "ac", "--folder", hostDir)
	require.Equal(t, 0, code, out)
	local := int64(outcome(t, out)["batch_id"].(float64))

	// A row another door (or an older role set-up, or an older build of
	// the command line) let through: written by the table owner, who
	// bypasses row-level security, through the enqueuer itself (every door
	// of this build refuses it, the table owner's command line too).
	out, code = runEnqueue(t, dbURL, "import", "--tenant-id", "attacker", "--tenant-database", "vdb", "--company-id", "vc", "--folder", "s3://fleet-uploads/tenants/victim/vdb/vc/up-1")
	require.Equal(t, 2, code, out)
	client, err := jobs.NewInsertClient(admin, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	res, err := (&jobs.Enqueuer{Pool: admin, River: client, Logger: slog.New(slog.DiscardHandler)}).Import(ctx, jobs.ImportRequest{
		TenantID: "attacker", TenantDatabase: "vdb", CompanyID: "vc", Folder: "s3://fleet-uploads/tenants/victim/vdb/vc/up-1"})
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeEnqueued, res.Outcome)
	crossTenant := res.BatchID

	startStrictWorker(t, workerURL, append([]string{"--bucket", "fleet-uploads"}, fastLease...)...)
	for id, want := range map[int64]string{
		local:       "file:// folders are not read by this worker",
		crossTenant: `the folder's path names tenant_id "victim", the batch "attacker"`,
		offList:     `folder is not mapped to a tenant: bucket "other-bkt" is not accepted`,
	} {
		b := waitParked(t, admin, id)
		require.Equal(t, batch.StatusRunning, b.Status)
		require.Contains(t, *b.ParkedReason, "refused by this worker's rules: "+want)
		require.NotContains(t, *b.ParkedReason, hostDir, "no host path in the reason")
		d, err := batch.ParseDetails(b.Details)
		require.NoError(t, err)
		require.Equal(t, batch.PhaseReserved, d.Phase, "details untouched: nothing was read")
		require.Nil(t, d.Progress, "no progress: nothing was read")
	}
	var records int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_records`).Scan(&records))
	require.Zero(t, records)
	out, code = runEnqueue(t, enqueueURL, "list", "--parked", "--json")
	require.Equal(t, 0, code, out)
	require.Equal(t, 3, strings.Count(out, "refused by this worker"), out)
}
