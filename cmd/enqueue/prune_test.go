package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestPruneCommand: enqueue prune is a dry run unless --apply (counts by
// status and the id range, nothing deleted), deletes with --apply, and
// answers invalid input (exit 2) for a retention shorter than a day, an
// unreadable one, or a bad batch size, before connecting.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	var ids []int64
	for i, status := range []string{"Failed", "Succeeded", "Failed", "Failed", "Running"} {
		folder := "fleet_s3:s3://fleet-uploads/tenants/t1/db/c/a"
		completed := "now() - interval '100 days'"
		if status == "Running" {
			folder, completed = "fleet_s3:s3://fleet-uploads/tenants/t1/db/c/b", "NULL"
		}
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `
			INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope, completed_at)
			VALUES ('c', 't1', 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', $1, '{"version": 1, "phase": "failed_pre_commit"}', $2, `+completed+`)
			RETURNING id`, status, folder).Scan(&id), i)
		ids = append(ids, id)
	}
	count := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
		return n
	}

	for _, args := range [][]string{
		{"prune", "--older-than", "1h"},
		{"prune", "--older-than", "ninety days"},
		{"prune", "--older-than", "30d", "--batch-size", "0"},
		{"prune", "--older-than", "30d", "--lock-timeout", "0s"},
		{"prune"},
	} {
		out, code := runCLI(t, dbURL, args...)
		require.Equal(t, cli.ExitInvalidInput, code, "%v: %s", args, out)
		require.Contains(t, out, `"outcome":"invalid_input"`, args)
	}
	out, _ := runCLI(t, dbURL, "prune", "--older-than", "1h")
	require.Contains(t, out, `"field":"older_than"`)
	require.Equal(t, 5, count())

	type result struct {
		Outcome  string           `json:"outcome"`
		Applied  bool             `json:"applied"`
		Batches  int64            `json:"batches"`
		ByStatus map[string]int64 `json:"by_status"`
		MinID    int64            `json:"min_id"`
		MaxID    int64            `json:"max_id"`
	}
	parse := func(out string) result {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 1, out)
		var r result
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &r), out)
		return r
	}
	out, code := runCLI(t, dbURL, "prune", "--older-than", "90d")
	require.Equal(t, cli.ExitOK, code, out)
	dry := parse(out)
	// The folder's newest (ids[3]) and newest Succeeded (ids[1]) batches
	// stay, and the Running one.
	require.Equal(t, result{Outcome: "would_prune", Batches: 2, ByStatus: map[string]int64{"Failed": 2}, MinID: ids[0], MaxID: ids[2]}, dry)
	require.Equal(t, 5, count(), "a dry run deletes nothing")

	out, code = runCLI(t, dbURL, "prune", "--older-than", "2160h", "--apply", "--batch-size", "1")
	require.Equal(t, cli.ExitOK, code, out)
	require.Equal(t, result{Outcome: "pruned", Applied: true, Batches: 2, ByStatus: map[string]int64{"Failed": 2}, MinID: ids[0], MaxID: ids[2]}, parse(out))
	require.Equal(t, 3, count())
}
