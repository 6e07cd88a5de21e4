package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

var reconcileTenants = []string{"acme", "globex", "initech", "umbrella"}

// folderKey is the prefix of folder n (under tenants/, the default pattern).
func folderKey(n int) string {
	t := reconcileTenants[n%len(reconcileTenants)]
	return fmt.Sprintf("tenants/%s/db_%s/company-1/upload-%05d", t, t, n)
}

// putFolders writes n completed folders to the bucket: each a marker, one
// in ten also a data object. It returns the number of objects.
func putFolders(t *testing.T, s3 *s3test.Server, bucket string, n int) (objects int) {
	t.Helper()
	var markers, data []string
	for i := range n {
		markers = append(markers, folderKey(i)+"/_SUCCESS")
		if i%10 == 0 {
			data = append(data, folderKey(i)+"/trips.csv")
		}
	}
	s3.PutMany(t, bucket, markers, nil)
	s3.PutMany(t, bucket, data, []byte("vehicle,km\nV1,10\n"))
	return len(markers) + len(data)
}

// runReconcile runs enqueue reconcile and returns its folder lines by
// outcome and its summary.
func runReconcile(t *testing.T, dbURL string, env []string, args ...string) (map[string][]map[string]any, map[string]any, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "enqueue"), append([]string{"reconcile"}, args...)...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dbURL, "LOG_LEVEL=warn"), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running enqueue reconcile: %v", err)
	}
	code := cmd.ProcessState.ExitCode()
	if code != 0 {
		t.Logf("enqueue reconcile exited %d: %s", code, stderr.String())
	}
	byOutcome := map[string][]map[string]any{}
	var summary map[string]any
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if s, ok := m["summary"]; ok {
			summary = s.(map[string]any)
			continue
		}
		o := m["outcome"].(string)
		byOutcome[o] = append(byOutcome[o], m)
	}
	require.NotNil(t, summary, "a summary line")
	return byOutcome, summary, code
}

