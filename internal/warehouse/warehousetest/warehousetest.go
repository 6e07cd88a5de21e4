// Package warehousetest is the one contract test suite for
// warehouse.Warehouse. Every implementation runs it (Exercise) with a
// factory that gives each case a fresh, migrated warehouse, so the local
// PostgreSQL warehouse and the Redshift one (against its Data API double)
// are held to the same behaviour: load, replace, refuse a superseded slice,
// refuse malformed records, publish once, the publication window, refuse a
// stale lease holder's publication, tell the truth about a load whose
// client died, and skip, within the import's tolerance, records holding a
// value the warehouse cannot store (AnUnstorableValueIsABadRecord).
package warehousetest

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/warehouse"
)

// Harness is one implementation under test, with ways to look into it
// around the interface.
type Harness struct {
	Warehouse warehouse.Warehouse
	// Records returns the slice's rows as the warehouse stores them.
	Records func(ctx context.Context, tenantID, scope string) ([]Row, error)
	// Publications returns the outbox rows of the slice.
	Publications func(ctx context.Context, tenantID, scope string) ([]Publication, error)
	// AgeCommit moves the slice's commit time d into the past.
	AgeCommit func(ctx context.Context, tenantID, scope string, d time.Duration) error
	// DyingLoad runs a Load whose client dies once the warehouse has the
	// work in hand, and returns when that Load has returned, with a
	// function that waits until the warehouse settled what it still had.
	DyingLoad func(t *testing.T, s warehouse.Slice, src *folder.Source, objects []folder.Object) (settle func())
	// OrphanCommits is what the warehouse does with a dying client's load:
	// true if it commits all the same (Redshift: the Data API runs the
	// statement whatever the client does), false if it rolls back
	// (PostgreSQL: the session ends with its client).
	OrphanCommits bool
	// LedgerRows returns every row of the load ledger
	// (curated.fleet_load_objects) of the slice, whatever its batch, in key
	// order: what the ledger holds, not only what LedgerReader shows. Nil
	// skips the checks that need it.
	LedgerRows func(ctx context.Context, tenantID, scope string) ([]warehouse.LedgerObject, error)
	// ErrorRows returns every row of the load errors table
	// (curated.fleet_load_errors) of the slice, whatever its batch, by
	// batch and ordinal. Nil skips the checks that need it.
	ErrorRows func(ctx context.Context, tenantID, scope string) ([]warehouse.LoadError, error)
	// KilledLoad runs a Load that dies after it wrote the new slice's
	// records and ledger rows and before its commit (PostgreSQL: its
	// client is gone at the last lease check; Redshift: the swap
	// transaction fails at its last statement), and returns once the Load
	// returned. Nil skips the case.
	KilledLoad func(t *testing.T, s warehouse.Slice, src *folder.Source, objects []folder.Object)
}

// Row is one stored record.
type Row struct {
	BatchID   int64
	ObjectKey string
	Line      int64
	Record    string // JSON
}

// Publication is one outbox row.
type Publication struct {
	BatchID int64
	// BatchUID is the uid the publication names the batch by, empty for
	// a legacy batch's.
	BatchUID    string
	RecordCount int64
	PublishedAt time.Time
}

// Factory returns a fresh harness for one test case.
type Factory func(t *testing.T) Harness

// Exercise runs every case of the contract against the implementation
// factory makes, each case in parallel on its own warehouse.
func Exercise(t *testing.T, factory Factory) {
	cases := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"LoadsEveryRecordStamped", testLoad},
		{"LoadsAnEmptyFolder", testLoadEmpty},
		{"LoadsEveryRecordOnceWhateverTheFolderSize", testLoadSizes},
		{"ReplacesTheSlice", testReplace},
		{"RefusesASupersededSlice", testSuperseded},
		{"MalformedRecordLeavesTheSliceUntouched", testMalformed},
		{"BeforeCommitErrorAbortsTheLoad", testBeforeCommit},
		{"PublishesOnce", testPublishOnce},
		{"PublicationWindowOnTheWarehouseClock", testWindow},
		{"PublishRefusesMissingAndSuperseded", testPublishRefused},
		{"StaleLeasePublishIsRefused", testStaleLeasePublish},
		{"StampAfterALoadWhoseClientDied", testDyingLoad},
		{"LedgerListsTheLoadedObjects", testLedger},
		{"ALoadKilledBeforeItsCommitLeavesTheOldSliceAndLedger", testLedgerKilled},
		{"AReimportReplacesTheLedger", testLedgerReimport},
		{"BadRecordsWithinTheToleranceAreSkippedAndRecorded", testBadRecords},
		{"BadRecordsBeyondTheToleranceFailTheLoad", testBadRecordsBeyond},
		{"AReimportReplacesTheLoadErrors", testBadRecordsReimport},
		{"ALoadKilledBeforeItsCommitLeavesTheOldLoadErrors", testBadRecordsKilled},
		{"AnUnstorableValueIsABadRecord", testUnstorableValues},
		{"ABatchIsNamedByItsIDAndUID", testIdentity},
		{"AForgottenBatchsStampIsTakenOverOnlyByName", testTakeOver},
		{"APublicationIsRecordedOncePerBatchIdentity", testPublicationIdentity},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, factory(t))
		})
	}
}

// PoolReaders returns Records, Publications and AgeCommit for a warehouse
// whose tables are readable as curated.fleet_* through pool (the local
// warehouse, and the Redshift double's database).
func PoolReaders(pool *pgxpool.Pool) (
	records func(context.Context, string, string) ([]Row, error),
	publications func(context.Context, string, string) ([]Publication, error),
	age func(context.Context, string, string, time.Duration) error,
) {
	records = func(ctx context.Context, tenant, scope string) ([]Row, error) {
		rows, err := pool.Query(ctx, `
			SELECT batch_id, object_key, line_number, record::text FROM curated.fleet_records
			WHERE tenant_id = $1 AND source_scope = $2 ORDER BY object_key, line_number`, tenant, scope)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []Row
		for rows.Next() {
			var r Row
			if err := rows.Scan(&r.BatchID, &r.ObjectKey, &r.Line, &r.Record); err != nil {
				return nil, err
			}
			out = append(out, r)
		}
		return out, rows.Err()
	}
	publications = func(ctx context.Context, tenant, scope string) ([]Publication, error) {
		rows, err := pool.Query(ctx, `
			SELECT batch_id, COALESCE(batch_uid, ''), record_count, published_at FROM curated.fleet_publications
			WHERE tenant_id = $1 AND source_scope = $2 ORDER BY batch_id, batch_uid`, tenant, scope)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []Publication
		for rows.Next() {
			var p Publication
			if err := rows.Scan(&p.BatchID, &p.BatchUID, &p.RecordCount, &p.PublishedAt); err != nil {
				return nil, err
			}
			out = append(out, p)
		}
		return out, rows.Err()
	}
	age = func(ctx context.Context, tenant, scope string, d time.Duration) error {
		_, err := pool.Exec(ctx, `
			UPDATE curated.fleet_slices SET committed_at = committed_at - $3 * interval '1 microsecond'
			WHERE tenant_id = $1 AND source_scope = $2`, tenant, scope, d.Microseconds())
		return err
	}
	return records, publications, age
}

