// Package release builds the binaries of an earlier commit of this
// repository, for tests that run two releases side by side (a rolling
// upgrade: workers and doors of both, on today's schema).
//
// The commit's tree is taken from git (git archive, so the working tree and
// its uncommitted changes play no part) and built with the go command of
// the test (GOTOOLCHAIN=local), its module cache and build cache, and
// GOFLAGS=-mod=mod: the commit's go.sum may lack what its go.mod asks of a
// module cache filled by a newer go.mod, and the module proxy is asked for
// what the cache lacks.
// The binaries are cached under a directory named by the full commit hash,
// so a second run finds them and builds nothing; a build is made in a
// directory of its own and renamed into place whole, so two test processes
// building the same commit at once cannot see half of one.
//
// The repository must hold the commit: a shallow clone may not (git fetch
// --unshallow, or a clone with the history).
package release

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries are the commands Build builds, in the directory it returns.
var Binaries = []string{"worker", "enqueue"}

// Options says what to build and where to keep it.
type Options struct {
	// Repo is a directory of the git repository that holds Commit.
	Repo string
	// Commit names the commit (a hash, a prefix of one, a tag: anything
	// git rev-parse takes).
	Commit string
	// CacheDir holds the built binaries, one directory per commit.
	// Defaults to fleet-ingest/releases under os.UserCacheDir().
	CacheDir string
}

// Build returns the directory holding the worker and enqueue binaries of
// o.Commit, building them first unless an earlier Build did, and the full
// hash of the commit.
func Build(ctx context.Context, o Options) (dir, commit string, err error) {
	if commit, err = resolve(ctx, o.Repo, o.Commit); err != nil {
		return "", "", err
	}
	cache := o.CacheDir
	if cache == "" {
		user, err := os.UserCacheDir()
		if err != nil {
			return "", "", fmt.Errorf("release: no cache directory: %w", err)
		}
		cache = filepath.Join(user, "fleet-ingest", "releases")
	}
	dir = filepath.Join(cache, commit)
	if built(dir) {
		return dir, commit, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", "", fmt.Errorf("release: %w", err)
	}
	work, err := os.MkdirTemp(cache, commit+".building-")
	if err != nil {
		return "", "", fmt.Errorf("release: %w", err)
	}
	defer os.RemoveAll(work)
	src, bin := filepath.Join(work, "src"), filepath.Join(work, "bin")
	if err := os.Mkdir(src, 0o755); err != nil {
		return "", "", fmt.Errorf("release: %w", err)
	}
	if err := extract(ctx, o.Repo, commit, src); err != nil {
		return "", "", err
	}
	args := []string{"build", "-o", bin + string(filepath.Separator),
		"-ldflags", "-X github.com/fleet/ingest/internal/buildinfo.version=" + commit[:12]}
	for _, b := range Binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, goCommand(), args...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("release: building %s at %s: %w\n%s", strings.Join(Binaries, " and "), commit[:12], err, out)
	}
	if err := os.Rename(bin, dir); err != nil && !built(dir) {
		return "", "", fmt.Errorf("release: %w", err)
	}
	return dir, commit, nil
}

// resolve returns the full hash of the commit rev names in repo.
func resolve(ctx context.Context, repo, rev string) (string, error) {
	if rev == "" || strings.HasPrefix(rev, "-") {
		return "", fmt.Errorf("release: %q is not a commit", rev)
	}
	out, err := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "--verify", "--quiet", rev+"^{commit}").Output()
	if err != nil {
		shallow, _ := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "--is-shallow-repository").Output()
		hint := ""
		if strings.TrimSpace(string(shallow)) == "true" {
			hint = " (the clone is shallow: git fetch --unshallow)"
		}
		return "", fmt.Errorf("release: commit %q is not in the history of %s%s", rev, repo, hint)
	}
	return strings.TrimSpace(string(out)), nil
}

// extract writes the tree of commit into dir.
func extract(ctx context.Context, repo, commit, dir string) error {
	archive := exec.CommandContext(ctx, "git", "-C", repo, "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	var archiveErr, untarErr bytes.Buffer
	archive.Stderr, untar.Stderr, untar.Stdin = &archiveErr, &untarErr, pipe
	if err := archive.Start(); err != nil {
		return fmt.Errorf("release: git archive: %w", err)
	}
	if err := untar.Run(); err != nil {
		_ = archive.Wait()
		return fmt.Errorf("release: extracting %s: %w: %s", commit[:12], err, untarErr.String())
	}
	if err := archive.Wait(); err != nil {
		return fmt.Errorf("release: git archive %s: %w: %s", commit[:12], err, archiveErr.String())
	}
	return nil
}

// built reports whether dir holds every binary.
func built(dir string) bool {
	for _, b := range Binaries {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// goCommand is the go command of the running toolchain, else "go".
func goCommand() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// RepoRoot returns the top directory of the git repository holding dir.
func RepoRoot(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", dir, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("release: %s is not in a git repository: %w", dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}
