package redshift_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/klauspost/compress/gzip"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

func csvRows(tag string, n int) string {
	var b strings.Builder
	b.WriteString("id,tag\n")
	for i := range n {
		fmt.Fprintf(&b, "%d,%s\n", i, tag)
	}
	return b.String()
}

func (e *env) load(t *testing.T, s warehouse.Slice, files map[string]string) (warehouse.Stamp, error) {
	t.Helper()
	src, objs, _ := warehousetest.Source(t, files)
	return e.wh.Load(context.Background(), s, src, objs, nil)
}

// stagingKeys lists the staging objects left under the prefix.
func (e *env) stagingKeys(t *testing.T) []string {
	t.Helper()
	out, err := e.s3.Client().ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(stagingBucket)})
	require.NoError(t, err)
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys
}

func (e *env) get(t *testing.T, key string) []byte {
	t.Helper()
	out, err := e.s3.Client().GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(stagingBucket), Key: aws.String(key)})
	require.NoError(t, err)
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	require.NoError(t, err)
	return b
}

// loadSubmissions counts the load transactions submitted to the double.
func (e *env) loadSubmissions() int {
	n := 0
	for _, s := range e.double.Submissions() {
		if strings.HasPrefix(s.Name, "fleet-load-") {
			n++
		}
	}
	return n
}

func mustStamp(t *testing.T, wh warehouse.Warehouse, s warehouse.Slice) warehouse.Stamp {
	t.Helper()
	st, found, err := wh.Stamp(context.Background(), s.TenantID, s.SourceScope)
	require.NoError(t, err)
	require.True(t, found)
	return st
}

// TestStagingCleanupUnderAnEncodedPrefix: the staging listing asks for
// URL-encoded keys, which S3 returns with "=" as %3D; they are decoded
// before they are matched to the batch and deleted, so a staging prefix
// holding "=" is cleaned up too.
func TestStagingCleanupUnderAnEncodedPrefix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *redshift.Config) { c.Staging = "s3://" + stagingBucket + "/fleet/env=test/" })
	src, objs, scope := warehousetest.Source(t, map[string]string{"a.csv": "id\n1\n"})
	var seen []string
	_, err := e.wh.Load(context.Background(), warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 42, Generation: 1}, src, objs,
		func(context.Context) error { seen = e.stagingKeys(t); return nil })
	require.NoError(t, err)
	require.Contains(t, seen, "fleet/env=test/batch-42/gen-1/manifest.json")
	require.Empty(t, e.stagingKeys(t), "staging is deleted once the commit is confirmed")
}