// PoolLedger returns LedgerRows for a warehouse whose tables are readable
// as curated.fleet_* through pool.
func PoolLedger(pool *pgxpool.Pool) func(context.Context, string, string) ([]warehouse.LedgerObject, error) {
	return func(ctx context.Context, tenant, scope string) ([]warehouse.LedgerObject, error) {
		rows, err := pool.Query(ctx, `
			SELECT batch_id, COALESCE(batch_uid, ''), object_key, etag, size_bytes, record_count, last_modified, marker_modified
			FROM curated.fleet_load_objects
			WHERE tenant_id = $1 AND source_scope = $2 ORDER BY object_key, batch_id`, tenant, scope)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []warehouse.LedgerObject
		for rows.Next() {
			o := warehouse.LedgerObject{TenantID: tenant, SourceScope: scope}
			// timestamptz locally, timestamp (UTC) in the Redshift double.
			var modified, marker any
			if err := rows.Scan(&o.BatchID, &o.BatchUID, &o.ObjectKey, &o.ETag, &o.SizeBytes, &o.RecordCount, &modified, &marker); err != nil {
				return nil, err
			}
			o.LastModified = modified.(time.Time).UTC()
			if m, ok := marker.(time.Time); ok {
				m = m.UTC()
				o.MarkerModified = &m
			}
			out = append(out, o)
		}
		return out, rows.Err()
	}
}

// PoolErrors returns ErrorRows for a warehouse whose tables are readable
// as curated.fleet_* through pool.
func PoolErrors(pool *pgxpool.Pool) func(context.Context, string, string) ([]warehouse.LoadError, error) {
	return func(ctx context.Context, tenant, scope string) ([]warehouse.LoadError, error) {
		rows, err := pool.Query(ctx, `
			SELECT batch_id, COALESCE(batch_uid, ''), ordinal, object_key, line_number, column_number, reason, raw_excerpt
			FROM curated.fleet_load_errors
			WHERE tenant_id = $1 AND source_scope = $2 ORDER BY batch_id, ordinal`, tenant, scope)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []warehouse.LoadError
		for rows.Next() {
			e := warehouse.LoadError{TenantID: tenant, SourceScope: scope}
			var column int32
			if err := rows.Scan(&e.BatchID, &e.BatchUID, &e.Ordinal, &e.ObjectKey, &e.Line, &column, &e.Reason, &e.Excerpt); err != nil {
				return nil, err
			}
			e.Column = int(column)
			out = append(out, e)
		}
		return out, rows.Err()
	}
}

var folderSeq atomic.Int64

// tenant is this process's tenant: a warehouse shared by several runs (a
// live one) never sees one run's slices in another.
var tenant = fmt.Sprintf("tenant-%d-%d", time.Now().UnixNano(), os.Getpid())

// Source writes files into a fresh mem:// folder and opens it; it returns
// the source, its objects and the folder's scope. The suite and the tests of
// each implementation use it to make folders.
func Source(t *testing.T, files map[string]string) (*folder.Source, []folder.Object, string) {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("warehousetest-%d", folderSeq.Add(1))
	for k, v := range files {
		require.NoError(t, folder.MemBucket(name).WriteAll(ctx, "in/"+k, []byte(v), nil))
	}
	f, err := folder.Canonicalize("mem://" + name + "/in")
	require.NoError(t, err)
	src, err := folder.Opener{}.Open(ctx, f)
	require.NoError(t, err)
	t.Cleanup(func() { src.Close() })
	objs, err := src.Objects(ctx)
	require.NoError(t, err)
	return src, objs, f.Scope()
}

// newScope returns a scope no other case uses.
func newScope() string {
	return fmt.Sprintf("fleet_s3:mem://warehousetest-scope-%d/in", folderSeq.Add(1))
}

// Tenant is the tenant every slice of the suite belongs to.
func Tenant() string { return tenant }

func slice(scope string, batchID, gen int64) warehouse.Slice {
	return warehouse.Slice{TenantID: tenant, SourceScope: scope, BatchID: batchID, Generation: gen}
}

// rows returns n CSV rows under a header, tagged with tag.
func rows(tag string, n int) string {
	var b strings.Builder
	b.WriteString("id,tag\n")
	for i := range n {
		fmt.Fprintf(&b, "%d,%s\n", i, tag)
	}
	return b.String()
}

func load(t *testing.T, h Harness, s warehouse.Slice, files map[string]string) warehouse.Stamp {
	t.Helper()
	src, objs, _ := Source(t, files)
	st, err := h.Warehouse.Load(context.Background(), s, src, objs, nil)
	require.NoError(t, err)
	return st
}

// consistent checks that the slice holds exactly what its stamp says: the
// stamped count of records, all of the stamped batch. It returns the stamp.
func consistent(t *testing.T, h Harness, s warehouse.Slice) (warehouse.Stamp, []Row, bool) {
	t.Helper()
	ctx := context.Background()
	st, found, err := h.Warehouse.Stamp(ctx, s.TenantID, s.SourceScope)
	require.NoError(t, err)
	recs, err := h.Records(ctx, s.TenantID, s.SourceScope)
	require.NoError(t, err)
	if !found {
		require.Empty(t, recs, "an unstamped slice holds no records")
		_, objs, found := ledger(t, h, s.TenantID, s.SourceScope)
		require.False(t, found)
		require.Empty(t, objs, "an unstamped slice has no ledger")
		if h.LedgerRows != nil {
			raw, err := h.LedgerRows(ctx, s.TenantID, s.SourceScope)
			require.NoError(t, err)
			require.Empty(t, raw, "an unstamped slice has no ledger rows")
		}
		return st, nil, false
	}
	require.Len(t, recs, int(st.RecordCount), "the slice holds the stamped count")
	for _, r := range recs {
		require.Equal(t, st.BatchID, r.BatchID, "every record is of the stamped batch")
	}
	ledgerConsistent(t, h, s, st, recs)
	return st, recs, true
}

// ledger reads the slice's ledger through the warehouse's LedgerReader.
func ledger(t *testing.T, h Harness, tenantID, scope string) (warehouse.Stamp, []warehouse.LedgerObject, bool) {
	t.Helper()
	lr, ok := h.Warehouse.(warehouse.LedgerReader)
	require.True(t, ok, "the warehouse reads its load ledger (warehouse.LedgerReader)")
	st, objs, found, err := lr.Ledger(context.Background(), tenantID, scope)
	require.NoError(t, err)
	return st, objs, found
}

// ledgerConsistent checks that the ledger is the stamped slice's: read
// through LedgerReader with the same stamp, every row of the stamped batch,
// record counts per object equal to the slice's records of that object,
// adding up to the stamp's; and, through LedgerRows, that the table holds
// those rows and no other of the slice (an older batch's are gone).
func ledgerConsistent(t *testing.T, h Harness, s warehouse.Slice, st warehouse.Stamp, recs []Row) {
	t.Helper()
	perObject := map[string]int64{}
	for _, r := range recs {
		perObject[r.ObjectKey]++
	}
	check := func(what string, objs []warehouse.LedgerObject) {
		t.Helper()
		var total int64
		for _, o := range objs {
			require.Equal(t, st.BatchID, o.BatchID, "%s: every ledger row is of the stamped batch", what)
			require.Equal(t, perObject[o.ObjectKey], o.RecordCount, "%s: %s: the ledger counts the slice's records of the object", what, o.ObjectKey)
			total += o.RecordCount
		}
		require.Equal(t, st.RecordCount, total, "%s: the ledger's records add up to the stamp's", what)
		for key := range perObject {
			require.True(t, slices.ContainsFunc(objs, func(o warehouse.LedgerObject) bool { return o.ObjectKey == key }),
				"%s: the slice's object %s is in the ledger", what, key)
		}
	}
	lst, objs, found := ledger(t, h, s.TenantID, s.SourceScope)
	require.True(t, found)
	require.Equal(t, st.BatchID, lst.BatchID, "the ledger is read with the stamp")
	check("LedgerReader", objs)
	if h.LedgerRows != nil {
		raw, err := h.LedgerRows(context.Background(), s.TenantID, s.SourceScope)
		require.NoError(t, err)
		check("the table", raw)
		require.Equal(t, objs, raw, "the table holds exactly the rows the reader shows")
	}
}

