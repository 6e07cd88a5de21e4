package fleet_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/pipeline"
)

// badFolder is a folder with 3 bad records (a.csv line 3: too few fields;
// a.csv line 5, column 2: a NUL; b.ndjson line 2: not JSON) among 5 good
// ones, and its marker.
var badFolder = map[string]string{
	"_SUCCESS": "",
	"a.csv":    "id,note\n1,ok\n2\n3,fine\n4,bad\x00value\n5,last\n",
	"b.ndjson": "{\"n\": 1}\nnot json\n{\"n\": 2}\n",
}

// reserveTolerating reserves a batch of the folder that tolerates up to
// maxBad bad records (details.maxBadRecords, as every door sets it).
func (e *env) reserveTolerating(tenant, folderURL string, maxBad int) batch.Batch {
	e.t.Helper()
	return e.reserveDetails(tenant, folderURL, func(d *batch.Details) { d.MaxBadRecords = maxBad })
}

// TestBadRecordsWithinTheToleranceAreCountedAndRecorded: a batch that
// tolerates 5 bad records loads a folder of 3 (Succeeded, published): its
// summary counts them (details.objects.badRecords = 3), the warehouse's
// errors table holds them with the slice, and the slice holds the 5 good
// records. A batch of the same folder that tolerates 2 fails
// failed_pre_commit with reason bad_records, its error naming the third
// bad record's object and line, and the published slice and its errors
// are untouched; one that tolerates none fails on the first.
func TestBadRecordsWithinTheToleranceAreCountedAndRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: e.wh}
	url := e.folder(badFolder)

	ok := e.reserveTolerating("tenant-a", url, 5)
	res := e.deliver(ok.ID, p)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	got, d := e.details(ok.ID)
	require.Equal(t, batch.StatusSucceeded, got.Status)
	require.NotNil(t, d.Objects)
	require.Equal(t, int64(3), d.Objects.BadRecords, "the summary counts the skipped bad records")
	require.Equal(t, 5, d.MaxBadRecords)
	total, distinct, batches := e.sliceRecords("tenant-a", ok.Scope())
	require.Equal(t, 5, total)
	require.Equal(t, 5, distinct)
	require.Equal(t, []int64{ok.ID}, batches)
	st, errs, found, err := e.wh.LoadErrors(ctx, "tenant-a", ok.Scope())
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, ok.ID, st.BatchID)
	require.Equal(t, int64(3), st.BadRecords)
	require.Len(t, errs, 3)
	require.True(t, strings.HasSuffix(errs[2].ObjectKey, "b.ndjson"))
	require.Equal(t, int64(2), errs[2].Line)

	for _, c := range []struct {
		tolerate int
		object   string
		line     string
	}{{2, "b.ndjson", "line 2"}, {0, "a.csv", "line 3"}} {
		failed := e.reserveTolerating("tenant-a", url, c.tolerate)
		res := e.deliver(failed.ID, p)
		require.Equal(t, pipeline.Failed, res.Outcome, "tolerance %d", c.tolerate)
		require.Equal(t, batch.PhaseFailedPreCommit, res.Phase, "tolerance %d", c.tolerate)
		require.Equal(t, batch.ReasonBadRecords, res.Reason, "tolerance %d", c.tolerate)
		_, d := e.details(failed.ID)
		require.NotNil(t, d.LastError)
		require.Equal(t, batch.ReasonBadRecords, d.LastError.Reason)
		require.Contains(t, d.LastError.Message, c.object, "tolerance %d: the error names the object", c.tolerate)
		require.Contains(t, d.LastError.Message, c.line, "tolerance %d: and the line", c.tolerate)

		_, _, batches := e.sliceRecords("tenant-a", ok.Scope())
		require.Equal(t, []int64{ok.ID}, batches, "tolerance %d: the published slice is untouched", c.tolerate)
		_, after, _, err := e.wh.LoadErrors(ctx, "tenant-a", ok.Scope())
		require.NoError(t, err)
		require.Equal(t, errs, after, "tolerance %d: and so are its errors", c.tolerate)
	}
}
