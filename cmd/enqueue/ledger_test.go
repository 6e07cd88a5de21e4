package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// TestStatusObjectsListsTheLoadLedger: status --objects (text and --json)
// lists the load ledger of a batch whose slice the local warehouse holds,
// object by object with its ETag, size and records; once a newer batch
// replaced the slice it says so (slice_of_another_batch, naming that
// batch) and exits 8, as it does for a batch whose scope has no slice
// (warehouse_slice_missing); --objects with --watch is invalid input.
// status shows the objects summary the worker recorded in the details and
// a failure's reason, and list shows the reason next to the phase.
func TestStatusObjectsListsTheLoadLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	wh := warehouse.NewPostgres(pool)

	first := phased(t, pool, "tenant-o", batch.PhaseReserved, batch.StatusRunning, 0)
	marker := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	files := map[string]string{"a.csv": "id,name\n1,Ann\n2,Bo\n", "b.ndjson": "{\"id\":3}\n", "_SUCCESS": ""}
	src, objs, _ := warehousetest.Source(t, files)
	// The slice is the batch's scope; the objects come from a mem:// folder.
	s := warehouse.Slice{TenantID: first.TenantID, SourceScope: first.Scope(), BatchID: first.ID, Generation: 1, MarkerModified: marker}
	_, err := wh.Load(ctx, s, src, objs, nil)
	require.NoError(t, err)

	status := func(args ...string) (string, int) {
		t.Helper()
		return runCLI(t, dbURL, append([]string{"status"}, args...)...)
	}
	out, code := status("--batch-id", fmt.Sprint(first.ID), "--objects", "--json")
	require.Equal(t, cli.ExitOK, code, out)
	var lv struct {
		Outcome     string                   `json:"outcome"`
		BatchID     int64                    `json:"batch_id"`
		RecordCount int64                    `json:"record_count"`
		ObjectCount int64                    `json:"object_count"`
		Bytes       int64                    `json:"bytes"`
		Objects     []warehouse.LedgerObject `json:"objects"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &lv), out)
	require.Equal(t, "ledger", lv.Outcome)
	require.Equal(t, first.ID, lv.BatchID)
	require.Equal(t, int64(3), lv.RecordCount)
	require.Equal(t, int64(2), lv.ObjectCount, "the data objects, not the marker")
	require.Equal(t, int64(len(files["a.csv"])+len(files["b.ndjson"])), lv.Bytes)
	require.Len(t, lv.Objects, 2)
	for i, o := range objs {
		got := lv.Objects[i]
		require.Equal(t, src.FullKey(o), got.ObjectKey)
		require.Equal(t, o.ETag, got.ETag)
		require.NotEmpty(t, got.ETag)
		require.Equal(t, o.Size, got.SizeBytes)
		require.Equal(t, map[int]int64{0: 2, 1: 1}[i], got.RecordCount)
		require.NotNil(t, got.MarkerModified)
		require.True(t, marker.Equal(*got.MarkerModified))
	}
	require.Contains(t, out, `"object_key":"`+src.FullKey(objs[0])+`"`, "snake_case keys")

	out, code = status("--batch-id", fmt.Sprint(first.ID), "--objects")
	require.Equal(t, cli.ExitOK, code, out)
	require.Contains(t, out, fmt.Sprintf("batch %d, tenant tenant-o", first.ID))
	require.Contains(t, out, "2 objects")
	require.Contains(t, out, "marker modified 2026-12-01T09:30:00Z")
	require.Contains(t, out, "OBJECT")
	for _, o := range objs {
		require.Contains(t, out, src.FullKey(o))
		require.Contains(t, out, o.ETag)
	}

	// A newer batch of the same scope replaces the slice and its ledger.
	second := batch.Batch{ID: first.ID + 100}
	s2 := s
	s2.BatchID, s2.MarkerModified = second.ID, time.Time{}
	src2, objs2, _ := warehousetest.Source(t, map[string]string{"c.csv": "id\n1\n"})
	_, err = wh.Load(ctx, s2, src2, objs2, nil)
	require.NoError(t, err)
	for _, args := range [][]string{{"--objects"}, {"--objects", "--json"}} {
		out, code = status(append([]string{"--batch-id", fmt.Sprint(first.ID)}, args...)...)
		require.Equal(t, cli.ExitNoLedger, code, out)
		var refused map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &refused), out)
		require.Equal(t, "slice_of_another_batch", refused["outcome"])
		require.Equal(t, float64(second.ID), refused["slice_batch_id"])
		require.Contains(t, refused["error"], fmt.Sprintf("now belongs to batch %d", second.ID))
		require.NotContains(t, out, "a.csv", "none of the replaced ledger is shown")
	}

	// A batch whose scope the warehouse holds no slice of.
	other := phased(t, pool, "tenant-p", batch.PhaseFailedPreCommit, batch.StatusFailed, 0)
	out, code = status("--batch-id", fmt.Sprint(other.ID), "--objects")
	require.Equal(t, cli.ExitNoLedger, code, out)
	require.Contains(t, out, `"outcome":"warehouse_slice_missing"`)

	out, code = status("--batch-id", fmt.Sprint(first.ID), "--objects", "--watch")
	require.Equal(t, cli.ExitInvalidInput, code, out)
	require.Contains(t, out, `"field":"objects"`)

	// status shows the details' objects summary and a failure's reason;
	// list the reason next to the phase.
	a, err := lease.NewStore(pool).Acquire(ctx, first.ID, "worker-1/job-9/attempt-1/cd34", time.Minute)
	require.NoError(t, err)
	b, err := batch.NewStore(pool).Get(ctx, first.ID)
	require.NoError(t, err)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	newest := time.Date(2026, 12, 1, 9, 29, 0, 0, time.UTC)
	d.Objects = &batch.ObjectsSummary{Count: 2, Bytes: 28, NewestModified: &newest, Digest: "0f1e2d", Marker: "_SUCCESS", MarkerModified: &marker, Late: 1}
	_, err = batch.NewStore(pool).MarkSucceeded(ctx, a.Lease.Fence(), d)
	require.NoError(t, err)
	out, code = status("--batch-id", fmt.Sprint(first.ID), "--json")
	require.Equal(t, cli.ExitOK, code, out)
	var v batchView
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	require.NotNil(t, v.Objects)
	require.Equal(t, objectsView{Count: 2, Bytes: 28, NewestModified: &newest, Digest: "0f1e2d", Marker: "_SUCCESS", MarkerModified: &marker, Late: 1}, *v.Objects)
	require.Contains(t, out, `"objects":{"count":2,"bytes":28,"newest_modified":"2026-12-01T09:29:00Z","digest":"0f1e2d","marker":"_SUCCESS","marker_modified":"2026-12-01T09:30:00Z","late":1}`)
	out, code = status("--batch-id", fmt.Sprint(first.ID))
	require.Equal(t, cli.ExitOK, code, out)
	require.Contains(t, out, "objects: 2, 28 bytes, newest modified 2026-12-01T09:29:00Z, marker _SUCCESS modified 2026-12-01T09:30:00Z, 1 late")
	require.Contains(t, out, "digest:  0f1e2d")

	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET details = jsonb_set(details, '{lastError,reason}', '"folder_incomplete"') WHERE id = $1`, other.ID)
	require.NoError(t, err)
	out, code = status("--batch-id", fmt.Sprint(other.ID), "--json")
	require.Equal(t, cli.ExitOK, code, out)
	require.Contains(t, out, `"phase":"failed_pre_commit"`)
	require.Contains(t, out, `"reason":"folder_incomplete"`)
	require.Nil(t, func() *objectsView { var w batchView; _ = json.Unmarshal([]byte(out), &w); return w.Objects }(), "no summary recorded, none shown")
	for _, args := range [][]string{{"status", "--batch-id", fmt.Sprint(other.ID)}, {"list", "--tenant-id", "tenant-p"}} {
		out, code = runCLI(t, dbURL, args...)
		require.Equal(t, cli.ExitOK, code, out)
		require.Contains(t, out, "failed_pre_commit (folder_incomplete)", strings.Join(args, " "))
	}
}

