package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/reconcile"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

const bucket = "fleet-uploads"

// stray is an object that completes nothing.
const stray = "tenants/t1/db/company-1/upload-00001/part-0.csv"

func folderKey(n int) string {
	return fmt.Sprintf("tenants/t%d/db/company-1/upload-%05d", n%7, n)
}

type fixture struct {
	pool *pgxpool.Pool
	s3   *s3test.Server
	cfg  reconcile.Config
}

// newFixture writes n completed folders (and one stray object) and returns
// a Config on them over a fresh database.
func newFixture(t *testing.T, n int) *fixture {
	t.Helper()
	return newFixtureOn(t, pgtest.NewPool(t), n)
}

// newFixtureOn is newFixture on pool's database.
func newFixtureOn(t *testing.T, pool *pgxpool.Pool, n int) *fixture {
	t.Helper()
	f := &fixture{pool: pool, s3: s3test.Start(t)}
	f.s3.CreateBucket(t, bucket)
	var keys []string
	for i := range n {
		keys = append(keys, folderKey(i)+"/_SUCCESS")
	}
	f.s3.PutMany(t, bucket, keys, nil)
	f.s3.Put(t, bucket, stray, []byte("x"))
	client, err := jobs.NewInsertClient(f.pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	m := metrics.New()
	f.cfg = reconcile.Config{
		S3: f.s3.Client(), Bucket: bucket, Pool: f.pool, Metrics: m, Logger: slog.New(slog.DiscardHandler),
		Importer: &jobs.Enqueuer{Pool: f.pool, River: client, Metrics: m, Logger: slog.New(slog.DiscardHandler)},
	}
	return f
}

func (f *fixture) batches(t *testing.T) (batches, scopes int) {
	t.Helper()
	require.NoError(t, f.pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT (tenant_id, source_scope)) FROM ingestion_batches`).Scan(&batches, &scopes))
	return batches, scopes
}

// TestReconcilePeriodsResumeFromTheCheckpoint runs periods of at most
// 1,000 objects over 2,500 folders from three replicas at once: each
// period one replica works (the others skip: the checkpoint row locked, or the
// period was just run), each continues after the previous one's last key,
// the third completes the pass, and every folder is enqueued once. The
// next pass checks only markers modified since the finished pass began
// (less the overlap).
func TestReconcilePeriodsResumeFromTheCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 2500)
	f.cfg.MaxObjects = 1000
	const every = time.Hour // the "ran less than every/2 ago" rule is lifted below

	var starts []string
	for period := range 3 {
		var wg sync.WaitGroup
		results := make([]reconcile.Period, 3)
		for r := range 3 {
			wg.Go(func() {
				p, err := reconcile.RunPeriod(ctx, f.cfg, every)
				require.NoError(t, err)
				results[r] = p
			})
		}
		wg.Wait()
		scanned := 0
		for _, p := range results {
			if p.Outcome == "scanned" {
				scanned++
				starts = append(starts, p.StartAfter)
				require.Equal(t, period == 2, p.Summary.Complete, "period %d", period)
			}
		}
		require.Equal(t, 1, scanned, "period %d: one replica works", period)
		// The next period is due.
		due(t, f.pool, 2*time.Hour)
	}
	var keys []string
	for i := range 2500 {
		keys = append(keys, folderKey(i)+"/_SUCCESS")
	}
	keys = append(keys, stray)
	slices.Sort(keys)
	require.Equal(t, []string{"", keys[999], keys[1999]}, starts, "each period starts after the previous one's last key (1,000 per period)")
	batches, scopes := f.batches(t)
	require.Equal(t, 2500, batches)
	require.Equal(t, 2500, scopes)
	require.Equal(t, 2500.0, testutil.ToFloat64(f.cfg.Metrics.ReconcileMissed))

	var covered *time.Time
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT covered_since FROM ingest_reconcile_checkpoints`).Scan(&covered))
	require.NotNil(t, covered, "a finished pass records when it began")
	p, err := reconcile.RunPeriod(ctx, f.cfg, every)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	require.WithinDuration(t, covered.Add(-reconcile.CheckpointOverlap), p.Since, time.Millisecond)
	require.Zero(t, p.Summary.Outcomes["enqueued"])

	// Within half a period of the last run, every replica skips.
	p, err = reconcile.RunPeriod(ctx, f.cfg, every)
	require.NoError(t, err)
	require.Equal(t, "skipped", p.Outcome)
}

