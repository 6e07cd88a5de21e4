package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabaseURLAt(t, 1)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"migrate", "--database-url", url}, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "applied project migration 2 00002_source_scope_and_execution_lease.sql")
	require.Contains(t, stdout.String(), "applied River migration")

	stdout.Reset()
	code = run(context.Background(), []string{"migrate", "--database-url", url}, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	require.Equal(t, "database schema is current: nothing to apply\nbatch ids: the warehouse names batches up to 0; the id sequence stands at 0\n", stdout.String())
}

func TestMigrateCommandErrors(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"migrate"}, &stdout, &stderr)
	require.Equal(t, cli.ExitInvalidInput, code, "no database URL is invalid input")
	require.Contains(t, stderr.String(), "DATABASE_URL")

	stderr.Reset()
	code = run(context.Background(), []string{"migrate", "--database-url", "postgres://u:hunter2secret@127.0.0.1:1/db?connect_timeout=2"}, &stdout, &stderr)
	require.Equal(t, cli.ExitInfra, code, "an unreachable database is an infrastructure failure")
	require.NotContains(t, stderr.String(), "hunter2secret")
	require.Contains(t, stderr.String(), "unreachable")

	stderr.Reset()
	code = run(context.Background(), []string{"frobnicate"}, &stdout, &stderr)
	require.Equal(t, cli.ExitInvalidInput, code)

	stdout.Reset()
	code = run(context.Background(), []string{"--help"}, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code)
	require.True(t, strings.Contains(stdout.String(), "migrate"), stdout.String())
}

func TestWorkerUsageErrorsAreJSON(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		args  []string
		field string
	}{
		"bad duration":    {[]string{"run", "--lease-ttl", "soon"}, "lease_ttl"},
		"unknown flag":    {[]string{"run", "--turbo"}, "turbo"},
		"unknown command": {[]string{"frobnicate", "now"}, "command"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tt.args, &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, name)
		var entry map[string]any
		require.NoError(t, json.Unmarshal(bytes.TrimSpace(stderr.Bytes()), &entry), "%s: %s", name, stderr.String())
		require.Equal(t, "invalid input", entry["msg"], name)
		require.Equal(t, tt.field, entry["field"], "%s: %v", name, entry["error"])
	}
}

func TestWorkerVersionFlag(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.Equal(t, cli.ExitOK, run(context.Background(), []string{"--version"}, &stdout, &stderr))
	require.Regexp(t, `^worker \S+ \(revision \S+, go1\.\d+`, stdout.String())
}

// TestWorkerRefusesAnUnmigratedDatabase: "worker run" on a database behind
// this build stops at once and says to run "worker migrate"; durations in
// its logs are seconds.
func TestWorkerRefusesAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	for _, url := range []string{pgtest.NewDatabaseURLAt(t, 1), pgtest.EmptyDatabaseURL(t)} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"run", "--database-url", url, "--metrics-addr", "127.0.0.1:0", "--lease-ttl", "3s", "--lease-renew-every", "1s"}, &stdout, &stderr)
		require.Equal(t, cli.ExitInfra, code, stderr.String())
		require.Contains(t, stderr.String(), "run `worker migrate` first")
	}
}

func TestDurationsAreLoggedInSeconds(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	g := cli.Globals{LogFormat: "json", LogLevel: "info"}
	g.Logger(&buf).Info("x", "lease_ttl", 3*time.Second, "grace_seconds", 1500*time.Millisecond, "n", 2)
	var entry map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &entry))
	require.Equal(t, 3.0, entry["lease_ttl_seconds"])
	require.Equal(t, 1.5, entry["grace_seconds"])
	require.Equal(t, 2.0, entry["n"])
	require.NotContains(t, entry, "lease_ttl")
}
