package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestListFitsAHundredColumnsAndPagesByFolder: enqueue list's default
// table fits 100 columns whatever its cells hold (a 100-byte tenant id, a
// long folder, a failure with its reason), -o wide shows every column;
// --tenant-id --folder pages a folder's batches with the cursor the last
// JSON line gives, each batch once; --folder without --tenant-id and a bad
// --since are invalid input (exit 2).
func TestListFitsAHundredColumnsAndPagesByFolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	long := strings.Repeat("t", 100)
	phased(t, pool, long, batch.PhaseFailedPreCommit, batch.StatusFailed, 0)
	phased(t, pool, "tenant-a", batch.PhaseReserved, batch.StatusRunning, 0)
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = jsonb_set(details, '{lastError,reason}', '"folder_incomplete"') WHERE tenant_id = $1`, long)
	require.NoError(t, err)

	out, code := runCLI(t, dbURL, "list")
	require.Equal(t, 0, code, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	for _, l := range lines {
		require.LessOrEqual(t, utf8.RuneCountInString(l), 100, "%q", l)
	}
	require.Contains(t, out, "folder_incomplete")
	wide, code := runCLI(t, dbURL, "list", "-o", "wide")
	require.Equal(t, 0, code)
	require.Contains(t, wide, "LEASE HOLDER")
	require.Greater(t, len(strings.Split(wide, "\n")[0]), 100)

	// Five batches of one folder, paged two at a time.
	const folderURL = "s3://fleet-bucket/tenants/tenant-p/db/c/daily"
	var ids []float64
	for range 5 {
		out, code := runCLI(t, dbURL, "import", "--tenant-id", "tenant-p", "--tenant-database", "db", "--company-id", "c", "--folder", folderURL, "--reimport")
		require.Equal(t, 0, code, out)
		var o map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &o))
		ids = append(ids, o["batch_id"].(float64))
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Failed', completed_at = now() WHERE id = $1`, int64(o["batch_id"].(float64)))
		require.NoError(t, err)
	}
	var got []float64
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		args := []string{"list", "--tenant-id", "tenant-p", "--folder", folderURL, "--limit", "2", "--json"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		out, code := runCLI(t, dbURL, args...)
		require.Equal(t, 0, code, out)
		cursor = ""
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var o map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &o))
			if c, ok := o["next_cursor"]; ok {
				cursor = c.(string)
				continue
			}
			got = append(got, o["batch_id"].(float64))
		}
		if cursor == "" {
			break
		}
	}
	require.Equal(t, []float64{ids[4], ids[3], ids[2], ids[1], ids[0]}, got)

	out, code = runCLI(t, dbURL, "list", "--folder", folderURL)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `"field":"tenant_id"`)
	out, code = runCLI(t, dbURL, "list", "--tenant-id", "tenant-p", "--since", "yesterday")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `"field":"since"`)
	out, code = runCLI(t, dbURL, "list", "--tenant-id", "tenant-p", "--since", "1h")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "tenant-p")
}
