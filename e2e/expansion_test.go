package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// amplifyingHeaderFolder writes the red team's CSV: a 1 MiB header of 4,096
// columns (255-byte names, random letters so that TOAST compression cannot
// hide the cost) and 200 nearly empty rows (a short id, then 4,095 empty
// fields). It returns the folder's URL and the object's size.
func amplifyingHeaderFolder(t *testing.T) (string, int64) {
	t.Helper()
	const columns, nameBytes, rows = 4096, 255, 200
	rnd := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	name := make([]byte, nameBytes)
	for i := range columns {
		if i > 0 {
			b.WriteByte(',')
		}
		for j := range name {
			name[j] = byte('a' + rnd.IntN(26))
		}
		b.Write(name)
	}
	b.WriteByte('\n')
	require.Equal(t, 1<<20, b.Len(), "a 1 MiB header")
	empty := strings.Repeat(",", columns-1)
	for i := range rows {
		fmt.Fprintf(&b, "r%d%s\n", i, empty)
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "wide.csv"), []byte(b.String()), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644))
	return "file://" + dir, int64(b.Len())
}

// ordinaryFleetFolder writes a fleet CSV as trackers export them: short
// column names, most optional fields empty on most rows.
func ordinaryFleetFolder(t *testing.T, rows int) (string, int64) {
	t.Helper()
	var b strings.Builder
	b.WriteString("vehicle_id,ts,lat,lon,speed,heading,odometer_km,fuel_pct,ignition,driver_id,dtc,trailer_id,door_open,temp_c,geofence,alert\n")
	for i := range rows {
		fmt.Fprintf(&b, "V-%04d,2026-03-01T12:%02d:%02dZ,52.%06d,13.%06d,%d,%d,%d.%d,%d,%t,", i%50, i/60%60, i%60, i*37%1000000, i*91%1000000, i%130, i%360, 100000+i, i%10, i%100, i%7 != 0)
		if i%10 == 0 {
			b.WriteString("D-0042")
		}
		b.WriteString(",,,,,,\n")
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "telemetry.csv"), []byte(b.String()), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644))
	return "file://" + dir, int64(b.Len())
}

// recordsSize returns the stored size of curated.fleet_records, TOAST and
// indexes included.
func recordsSize(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT pg_total_relation_size('curated.fleet_records')`).Scan(&n))
	return n
}

// waitDone waits until the batch is Succeeded or Failed.
func waitDone(t *testing.T, pool *pgxpool.Pool, id int64, timeout time.Duration) batch.Batch {
	t.Helper()
	var b batch.Batch
	require.Eventually(t, func() bool {
		b, _ = getBatch(t, pool, id)
		return b.Status == batch.StatusSucceeded || b.Status == batch.StatusFailed
	}, timeout, 50*time.Millisecond, "batch %d never finished", id)
	return b
}

// TestHeaderAmplificationIsRefusedInAWorker runs a real worker, with its
// default limits, over the red team's 1.8 MB CSV whose 1 MiB header was
// repeated in each of its 200 records: it grew curated.fleet_records by
// 211 MB. Now the batch fails failed_pre_commit naming the object and the
// line, not one of its records is stored and the table does not grow; an
// ordinary fleet CSV, with many short and mostly empty columns, still
// loads through the same worker.
func TestHeaderAmplificationIsRefusedInAWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	startWorker(t, dbURL, fastLease...)

	wide, wideBytes := amplifyingHeaderFolder(t)
	before := recordsSize(t, pool)
	id := enqueueBatch(t, dbURL, "tenant-x", wide)
	b := waitDone(t, pool, id, 120*time.Second)
	after := recordsSize(t, pool)
	var stored int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_records WHERE batch_id = $1`, id).Scan(&stored))
	t.Logf("%d-byte CSV with a 1 MiB header: batch %s, %d records stored, curated.fleet_records %d -> %d bytes (grew %d, %.1f× the object)",
		wideBytes, b.Status, stored, before, after, after-before, float64(after-before)/float64(wideBytes))
	require.Equal(t, batch.StatusFailed, b.Status, "the amplifying object is refused")
	_, d := getBatch(t, pool, id)
	require.Equal(t, batch.PhaseFailedPreCommit, d.Phase)
	require.NotNil(t, d.LastError)
	require.Contains(t, d.LastError.Message, "/wide.csv: line 2: ")
	require.Contains(t, d.LastError.Message, "bytes of JSON")
	require.Zero(t, stored, "nothing of the batch is stored")
	require.Less(t, after-before, wideBytes, "the table grew less than the object's own size")

	ordinary, ordinaryBytes := ordinaryFleetFolder(t, 20000)
	id = enqueueBatch(t, dbURL, "tenant-x", ordinary)
	waitStatus(t, pool, id, batch.StatusSucceeded, 120*time.Second)
	var records, columnBytes int64
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*), sum(pg_column_size(record)) FROM curated.fleet_records WHERE batch_id = $1`, id).Scan(&records, &columnBytes))
	require.Equal(t, int64(20000), records)
	grown := recordsSize(t, pool) - after
	t.Logf("ordinary %d-byte fleet CSV: %d records, %d bytes of jsonb (%.2f×), curated.fleet_records grew %d bytes (%.2f×)",
		ordinaryBytes, records, columnBytes, float64(columnBytes)/float64(ordinaryBytes), grown, float64(grown)/float64(ordinaryBytes))
}