// TestReconcileSinceAndDryRun: markers modified before --since are not
// looked at; a dry run writes nothing.
func TestReconcileSinceAndDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 30)
	cfg := f.cfg
	cfg.Since = time.Now().Add(time.Hour)
	sum, err := reconcile.Scan(ctx, cfg, "")
	require.NoError(t, err)
	require.Equal(t, 31, sum.ObjectsListed)
	require.Zero(t, sum.Folders)

	cfg.Since, cfg.DryRun = time.Now().Add(-time.Hour), true
	var reports []reconcile.Folder
	cfg.Report = func(r reconcile.Folder) { reports = append(reports, r) }
	sum, err = reconcile.Scan(ctx, cfg, "")
	require.NoError(t, err)
	require.True(t, sum.Complete)
	require.Equal(t, 30, sum.Outcomes["would_enqueue"])
	require.Len(t, reports, 30)
	require.Equal(t, "t0", reports[0].TenantID)
	batches, _ := f.batches(t)
	require.Zero(t, batches)
}

// TestReconcileReportsUnmappedMarkers: a marker outside the path pattern
// is reported unmapped, never enqueued.
func TestReconcileReportsUnmappedMarkers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	f.s3.Put(t, bucket, "elsewhere/acme/_SUCCESS", nil)
	sum, err := reconcile.Scan(context.Background(), f.cfg, "")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"enqueued": 2, "unmapped": 1}, sum.Outcomes)
}

// waitingImporter holds its first burst until the listing has asked for
// the next page (or a timeout passes), and says whether it saw that.
type waitingImporter struct {
	reconcile.Importer
	s3         *s3test.Server
	calls      int
	overlapped bool
}

func (w *waitingImporter) ImportMany(ctx context.Context, reqs []jobs.ImportRequest) ([]jobs.Result, error) {
	w.calls++
	if w.calls == 1 {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && !w.overlapped {
			w.overlapped = w.s3.Requests(bucket, "ListObjectsV2") >= 2
			time.Sleep(5 * time.Millisecond)
		}
	}
	return w.Importer.ImportMany(ctx, reqs)
}

// TestReconcileListsTheNextPageWhileReconciling: the listing does not wait
// for a page's look-ups and burst: the second page is asked for while the
// first page's burst is still being imported, so a scan lasts about as
// long as its listing (S3's page latency) when the database is quicker.
// Every folder is still enqueued once, and a listing error still ends the
// scan with what was reconciled before it.
func TestReconcileListsTheNextPageWhileReconciling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 2500) // three pages of at most 1,000 keys
	imp := &waitingImporter{Importer: f.cfg.Importer, s3: f.s3}
	f.cfg.Importer = imp
	sum, err := reconcile.Scan(ctx, f.cfg, "")
	require.NoError(t, err)
	require.True(t, imp.overlapped, "the second page was not listed before the first page's burst returned")
	require.True(t, sum.Complete)
	require.Equal(t, 3, sum.Pages)
	require.Equal(t, 2500, sum.Outcomes["enqueued"])
	batches, scopes := f.batches(t)
	require.Equal(t, 2500, batches)
	require.Equal(t, 2500, scopes)

	// A listing that fails on a later page: the pages before it are
	// reconciled, the error is returned, and LastKey says where to go on.
	// (While the first page is reconciled, at most two more are listed.)
	g := newFixture(t, 5500) // six pages
	var reports int
	g.cfg.Report = func(reconcile.Folder) {
		reports++
		if reports == 1 {
			g.s3.Throttle(bucket, 1000) // every later request answers 503 SlowDown, retries too
		}
	}
	sum, err = reconcile.Scan(ctx, g.cfg, "")
	require.Error(t, err)
	require.ErrorContains(t, err, "SlowDown")
	require.False(t, sum.Complete)
	require.NotEmpty(t, sum.LastKey)
	batches, _ = g.batches(t)
	require.Equal(t, sum.Folders, batches, "what was reported was enqueued")
	require.GreaterOrEqual(t, sum.Pages, 1)
	require.LessOrEqual(t, sum.Pages, 3)
	require.Equal(t, sum.Pages*1000, sum.ObjectsListed)
}

