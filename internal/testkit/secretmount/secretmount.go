// Package secretmount lays out a directory as the kubelet mounts a
// Kubernetes Secret, for tests of files read again while they change.
//
// Each key is a symlink <dir>/<key> -> ..data/<key>; ..data is a symlink to
// a timestamped directory holding the files. Update writes a new timestamped
// directory and renames a new ..data symlink over the old one, atomically:
// a reader opening <dir>/<key> sees the old file or the new one, never a
// mix, and a key the update no longer holds dangles (the file is gone).
// It does not emulate the kubelet's delay (about a minute) nor its removal
// of the old directory, which a reader holding an open file would survive.
package secretmount

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Mount is a Secret mounted in a test's temporary directory.
type Mount struct {
	t       testing.TB
	dir     string
	version int
	keys    map[string]bool
}

// New mounts files (key to content) in a new temporary directory.
func New(t testing.TB, files map[string]string) *Mount {
	t.Helper()
	m := &Mount{t: t, dir: t.TempDir(), keys: map[string]bool{}}
	m.Update(files)
	return m
}

// Path is the file of key, as a pod reads it.
func (m *Mount) Path(key string) string { return filepath.Join(m.dir, key) }

// Update replaces the Secret's data with files, as kubectl apply of the
// Secret and the kubelet's next sync do: the keys of files are swapped in
// at once, and keys no longer in files are gone.
func (m *Mount) Update(files map[string]string) {
	m.t.Helper()
	m.version++
	version := fmt.Sprintf("..2026_12_06_03_00_00.%06d", m.version)
	require.NoError(m.t, os.Mkdir(filepath.Join(m.dir, version), 0o755))
	for key, content := range files {
		require.NoError(m.t, os.WriteFile(filepath.Join(m.dir, version, key), []byte(content), 0o600))
		if !m.keys[key] {
			require.NoError(m.t, os.Symlink(filepath.Join("..data", key), m.Path(key)))
			m.keys[key] = true
		}
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	require.NoError(m.t, os.Symlink(version, tmp))
	require.NoError(m.t, os.Rename(tmp, filepath.Join(m.dir, "..data")))
}

// WriteInPlace rewrites key's file where it is, through its symlinks (an
// editor or a configuration tool that does not swap files).
func (m *Mount) WriteInPlace(key, content string) {
	m.t.Helper()
	require.NoError(m.t, os.WriteFile(m.Path(key), []byte(content), 0o600))
}
