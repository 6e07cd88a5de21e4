package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/pgtest"
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
	require.Equal(t, "database schema is current: nothing to apply\n", stdout.String())
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
