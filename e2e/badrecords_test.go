package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestBadRecordsFailOrAreSkippedWithinTheTolerance runs a real worker over
// a folder with 3 bad records (a CSV row too short, a CSV value holding
// NUL, an NDJSON line that is not JSON) among 5 good ones. Imported from
// the command line without a tolerance, the batch fails failed_pre_commit
// with reason bad_records, naming the first one's object and line, with
// nothing in the warehouse; imported again with --max-bad-records 5 it
// succeeds, the slice holds the 5 good records, the summary counts 3 bad
// ones and status --errors lists them from the warehouse.
func TestBadRecordsFailOrAreSkippedWithinTheTolerance(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	startWorker(t, dbURL, fastLease...)
	url := writeFolder(t, map[string]string{
		"_SUCCESS": "",
		"a.csv":    "id,note\n1,ok\n2\n3,fine\n4,bad\x00value\n5,last\n",
		"b.ndjson": "{\"n\": 1}\nnot json\n{\"n\": 2}\n",
	})

	strict := enqueueBatch(t, dbURL, "tenant-bad", url)
	waitStatus(t, pool, strict, batch.StatusFailed, 60*time.Second)
	_, d := getBatch(t, pool, strict)
	require.Equal(t, batch.PhaseFailedPreCommit, d.Phase)
	require.NotNil(t, d.LastError)
	require.Equal(t, batch.ReasonBadRecords, d.LastError.Reason)
	require.Contains(t, d.LastError.Message, "/a.csv")
	require.Contains(t, d.LastError.Message, "line 3")
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM curated.fleet_records WHERE batch_id = $1`, strict).Scan(&n))
	require.Zero(t, n, "nothing of the failed batch is in the warehouse")

	out, code := runEnqueue(t, dbURL, append(importArgs("tenant-bad", url), "--max-bad-records", "5")...)
	require.Equal(t, 0, code, out)
	o := outcome(t, out)
	require.Equal(t, "enqueued", o["outcome"], out)
	tolerant := int64(o["batch_id"].(float64))
	waitStatus(t, pool, tolerant, batch.StatusSucceeded, 60*time.Second)
	_, d = getBatch(t, pool, tolerant)
	require.Equal(t, 5, d.MaxBadRecords)
	require.NotNil(t, d.Objects)
	require.Equal(t, int64(3), d.Objects.BadRecords)
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(DISTINCT (object_key, line_number)) FROM curated.fleet_records WHERE batch_id = $1`, tolerant).Scan(&n))
	require.Equal(t, 5, n, "every good record once")

	out, code = runEnqueue(t, dbURL, "status", "--batch-id", itoa(tolerant), "--errors", "--json")
	require.Equal(t, 0, code, out)
	var ev struct {
		Outcome    string `json:"outcome"`
		BadRecords int64  `json:"bad_records"`
		Errors     []struct {
			ObjectKey string `json:"object_key"`
			Line      int64  `json:"line_number"`
			Column    int    `json:"column_number"`
			Reason    string `json:"reason"`
			Excerpt   string `json:"raw_excerpt"`
		} `json:"errors"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &ev), out)
	require.Equal(t, "load_errors", ev.Outcome)
	require.Equal(t, int64(3), ev.BadRecords)
	require.Len(t, ev.Errors, 3)
	require.True(t, strings.HasSuffix(ev.Errors[1].ObjectKey, "a.csv"))
	require.Equal(t, int64(5), ev.Errors[1].Line)
	require.Equal(t, 2, ev.Errors[1].Column)
	require.Equal(t, `"bad\x00value"`, ev.Errors[1].Excerpt)
	require.True(t, strings.HasSuffix(ev.Errors[2].ObjectKey, "b.ndjson"))
	require.Equal(t, int64(2), ev.Errors[2].Line)

	out, code = runEnqueue(t, dbURL, "status", "--batch-id", itoa(tolerant))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "3 bad records skipped")
}
