package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/pipeline"
)

// TestTheLedgerAgreesWithTheBatchSummary: a folder loaded by the pipeline
// leaves a load ledger in the warehouse that says what the batch's summary
// (details.objects) says on the operational side: as many objects, as many
// bytes, the same digest of keys and ETags, the marker's time in every row;
// and as many records as the slice's stamp. A re-import of the changed
// folder replaces it with the new batch's.
func TestTheLedgerAgreesWithTheBatchSummary(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	p := &fleet.Pipeline{AllowLocalFolders: true, Warehouse: e.wh}
	url := e.folder(map[string]string{"_SUCCESS": "", "a.csv": "id\n1\n2\n", "sub/b.ndjson": "{\"id\":3}\n"})

	check := func(batchID int64, scope string, records int64) {
		t.Helper()
		_, d := e.details(batchID)
		require.NotNil(t, d.Objects)
		st, objs, found, err := e.wh.Ledger(ctx, "tenant-a", scope)
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, batchID, st.BatchID)
		require.Equal(t, records, st.RecordCount)
		require.EqualValues(t, d.Objects.Count, len(objs))
		var bytes, total int64
		listing := make([]folder.Object, 0, len(objs))
		for _, o := range objs {
			bytes += o.SizeBytes
			total += o.RecordCount
			listing = append(listing, folder.Object{Key: o.ObjectKey, ETag: o.ETag})
			require.NotNil(t, o.MarkerModified)
			require.True(t, d.Objects.MarkerModified.Truncate(time.Microsecond).Equal(*o.MarkerModified), "the marker's time, as the summary has it (to the warehouse's microsecond): %s, %s", d.Objects.MarkerModified, o.MarkerModified)
		}
		require.Equal(t, d.Objects.Bytes, bytes)
		require.Equal(t, records, total)
		require.Equal(t, d.Objects.Digest, folder.Digest(listing), "the ledger names the same objects and ETags as the summary")
	}

	first := e.reserve("tenant-a", url)
	require.Equal(t, pipeline.Succeeded, e.deliver(first.ID, p).Outcome)
	check(first.ID, first.Scope(), 3)

	e.write(url, "a.csv", "id\n1\n2\n4\n")
	e.write(url, "c.csv", "id\n5\n")
	again := e.reserve("tenant-a", url)
	require.Equal(t, pipeline.Succeeded, e.deliver(again.ID, p).Outcome)
	check(again.ID, first.Scope(), 5)
}
