package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
)

type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	store    *batch.Store
	leases   *lease.Store
	wh       *warehouse.Postgres
	pipeline *fleet.Pipeline
}

var bucketSeq atomic.Int64

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := pgtest.NewPool(t)
	wh := warehouse.NewPostgres(pool)
	return &env{
		t: t, pool: pool, store: batch.NewStore(pool), leases: lease.NewStore(pool), wh: wh,
		pipeline: &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh},
	}
}

// folder writes files into a fresh mem:// bucket and returns the folder URL.
func (e *env) folder(files map[string]string) string {
	e.t.Helper()
	name := fmt.Sprintf("pipeline-test-%d", bucketSeq.Add(1))
	for k, v := range files {
		require.NoError(e.t, folder.MemBucket(name).WriteAll(context.Background(), "upload/"+k, []byte(v), nil))
	}
	return "mem://" + name + "/upload"
}

func (e *env) write(folderURL, key, content string) {
	e.t.Helper()
	f, err := folder.Canonicalize(folderURL)
	require.NoError(e.t, err)
	require.NoError(e.t, folder.MemBucket(f.Bucket).WriteAll(context.Background(), f.Prefix+"/"+key, []byte(content), nil))
}

func (e *env) reserve(tenant, folderURL string) batch.Batch {
	e.t.Helper()
	return e.reserveDetails(tenant, folderURL, nil)
}

// reserveWith reserves a batch of the folder, opting out of the completion
// marker if noMarker.
func (e *env) reserveWith(tenant, folderURL string, noMarker bool) batch.Batch {
	e.t.Helper()
	return e.reserveDetails(tenant, folderURL, func(d *batch.Details) { d.MarkerOptional = noMarker })
}

// reserveDetails reserves a batch of the folder whose new details set
// changes, as a door's import request would.
func (e *env) reserveDetails(tenant, folderURL string, set func(*batch.Details)) batch.Batch {
	e.t.Helper()
	f, err := folder.Canonicalize(folderURL)
	require.NoError(e.t, err)
	details := batch.NewDetails(f.String())
	if set != nil {
		set(&details)
	}
	res, err := e.store.Reserve(context.Background(), batch.Reservation{
		CompanyID: "company-1", TenantID: tenant, TenantDatabase: "tenant_db",
		SourceType: batch.SourceTypeFleetS3, IngestionMode: batch.IngestionModeFileUpload,
		PipelineStage: batch.PipelineStageFleet, SourceScope: f.Scope(), Details: details,
	})
	require.NoError(e.t, err)
	require.Equal(e.t, batch.Reserved, res.Outcome)
	return res.Batch
}

// diedInLoading stages a batch as a delivery that recorded "loading" and
// then died: it writes under a lease long enough for any machine load, then
// renews the term to expire at once (as if it had simply run out) and
// returns that term.
// newerBatch records a Succeeded batch of b's folder, newer than b: a
// batch the operational database knows (written directly, as the
// reservation's unique index holds only Running batches).
func (e *env) newerBatch(b batch.Batch) batch.Batch {
	e.t.Helper()
	n, err := batch.Scan(e.pool.QueryRow(context.Background(), `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			pipeline_stage, status, details, source_scope, completed_at)
		SELECT company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			pipeline_stage, 'Succeeded', details, source_scope, now()
		FROM ingestion_batches WHERE id = $1
		RETURNING `+batch.Columns, b.ID))
	require.NoError(e.t, err)
	return n
}

func (e *env) diedInLoading(id int64, holder string) lease.Lease {
	e.t.Helper()
	ctx := context.Background()
	a, err := e.leases.Acquire(ctx, id, holder, time.Minute)
	require.NoError(e.t, err)
	require.Equal(e.t, lease.Acquired, a.Outcome)
	_, d := e.details(id)
	d.Phase = batch.PhaseLoading
	_, err = e.store.WriteDetails(ctx, a.Lease.Fence(), d)
	require.NoError(e.t, err)
	l, ok, err := e.leases.Renew(ctx, a.Lease, time.Microsecond)
	require.NoError(e.t, err)
	require.True(e.t, ok)
	return l
}