// TestReconcileSkipsKeysNoDoorReads: one tenant's folder holds a key with
// U+0001 (S3 accepts any Unicode key; without URL-encoded keys its page
// cannot be decoded), a folder name holds one too, and a later page holds
// a key with DEL, while every other tenant's completed folder had its
// notification lost. The pass completes: the bad keys are skipped,
// counted and logged escaped, and every folder on their pages and after
// them is enqueued (the bad tenant's own folder too: its marker is
// readable, and the worker refuses the folder).
func TestReconcileSkipsKeysNoDoorReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1500) // two pages
	bad := []string{
		"tenants/bad\x01/db/company-1/upload-x/_SUCCESS",
		folderKey(0) + "/trips\x01.csv",
		folderKey(1497) + "/trips\x7f.csv",
	}
	for _, k := range bad {
		f.s3.Put(t, bucket, k, []byte("x"))
	}
	var logs testproc.SyncBuffer
	f.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	sum, err := reconcile.Scan(ctx, f.cfg, "")
	require.NoError(t, err)
	require.True(t, sum.Complete)
	require.Equal(t, 2, sum.Pages)
	require.Equal(t, 1500+1+len(bad), sum.ObjectsListed)
	require.Equal(t, len(bad), sum.KeysSkipped)
	require.Equal(t, float64(len(bad)), testutil.ToFloat64(f.cfg.Metrics.ReconcileKeysSkipped))
	require.Equal(t, map[string]int{"enqueued": 1500}, sum.Outcomes)
	batches, scopes := f.batches(t)
	require.Equal(t, 1500, batches)
	require.Equal(t, 1500, scopes)

	var logged []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["msg"] == "reconcile: skipped an object key that no door reads" {
			require.Equal(t, "WARN", m["level"])
			logged = append(logged, m["key"].(string))
		}
	}
	require.Equal(t, []string{
		`"tenants/bad\x01/db/company-1/upload-x/_SUCCESS"`,
		strconv.Quote(folderKey(0) + "/trips\x01.csv"),
		strconv.Quote(folderKey(1497) + "/trips\x7f.csv"),
	}, logged, "each skipped key logged once, escaped")
	require.NotContains(t, logs.String(), `\u0001`, "no raw control character reaches the log")
}

// TestReconcileCheckpointOnASkippedKey: a period that ends on a key with
// U+0001 (the last of its 1,000) stores it as the checkpoint, and the next
// period lists from after it: the key is skipped once per pass and every
// folder is enqueued once.
func TestReconcileCheckpointOnASkippedKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1200)
	var keys []string
	for i := range 1200 {
		keys = append(keys, folderKey(i)+"/_SUCCESS")
	}
	keys = append(keys, stray)
	slices.Sort(keys)
	badKey := keys[998] + "\x01" // sorts right after keys[998]: the 1,000th key
	f.s3.Put(t, bucket, badKey, []byte("x"))
	f.cfg.MaxObjects = 1000

	p, err := reconcile.RunPeriod(ctx, f.cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	require.False(t, p.Summary.Complete)
	require.Equal(t, badKey, p.Summary.LastKey)
	require.Equal(t, 1, p.Summary.KeysSkipped)
	due(t, f.pool, 2*time.Hour)

	p, err = reconcile.RunPeriod(ctx, f.cfg, time.Hour)
	require.NoError(t, err)
	require.Equal(t, badKey, p.StartAfter)
	require.True(t, p.Summary.Complete)
	require.Zero(t, p.Summary.KeysSkipped, "the key is met once per pass")
	batches, scopes := f.batches(t)
	require.Equal(t, 1200, batches)
	require.Equal(t, 1200, scopes)
}