// TestStagingManifestAndCleanup: a load stages gzip NDJSON parts and a
// manifest naming exactly those parts (mandatory, with their sizes) under
// batch-{id}/gen-{generation}/, its ledger rows and load errors beside them
// (one part and a manifest each), sends its transactions to the configured target, and
// deletes its staging once the commit is confirmed.
func TestStagingManifestAndCleanup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	src, objs, scope := warehousetest.Source(t, map[string]string{"a.csv": "id,name\n1,Ann\n2,Bo\n", "b.ndjson": `{"deep":{"x":[1,{"y":"z"}]}}` + "\n"})
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 41, Generation: 3}
	var seen []string
	var man redshift.Manifest
	st, err := e.wh.Load(context.Background(), s, src, objs, func(context.Context) error {
		seen = e.stagingKeys(t)
		require.NoError(t, json.Unmarshal(e.get(t, "fleet/staging/batch-41/gen-3/manifest.json"), &man))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(3), st.RecordCount)
	require.Equal(t, []string{
		"fleet/staging/batch-41/gen-3/errors-manifest.json", "fleet/staging/batch-41/gen-3/errors.ndjson.gz",
		"fleet/staging/batch-41/gen-3/ledger-manifest.json", "fleet/staging/batch-41/gen-3/ledger.ndjson.gz",
		"fleet/staging/batch-41/gen-3/manifest.json", "fleet/staging/batch-41/gen-3/part-00000.ndjson.gz",
	}, seen)
	require.Len(t, man.Entries, 1)
	entry := man.Entries[0]
	require.Equal(t, "s3://"+stagingBucket+"/fleet/staging/batch-41/gen-3/part-00000.ndjson.gz", entry.URL)
	require.True(t, entry.Mandatory)
	require.Positive(t, entry.Meta.ContentLength)

	require.Empty(t, e.stagingKeys(t), "staging is deleted once the commit is confirmed")

	var copySub, swapSub redshifttest.Submission
	for _, sub := range e.double.Submissions() {
		require.Empty(t, sub.Params, "%s: values are literals, never parameters", sub.Name)
		switch sub.Name {
		case "fleet-load-copy-41-3":
			copySub = sub
		case "fleet-load-swap-41-3":
			swapSub = sub
		}
	}
	require.Equal(t, testWorkgroup, copySub.Workgroup)
	require.Equal(t, testDatabase, copySub.Database)
	require.Equal(t, []string{
		"DROP TABLE IF EXISTS curated_staging.fleet_load_41_3",
		"CREATE TABLE curated_staging.fleet_load_41_3 (LIKE curated.fleet_records INCLUDING DEFAULTS)",
	}, copySub.SQLs[:2], "the COPY goes into the load's own table")
	copySQL := copySub.SQLs[2]
	require.True(t, strings.HasPrefix(copySQL, "COPY curated_staging.fleet_load_41_3 ("), copySQL)
	require.Contains(t, copySQL, "FROM 's3://"+stagingBucket+"/fleet/staging/batch-41/gen-3/manifest.json'")
	require.Contains(t, copySQL, "IAM_ROLE '"+testRole+"'")
	require.Contains(t, copySQL, "MANIFEST")
	require.Contains(t, copySQL, "FORMAT AS JSON 'auto'")
	require.Contains(t, copySQL, "GZIP")
	require.Equal(t, []string{
		"DROP TABLE IF EXISTS curated_staging.fleet_load_41_3_objects",
		"CREATE TABLE curated_staging.fleet_load_41_3_objects (LIKE curated.fleet_load_objects)",
	}, copySub.SQLs[3:5], "the ledger is staged in the same transaction, into a table of its own")
	require.True(t, strings.HasPrefix(copySub.SQLs[5], "COPY curated_staging.fleet_load_41_3_objects ("), copySub.SQLs[5])
	require.Contains(t, copySub.SQLs[5], "FROM 's3://"+stagingBucket+"/fleet/staging/batch-41/gen-3/ledger-manifest.json'")
	require.Equal(t, []string{
		"DROP TABLE IF EXISTS curated_staging.fleet_load_41_3_errors",
		"CREATE TABLE curated_staging.fleet_load_41_3_errors (LIKE curated.fleet_load_errors)",
	}, copySub.SQLs[6:8], "the load errors are staged in the same transaction, into a table of their own")
	require.True(t, strings.HasPrefix(copySub.SQLs[8], "COPY curated_staging.fleet_load_41_3_errors ("), copySub.SQLs[8])
	require.Contains(t, copySub.SQLs[8], "FROM 's3://"+stagingBucket+"/fleet/staging/batch-41/gen-3/errors-manifest.json'")
	for _, q := range copySub.SQLs {
		require.NotContains(t, q, "LOCK", "the COPY's transaction takes no shared lock")
	}
	require.Equal(t, "LOCK curated.fleet_writer_lock", swapSub.SQLs[0], "the swap runs under the writer lock")
	swap := strings.Join(swapSub.SQLs, "\n")
	require.Contains(t, swap, "tenant_id = 'tenant-1'")
	require.Contains(t, swap, "FROM curated_staging.fleet_load_41_3")
	require.Contains(t, swap, "DELETE FROM curated.fleet_load_objects", "the swap replaces the ledger with the slice")
	require.Contains(t, swap, "INSERT INTO curated.fleet_load_objects")
	require.Contains(t, swap, "DELETE FROM curated.fleet_load_errors", "the swap replaces the load errors with the slice")
	require.Contains(t, swap, "INSERT INTO curated.fleet_load_errors")
	require.Equal(t, []string{"DROP TABLE curated_staging.fleet_load_41_3", "DROP TABLE curated_staging.fleet_load_41_3_objects",
		"DROP TABLE curated_staging.fleet_load_41_3_errors"},
		swapSub.SQLs[len(swapSub.SQLs)-3:])
}