// waitExpired waits until the database clock is past the lease's expiry.
func (e *env) waitExpired(l lease.Lease) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		var expired bool
		require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT now() >= $1`, l.ExpiresAt).Scan(&expired))
		return expired
	}, 5*time.Second, 5*time.Millisecond)
}

var deliverySeq atomic.Int64

// deliver runs one delivery of the batch: acquire the lease, execute, release.
func (e *env) deliver(id int64, p *fleet.Pipeline) pipeline.Result {
	e.t.Helper()
	ctx := context.Background()
	a, err := e.leases.Acquire(ctx, id, fmt.Sprintf("delivery-%d", deliverySeq.Add(1)), time.Minute)
	require.NoError(e.t, err)
	if a.Outcome != lease.Acquired {
		return pipeline.Result{Outcome: pipeline.SkippedTerminal}
	}
	res, err := pipeline.Execute(ctx, e.store, a.Lease, nil, pipeline.Registry{batch.SourceTypeFleetS3: p})
	require.NoError(e.t, err)
	_, err = e.leases.Release(ctx, a.Lease)
	require.NoError(e.t, err)
	return res
}

func (e *env) details(id int64) (batch.Batch, batch.Details) {
	e.t.Helper()
	b, err := e.store.Get(context.Background(), id)
	require.NoError(e.t, err)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(e.t, err)
	return b, d
}

// sliceRecords returns the number of records in the slice, the number of
// distinct (object, line) pairs, and the batch ids stamped on them.
func (e *env) sliceRecords(tenant, scope string) (total, distinct int, batches []int64) {
	e.t.Helper()
	ctx := context.Background()
	require.NoError(e.t, e.pool.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT (object_key, line_number))
		FROM curated.fleet_records WHERE tenant_id = $1 AND source_scope = $2`, tenant, scope).Scan(&total, &distinct))
	rows, err := e.pool.Query(ctx, `SELECT DISTINCT batch_id FROM curated.fleet_records WHERE tenant_id = $1 AND source_scope = $2 ORDER BY 1`, tenant, scope)
	require.NoError(e.t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		require.NoError(e.t, rows.Scan(&id))
		batches = append(batches, id)
	}
	return total, distinct, batches
}

