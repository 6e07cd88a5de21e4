package fleet_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
)

const largeRows = 1_000_000

// largeLoadRSSBound bounds the loader's peak RSS (about 32 MiB measured on
// a non-race build): well below the folder's size (about 78 MiB of CSV), so
// holding the folder in memory would fail it.
const largeLoadRSSBound = 48 << 20

// writeLargeFolder writes rows CSV rows of about 120 bytes, split over four
// files, and returns the folder and its total size.
func writeLargeFolder(t testing.TB, rows int) (string, int64) {
	t.Helper()
	dir := t.TempDir()
	var size int64
	const files = 4
	for f := range files {
		path := filepath.Join(dir, fmt.Sprintf("part-%d.csv", f))
		fh, err := os.Create(path)
		require.NoError(t, err)
		w := bufio.NewWriterSize(fh, 1<<20)
		fmt.Fprintln(w, "vehicle_id,recorded_at,latitude,longitude,speed_kmh,odometer_km,driver,status")
		for i := f; i < rows; i += files {
			fmt.Fprintf(w, "VH-%07d,2026-11-30T10:%02d:%02dZ,52.%06d,13.%06d,%d,%d,driver-%05d,moving\n",
				i, i%60, (i/60)%60, i%1000000, (i*7)%1000000, i%130, 100000+i, i%50000)
		}
		require.NoError(t, w.Flush())
		st, err := fh.Stat()
		require.NoError(t, err)
		size += st.Size()
		require.NoError(t, fh.Close())
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644))
	return "file://" + dir, size
}

// TestLargeFolderLoadsWithBoundedMemory loads a generated folder of a
// million rows in a separate process and checks that its peak resident
// memory stays far below the folder's size: records are streamed. The
// loader is a test binary built without the race detector (see testproc),
// so the figure does not depend on -race or on what else the machine runs.
func TestLargeFolderLoadsWithBoundedMemory(t *testing.T) {
	t.Parallel()
	url, size := writeLargeFolder(t, largeRows)
	dbURL := pgtest.NewDatabaseURL(t)
	loader := testproc.NonRaceTestBinary(t)

	start := time.Now()
	cmd := exec.Command(loader, "-test.run=^TestLargeFolderHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "FLEET_LARGE_HELPER=1", "FLEET_LARGE_FOLDER="+url, "FLEET_LARGE_DB="+dbURL)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	elapsed := time.Since(start)
	peakRSS := testproc.PeakRSS(t, out)

	pool := pgtest.Pool(t, dbURL)
	var count, distinct int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*), count(DISTINCT (object_key, line_number)) FROM curated.fleet_records`).Scan(&count, &distinct))
	require.Equal(t, int64(largeRows), count)
	require.Equal(t, int64(largeRows), distinct)

	t.Logf("loaded %d rows (%.1f MiB of CSV) in %s: %.0f rows/s, loader peak RSS %.1f MiB",
		largeRows, float64(size)/(1<<20), elapsed.Round(time.Millisecond), float64(largeRows)/elapsed.Seconds(), float64(peakRSS)/(1<<20))
	require.Less(t, peakRSS, int64(largeLoadRSSBound), "peak RSS must stay well below the folder size (%.1f MiB)", float64(size)/(1<<20))
}

// TestLargeFolderHelperProcess is the loader process of
// TestLargeFolderLoadsWithBoundedMemory; it does nothing on its own.
func TestLargeFolderHelperProcess(t *testing.T) {
	if os.Getenv("FLEET_LARGE_HELPER") != "1" {
		return
	}
	ctx := context.Background()
	pool := pgtest.Pool(t, os.Getenv("FLEET_LARGE_DB"))
	e := &env{t: t, pool: pool, store: batch.NewStore(pool), leases: lease.NewStore(pool), wh: warehouse.NewPostgres(pool)}
	b := e.reserve("tenant-large", os.Getenv("FLEET_LARGE_FOLDER"))
	a, err := e.leases.Acquire(ctx, b.ID, "large-"+strconv.Itoa(os.Getpid()), time.Hour)
	require.NoError(t, err)
	res, err := pipeline.Execute(ctx, e.store, a.Lease, nil, pipeline.Registry{batch.SourceTypeFleetS3: &fleet.Pipeline{AllowLocalFolders: true, Warehouse: e.wh}})
	require.NoError(t, err)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	testproc.ReportPeakRSS(t)
}