// TestStagedLinesAreCuratedRows: each staged line carries the columns of
// curated.fleet_records, the record itself as a nested object.
func TestStagedLinesAreCuratedRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	src, objs, scope := warehousetest.Source(t, map[string]string{"a.csv": "id,note\n1,\"say \"\"hi\"\"\"\n"})
	s := warehouse.Slice{TenantID: `tenant "q"`, SourceScope: scope, BatchID: 5, Generation: 1}
	var line map[string]any
	_, err := e.wh.Load(context.Background(), s, src, objs, func(context.Context) error {
		zr, err := gzip.NewReader(bytes.NewReader(e.get(t, "fleet/staging/batch-5/gen-1/part-00000.ndjson.gz")))
		require.NoError(t, err)
		sc := bufio.NewScanner(zr)
		require.True(t, sc.Scan())
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&line))
		require.False(t, sc.Scan(), "one record, one line")
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, map[string]any{
		"tenant_id": `tenant "q"`, "source_scope": scope, "batch_id": json.Number("5"), "lease_generation": json.Number("1"),
		"object_key": "in/a.csv", "line_number": json.Number("2"), "record": map[string]any{"id": "1", "note": `say "hi"`},
	}, line)
}

// TestStagingPartsAreBoundedAndUploadedInParts: a load larger than a part
// is split into several parts, none over PartBytes, each uploaded as a
// multipart upload once it outgrows one chunk; all records load.
func TestStagingPartsAreBoundedAndUploadedInParts(t *testing.T) {
	t.Parallel()
	const partBytes = 7 << 20
	e := newEnv(t, func(c *redshift.Config) {
		c.PartBytes = partBytes
		c.MaxRecordBytes = 1 << 20
	})
	// Random hex compresses to about half: ~20 MB of NDJSON, ~8 MB gzip, in
	// parts that rotate past 5 MiB (one multipart chunk).
	r := rand.New(rand.NewPCG(7, 11))
	var b strings.Builder
	b.WriteString("id,payload\n")
	const n = 100_000
	buf := make([]byte, 120)
	for i := range n {
		for j := range buf {
			buf[j] = "0123456789abcdef"[r.IntN(16)]
		}
		fmt.Fprintf(&b, "%d,%s\n", i, buf)
	}
	src, objs, scope := warehousetest.Source(t, map[string]string{"big.csv": b.String()})
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 9, Generation: 1}
	var man redshift.Manifest
	st, err := e.wh.Load(context.Background(), s, src, objs, func(context.Context) error {
		require.NoError(t, json.Unmarshal(e.get(t, "fleet/staging/batch-9/gen-1/manifest.json"), &man))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(n), st.RecordCount)
	require.GreaterOrEqual(t, len(man.Entries), 2, "more than one part")
	for i, en := range man.Entries {
		require.LessOrEqual(t, en.Meta.ContentLength, int64(partBytes), "part %d", i)
		require.True(t, en.Mandatory)
	}
	require.GreaterOrEqual(t, e.s3.Requests(stagingBucket, "CreateMultipartUpload"), 1)
	require.GreaterOrEqual(t, e.s3.Requests(stagingBucket, "UploadPart"), 2)
	var count int64
	require.NoError(t, e.double.Pool.QueryRow(context.Background(),
		`SELECT count(DISTINCT line_number) FROM curated.fleet_records WHERE source_scope = $1`, scope).Scan(&count))
	require.Equal(t, int64(n), count)
}