func (e *env) publications(scope string) (n int, batchIDs []int64) {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT batch_id FROM curated.fleet_publications WHERE source_scope = $1 ORDER BY id`, scope)
	require.NoError(e.t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		require.NoError(e.t, rows.Scan(&id))
		batchIDs = append(batchIDs, id)
	}
	return len(batchIDs), batchIDs
}

func (e *env) failPublications(on bool) {
	e.t.Helper()
	ctx := context.Background()
	if on {
		_, err := e.pool.Exec(ctx, `
			CREATE OR REPLACE FUNCTION curated.fail_publication() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN RAISE EXCEPTION 'publication outbox unavailable (injected)'; END $$;
			CREATE TRIGGER fail_publication BEFORE INSERT ON curated.fleet_publications
			FOR EACH ROW EXECUTE FUNCTION curated.fail_publication();`)
		require.NoError(e.t, err)
		return
	}
	_, err := e.pool.Exec(ctx, `DROP TRIGGER fail_publication ON curated.fleet_publications`)
	require.NoError(e.t, err)
}

var sampleFiles = map[string]string{
	"_SUCCESS":           "",
	"manifest.json":      `{"objects": 2}`,
	"trips.csv":          "vehicle,km\nV1,10\nV2,20\nV3,30\n",
	"events/day1.ndjson": `{"vehicle":"V1","event":"start"}` + "\n" + `{"vehicle":"V2","event":"stop"}` + "\n",
}

func TestPipelineHappyPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	url := e.folder(sampleFiles)
	b := e.reserve("tenant-a", url)

	res := e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)

	got, d := e.details(b.ID)
	require.Equal(t, batch.StatusSucceeded, got.Status)
	require.Nil(t, got.LeaseID)
	require.Equal(t, batch.PhasePublished, d.Phase)
	require.True(t, d.RedshiftCommitted)
	require.NotNil(t, d.CommittedAt)
	require.Equal(t, int64(5), d.RecordCount)
	require.True(t, d.Publication.Started)
	require.True(t, d.Publication.Completed)
	require.NotNil(t, d.Publication.CompletedAt)

	total, distinct, batches := e.sliceRecords("tenant-a", b.Scope())
	require.Equal(t, 5, total)
	require.Equal(t, 5, distinct)
	require.Equal(t, []int64{b.ID}, batches)

	st, found, err := e.wh.Stamp(ctx, "tenant-a", b.Scope())
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, b.ID, st.BatchID)
	require.Equal(t, int64(5), st.RecordCount)
	require.NotNil(t, st.PublishedAt)

	var recordCount int64
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT record_count FROM curated.fleet_publications WHERE batch_id = $1`, b.ID).Scan(&recordCount))
	require.Equal(t, int64(5), recordCount)

	var rec string
	require.NoError(t, e.pool.QueryRow(ctx, `
		SELECT record::text FROM curated.fleet_records
		WHERE batch_id = $1 AND object_key = 'upload/trips.csv' AND line_number = 3`, b.ID).Scan(&rec))
	require.JSONEq(t, `{"vehicle":"V2","km":"20"}`, rec)

	// A duplicate delivery after success finds a terminal batch and does nothing.
	again := e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.SkippedTerminal, again.Outcome)
	n, _ := e.publications(b.Scope())
	require.Equal(t, 1, n)
}

func TestPhasesAreIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	t.Run("warehouse load and publish repeated", func(t *testing.T) {
		url := e.folder(sampleFiles)
		b := e.reserve("tenant-a", url)
		f, _ := folder.Canonicalize(url)
		src, err := folder.Opener{}.Open(ctx, f)
		require.NoError(t, err)
		objs, err := src.Objects(ctx)
		require.NoError(t, err)
		s := warehouse.Slice{TenantID: "tenant-a", SourceScope: b.Scope(), BatchID: b.ID, Generation: 1}
		for range 3 {
			st, err := e.wh.Load(ctx, s, src, objs, nil)
			require.NoError(t, err)
			require.Equal(t, int64(5), st.RecordCount)
		}
		total, distinct, _ := e.sliceRecords("tenant-a", b.Scope())
		require.Equal(t, 5, total, "exactly one copy of each record")
		require.Equal(t, 5, distinct)
		for range 3 {
			_, err := e.wh.Publish(ctx, s, time.Hour, nil)
			require.NoError(t, err)
		}
		n, _ := e.publications(b.Scope())
		require.Equal(t, 1, n, "one publication per batch")
	})

	t.Run("delivery resumes from a recorded loading phase", func(t *testing.T) {
		url := e.folder(sampleFiles)
		b := e.reserve("tenant-b", url)
		// A previous delivery recorded "loading" and died before committing.
		e.waitExpired(e.diedInLoading(b.ID, "dead-delivery"))

		res := e.deliver(b.ID, e.pipeline)
		require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
		total, distinct, _ := e.sliceRecords("tenant-b", b.Scope())
		require.Equal(t, 5, total)
		require.Equal(t, 5, distinct)
	})

	t.Run("delivery resumes from a recorded publishing phase already published", func(t *testing.T) {
		url := e.folder(sampleFiles)
		b := e.reserve("tenant-c", url)
		// Drive the batch up to publishing and publish in the warehouse, as a
		// delivery that died before recording published would have.
		p := &crashAfter{phase: batch.PhasePublishing, inner: e.pipeline}
		res := e.deliver(b.ID, &fleet.Pipeline{AllowLocalFolders: true, Warehouse: p})
		require.Equal(t, pipeline.Retry, res.Outcome)
		_, d := e.details(b.ID)
		require.Equal(t, batch.PhasePublishing, d.Phase)
		_, err := e.wh.Publish(ctx, warehouse.Slice{TenantID: "tenant-c", SourceScope: b.Scope(), BatchID: b.ID}, time.Hour, nil)
		require.NoError(t, err)

		res = e.deliver(b.ID, e.pipeline)
		require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
		n, _ := e.publications(b.Scope())
		require.Equal(t, 1, n)
	})
}

