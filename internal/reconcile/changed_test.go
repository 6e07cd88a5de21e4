package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/reconcile"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
)

// loadS3 serves the buckets of the tests that load folders with the real
// worker pipeline, which finds S3 as a deployment does: through the AWS
// SDK's configuration (TestMain sets AWS_ENDPOINT_URL_S3). Other tests
// start their own server and pass its client.
var loadS3 *s3test.Server

func TestMain(m *testing.M) {
	loadS3 = s3test.New()
	loadS3.SetEnv()
	code := m.Run()
	loadS3.Close()
	os.Exit(code)
}

var loadBucketSeq atomic.Int64

// loadFixture is a bucket of the shared server, a fresh database, and the
// worker pipeline loading into the local warehouse.
type loadFixture struct {
	t      *testing.T
	bucket string
	*fixture
	logs     *testproc.SyncBuffer
	store    *batch.Store
	leases   *lease.Store
	pipeline *fleet.Pipeline
}

func newLoadFixture(t *testing.T) *loadFixture {
	t.Helper()
	f := &loadFixture{t: t, bucket: fmt.Sprintf("fleet-changed-%d", loadBucketSeq.Add(1)), logs: &testproc.SyncBuffer{}}
	f.fixture = &fixture{pool: pgtest.NewPool(t), s3: loadS3}
	loadS3.CreateBucket(t, f.bucket)
	client, err := jobs.NewInsertClient(f.pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	m := metrics.New()
	f.cfg = reconcile.Config{
		S3: loadS3.Client(), Bucket: f.bucket, Pool: f.pool, Metrics: m, Logger: slog.New(slog.NewJSONHandler(f.logs, nil)),
		Importer: &jobs.Enqueuer{Pool: f.pool, River: client, Metrics: m, Logger: slog.New(slog.DiscardHandler)},
	}
	f.store, f.leases = batch.NewStore(f.pool), lease.NewStore(f.pool)
	f.pipeline = &fleet.Pipeline{Warehouse: warehouse.NewPostgres(f.pool), Logger: slog.New(slog.DiscardHandler)}
	return f
}

// resetLogs gives the next scans a fresh log.
func (f *loadFixture) resetLogs() {
	f.logs = &testproc.SyncBuffer{}
	f.cfg.Logger = slog.New(slog.NewJSONHandler(f.logs, nil))
}

func (f *loadFixture) put(key, body string) {
	f.t.Helper()
	loadS3.Put(f.t, f.bucket, key, []byte(body))
}

func (f *loadFixture) delete(key string) {
	f.t.Helper()
	_, err := loadS3.Client().DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String(f.bucket), Key: aws.String(key)})
	require.NoError(f.t, err)
}

// scan runs one scan and returns its reports by folder key (the folder's
// path in the bucket).
func (f *loadFixture) scan(cfg reconcile.Config) (reconcile.Summary, map[string]reconcile.Folder) {
	f.t.Helper()
	reports := map[string]reconcile.Folder{}
	cfg.Report = func(r reconcile.Folder) {
		reports[strings.TrimPrefix(r.Folder, "s3://"+f.bucket+"/")] = r
	}
	sum, err := reconcile.Scan(context.Background(), cfg, "")
	require.NoError(f.t, err)
	require.True(f.t, sum.Complete)
	return sum, reports
}

// loadRunning runs every Running batch through the worker pipeline (lease,
// load into the warehouse, commit with the summary, publish) and requires
// each to succeed.
func (f *loadFixture) loadRunning() []int64 {
	f.t.Helper()
	ctx := context.Background()
	rows, err := f.pool.Query(ctx, `SELECT id FROM ingestion_batches WHERE status = 'Running' ORDER BY id`)
	require.NoError(f.t, err)
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(f.t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(f.t, rows.Err())
	for _, id := range ids {
		a, err := f.leases.Acquire(ctx, id, fmt.Sprintf("delivery-%d", id), time.Minute)
		require.NoError(f.t, err)
		require.Equal(f.t, lease.Acquired, a.Outcome)
		res, err := pipeline.Execute(ctx, f.store, a.Lease, nil, pipeline.Registry{batch.SourceTypeFleetS3: f.pipeline})
		require.NoError(f.t, err)
		require.Equal(f.t, pipeline.Succeeded, res.Outcome, "batch %d: %v", id, res.Err)
		_, err = f.leases.Release(ctx, a.Lease)
		require.NoError(f.t, err)
	}
	return ids
}

// changeLogs returns the "changed since its load" log lines, by folder.
func (f *loadFixture) changeLogs() map[string]map[string]any {
	f.t.Helper()
	out := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(f.logs.String()), "\n") {
		var m map[string]any
		require.NoError(f.t, json.Unmarshal([]byte(line), &m), line)
		if m["msg"] == "reconcile: a published folder changed since its load; imported again" {
			k := strings.TrimPrefix(m["folder"].(string), "s3://"+f.bucket+"/")
			require.NotContains(f.t, out, k, "a folder's change is logged once per scan")
			out[k] = m
		}
	}
	return out
}