func testLoad(t *testing.T, h Harness) {
	ctx := context.Background()
	src, objs, scope := Source(t, map[string]string{
		"a.csv":         "id,name,note\n1,Ann,\"multi\nline\"\n2,\"Bo \"\"B\"\"\",plain\n",
		"b/c.ndjson":    "{\"id\": 3, \"nested\": {\"k\": [1, 2.5, null, true]}}\n\n{\"id\": 4, \"name\": \"Ünï\"}\n",
		"_SUCCESS":      "",
		"manifest.json": "{}",
	})
	s := slice(scope, 7, 2)
	before := time.Now().Add(-time.Minute)
	st, err := h.Warehouse.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)
	require.Equal(t, int64(7), st.BatchID)
	require.Equal(t, int64(2), st.Generation)
	require.Equal(t, int64(4), st.RecordCount)
	require.Nil(t, st.PublishedAt)
	require.True(t, st.CommittedAt.After(before) && st.CommittedAt.Before(time.Now().Add(time.Minute)), "committed at %s", st.CommittedAt)

	read, found, err := h.Warehouse.Stamp(ctx, s.TenantID, s.SourceScope)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, st.BatchID, read.BatchID)
	require.Equal(t, st.Generation, read.Generation)
	require.Equal(t, st.RecordCount, read.RecordCount)
	require.WithinDuration(t, st.CommittedAt, read.CommittedAt, time.Millisecond)

	_, recs, _ := consistent(t, h, s)
	want := []Row{
		{7, "in/a.csv", 2, `{"id":"1","name":"Ann","note":"multi\nline"}`},
		{7, "in/a.csv", 4, `{"id":"2","name":"Bo \"B\"","note":"plain"}`},
		{7, "in/b/c.ndjson", 1, `{"id":3,"nested":{"k":[1,2.5,null,true]}}`},
		{7, "in/b/c.ndjson", 3, `{"id":4,"name":"Ünï"}`},
	}
	require.Len(t, recs, len(want))
	for i, w := range want {
		require.Equal(t, w.ObjectKey, recs[i].ObjectKey)
		require.Equal(t, w.Line, recs[i].Line)
		require.JSONEq(t, w.Record, recs[i].Record)
	}

	_, found, err = h.Warehouse.Stamp(ctx, s.TenantID, "fleet_s3:mem://nothing/here")
	require.NoError(t, err)
	require.False(t, found, "a slice never loaded has no stamp")
}

func testLoadEmpty(t *testing.T, h Harness) {
	scope := newScope()
	st := load(t, h, slice(scope, 1, 1), map[string]string{"only-header.csv": "id,tag\n"})
	require.Zero(t, st.RecordCount)
	got, _, found := consistent(t, h, slice(scope, 1, 1))
	require.True(t, found, "an empty load is still stamped")
	require.Equal(t, int64(1), got.BatchID)
}