// TestReconcileFindsExactlyTheMissedFolders: 2,000 completed folders, of
// which 1,800 were notified (imported as enqueue sqs would); a dry run
// names the 200 others and writes nothing; reconcile enqueues exactly
// those 200; a second run enqueues none. A folder whose batch failed
// before its commit is reported, not retried — unless
// --retry-failed-pre-commit; a succeeded one is already_succeeded.
func TestReconcileFindsExactlyTheMissedFolders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	s3 := s3test.Start(t)
	const bucket = "fleet-reconcile"
	s3.CreateBucket(t, bucket)
	start := time.Now()
	objects := putFolders(t, s3, bucket, 2000)
	t.Logf("wrote %d objects in %s", objects, time.Since(start).Round(time.Millisecond))

	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	enq := &jobs.Enqueuer{Pool: pool, River: client, Logger: slog.New(slog.DiscardHandler)}
	var notified []jobs.ImportRequest
	missed := map[string]bool{}
	for i := range 2000 {
		t := reconcileTenants[i%len(reconcileTenants)]
		f := "s3://" + bucket + "/" + folderKey(i)
		if i%10 == 3 {
			missed[f] = true
			continue
		}
		notified = append(notified, jobs.ImportRequest{TenantID: t, TenantDatabase: "db_" + t, CompanyID: "company-1", Folder: f})
	}
	res, err := enq.ImportMany(ctx, notified)
	require.NoError(t, err)
	require.Len(t, res, 1800)
	// Two notified folders finished: one failed before its commit, one succeeded.
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Failed', details = jsonb_set(details, '{phase}', '"failed_pre_commit"') WHERE id = $1`, res[0].BatchID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Succeeded', details = jsonb_set(details, '{phase}', '"published"') WHERE id = $1`, res[1].BatchID)
	require.NoError(t, err)

	env := s3.Env()
	args := []string{"--bucket", bucket, "--prefix", "tenants/"}
	dry, sum, code := runReconcile(t, dbURL, env, append(args, "--dry-run")...)
	require.Equal(t, 0, code)
	require.Len(t, dry["would_enqueue"], 200)
	require.Len(t, dry["running"], 1798)
	require.Len(t, dry["failed"], 1)
	require.Equal(t, "failed_pre_commit", dry["failed"][0]["phase"])
	require.Equal(t, float64(objects), sum["objects_listed"])
	batches, _ := batchCounts(t, pool)
	require.Equal(t, 1800, batches, "a dry run writes nothing")

	start = time.Now()
	out, sum, code := runReconcile(t, dbURL, env, args...)
	t.Logf("reconcile over 2,000 folders (%d objects): %s by the process, %.3fs scanning", objects, time.Since(start).Round(time.Millisecond), sum["duration_seconds"])
	require.Equal(t, 0, code)
	require.Len(t, out["enqueued"], 200)
	for _, f := range out["enqueued"] {
		require.True(t, missed[f["folder"].(string)], "%s was notified", f["folder"])
		require.NotZero(t, f["batch_id"])
	}
	require.Len(t, out["running"], 1798)
	require.Len(t, out["already_succeeded"], 1)
	require.Len(t, out["failed"], 1)
	require.Equal(t, 2000.0, sum["folders"])
	batches, scopes := batchCounts(t, pool)
	require.Equal(t, 2000, batches)
	require.Equal(t, 2000, scopes)

	out, _, code = runReconcile(t, dbURL, env, args...)
	require.Equal(t, 0, code)
	require.Empty(t, out["enqueued"], "a second run enqueues nothing")
	require.Len(t, out["running"], 1998)

	out, _, code = runReconcile(t, dbURL, env, append(args, "--retry-failed-pre-commit")...)
	require.Equal(t, 0, code)
	require.Len(t, out["enqueued"], 1, "the pre-commit failure is retried")
	require.Equal(t, float64(res[0].BatchID), out["enqueued"][0]["retry_of"])
}

// TestReconcileWhileTheConsumerWorks runs reconcile twice while an "enqueue
// sqs" process imports the notifications of the same 300 folders: each
// folder has exactly one batch whoever reserved it first.
func TestReconcileWhileTheConsumerWorks(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	s3 := s3test.Start(t)
	const bucket = "fleet-uploads" // the consumers' --bucket
	s3.CreateBucket(t, bucket)
	putFolders(t, s3, bucket, 300)
	sqs := sqstest.Start(t)
	queue := sqs.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "30"})
	var bodies []string
	for i := range 300 {
		bodies = append(bodies, sqstest.S3Event(bucket, folderKey(i)+"/_SUCCESS"))
	}
	startSQSConsumer(t, "sqs-racing", dbURL, sqs, queue)
	sqs.Send(t, queue, bodies...)
	enqueued := 0
	for range 2 {
		out, _, code := runReconcile(t, dbURL, s3.Env(), "--bucket", bucket, "--burst-size", "50")
		require.Equal(t, 0, code)
		enqueued += len(out["enqueued"])
	}
	waitDrained(t, sqs, queue, 60*time.Second)
	batches, scopes := batchCounts(t, pool)
	require.Equal(t, 300, batches)
	require.Equal(t, 300, scopes)
	t.Logf("reconcile enqueued %d of 300 folders before the consumer did", enqueued)
}

// TestReconcileEveryInTwoReplicas runs two "enqueue reconcile --every 1s
// --max-objects 1000" processes on 2,500 completed folders: the periods
// are shared (one replica works, the other skips), the pass spans periods
// from the checkpoint, every folder ends with one batch, and SIGTERM stops
// both with exit 0.
func TestReconcileEveryInTwoReplicas(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	s3 := s3test.Start(t)
	const bucket = "fleet-periodic"
	s3.CreateBucket(t, bucket)
	putFolders(t, s3, bucket, 2500)
	env := append([]string{"DATABASE_URL=" + dbURL}, s3.Env()...)
	args := []string{"reconcile", "--bucket", bucket, "--prefix", "tenants/", "--every", "1s", "--max-objects", "1000", "--admin-listen", "127.0.0.1:0"}
	a := startProcess(t, "reconcile-a", "enqueue", args, env, `"msg":"reconciling periodically"`)
	b := startProcess(t, "reconcile-b", "enqueue", args, env, `"msg":"reconciling periodically"`)
	require.Eventually(t, func() bool {
		var covered *time.Time
		err := pool.QueryRow(context.Background(), `SELECT covered_since FROM ingest_reconcile_checkpoints`).Scan(&covered)
		return err == nil && covered != nil
	}, 60*time.Second, 100*time.Millisecond, "the pass never completed")
	batches, scopes := batchCounts(t, pool)
	require.Equal(t, 2500, batches)
	require.Equal(t, 2500, scopes)
	sum := func(series string) float64 { return a.metric(series) + b.metric(series) }
	require.Equal(t, 2500.0, sum(`ingest_reconcile_missed_total`))
	require.GreaterOrEqual(t, sum(`ingest_reconcile_scans_total{outcome="scanned"}`), 3.0, "a pass of 2,750 objects at 1,000 per period")
	require.Positive(t, sum(`ingest_reconcile_scans_total{outcome="skipped"}`), "the other replica skipped")
	require.Zero(t, sum(`ingest_reconcile_scans_total{outcome="failed"}`))
	a.signal(syscall.SIGTERM)
	b.signal(syscall.SIGTERM)
	require.Equal(t, 0, a.wait(15*time.Second))
	require.Equal(t, 0, b.wait(15*time.Second))
}

// TestReconcileAndWorkerSurviveAControlCharacterKey: one tenant's folder
// holds a key with U+0001 (S3 accepts any Unicode key; unencoded, its
// listing page cannot be decoded) and another tenant's completed folder
// had its notification lost. A periodic "enqueue reconcile" process
// completes its passes: it skips the key, counts it and logs it escaped,
// and enqueues both folders (the first one's marker is readable); a
// worker process then fails the first tenant's batch before any warehouse
// write, naming the key escaped, and loads the other tenant's folder.
func TestReconcileAndWorkerSurviveAControlCharacterKey(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	s3 := s3test.Start(t)
	const bucket = "fleet-ctl-keys"
	s3.CreateBucket(t, bucket)
	acme := "tenants/acme/db_acme/company-1/upload-1/"
	globex := "tenants/globex/db_globex/company-1/upload-1/"
	badKey := acme + "trips\x01.csv"
	for _, prefix := range []string{acme, globex} {
		s3.Put(t, bucket, prefix+"trips.csv", []byte("vehicle,km\nV1,10\n"))
		s3.Put(t, bucket, prefix+"_SUCCESS", nil)
	}
	s3.Put(t, bucket, badKey, []byte("vehicle,km\nV9,90\n"))

	worker := startWorkerEnv(t, dbURL, s3.Env(), fastLease...)
	rec := startProcess(t, "reconcile", "enqueue",
		[]string{"reconcile", "--bucket", bucket, "--prefix", "tenants/", "--every", "1s", "--admin-listen", "127.0.0.1:0"},
		append([]string{"DATABASE_URL=" + dbURL}, s3.Env()...), `"msg":"reconciling periodically"`)
	line := rec.waitLog(`"msg":"reconcile: skipped an object key that no door reads"`, 30*time.Second)
	var logged struct{ Level, Key string }
	require.NoError(t, json.Unmarshal([]byte(line), &logged))
	require.Equal(t, "WARN", logged.Level)
	require.Equal(t, `"tenants/acme/db_acme/company-1/upload-1/trips\x01.csv"`, logged.Key)
	rec.waitLog(`"msg":"reconcile period finished"`, 30*time.Second)

	ids := map[string]int64{}
	require.Eventually(t, func() bool {
		rows, err := pool.Query(context.Background(), `SELECT tenant_id, id FROM ingestion_batches`)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var tenant string
			var id int64
			require.NoError(t, rows.Scan(&tenant, &id))
			ids[tenant] = id
		}
		return len(ids) == 2
	}, 30*time.Second, 50*time.Millisecond, "both folders enqueued")
	waitStatus(t, pool, ids["globex"], batch.StatusSucceeded, 60*time.Second)
	failed := waitStatus(t, pool, ids["acme"], batch.StatusFailed, 60*time.Second)
	_, d := getBatch(t, pool, failed.ID)
	require.Equal(t, batch.PhaseFailedPreCommit, d.Phase)
	require.NotNil(t, d.LastError)
	require.Contains(t, d.LastError.Message, `unreadable object key: "tenants/acme/db_acme/company-1/upload-1/trips\x01.csv" holds a control character (U+0001)`)
	total, _ := recordCopies(t, pool, failed.Scope())
	require.Zero(t, total, "nothing of the failed folder reached the warehouse")
	total, _ = recordCopies(t, pool, "fleet_s3:s3://"+bucket+"/"+strings.TrimSuffix(globex, "/"))
	require.Equal(t, 1, total)

	require.GreaterOrEqual(t, rec.metric(`ingest_reconcile_keys_skipped_total`), 1.0)
	require.Equal(t, 2.0, rec.metric(`ingest_reconcile_missed_total`))
	require.Zero(t, rec.metric(`ingest_reconcile_scans_total{outcome="failed"}`))
	require.NotContains(t, rec.logs.String(), "illegal character", "no page failed to decode")
	require.NotContains(t, worker.logs.String(), "illegal character")
	rec.signal(syscall.SIGTERM)
	require.Equal(t, 0, rec.wait(15*time.Second))
}