// crashAfter is a warehouse that fails with a transient-looking error on
// Publish, to stop a delivery right after it recorded the publishing phase.
type crashAfter struct {
	phase batch.Phase
	inner *fleet.Pipeline
}

func (c *crashAfter) Load(ctx context.Context, s warehouse.Slice, src *folder.Source, objs []folder.Object, before func(context.Context) error) (warehouse.Stamp, error) {
	return c.inner.Warehouse.Load(ctx, s, src, objs, before)
}

func (c *crashAfter) Stamp(ctx context.Context, tenantID, scope string) (warehouse.Stamp, bool, error) {
	return c.inner.Warehouse.Stamp(ctx, tenantID, scope)
}

func (c *crashAfter) Publish(context.Context, warehouse.Slice, time.Duration, func(context.Context) error) (warehouse.Stamp, error) {
	return warehouse.Stamp{}, context.DeadlineExceeded // transient: the delivery stops, batch stays Running
}

func TestCrashBetweenWarehouseCommitAndRecordingIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	url := e.folder(sampleFiles)
	b := e.reserve("tenant-a", url)

	// The crashed delivery committed the slice (generation 1) but never
	// recorded redshiftCommitted; its details still say "loading".
	crashed := e.diedInLoading(b.ID, "crashed")
	f, _ := folder.Canonicalize(url)
	src, err := folder.Opener{}.Open(ctx, f)
	require.NoError(t, err)
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	_, err = e.wh.Load(ctx, warehouse.Slice{TenantID: "tenant-a", SourceScope: b.Scope(), BatchID: b.ID, Generation: crashed.Generation}, src, objs, nil)
	require.NoError(t, err)

	// The folder changes afterwards: if the next delivery loaded again, the
	// slice would have a sixth record.
	e.write(url, "late.csv", "vehicle,km\nV9,90\n")
	e.waitExpired(crashed)

	res := e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	_, d := e.details(b.ID)
	require.True(t, d.RedshiftCommitted)
	require.Equal(t, int64(5), d.RecordCount)
	total, _, _ := e.sliceRecords("tenant-a", b.Scope())
	require.Equal(t, 5, total, "the committed slice was detected, not loaded again")
	n, _ := e.publications(b.Scope())
	require.Equal(t, 1, n)
}

