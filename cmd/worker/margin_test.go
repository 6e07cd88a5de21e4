package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
)

// TestRunRefusesANonsenseLeaseSafetyMargin: --lease-safety-margin that is
// negative, or not shorter than --lease-ttl minus --lease-renew-every (a
// lease renewed on time would reach it), is refused before anything
// connects, naming the flag, with the invalid-input exit code; the help
// page documents it with its environment variable.
func TestRunRefusesANonsenseLeaseSafetyMargin(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--lease-safety-margin=-1s"},
		{"--lease-safety-margin=20s"}, // the defaults: 30s − 10s
		{"--lease-safety-margin=25s"},
		{"--lease-ttl=3s", "--lease-renew-every=1s", "--lease-safety-margin=2s"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"run", "--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...), &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, "%v: %s", args, stderr.String())
		require.Contains(t, stderr.String(), "--lease-safety-margin (", "%v", args)
	}
	for _, args := range [][]string{
		{"--lease-safety-margin=19s"},
		{"--lease-ttl=3s", "--lease-renew-every=1s", "--lease-safety-margin=1500ms"},
		{"--lease-ttl=3s", "--lease-renew-every=1s"}, // the default: 300ms
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"run", "--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...), &stdout, &stderr)
		require.NotEqual(t, cli.ExitInvalidInput, code, "%v: %s", args, stderr.String())
		require.NotContains(t, stderr.String(), "--lease-safety-margin", "%v", args)
	}
	var stdout, stderr bytes.Buffer
	require.Equal(t, cli.ExitOK, run(context.Background(), []string{"run", "--help"}, &stdout, &stderr), stderr.String())
	require.Contains(t, stdout.String(), "--lease-safety-margin")
	require.Contains(t, stdout.String(), "$LEASE_SAFETY_MARGIN")
}

// TestRunReadsTheLeaseSafetyMarginFromTheEnvironment: LEASE_SAFETY_MARGIN
// is read and checked as the flag is. (t.Setenv: not parallel.)
func TestRunReadsTheLeaseSafetyMarginFromTheEnvironment(t *testing.T) {
	t.Setenv("LEASE_SAFETY_MARGIN", "20s")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--database-url", "postgres://nobody@127.0.0.1:1/none"}, &stdout, &stderr)
	require.Equal(t, cli.ExitInvalidInput, code, stderr.String())
	require.Contains(t, stderr.String(), "--lease-safety-margin (20s) must be at least 0 and shorter than --lease-ttl minus --lease-renew-every (20s)")
}