// TestStatusErrorsListsTheLoadErrors: a slice loaded with 3 bad records
// skipped within its tolerance: status --objects counts them (text and
// --json), status --errors lists them (text and --json) with object, line,
// column, reason and excerpt; --errors with --watch or --objects is invalid
// input (exit 2), and for a batch whose scope has no slice it exits 8.
func TestStatusErrorsListsTheLoadErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	wh := warehouse.NewPostgres(pool)

	b := phased(t, pool, "tenant-e", batch.PhaseReserved, batch.StatusRunning, 0)
	src, objs, _ := warehousetest.Source(t, warehousetest.BadFiles())
	src.Tolerate(5)
	_, err := wh.Load(ctx, warehouse.Slice{TenantID: b.TenantID, SourceScope: b.Scope(), BatchID: b.ID, Generation: 1}, src, objs, nil)
	require.NoError(t, err)
	status := func(args ...string) (string, int) {
		t.Helper()
		return runCLI(t, dbURL, append([]string{"status", "--batch-id", fmt.Sprint(b.ID)}, args...)...)
	}

	out, code := status("--objects", "--json")
	require.Equal(t, cli.ExitOK, code, out)
	require.Contains(t, out, `"bad_records":3`)
	out, code = status("--objects")
	require.Equal(t, cli.ExitOK, code, out)
	require.Contains(t, out, "5 records, 3 bad records skipped (status --errors lists them)")

	out, code = status("--errors", "--json")
	require.Equal(t, cli.ExitOK, code, out)
	var ev struct {
		Outcome    string                `json:"outcome"`
		BatchID    int64                 `json:"batch_id"`
		BadRecords int64                 `json:"bad_records"`
		Errors     []warehouse.LoadError `json:"errors"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ev), out)
	require.Equal(t, "load_errors", ev.Outcome)
	require.Equal(t, b.ID, ev.BatchID)
	require.Equal(t, int64(3), ev.BadRecords)
	require.Len(t, ev.Errors, 3)
	require.Equal(t, "in/a.csv", ev.Errors[1].ObjectKey[strings.LastIndex(ev.Errors[1].ObjectKey, "in/"):])
	require.Equal(t, int64(5), ev.Errors[1].Line)
	require.Equal(t, 2, ev.Errors[1].Column)
	require.NotEmpty(t, ev.Errors[1].Reason)
	require.Contains(t, ev.Errors[1].Excerpt, `bad\x00value`)
	require.LessOrEqual(t, len(ev.Errors[1].Excerpt), 1024)
	require.Contains(t, out, `"line_number":5,"column_number":2`, "snake_case keys")

	out, code = status("--errors")
	require.Equal(t, cli.ExitOK, code, out)
	require.Contains(t, out, "3 bad records skipped")
	require.Contains(t, out, "REASON")
	require.Contains(t, out, "b.ndjson")
	require.Contains(t, out, `"not json"`)
	for _, line := range strings.Split(out, "\n") {
		require.LessOrEqual(t, len(line), 400, "a long excerpt is cut in the table: %q", line)
	}

	for _, args := range [][]string{{"--errors", "--watch"}, {"--errors", "--objects"}} {
		out, code = status(args...)
		require.Equal(t, cli.ExitInvalidInput, code, out)
		require.Contains(t, out, `"field":"errors"`)
	}
	other := phased(t, pool, "tenant-f", batch.PhaseFailedPreCommit, batch.StatusFailed, 0)
	out, code = runCLI(t, dbURL, "status", "--batch-id", fmt.Sprint(other.ID), "--errors")
	require.Equal(t, cli.ExitNoLedger, code, out)
	require.Contains(t, out, `"outcome":"warehouse_slice_missing"`)
	require.Contains(t, out, "no load errors")
}
