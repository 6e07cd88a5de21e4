package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestAnUnstorableNumberIsABadRecord is issue 44's repro: an NDJSON folder
// whose one record holds 1e1000000 (valid JSON, beyond PostgreSQL's
// numeric) imported with --max-bad-records 1 by a real worker ends
// Succeeded, the slice holding every other record and the errors table
// that record: its object, line, column (the byte where the number starts)
// and a reason naming its JSON path. It does so on both of the local
// warehouse's load paths: a small folder (one INSERT) and one past 256
// records (COPY). Imported without a tolerance, the folder fails
// bad_records naming the object, line and column instead of failing in
// the warehouse's COPY with no reason.
func TestAnUnstorableNumberIsABadRecord(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	startWorker(t, dbURL, fastLease...)

	for _, c := range []struct {
		name   string
		before int // good records before the bad one
	}{{"small", 2}, {"streamed", 300}} {
		var body strings.Builder
		for i := range c.before {
			fmt.Fprintf(&body, `{"vehicle":"V%d","km":%d.5}`+"\n", i, i)
		}
		body.WriteString(`{"vehicle":"VX","km":1e1000000}` + "\n")
		body.WriteString(`{"vehicle":"VY","km":1e3}` + "\n")
		url := writeFolder(t, map[string]string{"_SUCCESS": "", "trips.ndjson": body.String()})
		line := int64(c.before + 1)

		strict := enqueueBatch(t, dbURL, "tenant-values", url)
		waitStatus(t, pool, strict, batch.StatusFailed, 60*time.Second)
		_, d := getBatch(t, pool, strict)
		require.Equal(t, batch.PhaseFailedPreCommit, d.Phase, c.name)
		require.NotNil(t, d.LastError, c.name)
		require.Equal(t, batch.ReasonBadRecords, d.LastError.Reason, c.name)
		require.Contains(t, d.LastError.Message, fmt.Sprintf("/trips.ndjson: line %d, column 22: the value at $.km: the number has 1000001 digits", line), c.name)

		out, code := runEnqueue(t, dbURL, append(importArgs("tenant-values", url), "--max-bad-records", "1")...)
		require.Equal(t, 0, code, out)
		o := outcome(t, out)
		require.Equal(t, "enqueued", o["outcome"], out)
		id := int64(o["batch_id"].(float64))
		waitStatus(t, pool, id, batch.StatusSucceeded, 60*time.Second)

		var n int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM curated.fleet_records WHERE batch_id = $1`, id).Scan(&n))
		require.Equal(t, c.before+1, n, "%s: every other record", c.name)
		var key, reason, excerpt string
		var gotLine int64
		var column int
		require.NoError(t, pool.QueryRow(t.Context(), `
			SELECT object_key, line_number, column_number, reason, raw_excerpt FROM curated.fleet_load_errors WHERE batch_id = $1`, id).
			Scan(&key, &gotLine, &column, &reason, &excerpt), c.name)
		require.True(t, strings.HasSuffix(key, "/trips.ndjson"), "%s: %s", c.name, key)
		require.Equal(t, line, gotLine, c.name)
		require.Equal(t, 22, column, c.name)
		require.Equal(t, "the value at $.km: the number has 1000001 digits before the decimal point, more than the 131072 PostgreSQL's numeric holds", reason, c.name)
		require.Equal(t, `"1e1000000"`, excerpt, c.name)
	}
}

// TestAnUnstorableNumberIsABadRecordInRedshift: the same through the
// Redshift warehouse (the Data API double): a worker loading a folder with
// 1e400 (within numeric, beyond DOUBLE PRECISION, which no number of a
// SUPER value holds) and 1e1000000 with --max-bad-records 2 stages
// neither, ends Succeeded, and Redshift's errors table names both.
func TestAnUnstorableNumberIsABadRecordInRedshift(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	double, env, migrateFlags, workerFlags := redshiftDouble(t)
	migrate := exec.Command(filepath.Join(binDir, "worker"), append([]string{"migrate", "--log-level", "warn"}, migrateFlags...)...)
	migrate.Env = append(append(os.Environ(), "DATABASE_URL="+dbURL), env...)
	migrated, err := migrate.CombinedOutput()
	require.NoError(t, err, string(migrated))
	startWorkerEnv(t, dbURL, env, append(append([]string(nil), workerFlags...), fastLease...)...)

	url := writeFolder(t, map[string]string{"_SUCCESS": "", "trips.ndjson": `{"vehicle":"V1","km":1.5}` + "\n" +
		`{"vehicle":"VX","km":1e400}` + "\n" + `{"vehicle":"VY","km":1e1000000}` + "\n" + `{"vehicle":"V2","km":2e300}` + "\n"})
	out, code := runEnqueue(t, dbURL, append(importArgs("tenant-values", url), "--max-bad-records", "2")...)
	require.Equal(t, 0, code, out)
	id := int64(outcome(t, out)["batch_id"].(float64))
	waitStatus(t, pool, id, batch.StatusSucceeded, 90*time.Second)

	var n int
	require.NoError(t, double.Pool.QueryRow(t.Context(), `SELECT count(*) FROM curated.fleet_records WHERE batch_id = $1`, id).Scan(&n))
	require.Equal(t, 2, n, "V1 and V2")
	rows, err := double.Pool.Query(t.Context(), `
		SELECT line_number, column_number, reason, raw_excerpt FROM curated.fleet_load_errors WHERE batch_id = $1 ORDER BY ordinal`, id)
	require.NoError(t, err)
	type loadError struct {
		Line    int64
		Column  int
		Reason  string
		Excerpt string
	}
	var got []loadError
	for rows.Next() {
		var e loadError
		require.NoError(t, rows.Scan(&e.Line, &e.Column, &e.Reason, &e.Excerpt))
		got = append(got, e)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 2, "%+v", got)
	require.Equal(t, loadError{2, 22, "the value at $.km: the number is beyond DOUBLE PRECISION's range (about ±1.8e308), the widest number a Redshift SUPER value holds", `"1e400"`}, got[0])
	require.Equal(t, int64(3), got[1].Line)
	require.Equal(t, 22, got[1].Column)
	require.Contains(t, got[1].Reason, "PostgreSQL's numeric")
}