const (
	folderA = "tenants/t1/db/company-1/upload-a" // gains a file
	folderB = "tenants/t1/db/company-1/upload-b" // a file rewritten
	folderC = "tenants/t1/db/company-1/upload-c" // unchanged, then a file removed
	folderD = "tenants/t2/db/company-1/upload-d" // its marker rewritten
	folderE = "tenants/t2/db/company-1/upload-e" // loaded by a build without summaries
)

// TestReconcileReimportsPublishedFoldersThatChanged: folders loaded and
// published by the real worker pipeline (which records the summary of the
// objects it read) are compared, on the next scans, with what the bucket
// holds. A folder that gained a file and one whose file was rewritten
// (new ETag) are imported again — exactly two new batches, each reported
// and logged with its reason and changed keys, counted by reason — and an
// unchanged one costs no import; after those loads, a second pass makes
// none. A folder whose marker was rewritten, and one with a file removed,
// are imported again too. A Succeeded batch without a summary (an older
// build) is counted, not compared, never imported. --since applies to the
// marker or any data object: a folder with an old marker and a new file
// is found; a folder untouched since is not even looked up.
func TestReconcileReimportsPublishedFoldersThatChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newLoadFixture(t)
	for _, dir := range []string{folderA, folderB, folderC, folderD, folderE} {
		f.put(dir+"/part-1.csv", "vehicle,km\nV1,10\n")
		f.put(dir+"/part-2.csv", "vehicle,km\nV2,20\n")
		f.put(dir+"/_SUCCESS", "")
	}
	// Not data for the worker nor for reconcile: other markers.
	f.put(folderC+"/_logs/run.txt", "spark")
	f.put(folderC+"/.hidden", "x")

	// The uploads' notifications were lost: the first scan enqueues all.
	sum, _ := f.scan(f.cfg)
	require.Equal(t, map[string]int{"enqueued": 5}, sum.Outcomes)
	require.Len(t, f.loadRunning(), 5)
	_, err := f.pool.Exec(ctx, `UPDATE ingestion_batches SET details = details - 'objects' WHERE details->>'sourceFolder' LIKE '%upload-e'`)
	require.NoError(t, err)

	// Nothing changed: no import; each folder compared (E cannot be).
	sum, reports := f.scan(f.cfg)
	require.Equal(t, map[string]int{"already_succeeded": 5}, sum.Outcomes)
	for _, dir := range []string{folderA, folderB, folderC, folderD} {
		require.Equal(t, reconcile.ComparedUnchanged, reports[dir].Compared, dir)
		require.Nil(t, reports[dir].Change, dir)
	}
	require.Equal(t, reconcile.ComparedNoSummary, reports[folderE].Compared)
	require.Equal(t, 1, sum.Unsummarized)
	require.Contains(t, f.logs.String(), `"msg":"reconcile: published folders whose batch records no summary of the objects it loaded (a build before the summary) were not compared","folders":1`)
	batches, _ := f.batches(t)
	require.Equal(t, 5, batches)

	// A gains a file, B's file is rewritten, E (no summary) gains one; C
	// and D are untouched (their markers are older than since).
	since := time.Now().Truncate(time.Millisecond)
	f.put(folderA+"/part-3.csv", "vehicle,km\nV3,30\n")
	f.put(folderB+"/part-2.csv", "vehicle,km\nV2,22\n")
	f.put(folderE+"/part-3.csv", "vehicle,km\nV3,30\n")
	f.resetLogs()
	cfg := f.cfg
	cfg.Since = since
	sum, reports = f.scan(cfg)
	require.Equal(t, map[string]int{"reimported": 2, "already_succeeded": 1}, sum.Outcomes, "C and D are not looked up: nothing of theirs modified since")
	require.Equal(t, map[string]int{"added": 1, "changed": 1}, sum.Changed)
	batches, _ = f.batches(t)
	require.Equal(t, 7, batches, "exactly two new batches")
	a, b := reports[folderA], reports[folderB]
	require.Equal(t, reconcile.ComparedChanged, a.Compared)
	require.Equal(t, &reconcile.Change{Reason: "added", Keys: []string{folderA + "/part-3.csv"}, ObjectsBefore: 2, ObjectsNow: 3, PreviousBatchID: a.Change.PreviousBatchID}, a.Change)
	require.Equal(t, &reconcile.Change{Reason: "changed", Keys: []string{folderB + "/part-2.csv"}, ObjectsBefore: 2, ObjectsNow: 2, PreviousBatchID: b.Change.PreviousBatchID}, b.Change)
	require.NotZero(t, a.BatchID)
	require.NotEqual(t, a.BatchID, a.Change.PreviousBatchID)
	require.Equal(t, reconcile.ComparedNoSummary, reports[folderE].Compared)
	require.Equal(t, 1.0, testutil.ToFloat64(f.cfg.Metrics.ReconcileChanged.WithLabelValues("added")))
	require.Equal(t, 1.0, testutil.ToFloat64(f.cfg.Metrics.ReconcileChanged.WithLabelValues("changed")))
	logs := f.changeLogs()
	require.Len(t, logs, 2)
	require.Equal(t, "added", logs[folderA]["reason"])
	require.Equal(t, []any{folderA + "/part-3.csv"}, logs[folderA]["keys"])
	require.Equal(t, float64(a.BatchID), logs[folderA]["batch_id"])
	require.Equal(t, "changed", logs[folderB]["reason"])
	require.Equal(t, []any{folderB + "/part-2.csv"}, logs[folderB]["keys"])

	// The re-imports load; the next pass (every folder) makes none.
	require.Len(t, f.loadRunning(), 2)
	sum, reports = f.scan(f.cfg)
	require.Equal(t, map[string]int{"already_succeeded": 5}, sum.Outcomes)
	require.Equal(t, reconcile.ComparedUnchanged, reports[folderA].Compared)
	require.Equal(t, reconcile.ComparedUnchanged, reports[folderB].Compared)
	batches, _ = f.batches(t)
	require.Equal(t, 7, batches)

	// D's producer writes its marker again; one of C's files is removed.
	f.put(folderD+"/_SUCCESS", "")
	f.delete(folderC + "/part-2.csv")
	f.resetLogs()
	sum, reports = f.scan(f.cfg)
	require.Equal(t, map[string]int{"reimported": 2, "already_succeeded": 3}, sum.Outcomes)
	require.Equal(t, "marker_rewritten", reports[folderD].Change.Reason)
	require.Equal(t, []string{folderD + "/_SUCCESS"}, reports[folderD].Change.Keys)
	require.Equal(t, "removed", reports[folderC].Change.Reason)
	require.Empty(t, reports[folderC].Change.Keys, "a listing cannot name a removed object")
	require.EqualValues(t, 1, reports[folderC].Change.ObjectsNow)
	logs = f.changeLogs()
	require.Equal(t, "marker_rewritten", logs[folderD]["reason"])
	require.Equal(t, "removed", logs[folderC]["reason"])
	require.Len(t, f.loadRunning(), 2)
	sum, _ = f.scan(f.cfg)
	require.Equal(t, map[string]int{"already_succeeded": 5}, sum.Outcomes)
	batches, _ = f.batches(t)
	require.Equal(t, 9, batches)

	// A dry run says what it would import, and imports nothing.
	f.put(folderA+"/part-4.csv", "vehicle,km\nV4,40\n")
	cfg = f.cfg
	cfg.DryRun = true
	sum, reports = f.scan(cfg)
	require.Equal(t, map[string]int{"would_reimport": 1, "already_succeeded": 4}, sum.Outcomes)
	require.Equal(t, []string{folderA + "/part-4.csv"}, reports[folderA].Change.Keys)
	batches, _ = f.batches(t)
	require.Equal(t, 9, batches)
}

