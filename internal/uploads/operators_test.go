package uploads

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// TestOperatorTokensFile: named hashes, one per line; a token's operator
// is the name of its line; a malformed line is refused by its number
// (never its content) while the others apply; the former format (the
// token itself) is operator "operator".
func TestOperatorTokensFile(t *testing.T) {
	t.Parallel()
	tokA, lineA, err := MintOperatorToken("alice")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(tokA, OperatorTokenPrefix))
	require.Equal(t, OperatorTokenLine("alice", tokA), lineA)
	_, _, err = MintOperatorToken("bad name")
	require.Error(t, err)

	raw := "# ops\n" + lineA + "\n" + OperatorTokenLine("bob", "bob-tok") + "\n" +
		"carol pasted-a-token-instead\n" + // a token pasted for its hash
		"dave sha256:abc\n" + OperatorTokenLine("alice", tokA) + "\n" + "eve\n"
	tokens, errs, legacy := ParseOperatorTokens([]byte(raw))
	require.False(t, legacy)
	require.Len(t, tokens, 2)
	require.Len(t, errs, 4)
	for i, line := range []string{"line 4:", "line 5:", "line 6: the same token hash as line 2", "line 7:"} {
		require.Contains(t, errs[i].Error(), line)
		require.NotContains(t, errs[i].Error(), "pasted-a-token-instead", "never the line's content")
	}

	tokens, errs, legacy = ParseOperatorTokens([]byte("\n  old-shared-token \n"))
	require.True(t, legacy)
	require.Empty(t, errs)
	o := &OperatorTokens{tokens: tokens}
	name, ok := o.Operator("old-shared-token")
	require.True(t, ok)
	require.Equal(t, LegacyOperatorName, name)
}

// TestOperatorTokensRotate: two tokens of an operator in the file, both
// open; the old line removed, only the new one, at the next reload; a
// malformed line added meanwhile does not keep the removed one; a missing
// file opens nothing.
func TestOperatorTokensRotate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "operators")
	write := func(lines ...string) {
		require.NoError(t, os.WriteFile(path+".new", []byte(strings.Join(lines, "\n")+"\n"), 0o600))
		require.NoError(t, os.Rename(path+".new", path))
	}
	logs := &testproc.SyncBuffer{}
	write(OperatorTokenLine("alice", "old"), OperatorTokenLine("alice-2", "new"))
	o, err := LoadOperatorTokens(path, slog.New(slog.NewJSONHandler(logs, nil)))
	require.NoError(t, err)
	who := func(token string) string { name, _ := o.Operator(token); return name }
	require.Equal(t, "alice", who("old"))
	require.Equal(t, "alice-2", who("new"))
	require.Equal(t, "", who("other"))
	require.Equal(t, "", who(""))

	write(OperatorTokenLine("alice-2", "new"), "not a line")
	err = o.Reload()
	require.ErrorContains(t, err, "line 2")
	require.Equal(t, "", who("old"), "a removed line stops working, whatever else is wrong")
	require.Equal(t, "alice-2", who("new"))

	// Watch applies it without a call, and counts what was wrong.
	failures := make(chan struct{}, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go o.Watch(ctx, 50*time.Millisecond, func() {
		select {
		case failures <- struct{}{}:
		default:
		}
	})
	<-failures // the malformed line, still there
	require.NoError(t, os.Remove(path))
	require.Eventually(t, func() bool { return who("new") == "" }, 10*time.Second, 20*time.Millisecond, "a missing file opens nothing")
	write(OperatorTokenLine("bob", "bobs"))
	require.Eventually(t, func() bool { return who("bobs") == "bob" }, 10*time.Second, 20*time.Millisecond)
	require.NotContains(t, logs.String(), `"new"`)

	_, err = LoadOperatorTokens(filepath.Join(t.TempDir(), "missing"), nil)
	require.Error(t, err, "a door does not start without the file it was given")
	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, []byte("# nobody\n"), 0o600))
	_, err = LoadOperatorTokens(empty, nil)
	require.ErrorContains(t, err, "no operator token")
}

// TestOperatorOnlyPassesTheOperatorOn: the handler behind OperatorOnly
// learns which operator the token names (OperatorOf), whatever Basic user
// name the browser sent.
func TestOperatorOnlyPassesTheOperatorOn(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "operators")
	require.NoError(t, os.WriteFile(path, []byte(OperatorTokenLine("alice", "alice-tok")+"\n"), 0o600))
	ops, err := LoadOperatorTokens(path, nil)
	require.NoError(t, err)
	s, err := New(Config{Enqueuer: &jobs.Enqueuer{}, AuthToken: token, OperatorTokens: ops})
	require.NoError(t, err)
	var got string
	h := s.OperatorOnly("test", http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got, _ = OperatorOf(r.Context()) }))
	req := httptest.NewRequest(http.MethodGet, "/riverui/", nil)
	req.SetBasicAuth("mallory", "alice-tok")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "alice", got)

	req = httptest.NewRequest(http.MethodGet, "/riverui/", nil)
	req.SetBasicAuth("alice", token)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code, "the import token never opens it")

	_, err = New(Config{Enqueuer: &jobs.Enqueuer{}, AuthToken: "alice-tok", OperatorTokens: ops})
	require.ErrorContains(t, err, "the operator token must differ from the import token")
}