func TestPreCommitFailureLeavesPreviousSliceUntouched(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	url := e.folder(sampleFiles)
	first := e.reserve("tenant-a", url)
	require.Equal(t, pipeline.Succeeded, e.deliver(first.ID, e.pipeline).Outcome)
	before, _, _ := e.sliceRecords("tenant-a", first.Scope())

	// The folder is re-uploaded with a malformed CSV (a ragged row on the
	// 3rd line) after a good file.
	e.write(url, "trips.csv", "vehicle,km\nV1,10\nV2\n")
	second := e.reserve("tenant-a", url)
	res := e.deliver(second.ID, e.pipeline)
	require.Equal(t, pipeline.Failed, res.Outcome)
	require.Equal(t, batch.PhaseFailedPreCommit, res.Phase)

	got, d := e.details(second.ID)
	require.Equal(t, batch.StatusFailed, got.Status)
	require.Equal(t, batch.PhaseFailedPreCommit, d.Phase)
	require.False(t, d.RedshiftCommitted)
	require.NotNil(t, d.LastError)
	require.Contains(t, d.LastError.Message, "upload/trips.csv: line 3")

	total, _, batches := e.sliceRecords("tenant-a", first.Scope())
	require.Equal(t, before, total, "previous slice untouched")
	require.Equal(t, []int64{first.ID}, batches)
	st, _, err := e.wh.Stamp(ctx, "tenant-a", first.Scope())
	require.NoError(t, err)
	require.Equal(t, first.ID, st.BatchID)
	require.NotNil(t, st.PublishedAt)

	// Terminal: a later delivery does nothing, and resume is refused.
	require.Equal(t, pipeline.SkippedTerminal, e.deliver(second.ID, e.pipeline).Outcome)
	rr, err := e.store.Resume(ctx, batch.ResumeRequest{BatchID: second.ID, TenantID: "tenant-a", SourceType: batch.SourceTypeFleetS3, SourceScope: second.Scope()}, warehouse.Verifier(e.wh))
	require.NoError(t, err)
	require.Equal(t, batch.NotResumable, rr.Outcome)
	require.Equal(t, batch.ReasonNotCommitted, rr.Reason)
}

func TestPreCommitFailuresOfTheFolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cases := map[string]struct {
		url  string
		want string
	}{
		"empty folder":       {e.folder(map[string]string{"_SUCCESS": ""}), "no data objects"},
		"missing folder":     {"file:///nonexistent/fleet/folder", "nonexistent"},
		"unsupported object": {e.folder(map[string]string{"a.parquet": "PAR1"}), "unsupported object"},
		"nul in ndjson":      {e.folder(map[string]string{"_SUCCESS": "", "a.ndjson": `{"a":"\u0000"}`}), "NUL"},
	}
	for name, tt := range cases {
		b := e.reserve("tenant-"+strings.ReplaceAll(name, " ", "-"), tt.url)
		res := e.deliver(b.ID, e.pipeline)
		require.Equal(t, pipeline.Failed, res.Outcome, name)
		require.Equal(t, batch.PhaseFailedPreCommit, res.Phase, name)
		_, d := e.details(b.ID)
		require.Contains(t, d.LastError.Message, tt.want, name)
		_, found, err := e.wh.Stamp(context.Background(), b.TenantID, b.Scope())
		require.NoError(t, err)
		require.False(t, found, name)
	}
}

func TestPublicationFailureThenResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	url := e.folder(sampleFiles)
	b := e.reserve("tenant-a", url)

	e.failPublications(true)
	res := e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Failed, res.Outcome)
	require.Equal(t, batch.PhaseFailedPublication, res.Phase)
	got, d := e.details(b.ID)
	require.Equal(t, batch.StatusFailed, got.Status)
	require.True(t, d.RedshiftCommitted)
	require.False(t, d.Publication.Completed)
	require.Contains(t, d.LastError.Message, "publication outbox unavailable (injected)")
	n, _ := e.publications(b.Scope())
	require.Zero(t, n)

	// The scope is free while Failed; resume reacquires it after proving the
	// slice is still this batch's.
	e.failPublications(false)
	rr, err := e.store.Resume(ctx, batch.ResumeRequest{BatchID: b.ID, TenantID: "tenant-a", SourceType: batch.SourceTypeFleetS3, SourceScope: b.Scope()}, warehouse.Verifier(e.wh))
	require.NoError(t, err)
	require.Equal(t, batch.Resumed, rr.Outcome, rr.Reason)

	res = e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	got, d = e.details(b.ID)
	require.Equal(t, batch.StatusSucceeded, got.Status)
	require.Equal(t, 1, d.Resumes)
	total, distinct, _ := e.sliceRecords("tenant-a", b.Scope())
	require.Equal(t, 5, total, "the resumed batch did not load again")
	require.Equal(t, 5, distinct)
	n, ids := e.publications(b.Scope())
	require.Equal(t, 1, n)
	require.Equal(t, []int64{b.ID}, ids)
}

