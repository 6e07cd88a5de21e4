package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
)

// TestREADMEDocumentsEveryFlag: every flag worker's --help shows is named
// in the README (as --flag, in a table, a list or a command line), so the README's flag tables and lists do
// not drift from the binary.
func TestREADMEDocumentsEveryFlag(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	readme := string(raw)
	flags, err := cli.Flags(&workerCLI{}, "worker")
	require.NoError(t, err)
	require.Greater(t, len(flags), 25)
	var missing []string
	for _, f := range flags {
		if !cli.NamesFlag(readme, f.Name) {
			missing = append(missing, "worker "+f.Command+" --"+f.Name)
		}
	}
	require.Empty(t, missing, "flags --help shows that README.md does not name")
}