// TestRecordsBeyondRedshiftLimitsAreRefusedBeforeStaging: records Redshift
// could not load are malformed, named by object and line, before any COPY
// is submitted, and leave no staging behind. They are bad records: within
// the import's tolerance they are skipped and recorded in the load errors.
func TestRecordsBeyondRedshiftLimitsAreRefusedBeforeStaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	long := strings.Repeat("x", 70_000)
	deep := strings.Repeat(`{"a":`, 1001) + "1" + strings.Repeat("}", 1001)
	huge := `{"blob":[` + strings.Repeat(`"`+strings.Repeat("y", 60_000)+`",`, 70) + `"end"]}`
	cases := []struct {
		name, body, want string
	}{
		{"long string", `{"ok":1}` + "\n" + `{"text":"` + long + `"}`, "string value of 70000 bytes"},
		{"escaped long string", `{"ok":1}` + "\n" + `{"text":"` + strings.Repeat(`\u00e9`, 33_000) + `"}`, "string value of 66000 bytes"},
		{"deep nesting", `{"ok":1}` + "\n" + deep, "nested more than 1000 levels"},
		{"object over 4 MB", `{"ok":1}` + "\n" + huge, "over Redshift's limit of 4000000 bytes for one JSON object"},
		{"invalid UTF-8", `{"ok":1}` + "\n" + "{\"bad\":\"\xff\xfe\"}", "invalid UTF-8"},
		// Within PostgreSQL's numeric, beyond any number type of SUPER.
		{"a number beyond DOUBLE PRECISION", `{"ok":1}` + "\n" + `{"reading":{"v":[0, -1.5e400]}}`, "$.reading.v[1]: the number is beyond DOUBLE PRECISION"},
		{"a number DOUBLE PRECISION makes 0", `{"ok":1}` + "\n" + `{"reading":1e-400}`, "$.reading: the number is too small for DOUBLE PRECISION"},
		{"a long number beyond DOUBLE PRECISION", `{"ok":1}` + "\n" + `{"reading":1` + strings.Repeat("0", 400) + `}`, "beyond DOUBLE PRECISION"},
	}
	for i, c := range cases {
		_, err := e.load(t, warehouse.Slice{TenantID: "tenant-1", SourceScope: fmt.Sprintf("fleet_s3:mem://limits/%d", i), BatchID: int64(i + 1), Generation: 1},
			map[string]string{"records.ndjson": c.body})
		require.ErrorIs(t, err, folder.ErrMalformed, c.name)
		require.Contains(t, err.Error(), "in/records.ndjson: line 2", c.name)
		require.Contains(t, err.Error(), c.want, c.name)
		require.False(t, pipeline.IsTransient(err), c.name)
	}
	require.Zero(t, e.loadSubmissions(), "nothing was submitted")
	require.Empty(t, e.stagingKeys(t), "nothing is left staged")

	// They are bad records, like the reader's own: failing the load as
	// bad_records does, or skipped and recorded within the tolerance.
	for i, c := range cases {
		src, objs, _ := warehousetest.Source(t, map[string]string{"records.ndjson": c.body})
		s := warehouse.Slice{TenantID: "tenant-1", SourceScope: fmt.Sprintf("fleet_s3:mem://limits/tolerated-%d", i), BatchID: int64(i + 1), Generation: 1}
		_, err := e.wh.Load(context.Background(), s, src, objs, nil)
		bad, ok := folder.AsBadRecord(err)
		require.True(t, ok, "%s: %v", c.name, err)
		require.Equal(t, int64(2), bad.Line, c.name)
		require.Contains(t, bad.Reason, c.want, c.name)
		require.LessOrEqual(t, len(bad.Excerpt), folder.MaxExcerptBytes, c.name)

		src, objs, _ = warehousetest.Source(t, map[string]string{"records.ndjson": c.body})
		src.Tolerate(1)
		st, err := e.wh.Load(context.Background(), s, src, objs, nil)
		require.NoError(t, err, c.name)
		require.Equal(t, int64(1), st.RecordCount, c.name)
		require.Equal(t, int64(1), st.BadRecords, c.name)
		_, errs, _, err := e.wh.LoadErrors(context.Background(), s.TenantID, s.SourceScope)
		require.NoError(t, err)
		require.Len(t, errs, 1, c.name)
		require.Equal(t, int64(2), errs[0].Line, c.name)
		require.Contains(t, errs[0].Reason, c.want, c.name)
		require.LessOrEqual(t, len(errs[0].Excerpt), folder.MaxExcerptBytes, c.name)
	}

	// Just within the limits, the same shapes load.
	st, err := e.load(t, warehouse.Slice{TenantID: "tenant-1", SourceScope: "fleet_s3:mem://limits/ok", BatchID: 99, Generation: 1},
		map[string]string{"records.ndjson": `{"text":"` + strings.Repeat("x", 65_535) + `"}` + "\n" + strings.Repeat(`[`, 999) + strings.Repeat(`]`, 999) + "\n"})
	require.ErrorIs(t, err, folder.ErrMalformed, "an array is not a record")
	st, err = e.load(t, warehouse.Slice{TenantID: "tenant-1", SourceScope: "fleet_s3:mem://limits/ok", BatchID: 99, Generation: 1},
		map[string]string{"records.ndjson": `{"text":"` + strings.Repeat("x", 65_535) + `"}` + "\n" + strings.Repeat(`{"a":`, 999) + "1" + strings.Repeat("}", 999) + "\n"})
	require.NoError(t, err)
	require.Equal(t, int64(2), st.RecordCount)
}

