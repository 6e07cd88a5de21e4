package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/pgtest"
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
