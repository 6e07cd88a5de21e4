package reloadfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/secretmount"
)

// A File of NewFailClosed holds its closed value until read and whenever
// its file cannot be read; takes a parse's partial value with its error,
// reporting the error at every reload until the file changes; and calls
// loaded once per change.
func TestFailClosedFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "f")
	write := func(s string) { require.NoError(t, os.WriteFile(path, []byte(s), 0o600)) }
	// Lines; a line "bad" is refused, the others kept.
	parse := func(raw []byte) ([]string, error) {
		var good []string
		var refused []string
		for i, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			if l == "bad" {
				refused = append(refused, fmt.Sprint("line ", i+1))
				continue
			}
			good = append(good, l)
		}
		if refused != nil {
			return good, errors.New(strings.Join(refused, ", ") + " refused")
		}
		return good, nil
	}
	var loads int
	f := NewFailClosed(path, "test file", []string{}, parse, func([]string) { loads++ })
	require.Equal(t, []string{}, f.Current(), "closed before the first read")
	err := f.Reload()
	require.ErrorIs(t, err, os.ErrNotExist)
	require.True(t, strings.HasPrefix(err.Error(), "test file: "), err)

	write("a\nb\n")
	require.NoError(t, f.Reload())
	require.Equal(t, []string{"a", "b"}, f.Current())

	// b removed, a bad line added: b is out at once, a stays.
	write("a\nbad\n")
	for range 3 {
		require.EqualError(t, f.Reload(), "line 2 refused", "reported at every reload while unchanged")
		require.Equal(t, []string{"a"}, f.Current())
	}
	require.Equal(t, 2, loads, "loaded once per change")

	require.NoError(t, os.Remove(path))
	require.ErrorIs(t, f.Reload(), os.ErrNotExist)
	require.Equal(t, []string{}, f.Current(), "a missing file grants nothing, not the values last read")
	require.NoError(t, os.WriteFile(path, nil, 0o000))
	if f.Reload() != nil { // root reads any file
		require.Equal(t, []string{}, f.Current(), "an unreadable file grants nothing")
	}
	require.NoError(t, os.Remove(path))
	write("a\nbad\n")
	require.Error(t, f.Reload())
	require.Equal(t, []string{"a"}, f.Current(), "the same content again after a missing file is read again")
}

// Secrets: every value of the file is current (old and new during a
// rotation); a removed line is no longer current at the next reload; a
// file with no value or none at all fails closed; comments and blank
// lines are skipped; an update by a Kubernetes symlink swap and one
// written in place are both seen; errors never hold a value.
func TestSecretsRotateAndFailClosed(t *testing.T) {
	t.Parallel()
	const oldV, newV = "old-secret-value", "new-secret-value"
	m := secretmount.New(t, map[string]string{"token": oldV + "\n"})
	var loaded []int
	s, err := LoadSecrets(m.Path("token"), "import token file", func(n int) { loaded = append(loaded, n) })
	require.NoError(t, err)
	values := func() []string {
		var out []string
		for _, v := range s.Current() {
			out = append(out, string(v))
		}
		return out
	}
	require.Equal(t, []string{oldV}, values())

	m.Update(map[string]string{"token": "# rotation: new first, old until the clients moved\n" + newV + "\n\n  " + oldV + "  \n"})
	require.NoError(t, s.Reload())
	require.Equal(t, []string{newV, oldV}, values())
	m.Update(map[string]string{"token": newV + "\n"})
	require.NoError(t, s.Reload())
	require.Equal(t, []string{newV}, values(), "the old value is gone at the next reload")

	// Written in place, through the symlinks.
	m.WriteInPlace("token", "# nothing yet\n\n")
	err = s.Reload()
	require.ErrorIs(t, err, ErrNoSecret)
	require.Empty(t, values(), "a file without a value grants nothing")
	require.NotContains(t, err.Error(), newV)
	m.WriteInPlace("token", newV)
	require.NoError(t, s.Reload())
	require.Equal(t, []string{newV}, values())

	m.Update(map[string]string{"other-key": "x"}) // the key removed from the Secret
	require.ErrorIs(t, s.Reload(), os.ErrNotExist)
	require.Empty(t, values(), "a missing file grants nothing")
	require.Equal(t, []int{1, 2, 1, 1}, loaded)

	_, err = LoadSecrets(filepath.Join(t.TempDir(), "none"), "hmac secret file", nil)
	require.ErrorIs(t, err, os.ErrNotExist)
	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n# only a comment\n"), 0o600))
	_, err = LoadSecrets(empty, "hmac secret file", nil)
	require.ErrorIs(t, err, ErrNoSecret)
	require.Contains(t, err.Error(), "hmac secret file "+empty)

	var none *Secrets
	require.Empty(t, none.Current())
	require.ErrorIs(t, none.Reload(), ErrNoFile)
	require.Equal(t, "", none.Path())
}
