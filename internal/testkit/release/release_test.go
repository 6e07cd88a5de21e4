package release_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/release"
)

// TestBuildFindsACommitBuiltBefore: binaries built once are found by the
// commit's full hash, whatever name the caller gives the commit, and
// nothing is built again; a commit the repository does not hold is
// refused, naming it.
func TestBuildFindsACommitBuiltBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	repo, err := release.RepoRoot(ctx, ".")
	require.NoError(t, err)
	out, err := exec.Command("git", "-C", repo, "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	head := strings.TrimSpace(string(out))
	cache := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(cache, head), 0o755))
	for _, b := range release.Binaries {
		require.NoError(t, os.WriteFile(filepath.Join(cache, head, b), []byte("#!/bin/sh\n"), 0o755))
	}

	dir, commit, err := release.Build(ctx, release.Options{Repo: repo, Commit: head[:10], CacheDir: cache})
	require.NoError(t, err)
	require.Equal(t, head, commit)
	require.Equal(t, filepath.Join(cache, head), dir)

	_, _, err = release.Build(ctx, release.Options{Repo: repo, Commit: "0000000000000000000000000000000000000bad", CacheDir: cache})
	require.ErrorContains(t, err, `commit "0000000000000000000000000000000000000bad" is not in the history`)
	_, _, err = release.Build(ctx, release.Options{Repo: repo, Commit: "--upload-pack=x", CacheDir: cache})
	require.ErrorContains(t, err, "is not a commit")
}