// testLoadSizes loads folders on either side of the local warehouse's
// small-load limits (256 records, 256 KiB: one INSERT below them, COPY
// from the first record past them, the records read before it first):
// every record arrives once, on its own line, and a record the database
// refuses past the limits is still malformed.
func testLoadSizes(t *testing.T, h Harness) {
	ctx := context.Background()
	// Over 256 KiB in strings Redshift's SUPER can hold (64 KiB each).
	var pads []string
	for i := range 6 {
		pads = append(pads, fmt.Sprintf(`"p%d":"%s"`, i, strings.Repeat("x", 50<<10)))
	}
	big := "{" + strings.Join(pads, ",") + "}\n"
	for i, c := range []struct {
		name  string
		files map[string]string
		want  int // records; -1: malformed
	}{
		{"256 records", map[string]string{"a.csv": rows("a", 256)}, 256},
		{"257 records", map[string]string{"a.csv": rows("a", 257)}, 257},
		{"1000 records in two objects", map[string]string{"a.csv": rows("a", 600), "b.csv": rows("b", 400)}, 1000},
		{"a first record past 256 KiB", map[string]string{"a.ndjson": big + `{"n":1}` + "\n"}, 2},
		{"a record past 256 KiB after small ones", map[string]string{"a.csv": rows("a", 10), "b.ndjson": big}, 11},
		{"a NUL past the limits", map[string]string{"a.csv": rows("a", 300), "b.ndjson": `{"bad":"a\u0000b"}` + "\n"}, -1},
	} {
		// A batch id of its own per load, as batches have (the Redshift
		// warehouse derives its Data API client tokens from it).
		s := slice(newScope(), int64(i+1), 1)
		src, objs, _ := Source(t, c.files)
		st, err := h.Warehouse.Load(ctx, s, src, objs, nil)
		if c.want < 0 {
			require.ErrorIs(t, err, folder.ErrMalformed, c.name)
			_, _, found := consistent(t, h, s)
			require.False(t, found, "%s: nothing committed", c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, int64(c.want), st.RecordCount, c.name)
		_, recs, _ := consistent(t, h, s)
		require.Len(t, recs, c.want, c.name)
		seen := map[string]bool{}
		for _, r := range recs {
			k := fmt.Sprintf("%s:%d", r.ObjectKey, r.Line)
			require.False(t, seen[k], "%s: %s loaded once", c.name, k)
			seen[k] = true
		}
		for name, body := range c.files {
			if strings.HasSuffix(name, ".csv") {
				for line := 2; line <= strings.Count(body, "\n"); line++ {
					require.True(t, seen[fmt.Sprintf("in/%s:%d", name, line)], "%s: in/%s line %d loaded", c.name, name, line)
				}
			}
		}
	}
}

func testReplace(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	load(t, h, slice(scope, 1, 1), map[string]string{"x.csv": rows("one", 3)})
	_, err := h.Warehouse.Publish(ctx, slice(scope, 1, 1), time.Hour, nil)
	require.NoError(t, err)

	st := load(t, h, slice(scope, 2, 1), map[string]string{"y.csv": rows("two", 2)})
	require.Equal(t, int64(2), st.BatchID)
	require.Nil(t, st.PublishedAt, "a new load is not published")
	got, recs, _ := consistent(t, h, slice(scope, 2, 1))
	require.Equal(t, int64(2), got.RecordCount)
	require.Nil(t, got.PublishedAt)
	for _, r := range recs {
		require.Equal(t, "in/y.csv", r.ObjectKey, "nothing of the old slice is left")
	}

	// A later generation of the same batch replaces it too.
	st = load(t, h, slice(scope, 2, 5), map[string]string{"z.csv": rows("again", 4)})
	require.Equal(t, int64(5), st.Generation)
	got, _, _ = consistent(t, h, slice(scope, 2, 5))
	require.Equal(t, int64(4), got.RecordCount)
	require.Equal(t, int64(5), got.Generation)
}

func testSuperseded(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	load(t, h, slice(scope, 5, 3), map[string]string{"x.csv": rows("five", 3)})

	for _, s := range []warehouse.Slice{slice(scope, 4, 9), slice(scope, 5, 2)} {
		src, objs, _ := Source(t, map[string]string{"old.csv": rows("old", 7)})
		_, err := h.Warehouse.Load(ctx, s, src, objs, nil)
		require.ErrorIs(t, err, warehouse.ErrSliceSuperseded, "batch %d generation %d", s.BatchID, s.Generation)
		got, _, _ := consistent(t, h, s)
		require.Equal(t, int64(5), got.BatchID)
		require.Equal(t, int64(3), got.Generation)
		require.Equal(t, int64(3), got.RecordCount, "the newer slice is intact")
	}
}

func testMalformed(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	load(t, h, slice(scope, 1, 1), map[string]string{"good.csv": rows("good", 3)})
	for i, files := range []map[string]string{
		{"a.csv": rows("fine", 2), "b.csv": "id,tag\n1,x\n2,x,extra\n"},
		{"c.ndjson": "{\"id\": 1}\n[1, 2]\n"},
	} {
		src, objs, _ := Source(t, files)
		_, err := h.Warehouse.Load(ctx, slice(scope, int64(2+i), 1), src, objs, nil)
		require.ErrorIs(t, err, folder.ErrMalformed)
		require.Contains(t, err.Error(), "line", "the error names the line: %v", err)
		require.Contains(t, err.Error(), map[int]string{0: "in/b.csv", 1: "in/c.ndjson"}[i], "the error names the object: %v", err)
		got, recs, _ := consistent(t, h, slice(scope, 1, 1))
		require.Equal(t, int64(1), got.BatchID, "the previous slice is untouched")
		require.Len(t, recs, 3)
	}
}

func testBeforeCommit(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	load(t, h, slice(scope, 1, 1), map[string]string{"good.csv": rows("good", 3)})
	src, objs, _ := Source(t, map[string]string{"new.csv": rows("new", 5)})
	calls := 0
	_, err := h.Warehouse.Load(ctx, slice(scope, 2, 1), src, objs, func(context.Context) error {
		calls++
		return fmt.Errorf("lease check: %w", batch.ErrStaleLease)
	})
	require.ErrorIs(t, err, batch.ErrStaleLease)
	require.Positive(t, calls)
	got, _, _ := consistent(t, h, slice(scope, 1, 1))
	require.Equal(t, int64(1), got.BatchID, "a load whose lease check failed changed nothing")
}

func testPublishOnce(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	s := slice(scope, 3, 1)
	loaded := load(t, h, s, map[string]string{"x.csv": rows("x", 4)})
	var checks int
	first, err := h.Warehouse.Publish(ctx, s, time.Hour, func(context.Context) error { checks++; return nil })
	require.NoError(t, err)
	require.Positive(t, checks, "the lease is checked")
	require.NotNil(t, first.PublishedAt)
	require.Equal(t, loaded.RecordCount, first.RecordCount)
	require.False(t, first.PublishedAt.Before(first.CommittedAt))

	again, err := h.Warehouse.Publish(ctx, slice(scope, 3, 2), time.Hour, nil)
	require.NoError(t, err, "publishing again (another delivery of the batch) is a no-op")
	require.NotNil(t, again.PublishedAt)
	require.WithinDuration(t, *first.PublishedAt, *again.PublishedAt, time.Millisecond)

	pubs, err := h.Publications(ctx, s.TenantID, s.SourceScope)
	require.NoError(t, err)
	require.Len(t, pubs, 1, "one outbox row per batch")
	require.Equal(t, int64(3), pubs[0].BatchID)
	require.Equal(t, int64(4), pubs[0].RecordCount)
	require.WithinDuration(t, *first.PublishedAt, pubs[0].PublishedAt, time.Millisecond)
	st, _, _ := consistent(t, h, s)
	require.NotNil(t, st.PublishedAt)
}

func testWindow(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	s := slice(scope, 1, 1)
	load(t, h, s, map[string]string{"x.csv": rows("x", 2)})
	require.NoError(t, h.AgeCommit(ctx, s.TenantID, s.SourceScope, 2*time.Hour))

	_, err := h.Warehouse.Publish(ctx, s, time.Hour, nil)
	require.ErrorIs(t, err, warehouse.ErrPublicationExpired, "committed 2 h ago by the warehouse clock, window 1 h")
	pubs, err := h.Publications(ctx, s.TenantID, s.SourceScope)
	require.NoError(t, err)
	require.Empty(t, pubs)

	st, err := h.Warehouse.Publish(ctx, s, 3*time.Hour, nil)
	require.NoError(t, err, "within a 3 h window")
	require.NotNil(t, st.PublishedAt)

	require.NoError(t, h.AgeCommit(ctx, s.TenantID, s.SourceScope, 10*time.Hour))
	again, err := h.Warehouse.Publish(ctx, s, time.Hour, nil)
	require.NoError(t, err, "a published slice does not expire: publishing again is a no-op")
	require.WithinDuration(t, *st.PublishedAt, *again.PublishedAt, time.Millisecond)
}

func testPublishRefused(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	_, err := h.Warehouse.Publish(ctx, slice(scope, 1, 1), time.Hour, nil)
	require.ErrorIs(t, err, warehouse.ErrSliceMissing)

	load(t, h, slice(scope, 2, 1), map[string]string{"x.csv": rows("x", 2)})
	_, err = h.Warehouse.Publish(ctx, slice(scope, 1, 1), time.Hour, nil)
	require.ErrorIs(t, err, warehouse.ErrSliceSuperseded)
	pubs, err := h.Publications(ctx, tenant, scope)
	require.NoError(t, err)
	require.Empty(t, pubs)
}

func testStaleLeasePublish(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	s := slice(scope, 1, 1)
	load(t, h, s, map[string]string{"x.csv": rows("x", 2)})
	_, err := h.Warehouse.Publish(ctx, s, time.Hour, func(context.Context) error {
		return fmt.Errorf("verify: %w", batch.ErrStaleLease)
	})
	require.ErrorIs(t, err, batch.ErrStaleLease)
	st, _, _ := consistent(t, h, s)
	require.Nil(t, st.PublishedAt, "a stale holder published nothing")
	pubs, err := h.Publications(ctx, s.TenantID, s.SourceScope)
	require.NoError(t, err)
	require.Empty(t, pubs)
}

func testDyingLoad(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	load(t, h, slice(scope, 1, 1), map[string]string{"x.csv": rows("one", 3)})

	src, objs, _ := Source(t, map[string]string{"y.csv": rows("two", 5)})
	settle := h.DyingLoad(t, slice(scope, 2, 1), src, objs)
	// Whatever the warehouse has done so far, the stamp tells it.
	_, _, _ = consistent(t, h, slice(scope, 2, 1))
	settle()
	st, _, found := consistent(t, h, slice(scope, 2, 1))
	require.True(t, found)
	if h.OrphanCommits {
		require.Equal(t, int64(2), st.BatchID, "the load committed after its client died, and the stamp says so")
		require.Equal(t, int64(5), st.RecordCount)
	} else {
		require.Equal(t, int64(1), st.BatchID, "the load died with its client, and the stamp says so")
	}

	// The next delivery, reading the stamp, loads again under a later
	// generation (or would skip the load, had it seen its batch).
	src, objs, _ = Source(t, map[string]string{"y.csv": rows("two", 5)})
	next, err := h.Warehouse.Load(ctx, slice(scope, 2, 2), src, objs, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), next.Generation)
	got, _, _ := consistent(t, h, slice(scope, 2, 2))
	require.Equal(t, int64(5), got.RecordCount)
}

