package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
)

// slowWarehouse is a test double of a warehouse whose load reads the
// records like a real one, one object at a time, and waits after the first
// object until the test lets it go on. It commits nothing anywhere: it does
// not emulate stamps, transactions or publication beyond what the pipeline
// needs to finish.
type slowWarehouse struct {
	firstDone chan struct{}
	goOn      chan struct{}
}

func (w *slowWarehouse) Load(ctx context.Context, s warehouse.Slice, src *folder.Source, objects []folder.Object, before func(context.Context) error) (warehouse.Stamp, error) {
	var n int64
	for i, o := range objects {
		rr := src.Records(ctx, []folder.Object{o})
		for rr.Next() {
			n++
		}
		if err := rr.Err(); err != nil {
			return warehouse.Stamp{}, err
		}
		rr.Close()
		if i == 0 {
			close(w.firstDone)
			select {
			case <-w.goOn:
			case <-ctx.Done():
				return warehouse.Stamp{}, ctx.Err()
			}
		}
	}
	if err := before(ctx); err != nil {
		return warehouse.Stamp{}, err
	}
	return warehouse.Stamp{BatchID: s.BatchID, Generation: s.Generation, RecordCount: n, CommittedAt: time.Now()}, nil
}

func (w *slowWarehouse) Stamp(context.Context, string, string) (warehouse.Stamp, bool, error) {
	return warehouse.Stamp{}, false, nil
}

func (w *slowWarehouse) Publish(_ context.Context, s warehouse.Slice, _ time.Duration, before func(context.Context) error) (warehouse.Stamp, error) {
	now := time.Now()
	return warehouse.Stamp{BatchID: s.BatchID, PublishedAt: &now}, nil
}

// TestLoadProgressIsRecorded: while a load runs, the objects and records
// read so far reach the batch details (fenced, every ProgressEvery) and
// ingest_records_loaded_total; the committed batch keeps the final figures.
func TestLoadProgressIsRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var first, second strings.Builder
	first.WriteString("vehicle,km\n")
	for i := range 300 {
		fmt.Fprintf(&first, "V%d,%d\n", i, i)
	}
	second.WriteString("vehicle,km\nZ,1\nZ,2\n")
	b := e.reserve("tenant-a", e.folder(map[string]string{"_SUCCESS": "", "a.csv": first.String(), "b.csv": second.String()}))

	wh := &slowWarehouse{firstDone: make(chan struct{}), goOn: make(chan struct{})}
	m := metrics.New()
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Metrics: m, ProgressEvery: 20 * time.Millisecond}
	done := make(chan pipeline.Result, 1)
	go func() { done <- e.deliver(b.ID, p) }()
	testproc.Await(t, wh.firstDone, "the first object's load")

	var mid batch.Details
	require.Eventually(t, func() bool {
		_, mid = e.details(b.ID)
		return mid.Progress != nil && mid.Progress.RecordsDone == 300
	}, 30*time.Second, 10*time.Millisecond, "progress of the running load reaches the details")
	require.Equal(t, batch.PhaseLoading, mid.Phase)
	require.Equal(t, int64(1), mid.Progress.ObjectsDone)
	require.Equal(t, int64(2), mid.Progress.ObjectsTotal)
	require.Equal(t, float64(300), testutil.ToFloat64(m.RecordsLoaded))

	close(wh.goOn)
	res := testproc.Await(t, done, "the delivery to end")
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	_, d := e.details(b.ID)
	require.Equal(t, batch.PhasePublished, d.Phase)
	require.Equal(t, int64(302), d.RecordCount)
	require.Equal(t, &batch.Progress{ObjectsDone: 2, ObjectsTotal: 2, RecordsDone: 302, At: d.Progress.At}, d.Progress)
	require.Equal(t, float64(302), testutil.ToFloat64(m.RecordsLoaded))
}