func TestResumeRefusedWhenSuperseded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	url := e.folder(sampleFiles)
	old := e.reserve("tenant-a", url)
	e.failPublications(true)
	require.Equal(t, batch.PhaseFailedPublication, e.deliver(old.ID, e.pipeline).Phase)
	e.failPublications(false)

	// A newer batch of the same folder commits and publishes.
	newer := e.reserve("tenant-a", url)
	require.Equal(t, pipeline.Succeeded, e.deliver(newer.ID, e.pipeline).Outcome)

	rr, err := e.store.Resume(ctx, batch.ResumeRequest{BatchID: old.ID, TenantID: "tenant-a", SourceType: batch.SourceTypeFleetS3, SourceScope: old.Scope()}, warehouse.Verifier(e.wh))
	require.NoError(t, err)
	require.Equal(t, batch.NotResumable, rr.Outcome)
	require.Equal(t, batch.ReasonSuperseded, rr.Reason)
	got, d := e.details(old.ID)
	require.Equal(t, batch.StatusFailed, got.Status)
	require.Equal(t, batch.PhaseSuperseded, d.Phase)
	n, ids := e.publications(old.Scope())
	require.Equal(t, 1, n, "nothing of the old batch was published")
	require.Equal(t, []int64{newer.ID}, ids)

	// A delivery of the superseded batch does no work.
	require.Equal(t, pipeline.SkippedTerminal, e.deliver(old.ID, e.pipeline).Outcome)
}

func TestSliceOfNewerBatchIsNeverOverwritten(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	url := e.folder(sampleFiles)
	old := e.reserve("tenant-a", url)
	// Cancel old so a newer batch can reserve, then let the newer one
	// commit; a late load of the old one must be refused.
	cancelled, err := e.store.Cancel(ctx, batch.CancelRequest{BatchID: old.ID, TenantID: "tenant-a", By: "test"})
	require.NoError(t, err)
	require.Equal(t, batch.Cancelled, cancelled.Outcome)
	newer := e.reserve("tenant-a", url)
	require.Equal(t, pipeline.Succeeded, e.deliver(newer.ID, e.pipeline).Outcome)

	f, _ := folder.Canonicalize(url)
	src, err := folder.Opener{}.Open(ctx, f)
	require.NoError(t, err)
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	_, err = e.wh.Load(ctx, warehouse.Slice{TenantID: "tenant-a", SourceScope: old.Scope(), BatchID: old.ID, Generation: 9}, src, objs, nil)
	require.ErrorIs(t, err, warehouse.ErrSliceSuperseded)
	_, err = e.wh.Publish(ctx, warehouse.Slice{TenantID: "tenant-a", SourceScope: old.Scope(), BatchID: old.ID}, time.Hour, nil)
	require.ErrorIs(t, err, warehouse.ErrSliceSuperseded)
	_, _, batches := e.sliceRecords("tenant-a", old.Scope())
	require.Equal(t, []int64{newer.ID}, batches)
}