// testLedger loads a folder of objects of every kind (CSV, NDJSON, a CSV
// of its header only, one past the local warehouse's small-load limit, a
// marker that is not data): the ledger holds exactly the folder's data
// objects, each with its ETag, size, last-modified time and number of
// records, and the marker's time; LedgerReader reads it with the stamp.
func testLedger(t *testing.T, h Harness) {
	ctx := context.Background()
	files := map[string]string{
		"a.csv":         "id,name\n1,Ann\n2,Bo\n",
		"b/c.ndjson":    "{\"id\": 3}\n\n{\"id\": 4}\n{\"id\": 5}\n",
		"big.csv":       rows("big", 300),
		"empty.csv":     "id,tag\n",
		"_SUCCESS":      "",
		"manifest.json": "{}",
	}
	want := map[string]int64{"a.csv": 2, "b/c.ndjson": 3, "big.csv": 300, "empty.csv": 0}
	src, objs, scope := Source(t, files)
	require.Len(t, objs, len(want), "the folder's data objects")
	marker := time.Date(2026, 11, 30, 10, 0, 0, 123456000, time.UTC)
	s := slice(scope, 11, 3)
	s.MarkerModified = marker
	st, err := h.Warehouse.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)
	require.Equal(t, int64(305), st.RecordCount)
	consistent(t, h, s)

	lst, ledgerObjs, found := ledger(t, h, s.TenantID, s.SourceScope)
	require.True(t, found)
	require.Equal(t, int64(11), lst.BatchID)
	require.Equal(t, int64(3), lst.Generation)
	require.Equal(t, st.RecordCount, lst.RecordCount)
	require.Len(t, ledgerObjs, len(objs), "one ledger row per data object, the marker and manifest.json are not data")
	for _, o := range objs {
		i := slices.IndexFunc(ledgerObjs, func(l warehouse.LedgerObject) bool { return l.ObjectKey == src.FullKey(o) })
		require.GreaterOrEqual(t, i, 0, "%s is in the ledger", o.Key)
		l := ledgerObjs[i]
		name := strings.TrimPrefix(o.Key, "in/")
		require.Equal(t, int64(11), l.BatchID)
		require.Equal(t, s.TenantID, l.TenantID)
		require.Equal(t, s.SourceScope, l.SourceScope)
		require.NotEmpty(t, o.ETag, "the store names an ETag")
		require.Equal(t, o.ETag, l.ETag, name)
		require.Equal(t, int64(len(files[name])), l.SizeBytes, name)
		require.Equal(t, o.Size, l.SizeBytes, name)
		require.Equal(t, want[name], l.RecordCount, name)
		require.WithinDuration(t, o.LastModified, l.LastModified, time.Millisecond, name)
		require.NotNil(t, l.MarkerModified, name)
		require.True(t, marker.Equal(*l.MarkerModified), "%s: marker %s", name, l.MarkerModified)
	}

	// Without a marker (an import that opted out of it) the column is NULL.
	src, objs, scope = Source(t, map[string]string{"x.csv": rows("x", 2)})
	s = slice(scope, 12, 1)
	_, err = h.Warehouse.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)
	_, ledgerObjs, _ = ledger(t, h, s.TenantID, s.SourceScope)
	require.Len(t, ledgerObjs, 1)
	require.Nil(t, ledgerObjs[0].MarkerModified)
	require.Equal(t, int64(2), ledgerObjs[0].RecordCount)
}

// testLedgerKilled: a load that dies after it wrote the new slice and its
// ledger, before its commit, leaves neither visible: the old slice and its
// ledger stay, whole.
func testLedgerKilled(t *testing.T, h Harness) {
	if h.KilledLoad == nil {
		t.Skip("the harness cannot kill a load before its commit")
	}
	scope := newScope()
	old := slice(scope, 1, 1)
	load(t, h, old, map[string]string{"x.csv": rows("one", 3), "w.csv": rows("w", 1)})
	_, before, _ := ledger(t, h, old.TenantID, old.SourceScope)
	require.Len(t, before, 2)

	src, objs, _ := Source(t, map[string]string{"y.csv": rows("two", 5), "z.csv": rows("z", 2), "v.csv": rows("v", 1)})
	h.KilledLoad(t, slice(scope, 2, 1), src, objs)
	st, _, found := consistent(t, h, old)
	require.True(t, found)
	require.Equal(t, int64(1), st.BatchID, "the killed load committed nothing")
	require.Equal(t, int64(4), st.RecordCount)
	_, after, _ := ledger(t, h, old.TenantID, old.SourceScope)
	require.Equal(t, before, after, "the old slice's ledger is intact")
}

// testLedgerReimport: a newer batch loading the same scope from a
// different set of objects (one gone, one rewritten, one new) replaces the
// ledger with its own: no row of the old batch is left.
func testLedgerReimport(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	first := slice(scope, 1, 1)
	load(t, h, first, map[string]string{"gone.csv": rows("gone", 2), "kept.csv": rows("kept", 3)})
	_, err := h.Warehouse.Publish(ctx, first, time.Hour, nil)
	require.NoError(t, err)
	_, firstObjs, _ := ledger(t, h, first.TenantID, first.SourceScope)
	require.Len(t, firstObjs, 2)

	files := map[string]string{"kept.csv": rows("rewritten", 4), "new.ndjson": "{\"n\": 1}\n"}
	src, objs, _ := Source(t, files)
	second := slice(scope, 2, 1)
	_, err = h.Warehouse.Load(ctx, second, src, objs, nil)
	require.NoError(t, err)
	st, _, _ := consistent(t, h, second)
	require.Equal(t, int64(2), st.BatchID)
	_, got, _ := ledger(t, h, second.TenantID, second.SourceScope)
	require.Len(t, got, 2, "the new slice's objects only")
	for _, o := range objs {
		i := slices.IndexFunc(got, func(l warehouse.LedgerObject) bool { return l.ObjectKey == src.FullKey(o) })
		require.GreaterOrEqual(t, i, 0, "%s is in the ledger", o.Key)
		require.Equal(t, int64(2), got[i].BatchID)
		require.Equal(t, o.ETag, got[i].ETag)
		require.Equal(t, o.Size, got[i].SizeBytes)
	}
	for _, o := range got {
		require.NotContains(t, o.ObjectKey, "gone.csv", "the old batch's objects are gone from the ledger")
		for _, f := range firstObjs {
			if strings.HasSuffix(f.ObjectKey, "/kept.csv") && strings.HasSuffix(o.ObjectKey, "/kept.csv") {
				require.NotEqual(t, f.ETag, o.ETag, "the rewritten object has its new ETag")
				require.Equal(t, int64(4), o.RecordCount)
			}
		}
	}
	if h.LedgerRows != nil {
		raw, err := h.LedgerRows(ctx, second.TenantID, second.SourceScope)
		require.NoError(t, err)
		require.Equal(t, got, raw, "no row of the old batch is left in the table")
	}
}

