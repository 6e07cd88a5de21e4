package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestImportFromFile imports a file of folders as one burst: one JSON line
// per folder, in order, one transaction for the batches it reserved, and the
// exit code of the worst outcome.
func TestImportFromFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	flags := []string{"import", "--tenant-id", "tenant-a", "--tenant-database", "db", "--company-id", "c"}
	// at is a folder of tenant-a's, as the default --path-pattern names it.
	at := func(name string) string { return "s3://fleet-bucket/tenants/tenant-a/db/c/" + name }
	lines := func(out string) []map[string]any {
		var res []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &m), l)
			res = append(res, m)
		}
		return res
	}

	file := write("folders.txt", "# nightly uploads\n"+at("a")+"\n\n"+at("b")+"\n"+at("../bad")+"\n"+at("c")+"\n")
	out, code := runCLI(t, dbURL, append(flags, "--from-file", file)...)
	require.Equal(t, cli.ExitInvalidInput, code, out)
	res := lines(out)
	require.Len(t, res, 4)
	var ids []int64
	for _, i := range []int{0, 1, 3} {
		require.Equal(t, "enqueued", res[i]["outcome"], res[i])
		ids = append(ids, int64(res[i]["batch_id"].(float64)))
	}
	require.Equal(t, "invalid_input", res[2]["outcome"])
	require.Equal(t, "folder", res[2]["field"])
	var xids int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM ingestion_batches WHERE id = ANY($1)`, ids).Scan(&xids))
	require.Equal(t, 1, xids, "one transaction")

	out, code = runCLI(t, dbURL, append(flags, "--from-file", write("again.txt", at("a")+"\n"+at("d")+"\n"))...)
	require.Equal(t, cli.ExitConflict, code, out)
	res = lines(out)
	require.Equal(t, "conflict", res[0]["outcome"])
	require.Equal(t, float64(ids[0]), res[0]["running_batch_id"])
	require.Equal(t, "enqueued", res[1]["outcome"])

	out, code = runCLI(t, dbURL, append(flags, "--from-file", write("empty.txt", "# nothing\n"))...)
	require.Equal(t, cli.ExitInvalidInput, code, out)
	require.Equal(t, "from_file", lines(out)[0]["field"])
	_, code = runCLI(t, dbURL, append(flags, "--from-file", write("both.txt", at("e")+"\n"), "--folder", at("e"))...)
	require.Equal(t, cli.ExitInvalidInput, code, "--folder and --from-file exclude each other")
}