// TestReconcileComparesAFolderAPeriodEndsIn: a period of --every ends
// after the page that reaches MaxObjects, here inside a published folder
// that gained a file on the next page. The folder is listed to its end
// (its own prefix) and compared whole: imported again, naming the new
// key; the next period, which starts inside the folder, does not see its
// marker and neither compares nor imports it again.
func TestReconcileComparesAFolderAPeriodEndsIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newLoadFixture(t)
	var filler []string
	for i := range 995 {
		filler = append(filler, fmt.Sprintf("tenants/a-filler/k-%04d", i)) // completes no folder
	}
	loadS3.PutMany(t, f.bucket, filler, []byte("x"))
	const dir = "tenants/t1/db/company-1/upload-x"
	f.put(dir+"/_SUCCESS", "") // sorts before its parts
	for i := range 10 {
		f.put(fmt.Sprintf("%s/part-%02d.csv", dir, i), fmt.Sprintf("vehicle,km\nV%d,%d\n", i, i))
	}
	sum, _ := f.scan(f.cfg)
	require.Equal(t, map[string]int{"enqueued": 1}, sum.Outcomes)
	require.Len(t, f.loadRunning(), 1)

	f.put(dir+"/part-99.csv", "vehicle,km\nV99,99\n") // on the second page
	cfg := f.cfg
	cfg.MaxObjects = 1000
	var reports []reconcile.Folder
	cfg.Report = func(r reconcile.Folder) { reports = append(reports, r) }
	p, err := reconcile.RunPeriod(ctx, cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	require.False(t, p.Summary.Complete)
	require.Equal(t, dir+"/part-03.csv", p.Summary.LastKey, "the period ends inside the folder")
	require.Len(t, reports, 1)
	require.Equal(t, reconcile.OutcomeReimported, reports[0].Outcome)
	require.Equal(t, reconcile.ComparedChanged, reports[0].Compared)
	require.Equal(t, "added", reports[0].Change.Reason)
	require.Equal(t, []string{dir + "/part-99.csv"}, reports[0].Change.Keys)
	require.EqualValues(t, 11, reports[0].Change.ObjectsNow)

	due(t, f.pool, 2*time.Hour)
	reports = nil
	p, err = reconcile.RunPeriod(ctx, cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, dir+"/part-03.csv", p.StartAfter)
	require.True(t, p.Summary.Complete)
	require.Empty(t, reports, "the rest of the folder, without its marker, completes nothing")
	batches, _ := f.batches(t)
	require.Equal(t, 2, batches)
}