// BadFiles is a folder with 3 bad records and 5 good ones: a CSV row with
// too few fields (a.csv line 3), a CSV value holding NUL, long enough that
// its excerpt is cut (a.csv line 5, column 2), and an NDJSON line that is
// not JSON (b.ndjson line 2).
func BadFiles() map[string]string {
	return map[string]string{
		"a.csv":    "id,note\n1,ok\n2\n3,fine\n4,bad\x00" + strings.Repeat("value", 1000) + "\n5,last\n",
		"b.ndjson": "{\"n\": 1}\nnot json\n{\"n\": 2}\n",
	}
}

// badSource opens a folder of files whose readers skip up to tolerate bad
// records.
func badSource(t *testing.T, files map[string]string, tolerate int) (*folder.Source, []folder.Object, string) {
	src, objs, scope := Source(t, files)
	src.Tolerate(tolerate)
	return src, objs, scope
}

// loadErrors reads the slice's load errors through the warehouse's
// ErrorsReader.
func loadErrors(t *testing.T, h Harness, s warehouse.Slice) (warehouse.Stamp, []warehouse.LoadError, bool) {
	t.Helper()
	er, ok := h.Warehouse.(warehouse.ErrorsReader)
	require.True(t, ok, "the warehouse reads its load errors (warehouse.ErrorsReader)")
	st, errs, found, err := er.LoadErrors(context.Background(), s.TenantID, s.SourceScope)
	require.NoError(t, err)
	return st, errs, found
}

// testBadRecords: with a tolerance of 5, a folder of 3 bad records loads
// every other record once, the stamp counts the 3, and the errors table
// holds them with object, line, column, reason and an excerpt of at most
// 1 KiB, numbered in the order they were read.
func testBadRecords(t *testing.T, h Harness) {
	ctx := context.Background()
	src, objs, scope := badSource(t, BadFiles(), 5)
	s := slice(scope, 21, 2)
	st, err := h.Warehouse.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)
	require.Equal(t, int64(3), st.BadRecords, "Load's stamp counts the skipped bad records")
	require.Equal(t, int64(5), st.RecordCount)
	got, recs, _ := consistent(t, h, s)
	require.Equal(t, int64(3), got.BadRecords, "the stamp read back counts them too")
	seen := map[string]int{}
	for _, r := range recs {
		seen[fmt.Sprintf("%s:%d", r.ObjectKey[strings.LastIndex(r.ObjectKey, "/")+1:], r.Line)]++
	}
	require.Equal(t, map[string]int{"a.csv:2": 1, "a.csv:4": 1, "a.csv:6": 1, "b.ndjson:1": 1, "b.ndjson:3": 1}, seen,
		"every good record once, no bad one")

	est, errs, found := loadErrors(t, h, s)
	require.True(t, found)
	require.Equal(t, int64(21), est.BatchID)
	require.Equal(t, int64(3), est.BadRecords)
	require.Len(t, errs, 3)
	type where struct {
		key          string
		line         int64
		column       int
		excerptHolds string
	}
	want := []where{{"a.csv", 3, 0, ""}, {"a.csv", 5, 2, `bad\x00value`}, {"b.ndjson", 2, 0, "not json"}}
	for i, e := range errs {
		w := want[i]
		require.Equal(t, int64(i+1), e.Ordinal)
		require.Equal(t, int64(21), e.BatchID)
		require.Equal(t, s.TenantID, e.TenantID)
		require.Equal(t, s.SourceScope, e.SourceScope)
		require.True(t, strings.HasSuffix(e.ObjectKey, "in/"+w.key), "error %d names its object: %s", i+1, e.ObjectKey)
		require.Equal(t, w.line, e.Line, "error %d's line", i+1)
		if w.column > 0 {
			require.Equal(t, w.column, e.Column, "error %d's column", i+1)
		}
		require.NotEmpty(t, e.Reason, "error %d says why", i+1)
		require.NotEmpty(t, e.Excerpt, "error %d shows the raw value", i+1)
		require.LessOrEqual(t, len(e.Excerpt), folder.MaxExcerptBytes, "error %d's excerpt is at most 1 KiB", i+1)
		require.Contains(t, e.Excerpt, w.excerptHolds, "error %d's excerpt", i+1)
	}
	require.Contains(t, errs[1].Excerpt, "bytes)", "the long value's excerpt is cut and says how long it was")
	if h.ErrorRows != nil {
		raw, err := h.ErrorRows(ctx, s.TenantID, s.SourceScope)
		require.NoError(t, err)
		require.Equal(t, errs, raw, "the table holds exactly the slice's errors")
	}

	// The same past the local warehouse's small-load limit (its COPY
	// stream).
	files := BadFiles()
	files["0big.csv"] = rows("big", 300) // read first: the bad records come in the stream
	src, objs, scope = badSource(t, files, 5)
	s = slice(scope, 23, 1)
	st, err = h.Warehouse.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)
	require.Equal(t, int64(3), st.BadRecords)
	require.Equal(t, int64(305), st.RecordCount)
	_, errs, _ = loadErrors(t, h, s)
	require.Len(t, errs, 3)
	require.Equal(t, int64(5), errs[1].Line)

	// A load without bad records has none, and the stamp says 0.
	src, objs, scope = badSource(t, map[string]string{"x.csv": rows("x", 2)}, 5)
	s = slice(scope, 22, 1)
	st, err = h.Warehouse.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)
	require.Zero(t, st.BadRecords)
	_, errs, found = loadErrors(t, h, s)
	require.True(t, found)
	require.Empty(t, errs)
}

// UnstorableFiles is a folder of 4 good records and 5 whose values the
// warehouse cannot store, though they are valid JSON or CSV: a number
// beyond PostgreSQL's numeric (the 1e1000000, u.ndjson line 2), a
// number with more digits after the point than numeric holds (line 3),
// \u0000 (line 4), a lone surrogate in a key (line 5), invalid UTF-8 in a
// CSV value (v.csv line 3). The good records hold only what both
// warehouses store.
func UnstorableFiles() map[string]string {
	return map[string]string{
		"u.ndjson": strings.Join([]string{
			`{"id":1,"reading":2.5e10}`,
			`{"id":2,"reading":1e1000000}`,
			`{"id":3,"reading":{"samples":[1,1e-16384]}}`,
			`{"id":4,"note":"a\u0000b"}`,
			`{"id":5,"\ud800":true}`,
			`{"id":6,"note":"1e1000000 and \\u0000 are text here"}`,
		}, "\n") + "\n",
		"v.csv": "id,note\n7,ok\n8,caf\xe9\n9,fine\n",
	}
}