// TestReconcileLogsSkippedKeysUpToABound: a bucket full of keys no door
// reads cannot flood the log: a scan logs the first MaxSkippedKeysLogged
// one by one and the rest as one count, and counts them all.
func TestReconcileLogsSkippedKeysUpToABound(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	const n = reconcile.MaxSkippedKeysLogged + 5
	for i := range n {
		f.s3.Put(t, bucket, fmt.Sprintf("tenants/t9/db/company-1/upload-%05d/\x01", i), nil)
	}
	var logs testproc.SyncBuffer
	f.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	sum, err := reconcile.Scan(context.Background(), f.cfg, "")
	require.NoError(t, err)
	require.Equal(t, n, sum.KeysSkipped)
	require.Equal(t, map[string]int{"enqueued": 1}, sum.Outcomes)
	require.Equal(t, reconcile.MaxSkippedKeysLogged, strings.Count(logs.String(), `"msg":"reconcile: skipped an object key that no door reads"`))
	require.Contains(t, logs.String(), fmt.Sprintf(`"msg":"reconcile: more object keys skipped than logged one by one","keys_skipped":%d,"not_logged":5`, n))
}

// TestAFolderThatFailedForWantOfItsMarker: reconcile enqueues a folder
// whose newest batch failed folder_incomplete (the worker found no marker)
// only when the marker it lists is not older than that failure — the
// producer completed the folder since. A marker older than the failure (a
// marker the worker does not take for its own, such as a --marker that
// differs between reconcile and the worker) is reported failed, so no
// pass fails a new batch every period.
func TestAFolderThatFailedForWantOfItsMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 2)
	seed := func(n int, failedAt string) int64 {
		t.Helper()
		fo := "s3://" + bucket + "/" + folderKey(n)
		var id int64
		require.NoError(t, f.pool.QueryRow(ctx, `
			INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			                               pipeline_stage, status, details, source_scope, completed_at)
			VALUES ('company-1', $1, 'db', 'FileUpload', 'FleetS3', 'Fleet', 'Failed',
			        jsonb_build_object('version', 1, 'phase', 'failed_pre_commit', 'sourceFolder', $2::text,
			                           'redshiftCommitted', false, 'publication', jsonb_build_object('started', false, 'completed', false),
			                           'lastError', jsonb_build_object('phase', 'failed_pre_commit', 'reason', 'folder_incomplete',
			                                                           'message', 'no completion marker', 'at', now())),
			        'fleet_s3:' || $2, now() + $3::interval) RETURNING id`,
			fmt.Sprintf("t%d", n%7), fo, failedAt).Scan(&id))
		return id
	}
	before := seed(0, "-1 hour") // failed an hour before the marker was written: completed since
	after := seed(1, "1 hour")   // failed after the marker it lists: not the worker's marker
	reports := map[string]reconcile.Folder{}
	cfg := f.cfg
	cfg.Report = func(r reconcile.Folder) { reports[r.Folder] = r }
	_, err := reconcile.Scan(ctx, cfg, "")
	require.NoError(t, err)

	r0 := reports["s3://"+bucket+"/"+folderKey(0)]
	require.Equal(t, reconcile.OutcomeEnqueued, r0.Outcome, "%+v", r0)
	require.Equal(t, before, r0.RetryOf)
	r1 := reports["s3://"+bucket+"/"+folderKey(1)]
	require.Equal(t, reconcile.OutcomeFailed, r1.Outcome, "%+v", r1)
	require.Equal(t, after, r1.BatchID)
	batches, _ := f.batches(t)
	require.Equal(t, 3, batches)
}
