package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
)

// TestRunHelpDocumentsRecordLimits: the record limits are on the help page,
// with their environment variables and defaults.
func TestRunHelpDocumentsRecordLimits(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--help"}, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	for _, s := range []string{
		"--max-record-bytes", "$MAX_RECORD_BYTES", "--max-columns", "$MAX_COLUMNS",
		"--max-record-expansion=32", "$MAX_RECORD_EXPANSION",
	} {
		require.Contains(t, stdout.String(), s)
	}
}

// TestRunRefusesNonsenseRecordExpansion: --max-record-expansion (or
// MAX_RECORD_EXPANSION) outside 2..1024 is refused before anything
// connects, naming the flag, with the invalid-input exit code.
func TestRunRefusesNonsenseRecordExpansion(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"0", "1", "-5", "1025"} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"run", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--max-record-expansion=" + v}, &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, "%s: %s", v, stderr.String())
		require.Contains(t, stderr.String(), "--max-record-expansion ("+v+") must be between 2 and 1024")
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--max-record-expansion", "lots"}, &stdout, &stderr)
	require.Equal(t, cli.ExitInvalidInput, code, stderr.String())
	require.Contains(t, stderr.String(), "max_record_expansion")
}

// TestRunReadsRecordExpansionFromTheEnvironment: MAX_RECORD_EXPANSION is
// read and checked as the flag is.
func TestRunReadsRecordExpansionFromTheEnvironment(t *testing.T) {
	t.Setenv("MAX_RECORD_EXPANSION", "1")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--database-url", "postgres://nobody@127.0.0.1:1/none"}, &stdout, &stderr)
	require.Equal(t, cli.ExitInvalidInput, code, stderr.String())
	require.Contains(t, stderr.String(), "--max-record-expansion (1) must be between 2 and 1024")
}