// testUnstorableValues: with a tolerance of 5, a folder whose 5 bad
// records hold values the warehouse cannot store (UnstorableFiles) loads
// its 4 good records, and the errors table names each bad one's object,
// line, column (the byte where the value starts; the CSV column) and why,
// with its JSON path; the same past the local warehouse's small-load limit
// (its COPY stream). A tolerance of 4 fails the load on the fifth, naming
// it.
func testUnstorableValues(t *testing.T, h Harness) {
	ctx := context.Background()
	type where struct {
		key    string
		line   int64
		column int
		reason string
	}
	want := []where{
		{"u.ndjson", 2, 19, "the value at $.reading: the number has 1000001 digits before the decimal point"},
		{"u.ndjson", 3, 33, "the value at $.reading.samples[1]: the number has 16384 digits after the decimal point"},
		{"u.ndjson", 4, 16, `the value at $.note: NUL characters (\u0000) cannot be stored`},
		{"u.ndjson", 5, 9, "a key of $: an unpaired UTF-16 surrogate escape cannot be stored"},
		{"v.csv", 3, 2, `column "note": invalid UTF-8`},
	}
	for i, extra := range []map[string]string{nil, {"0big.csv": rows("big", 300)}} {
		files := UnstorableFiles()
		maps.Copy(files, extra)
		src, objs, scope := badSource(t, files, 5)
		s := slice(scope, int64(31+i), 1)
		st, err := h.Warehouse.Load(ctx, s, src, objs, nil)
		require.NoError(t, err, "load %d", i)
		require.Equal(t, int64(5), st.BadRecords)
		require.Equal(t, int64(4+300*i), st.RecordCount)
		_, recs, _ := consistent(t, h, s)
		require.Len(t, recs, 4+300*i)
		_, errs, found := loadErrors(t, h, s)
		require.True(t, found)
		require.Len(t, errs, len(want))
		for j, e := range errs {
			w := want[j]
			require.True(t, strings.HasSuffix(e.ObjectKey, "in/"+w.key), "load %d error %d names its object: %s", i, j+1, e.ObjectKey)
			require.Equal(t, w.line, e.Line, "load %d error %d's line", i, j+1)
			require.Equal(t, w.column, e.Column, "load %d error %d's column", i, j+1)
			require.True(t, strings.HasPrefix(e.Reason, w.reason), "load %d error %d's reason: %s", i, j+1, e.Reason)
			require.NotEmpty(t, e.Excerpt)
		}
		require.Equal(t, `"1e1000000"`, errs[0].Excerpt, "the excerpt is the value")
	}

	src, objs, scope := badSource(t, UnstorableFiles(), 4)
	_, err := h.Warehouse.Load(ctx, slice(scope, 33, 1), src, objs, nil)
	bad, ok := folder.AsBadRecord(err)
	require.True(t, ok, "the fifth is one too many: %v", err)
	require.True(t, strings.HasSuffix(bad.ObjectKey, "in/v.csv"), "%v", err)
	require.Equal(t, int64(3), bad.Line)
	_, _, found := consistent(t, h, slice(scope, 33, 1))
	require.False(t, found, "nothing committed")
}

// testBadRecordsBeyond: a tolerance of 2 fails the load of a folder of 3
// bad records (on the third), and a tolerance of 0 on the first, naming its
// object, line and column; neither changes the slice, its ledger or its
// errors.
func testBadRecordsBeyond(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	old := slice(scope, 1, 1)
	src, objs, _ := badSource(t, map[string]string{"old.csv": "id,v\n1,a\n2\n3,c\n"}, 1)
	_, err := h.Warehouse.Load(ctx, old, src, objs, nil)
	require.NoError(t, err)
	oldSt, oldRecs, _ := consistent(t, h, old)
	require.Equal(t, int64(1), oldSt.BadRecords)
	_, oldLedger, _ := ledger(t, h, old.TenantID, old.SourceScope)
	_, oldErrs, _ := loadErrors(t, h, old)
	require.Len(t, oldErrs, 1)

	for _, c := range []struct {
		tolerate int
		key      string
		line     int64
		column   int
	}{{2, "b.ndjson", 2, 0}, {0, "a.csv", 3, 0}} {
		src, objs, _ := badSource(t, BadFiles(), c.tolerate)
		_, err := h.Warehouse.Load(ctx, slice(scope, 2, 1), src, objs, nil)
		require.ErrorIs(t, err, folder.ErrMalformed, "tolerance %d", c.tolerate)
		bad, ok := folder.AsBadRecord(err)
		require.True(t, ok, "tolerance %d: the error is the bad record: %v", c.tolerate, err)
		require.True(t, strings.HasSuffix(bad.ObjectKey, "in/"+c.key), "tolerance %d: %v", c.tolerate, err)
		require.Equal(t, c.line, bad.Line, "tolerance %d: %v", c.tolerate, err)
		require.Equal(t, c.column, bad.Column, "tolerance %d: %v", c.tolerate, err)
		require.Contains(t, err.Error(), c.key, "tolerance %d", c.tolerate)
		require.Contains(t, err.Error(), fmt.Sprintf("line %d", c.line), "tolerance %d", c.tolerate)
		var tooMany *folder.TooManyBadRecordsError
		require.ErrorAs(t, err, &tooMany)
		require.Equal(t, c.tolerate, tooMany.Tolerated)

		st, recs, _ := consistent(t, h, old)
		require.Equal(t, oldSt, st, "tolerance %d: the old stamp is untouched", c.tolerate)
		require.Equal(t, oldRecs, recs)
		_, l, _ := ledger(t, h, old.TenantID, old.SourceScope)
		require.Equal(t, oldLedger, l, "tolerance %d: the old ledger is untouched", c.tolerate)
		_, e, _ := loadErrors(t, h, old)
		require.Equal(t, oldErrs, e, "tolerance %d: the old errors are untouched", c.tolerate)
	}
}

// testBadRecordsReimport: a newer batch's load replaces the slice's
// errors with its own, and one without bad records leaves none.
func testBadRecordsReimport(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	first := slice(scope, 1, 1)
	src, objs, _ := badSource(t, BadFiles(), 5)
	_, err := h.Warehouse.Load(ctx, first, src, objs, nil)
	require.NoError(t, err)
	_, errs, _ := loadErrors(t, h, first)
	require.Len(t, errs, 3)

	second := slice(scope, 2, 1)
	src, objs, _ = badSource(t, map[string]string{"c.csv": "id,v\n1,a\n2,b,c\n"}, 5)
	st, err := h.Warehouse.Load(ctx, second, src, objs, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.BadRecords)
	_, errs, _ = loadErrors(t, h, second)
	require.Len(t, errs, 1)
	require.Equal(t, int64(2), errs[0].BatchID)
	require.Equal(t, int64(1), errs[0].Ordinal)
	require.True(t, strings.HasSuffix(errs[0].ObjectKey, "in/c.csv"))
	require.Equal(t, int64(3), errs[0].Line)
	if h.ErrorRows != nil {
		raw, err := h.ErrorRows(ctx, second.TenantID, second.SourceScope)
		require.NoError(t, err)
		require.Equal(t, errs, raw, "no row of the old batch is left in the table")
	}

	third := slice(scope, 3, 1)
	st = load(t, h, third, map[string]string{"d.csv": rows("d", 2)})
	require.Zero(t, st.BadRecords)
	_, errs, _ = loadErrors(t, h, third)
	require.Empty(t, errs)
	if h.ErrorRows != nil {
		raw, err := h.ErrorRows(ctx, third.TenantID, third.SourceScope)
		require.NoError(t, err)
		require.Empty(t, raw, "a load without bad records leaves the slice none")
	}
}

