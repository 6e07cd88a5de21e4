package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
)

// TestAFolderWithoutItsMarkerIsNotLoaded: the worker, which lists the
// folder anyway, loads no folder without its completion marker, whatever
// door reserved the batch: the batch ends failed_pre_commit with reason
// folder_incomplete before any warehouse write (the slice a previous batch
// published is untouched), and the scope is free for the import the
// marker's own event brings, which loads it. An import that opted out of
// the marker loads the same folder as it is.
func TestAFolderWithoutItsMarkerIsNotLoaded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	m := metrics.New()
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: e.wh, Metrics: m}

	// A published slice of the scope, from a complete upload.
	url := e.folder(map[string]string{"_SUCCESS": "", "a.csv": "id\nold-1\n"})
	first := e.reserve("tenant-a", url)
	require.Equal(t, pipeline.Succeeded, e.deliver(first.ID, p).Outcome)

	// The producer starts the next upload in the same folder: the marker
	// is gone, two objects are there.
	f, err := folder.Canonicalize(url)
	require.NoError(t, err)
	require.NoError(t, folder.MemBucket(f.Bucket).Delete(ctx, f.Prefix+"/_SUCCESS"))
	e.write(url, "a.csv", "id\nnew-1\n")
	e.write(url, "b.csv", "id\nnew-2\n")

	half := e.reserve("tenant-a", url)
	res := e.deliver(half.ID, p)
	require.Equal(t, pipeline.Failed, res.Outcome, "%v", res.Err)
	require.Equal(t, batch.PhaseFailedPreCommit, res.Phase)
	require.Equal(t, batch.ReasonFolderIncomplete, res.Reason)
	got, d := e.details(half.ID)
	require.Equal(t, batch.StatusFailed, got.Status)
	require.Equal(t, batch.ReasonFolderIncomplete, d.LastError.Reason)
	require.Contains(t, d.LastError.Message, `holds no completion marker "_SUCCESS"`)
	require.Contains(t, d.LastError.Message, "2 data objects")
	require.False(t, d.RedshiftCommitted)
	require.Nil(t, d.Objects)

	// Nothing was written: the slice is still the first batch's.
	st, found, err := e.wh.Stamp(ctx, "tenant-a", first.Scope())
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, first.ID, st.BatchID)
	total, _, batches := e.sliceRecords("tenant-a", first.Scope())
	require.Equal(t, 1, total)
	require.Equal(t, []int64{first.ID}, batches)

	// The marker arrives; its import (a new batch: the failed one freed
	// the scope) loads the folder.
	e.write(url, "_SUCCESS", "")
	done := e.reserve("tenant-a", url)
	require.Equal(t, pipeline.Succeeded, e.deliver(done.ID, p).Outcome)
	total, _, batches = e.sliceRecords("tenant-a", first.Scope())
	require.Equal(t, 2, total)
	require.Equal(t, []int64{done.ID}, batches)
	_, d = e.details(done.ID)
	require.NotNil(t, d.Objects, "the load records the summary of what it read")
	require.EqualValues(t, 2, d.Objects.Count)
	require.Equal(t, "_SUCCESS", d.Objects.Marker)
	require.NotNil(t, d.Objects.MarkerModified)
	require.Len(t, d.Objects.Digest, 64)

	// A producer that writes no marker: the import opts out, and loads.
	bare := e.folder(map[string]string{"x.csv": "id\nx-1\n"})
	optOut := e.reserveWith("tenant-b", bare, true)
	require.Equal(t, pipeline.Succeeded, e.deliver(optOut.ID, p).Outcome)
	_, d = e.details(optOut.ID)
	require.True(t, d.MarkerOptional)
	require.EqualValues(t, 1, d.Objects.Count)
	require.Empty(t, d.Objects.Marker)

	// Another marker name for this worker: the folder's _SUCCESS is not it.
	other := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: e.wh, Marker: "_DONE"}
	b := e.reserve("tenant-c", e.folder(map[string]string{"_SUCCESS": "", "y.csv": "id\ny\n"}))
	res = e.deliver(b.ID, other)
	require.Equal(t, batch.ReasonFolderIncomplete, res.Reason)
}

// TestObjectsWrittenAfterTheMarkerAreLoadedAndCountedLate: an object whose
// last-modified time is after the marker's was written after the producer
// said the folder was complete; it is in the listing, so it is loaded,
// and it is counted late (the batch summary, ingest_late_objects_total).
func TestObjectsWrittenAfterTheMarkerAreLoadedAndCountedLate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := metrics.New()
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: e.wh, Metrics: m}
	url := e.folder(map[string]string{"a.csv": "id\na\n", "_SUCCESS": ""})
	// Late is later by S3's clock at its listing's precision, the second:
	// the object is written in a later second than the marker.
	time.Sleep(1100 * time.Millisecond)
	e.write(url, "late.csv", "id\nlate\n")

	b := e.reserve("tenant-a", url)
	require.Equal(t, pipeline.Succeeded, e.deliver(b.ID, p).Outcome)
	_, d := e.details(b.ID)
	require.EqualValues(t, 2, d.Objects.Count)
	require.EqualValues(t, 1, d.Objects.Late)
	require.True(t, d.Objects.NewestModified.After(*d.Objects.MarkerModified))
	require.Equal(t, 1.0, testutil.ToFloat64(m.LateObjects))
	total, _, _ := e.sliceRecords("tenant-a", b.Scope())
	require.Equal(t, 2, total, "the late object is loaded")
}
