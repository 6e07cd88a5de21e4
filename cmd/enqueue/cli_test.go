package main

import (
	"bytes"
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

// TestEveryInvalidInputKeepsTheJSONContract: kong's own parse errors used to
// print plain text; every invalid input now prints the documented outcome
// line on stdout and exits 2.
func TestEveryInvalidInputKeepsTheJSONContract(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		args  []string
		field string
	}{
		"missing flag":     {[]string{"import", "--tenant-id", "t", "--company-id", "c", "--folder", "s3://b/f"}, "tenant_database"},
		"bad enum":         {[]string{"list", "--status", "Sleeping"}, "status"},
		"bad number":       {[]string{"status", "--batch-id", "twelve"}, "batch_id"},
		"bad duration":     {[]string{"status", "--batch-id", "1", "--watch", "--interval", "soon"}, "interval"},
		"unknown flag":     {[]string{"list", "--colour"}, "colour"},
		"unknown command":  {[]string{"frobnicate"}, "command"},
		"no command":       {[]string{}, "command"},
		"invalid UTF-8":    {[]string{"import", "--tenant-id", "t\xff"}, "arguments"},
		"cancel no tenant": {[]string{"cancel", "--batch-id", "3"}, "tenant_id"},
		"retry no batch":   {[]string{"retry", "--tenant-id", "t"}, "batch_id"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tt.args, &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, name)
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		require.Len(t, lines, 1, "%s: one JSON line: %q", name, stdout.String())
		var out map[string]string
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &out), name)
		require.Equal(t, "invalid_input", out["outcome"], name)
		require.Equal(t, tt.field, out["field"], "%s: %s", name, out["error"])
		require.NotEmpty(t, out["error"], name)
	}
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--version"}, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code)
	require.Regexp(t, `^enqueue \S+ \(revision \S+, go1\.\d+`, stdout.String())
}

// TestUnmigratedDatabaseSaysToMigrate: a database behind this build's schema
// answers with the hint, not only with "column does not exist".
func TestUnmigratedDatabaseSaysToMigrate(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabaseURLAt(t, 1)
	for _, args := range [][]string{{"list"}, {"status", "--batch-id", "1"}} {
		out, code := runCLI(t, url, args...)
		require.Equal(t, cli.ExitInfra, code, out)
		var o map[string]string
		require.NoError(t, json.Unmarshal([]byte(out), &o))
		require.Equal(t, "error", o["outcome"])
		require.Contains(t, o["error"], "run `worker migrate`")
	}
}

// TestInvisibleCharactersAreRefused: U+034F (combining grapheme joiner)
// and U+3164 (Hangul filler) render as nothing or as a blank and passed the
// deny-list of format characters, so "ac͏me" was a tenant of its own. Tenant
// and company ids and folder path segments are allow-lists now: each such
// id or folder is refused with the documented invalid_input line naming
// the field, the character and what is allowed, exit 2, nothing written —
// in an import and in an --from-file line — while the ids and folders the
// demo uses are still imported.
func TestInvisibleCharactersAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	importArgs := func(tenant, company, folder string) []string {
		return []string{"import", "--tenant-id", tenant, "--tenant-database", "fleet_tenant_demo", "--company-id", company, "--folder", folder}
	}
	const okFolder = "s3://fleet-bucket/tenants/tenant-demo/fleet_tenant_demo/company-42/up-1"
	for name, tt := range map[string]struct {
		args       []string
		field, why string
	}{
		"tenant with U+034F":       {importArgs("tenant\u034f-demo", "company-42", okFolder), "tenant_id", "U+034F"},
		"tenant U+3164 alone":      {importArgs("\u3164", "company-42", okFolder), "tenant_id", "U+3164"},
		"tenant with U+FFA0":       {importArgs("tenant-demo\uffa0", "company-42", okFolder), "tenant_id", "U+FFA0"},
		"tenant with U+FE0F":       {importArgs("tenant-demo\ufe0f", "company-42", okFolder), "tenant_id", "U+FE0F"},
		"company with U+3164":      {importArgs("tenant-demo", "company\u316442", okFolder), "company_id", "U+3164"},
		"company with U+115F":      {importArgs("tenant-demo", "\u115fcompany-42", okFolder), "company_id", "U+115F"},
		"folder with U+034F":       {importArgs("tenant-demo", "company-42", "s3://fleet-bucket/tenants/tenant\u034f-demo/fleet_tenant_demo/company-42/up-1"), "folder", "U+034F"},
		"folder with U+3164":       {importArgs("tenant-demo", "company-42", "s3://fleet-bucket/tenants/\u3164/fleet_tenant_demo/company-42/up-1"), "folder", "U+3164"},
		"local folder with U+3164": {importArgs("tenant-demo", "company-42", "file:///tmp/fleet/\u3164/up-1"), "folder", "U+3164"},
	} {
		out, code := runCLI(t, dbURL, tt.args...)
		require.Equal(t, cli.ExitInvalidInput, code, "%s: %s", name, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 1, "%s: one JSON line: %q", name, out)
		var o map[string]string
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &o), name)
		require.Equal(t, "invalid_input", o["outcome"], name)
		require.Equal(t, tt.field, o["field"], "%s: %s", name, o["error"])
		require.Contains(t, o["error"], tt.why, name)
		require.Contains(t, o["error"], "only letters, digits", "%s: the error states the allow-list", name)
	}

	file := filepath.Join(t.TempDir(), "folders.txt")
	require.NoError(t, os.WriteFile(file, []byte("s3://fleet-bucket/tenants/tenant-demo/fleet_tenant_demo/company-42/a\u3164\n"), 0o600))
	out, code := runCLI(t, dbURL, "import", "--tenant-id", "tenant-demo", "--tenant-database", "fleet_tenant_demo", "--company-id", "company-42", "--from-file", file)
	require.Equal(t, cli.ExitInvalidInput, code, out)
	require.Contains(t, out, `"field":"folder"`)
	require.Contains(t, out, "U+3164")

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	require.Zero(t, n, "nothing was written")

	out, code = runCLI(t, dbURL, importArgs("tenant-demo", "company-42", okFolder)...)
	require.Equal(t, cli.ExitOK, code, "the demo's ids are valid: %s", out)
	require.Contains(t, out, `"outcome":"enqueued"`)
}

// TestLongRunningCommandsRefuseAnUnmigratedDatabase: serve, sqs and
// reconcile check the schema version at start as the worker does: on a
// database behind this build (or without any schema) they do not start,
// exit 1 and say why and to run `worker migrate`.
func TestLongRunningCommandsRefuseAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	for _, url := range []string{pgtest.NewDatabaseURLAt(t, 1), pgtest.EmptyDatabaseURL(t)} {
		for _, args := range [][]string{
			{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--insecure-no-auth"},
			{"sqs", "--queue-url", "http://127.0.0.1:1/000000000000/uploads", "--admin-listen", "127.0.0.1:0"},
			{"reconcile", "--bucket", "fleet-uploads", "--every", "1m", "--admin-listen", "127.0.0.1:0"},
			{"reconcile", "--bucket", "fleet-uploads"},
		} {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append(args, "--database-url", url), &stdout, &stderr)
			require.Equal(t, cli.ExitInfra, code, "%v: %s", args, stderr.String())
			require.Contains(t, stderr.String(), "not starting: ", args)
			require.Contains(t, stderr.String(), "run `worker migrate` first", args)
			var o map[string]string
			require.NoError(t, json.Unmarshal(stdout.Bytes(), &o), stdout.String())
			require.Equal(t, "error", o["outcome"])
			require.Contains(t, o["error"], "run `worker migrate` first")
		}
	}
}