func TestPublicationExpired(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	t.Run("resume after the window", func(t *testing.T) {
		url := e.folder(sampleFiles)
		b := e.reserve("tenant-a", url)
		e.failPublications(true)
		require.Equal(t, batch.PhaseFailedPublication, e.deliver(b.ID, e.pipeline).Phase)
		e.failPublications(false)
		rr, err := e.store.Resume(ctx, batch.ResumeRequest{BatchID: b.ID, TenantID: "tenant-a", SourceType: batch.SourceTypeFleetS3, SourceScope: b.Scope(), PublicationWindow: time.Microsecond}, warehouse.Verifier(e.wh))
		require.NoError(t, err)
		require.Equal(t, batch.NotResumable, rr.Outcome)
		require.Equal(t, batch.ReasonPublicationExpired, rr.Reason)
		_, d := e.details(b.ID)
		require.Equal(t, batch.PhasePublicationExpired, d.Phase)
		require.Equal(t, pipeline.SkippedTerminal, e.deliver(b.ID, e.pipeline).Outcome)
	})

	t.Run("publication attempted after the window", func(t *testing.T) {
		url := e.folder(sampleFiles)
		b := e.reserve("tenant-b", url)
		res := e.deliver(b.ID, &fleet.Pipeline{AllowLocalFolders: true, Warehouse: e.wh, PublicationWindow: time.Microsecond})
		require.Equal(t, pipeline.Failed, res.Outcome)
		require.Equal(t, batch.PhasePublicationExpired, res.Phase)
		n, _ := e.publications(b.Scope())
		require.Zero(t, n)
	})
}

func TestLostLeaseWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	url := e.folder(sampleFiles)
	b := e.reserve("tenant-a", url)

	stale, err := e.leases.Acquire(ctx, b.ID, "paused", 30*time.Millisecond)
	require.NoError(t, err)
	e.waitExpired(stale.Lease)

	// The paused delivery wakes up and runs with its expired lease; its
	// lease check before the warehouse commit refuses.
	verify := func(ctx context.Context) error {
		_, ok, err := e.leases.Renew(ctx, stale.Lease, time.Minute)
		if err != nil {
			return err
		}
		if !ok {
			return batch.ErrStaleLease
		}
		return nil
	}
	res, err := pipeline.Execute(ctx, e.store, stale.Lease, verify, pipeline.Registry{batch.SourceTypeFleetS3: e.pipeline})
	require.NoError(t, err)
	require.Equal(t, pipeline.LeaseLost, res.Outcome)
	_, d := e.details(b.ID)
	require.Equal(t, batch.PhaseReserved, d.Phase, "no write of the stale holder landed")
	_, found, err := e.wh.Stamp(ctx, "tenant-a", b.Scope())
	require.NoError(t, err)
	require.False(t, found)

	// A successor takes over and finishes.
	require.Equal(t, pipeline.Succeeded, e.deliver(b.ID, e.pipeline).Outcome)
}

func TestTransientWarehouseErrorIsRetriedNotFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	whPool := pgtest.Pool(t, dbURL) // the warehouse has connections of its own
	e := &env{t: t, pool: pool, store: batch.NewStore(pool), leases: lease.NewStore(pool), wh: warehouse.NewPostgres(whPool)}
	e.pipeline = &fleet.Pipeline{AllowLocalFolders: true, Warehouse: e.wh}
	url := e.folder(sampleFiles)
	b := e.reserve("tenant-a", url)

	// Hold a lock that blocks the load, then kill the loading backend once it
	// waits on it: the delivery sees a connection failure mid-load.
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = blocker.Exec(ctx, `LOCK TABLE curated.fleet_records IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	done := make(chan pipeline.Result, 1)
	go func() { done <- e.deliver(b.ID, e.pipeline) }()
	var pid int32
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `
			SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%fleet_records%'`).Scan(&pid)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	require.NoError(t, blocker.Rollback(ctx))

	res := testproc.Await(t, done, "the delivery whose backend was terminated")
	require.Equal(t, pipeline.Retry, res.Outcome, "%v", res.Err)
	require.True(t, pipeline.IsTransient(res.Err), "%v", res.Err)
	got, d := e.details(b.ID)
	require.Equal(t, batch.StatusRunning, got.Status, "a transient failure is not terminal")
	require.Equal(t, batch.PhaseLoading, d.Phase)

	// The next delivery finishes the batch.
	res = e.deliver(b.ID, e.pipeline)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	total, _, _ := e.sliceRecords("tenant-a", b.Scope())
	require.Equal(t, 5, total)
}