// testBadRecordsKilled: a load of bad records that dies before its commit
// leaves the old slice's errors, whole.
func testBadRecordsKilled(t *testing.T, h Harness) {
	if h.KilledLoad == nil {
		t.Skip("the harness cannot kill a load before its commit")
	}
	scope := newScope()
	old := slice(scope, 1, 1)
	src, objs, _ := badSource(t, map[string]string{"old.csv": "id,v\n1,a\n2\n3,c\n"}, 1)
	_, err := h.Warehouse.Load(context.Background(), old, src, objs, nil)
	require.NoError(t, err)
	_, before, _ := loadErrors(t, h, old)
	require.Len(t, before, 1)

	src, objs, _ = badSource(t, BadFiles(), 5)
	h.KilledLoad(t, slice(scope, 2, 1), src, objs)
	st, _, found := consistent(t, h, old)
	require.True(t, found)
	require.Equal(t, int64(1), st.BatchID, "the killed load committed nothing")
	require.Equal(t, int64(1), st.BadRecords)
	_, after, _ := loadErrors(t, h, old)
	require.Equal(t, before, after, "the old slice's errors are intact")
	if h.ErrorRows != nil {
		raw, err := h.ErrorRows(context.Background(), old.TenantID, old.SourceScope)
		require.NoError(t, err)
		require.Equal(t, before, raw)
	}
}

// Uids of the identity cases: two batches handed the same id (the
// operational database went back in time between them) and others.
const (
	uidA = "0a000000-0000-4000-8000-00000000000a"
	uidB = "0b000000-0000-4000-8000-00000000000b"
	uidC = "0c000000-0000-4000-8000-00000000000c"
)

func named(s warehouse.Slice, uid string) warehouse.Slice { s.BatchUID = uid; return s }

// testIdentity: the stamp, the ledger, the load errors and the
// publication name the batch by its id and its uid; a stamp of the same
// id with another uid is another batch's (it holds the slice as a newer
// one would), and a legacy name (no uid) names the batch of its id.
func testIdentity(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	s := named(slice(scope, 5, 1), uidA)
	src, objs, _ := badSource(t, BadFiles(), 5)
	st, err := h.Warehouse.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)
	require.Equal(t, batch.Ref{ID: 5, UID: uidA}, st.Ref())
	got, _, _ := consistent(t, h, s)
	require.Equal(t, uidA, got.BatchUID, "the stamp read back names the uid")
	_, objects, found := ledger(t, h, tenant, scope)
	require.True(t, found)
	for _, o := range objects {
		require.Equal(t, uidA, o.BatchUID, "the ledger names the uid")
	}
	if h.ErrorRows != nil {
		rows, err := h.ErrorRows(ctx, tenant, scope)
		require.NoError(t, err)
		require.NotEmpty(t, rows)
		for _, e := range rows {
			require.Equal(t, uidA, e.BatchUID, "the load errors name the uid")
		}
	}

	// The same id with another uid: another batch, which the slice's
	// holder is held against as against a newer one.
	other := named(slice(scope, 5, 9), uidB)
	src, objs, _ = Source(t, map[string]string{"other.csv": rows("other", 2)})
	_, err = h.Warehouse.Load(ctx, other, src, objs, nil)
	require.ErrorIs(t, err, warehouse.ErrSliceSuperseded)
	var held *warehouse.SupersededError
	require.ErrorAs(t, err, &held)
	require.Equal(t, batch.Ref{ID: 5, UID: uidA}, held.Holder)
	require.Equal(t, int64(1), held.Generation)
	_, err = h.Warehouse.Publish(ctx, other, time.Hour, nil)
	require.ErrorIs(t, err, warehouse.ErrSliceSuperseded, "a batch of the same id and another uid does not publish the slice")

	// A legacy name of the id is the batch's own; the publication names
	// the stamp's uid.
	_, err = h.Warehouse.Publish(ctx, slice(scope, 5, 1), time.Hour, nil)
	require.NoError(t, err)
	pubs, err := h.Publications(ctx, tenant, scope)
	require.NoError(t, err)
	require.Len(t, pubs, 1)
	require.Equal(t, uidA, pubs[0].BatchUID)
	again, err := h.Warehouse.Publish(ctx, s, time.Hour, nil)
	require.NoError(t, err, "publishing again by full name is a no-op")
	require.NotNil(t, again.PublishedAt)
	pubs, err = h.Publications(ctx, tenant, scope)
	require.NoError(t, err)
	require.Len(t, pubs, 1, "one publication per batch")
}

// testTakeOver: a load given TakeOver replaces the stamp of exactly that
// batch (id and uid), whatever its id; any other stamp of a higher id
// still holds the slice.
func testTakeOver(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	load(t, h, named(slice(scope, 9, 4), uidA), map[string]string{"forgotten.csv": rows("forgotten", 3)})

	s := named(slice(scope, 3, 1), uidB)
	for _, wrong := range []*batch.Ref{nil, {ID: 9, UID: uidC}, {ID: 8, UID: uidA}} {
		s.TakeOver = wrong
		src, objs, _ := Source(t, map[string]string{"new.csv": rows("new", 2)})
		_, err := h.Warehouse.Load(ctx, s, src, objs, nil)
		require.ErrorIs(t, err, warehouse.ErrSliceSuperseded, "take over %v", wrong)
		got, _, _ := consistent(t, h, s)
		require.Equal(t, batch.Ref{ID: 9, UID: uidA}, got.Ref(), "the slice is untouched")
	}

	s.TakeOver = &batch.Ref{ID: 9, UID: uidA}
	st := load(t, h, s, map[string]string{"new.csv": rows("new", 2)})
	require.Equal(t, batch.Ref{ID: 3, UID: uidB}, st.Ref())
	got, recs, _ := consistent(t, h, s)
	require.Equal(t, int64(2), got.RecordCount)
	for _, r := range recs {
		require.Equal(t, int64(3), r.BatchID, "nothing of the forgotten batch's slice is left")
	}
	_, err := h.Warehouse.Publish(ctx, named(slice(scope, 3, 1), uidB), time.Hour, nil)
	require.NoError(t, err)
}

// testPublicationIdentity: a batch handed the id of a forgotten batch
// that was published gets a publication of its own; it is not taken for
// the forgotten one's.
func testPublicationIdentity(t *testing.T, h Harness) {
	ctx := context.Background()
	scope := newScope()
	forgotten := named(slice(scope, 4, 1), uidA)
	load(t, h, forgotten, map[string]string{"a.csv": rows("a", 3)})
	_, err := h.Warehouse.Publish(ctx, forgotten, time.Hour, nil)
	require.NoError(t, err)

	reused := named(slice(scope, 4, 1), uidB)
	reused.TakeOver = &batch.Ref{ID: 4, UID: uidA}
	load(t, h, reused, map[string]string{"b.csv": rows("b", 2)})
	st, err := h.Warehouse.Publish(ctx, reused, time.Hour, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), st.RecordCount)
	pubs, err := h.Publications(ctx, tenant, scope)
	require.NoError(t, err)
	require.Len(t, pubs, 2, "one publication per batch identity")
	byUID := map[string]Publication{}
	for _, p := range pubs {
		require.Equal(t, int64(4), p.BatchID)
		byUID[p.BatchUID] = p
	}
	require.Equal(t, int64(3), byUID[uidA].RecordCount)
	require.Equal(t, int64(2), byUID[uidB].RecordCount)
}
