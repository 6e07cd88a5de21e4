package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestImportMaxBadRecords: import --max-bad-records puts the tolerance in
// the batch's details; -1 and 10001 (over the cap) are invalid input
// naming max_bad_records (exit 2), with nothing written.
func TestImportMaxBadRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	args := func(folder, maxBad string) []string {
		return []string{"import", "--tenant-id", "tenant-demo", "--tenant-database", "fleet_tenant_demo", "--company-id", "company-42",
			"--folder", "s3://fleet-bucket/tenants/tenant-demo/fleet_tenant_demo/company-42/" + folder, "--max-bad-records=" + maxBad}
	}
	for _, bad := range []string{"10001", "-1"} {
		out, code := runCLI(t, dbURL, args("refused", bad)...)
		require.Equal(t, cli.ExitInvalidInput, code, "%s: %s", bad, out)
		var o map[string]string
		require.NoError(t, json.Unmarshal([]byte(out), &o), out)
		require.Equal(t, "invalid_input", o["outcome"])
		require.Equal(t, "max_bad_records", o["field"], out)
		require.Contains(t, o["error"], "10000")
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
		require.Zero(t, n, "%s: nothing was written", bad)
	}

	out, code := runCLI(t, dbURL, args("ok", "10000")...)
	require.Equal(t, cli.ExitOK, code, out)
	var o struct {
		BatchID int64 `json:"batch_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &o), out)
	b, err := batch.NewStore(pool).Get(ctx, o.BatchID)
	require.NoError(t, err)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	require.Equal(t, 10000, d.MaxBadRecords, "the cap itself is allowed")
}