// TestEveryFailedStatementLeavesNothing fails each statement of the load's
// two transactions (the COPY into its staging table, then the swap) in
// turn: the previous slice stays whole, and the failure is not transient.
func TestEveryFailedStatementLeavesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, _, scope := warehousetest.Source(t, map[string]string{"x.csv": "id\n1\n"})
	base := warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 1, Generation: 1}
	_, err := e.load(t, base, map[string]string{"x.csv": csvRows("old", 3)})
	require.NoError(t, err)
	batchID := int64(1)
	for _, tx := range []struct {
		match      string
		statements int
	}{
		{copyMatch, 3}, // drop, create, COPY
		{swapMatch, 8}, // lock, guard, delete, insert, count guard, delete stamp, insert stamp, drop
	} {
		for n := 1; n <= tx.statements; n++ {
			batchID++
			in := e.double.Inject(redshifttest.Fault{Match: tx.match, FailAt: n, Error: fmt.Sprintf("ERROR: injected at %d", n)})
			s := warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: batchID, Generation: 1}
			_, err := e.load(t, s, map[string]string{"y.csv": csvRows("new", 5)})
			require.Error(t, err, "%s statement %d", tx.match, n)
			var se *redshift.StatementError
			require.ErrorAs(t, err, &se, "%s statement %d", tx.match, n)
			require.Contains(t, se.Message, fmt.Sprintf("injected at %d", n))
			require.False(t, pipeline.IsTransient(err), "%s statement %d: %v", tx.match, n, err)
			waitEnded(t, in)
			st := mustStamp(t, e.wh, base)
			require.Equal(t, int64(1), st.BatchID, "%s statement %d: the old stamp stays", tx.match, n)
			var total int64
			require.NoError(t, e.double.Pool.QueryRow(context.Background(),
				`SELECT count(*) FROM curated.fleet_records WHERE source_scope = $1 AND batch_id = 1`, scope).Scan(&total))
			require.Equal(t, int64(3), total, "%s statement %d: the old records stay", tx.match, n)
		}
	}
	require.Empty(t, e.stagingKeys(t), "a failed load's staging is deleted")
	var tables int64
	require.NoError(t, e.double.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = 'curated_staging'`).Scan(&tables))
	require.Zero(t, tables, "a failed load's staging table is dropped")
}

// TestConflictsAreRetriedWithoutRestaging: Redshift's 1023 on the swap and
// an aborted COPY are transient: the transaction is submitted again within
// the same load, from the same staging (one manifest, one staging table),
// and the load commits. Conflicts that outlast ConflictRetries leave the
// slice untouched and the load transient.
func TestConflictsAreRetriedWithoutRestaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *redshift.Config) { c.ConflictRetries = 2 })
	scope := "fleet_s3:mem://serial/x"
	conflict := "ERROR: 1023 DETAIL: Serializable isolation violation on table - 156273, transactions forming the cycle are: 8311, 8312 (pid:3154)"
	e.double.Inject(redshifttest.Fault{Match: copyMatch, FailAt: 3, Abort: true})
	e.double.Inject(redshifttest.Fault{Match: swapMatch, FailAt: 4, Error: conflict})
	e.double.Inject(redshifttest.Fault{Match: swapMatch, FailAt: 2, Error: "ERROR: could not complete because of conflict with concurrent transaction"})
	st, err := e.load(t, warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 1, Generation: 1}, map[string]string{"x.csv": csvRows("a", 2)})
	require.NoError(t, err)
	require.Equal(t, int64(2), st.RecordCount)
	names := map[string]int{}
	for _, sub := range e.double.Submissions() {
		names[sub.Name]++
	}
	require.Equal(t, 2, names["fleet-load-copy-1-1"], "the aborted COPY ran again from the same manifest")
	require.Equal(t, 3, names["fleet-load-swap-1-1"], "two conflicts, then the swap committed")
	require.Equal(t, 6, e.s3.Requests(stagingBucket, "PutObject"), "one part and one manifest, of the records, the ledger and the errors: staged once")

	for range 3 {
		e.double.Inject(redshifttest.Fault{Match: swapMatch, FailAt: 4, Error: conflict})
	}
	_, err = e.load(t, warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 2, Generation: 1}, map[string]string{"x.csv": csvRows("b", 3)})
	require.ErrorIs(t, err, warehouse.ErrTransient)
	require.True(t, pipeline.IsTransient(err))
	require.Equal(t, int64(1), mustStamp(t, e.wh, warehouse.Slice{TenantID: "tenant-1", SourceScope: scope}).BatchID, "nothing committed")
}

// TestCommitSeenOnlyByTheStamp: the load's transaction commits, but the
// client never sees it end within its deadline; reading the stamp back
// finds the commit.
func TestCommitSeenOnlyByTheStamp(t *testing.T) {
	t.Parallel()
	// The client never sees the outcome, so the load waits its whole
	// deadline and then reads the stamp: the deadline must outlast the
	// commit on a loaded machine (under 300 ms it once passed before the
	// double committed, in make test at load average ~10).
	e := newEnv(t, func(c *redshift.Config) { c.LoadTimeout = 3 * time.Second })
	in := e.double.Inject(redshifttest.Fault{Match: swapMatch, HideOutcome: true})
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: "fleet_s3:mem://hidden/x", BatchID: 3, Generation: 2}
	st, err := e.load(t, s, map[string]string{"x.csv": csvRows("a", 4)})
	require.NoError(t, err, "the stamp shows the commit the client did not see")
	require.Equal(t, int64(3), st.BatchID)
	require.Equal(t, int64(2), st.Generation)
	require.Equal(t, int64(4), st.RecordCount)
	in.Reveal()
}

// waitEnded waits for an injected fault's transaction to end (a held one after its Release),
// failing after 30 s rather than hanging the package: under a deadline of
// 200 ms a loaded machine once gave up on the load before the double had
// applied the fault, and the test waited until go test's 30 min timeout.
func waitEnded(t *testing.T, in *redshifttest.Injection) {
	t.Helper()
	select {
	case <-in.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the injected transaction did not end within 30 s")
	}
}

// TestCommitAfterTheClientsDeadline: the transaction is still running when
// the client's deadline passes: the load reports a transient failure of
// unknown outcome (never "failed"), and the commit that follows shows in
// the stamp.
func TestCommitAfterTheClientsDeadline(t *testing.T) {
	t.Parallel()
	// The deadline passes while the transaction is held (Hold), however
	// long it is; long enough that a loaded machine's double reaches the
	// hold before it.
	e := newEnv(t, func(c *redshift.Config) { c.LoadTimeout = 2 * time.Second })
	in := e.double.Inject(redshifttest.Fault{Match: swapMatch, Hold: true})
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: "fleet_s3:mem://late/x", BatchID: 8, Generation: 1}
	_, err := e.load(t, s, map[string]string{"x.csv": csvRows("a", 6)})
	require.ErrorIs(t, err, warehouse.ErrTransient)
	require.Contains(t, err.Error(), "still")
	_, found, err := e.wh.Stamp(context.Background(), s.TenantID, s.SourceScope)
	require.NoError(t, err)
	require.False(t, found, "not committed yet")
	require.NotEmpty(t, e.stagingKeys(t), "staging stays while the statement may still run")

	in.Release()
	waitEnded(t, in)
	st := mustStamp(t, e.wh, s)
	require.Equal(t, int64(8), st.BatchID)
	require.Equal(t, int64(6), st.RecordCount)

	// The next delivery's load of the batch settles on the stamp and
	// cleans the staging up. It runs with time to spare: under the 300 ms
	// deadline a loaded machine timed it out too, and it settled on the
	// first commit's stamp (generation 1).
	e.cfg.LoadTimeout = time.Minute
	e.wh = e.warehouse(t, e.double.Client())
	st, err = e.load(t, warehouse.Slice{TenantID: s.TenantID, SourceScope: s.SourceScope, BatchID: 8, Generation: 2}, map[string]string{"x.csv": csvRows("a", 6)})
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Generation)
	require.Empty(t, e.stagingKeys(t))
}

// TestCancelledLoadCancelsItsStatement: when the delivery's context ends
// (lease lost, shutdown), the running statement is cancelled.
func TestCancelledLoadCancelsItsStatement(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.double.Inject(redshifttest.Fault{Match: swapMatch, Hold: true})
	src, objs, scope := warehousetest.Source(t, map[string]string{"x.csv": csvRows("a", 3)})
	ctx, cancel := context.WithCancelCause(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := e.wh.Load(ctx, warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 1, Generation: 1}, src, objs, nil)
		errc <- err
	}()
	testproc.Await(t, in.Held(), "the swap to be held")
	cancel(batch.ErrStaleLease)
	err := testproc.Await(t, errc, "the cancelled load to end")
	require.ErrorIs(t, err, batch.ErrStaleLease)
	select {
	case <-in.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the held statement was not cancelled")
	}
	_, found, err := e.wh.Stamp(context.Background(), "tenant-1", scope)
	require.NoError(t, err)
	require.False(t, found, "the cancelled load did not commit")
}

// TestMissingMandatoryPartFailsTheCopy: a part named by the manifest that
// is gone from S3 fails the COPY and so the whole transaction.
func TestMissingMandatoryPartFailsTheCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	src, objs, scope := warehousetest.Source(t, map[string]string{"x.csv": csvRows("a", 3)})
	_, err := e.wh.Load(context.Background(), warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 1, Generation: 1}, src, objs,
		func(ctx context.Context) error {
			_, err := e.s3.Client().DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(stagingBucket), Key: aws.String("fleet/staging/batch-1/gen-1/part-00000.ndjson.gz")})
			return err
		})
	var se *redshift.StatementError
	require.ErrorAs(t, err, &se)
	require.Contains(t, se.Message, "mandatory")
	_, found, err := e.wh.Stamp(context.Background(), "tenant-1", scope)
	require.NoError(t, err)
	require.False(t, found)
}

// TestDataAPIThrottling: throttling the SDK's retries absorb is invisible;
// throttling that outlasts them is transient.
func TestDataAPIThrottling(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.double.Throttle(1)
	_, found, err := e.wh.Stamp(context.Background(), "tenant-1", "fleet_s3:mem://throttled/x")
	require.NoError(t, err, "the SDK retried")
	require.False(t, found)

	e.double.Throttle(1_000)
	_, _, err = e.wh.Stamp(context.Background(), "tenant-1", "fleet_s3:mem://throttled/x")
	require.Error(t, err)
	require.Contains(t, err.Error(), "ThrottlingException")
	require.True(t, pipeline.IsTransient(err), "%v", err)
	e.double.Throttle(0)
}

// TestPublishDeletesEveryStagedGenerationUpToItsOwn: staging left by a
// load whose client died is deleted once the batch is published; a newer
// generation's staging is left alone.
func TestPublishDeletesEveryStagedGenerationUpToItsOwn(t *testing.T) {
	t.Parallel()
	// As in TestCommitAfterTheClientsDeadline: the deadline passes while
	// the swap is held.
	e := newEnv(t, func(c *redshift.Config) { c.LoadTimeout = 2 * time.Second })
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: "fleet_s3:mem://cleanup/x", BatchID: 4, Generation: 1}
	in := e.double.Inject(redshifttest.Fault{Match: swapMatch, Hold: true})
	_, err := e.load(t, s, map[string]string{"x.csv": csvRows("a", 2)})
	require.ErrorIs(t, err, warehouse.ErrTransient)
	in.Release()
	waitEnded(t, in)
	e.s3.Put(t, stagingBucket, "fleet/staging/batch-4/gen-7/part-00000.ndjson.gz", []byte("a newer delivery's"))
	e.s3.Put(t, stagingBucket, "fleet/staging/batch-40/gen-1/part-00000.ndjson.gz", []byte("another batch's"))

	st, err := e.wh.Publish(context.Background(), warehouse.Slice{TenantID: s.TenantID, SourceScope: s.SourceScope, BatchID: 4, Generation: 2}, time.Hour, nil)
	require.NoError(t, err)
	require.NotNil(t, st.PublishedAt)
	require.Equal(t, []string{"fleet/staging/batch-4/gen-7/part-00000.ndjson.gz", "fleet/staging/batch-40/gen-1/part-00000.ndjson.gz"}, e.stagingKeys(t))
}

// TestMigrateIsIdempotent: the schema is created once, with its version
// row; migrating again applies nothing.
func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	again, err := e.wh.Migrate(context.Background())
	require.NoError(t, err)
	require.Empty(t, again)
	var versions []int64
	rows, err := e.double.Pool.Query(context.Background(), `SELECT version FROM curated.fleet_warehouse_migrations ORDER BY version`)
	require.NoError(t, err)
	for rows.Next() {
		var v int64
		require.NoError(t, rows.Scan(&v))
		versions = append(versions, v)
	}
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, versions)
	var recordType string
	require.NoError(t, e.double.Pool.QueryRow(context.Background(), `
		SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = 'curated.fleet_records'::regclass AND attname = 'record'`).Scan(&recordType))
	require.Equal(t, "jsonb", recordType, "SUPER, as the double keeps it")
}

// TestClusterWithDatabaseUser: a provisioned cluster with temporary
// credentials for a database user sends both in every request.
func TestClusterWithDatabaseUser(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cluster := redshifttest.Start(t, redshifttest.Options{DatabaseURL: e.double.Pool.Config().ConnString(), S3: e.s3.Client(), Cluster: "fleet-cluster", Database: testDatabase})
	cfg := testConfig()
	cfg.WorkgroupName, cfg.ClusterID, cfg.DBUser = "", "fleet-cluster", "fleet_loader"
	wh, err := redshift.New(cfg, cluster.Client(), e.s3.Client())
	require.NoError(t, err)
	_, found, err := wh.Stamp(context.Background(), "tenant-1", "fleet_s3:mem://cluster/x")
	require.NoError(t, err)
	require.False(t, found)
	subs := cluster.Submissions()
	require.NotEmpty(t, subs)
	require.Equal(t, "fleet-cluster", subs[0].Cluster)
	require.Equal(t, "fleet_loader", subs[0].DBUser)
	require.Empty(t, subs[0].Workgroup)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	good := testConfig()
	require.NoError(t, good.Validate())
	cases := []struct {
		field  string
		adjust func(*redshift.Config)
	}{
		{"workgroup", func(c *redshift.Config) { c.WorkgroupName = "" }},
		{"workgroup", func(c *redshift.Config) { c.ClusterID = "c1" }},
		{"database", func(c *redshift.Config) { c.Database = "" }},
		{"db-user", func(c *redshift.Config) { c.DBUser = "loader" }},
		{"secret-arn", func(c *redshift.Config) {
			c.WorkgroupName, c.ClusterID, c.DBUser, c.SecretARN = "", "c1", "u", "arn:aws:secretsmanager:us-east-1:123456789012:secret:x"
		}},
		{"iam-role", func(c *redshift.Config) { c.IAMRole = "" }},
		{"iam-role", func(c *redshift.Config) { c.IAMRole = "arn:aws:iam::123456789012:role/x' CREDENTIALS 'y" }},
		{"staging", func(c *redshift.Config) { c.Staging = "" }},
		{"staging", func(c *redshift.Config) { c.Staging = "s3://bucket/it's/" }},
		{"staging", func(c *redshift.Config) { c.Staging = "s3://Bad_Bucket/x/" }},
		{"staging", func(c *redshift.Config) { c.Staging = "https://bucket/x/" }},
		{"staging", func(c *redshift.Config) { c.Staging = "s3://bucket/a/../b/" }},
		{"part-bytes", func(c *redshift.Config) { c.PartBytes = 1 << 20 }},
	}
	for _, c := range cases {
		cfg := testConfig()
		c.adjust(&cfg)
		err := cfg.Validate()
		var ce *redshift.ConfigError
		require.True(t, errors.As(err, &ce), "%s: %v", c.field, err)
		require.Equal(t, c.field, ce.Field, "%v", err)
	}
	cfg := testConfig()
	cfg.IAMRole = "default"
	require.NoError(t, cfg.Validate())
	bucket, prefix, err := redshift.ParseStaging("s3://fleet-staging/loads")
	require.NoError(t, err)
	require.Equal(t, "fleet-staging", bucket)
	require.Equal(t, "loads/", prefix)
}

// TestStagingThrottledIsTransient: S3 throttling the staging uploads past
// the SDK's retries fails the load as transient, before anything is
// submitted; once S3 answers, the load goes through.
func TestStagingThrottledIsTransient(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: "fleet_s3:mem://slow-staging/x", BatchID: 1, Generation: 1}
	e.s3.Throttle(stagingBucket, 1_000)
	_, err := e.load(t, s, map[string]string{"x.csv": csvRows("a", 3)})
	require.Error(t, err)
	require.Contains(t, err.Error(), "SlowDown")
	require.True(t, pipeline.IsTransient(err), "%v", err)
	require.Zero(t, e.loadSubmissions())
	e.s3.Throttle(stagingBucket, 0)
	st, err := e.load(t, warehouse.Slice{TenantID: s.TenantID, SourceScope: s.SourceScope, BatchID: 1, Generation: 2}, map[string]string{"x.csv": csvRows("a", 3)})
	require.NoError(t, err)
	require.Equal(t, int64(3), st.RecordCount)
}
