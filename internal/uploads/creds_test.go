package uploads

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/reloadfile"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// batchStatus is the status of GET /v1/batches/999999?tenant_id=t1 (no such batch) with
// bearer: 404 for a caller the door authenticates, 401 for anyone else.
func batchStatus(t *testing.T, f *fixture, bearer string) int {
	t.Helper()
	status, _ := f.get(t, "/v1/batches/999999?tenant_id=t1", map[string]string{"Authorization": "Bearer " + bearer})
	return status
}

// TestTenantTokensFailClosed: the edit that removes tenant B's line and
// adds a malformed one (A's token pasted instead of its hash) refuses B's
// token at the next reload, keeps A's, and reports the bad line by number
// only (Reload's error, RefusedLines, Watch); a deleted file refuses every
// tenant token, not the ones last read; the file put back is applied
// again.
func TestTenantTokensFailClosed(t *testing.T) {
	t.Parallel()
	tokA, lineA, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	tokB, lineB, err := MintTenantToken("tenant-b")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"+lineB+"\n"), 0o600))
	tokens, err := LoadTenantTokens(path, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	f := newServer(t, pgtest.NewPool(t), func(c *Config) { c.TenantTokens = tokens })
	require.Equal(t, http.StatusNotFound, batchStatus(t, f, tokA))
	require.Equal(t, http.StatusNotFound, batchStatus(t, f, tokB))

	var reloads atomic.Int64
	reported := make(chan error, 10)
	firstRefused := make(chan int, 1)
	go tokens.Watch(t.Context(), 100*time.Millisecond, func(refused int, err error) {
		if reloads.Add(1) == 1 {
			firstRefused <- refused
		}
		if err != nil {
			select {
			case reported <- err:
			default: // the test reads the ones it waits for
			}
		}
	})
	require.Equal(t, 0, <-firstRefused, "reported once at start")
	// nextError is the first reload error reported that matches.
	nextError := func(match func(error) bool) error {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case err := <-reported:
				if match(err) {
					return err
				}
			case <-deadline:
				t.Fatal("no matching reload error reported")
			}
		}
	}
	var refused *RefusedLinesError
	isRefused := func(err error) bool { return errors.As(err, &refused) }

	require.NoError(t, os.WriteFile(path, []byte(lineA+"\ntenant-c "+tokA+"\n"), 0o600))
	err = nextError(isRefused)
	require.Len(t, refused.Lines, 1)
	require.Equal(t, 2, refused.Lines[0].Line)
	require.Contains(t, err.Error(), "line 2: ")
	require.NotContains(t, err.Error(), tokA, "the line's content is never reported")
	require.NotContains(t, err.Error(), strings.TrimPrefix(tokA, TenantTokenPrefix))
	require.Equal(t, 1, tokens.RefusedLines())
	require.Equal(t, http.StatusUnauthorized, batchStatus(t, f, tokB), "B's line is removed whatever else is wrong")
	require.Equal(t, http.StatusNotFound, batchStatus(t, f, tokA), "A's line stands")
	// Reported again at the next reloads, the file unchanged.
	for range 3 {
		nextError(isRefused)
	}

	require.NoError(t, os.Remove(path))
	nextError(func(err error) bool { return errors.Is(err, os.ErrNotExist) })
	require.Equal(t, http.StatusUnauthorized, batchStatus(t, f, tokA), "a deleted file refuses every tenant token")
	require.Equal(t, 0, tokens.RefusedLines())
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"+lineB+"\n"), 0o600))
	require.Eventually(t, func() bool {
		return batchStatus(t, f, tokA) == http.StatusNotFound && batchStatus(t, f, tokB) == http.StatusNotFound
	}, 10*time.Second, 20*time.Millisecond, "the file put back is applied")
	require.Positive(t, reloads.Load())

	// A door starts on a file with refused lines (the others apply), not
	// on one it cannot read.
	require.NoError(t, os.WriteFile(path, []byte("nonsense\n"+lineB+"\n"), 0o600))
	started, err := LoadTenantTokens(path, nil)
	require.NoError(t, err)
	require.Equal(t, 1, started.RefusedLines())
	tenant, ok := started.Tenant(tokB)
	require.True(t, ok)
	require.Equal(t, "tenant-b", tenant)
	_, err = LoadTenantTokens(filepath.Join(t.TempDir(), "missing"), nil)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestImportTokensRotate: two import tokens in the file, both work; the
// old one's line removed, only the new one works after the reload, on the
// same server (no restart); the new one is recognised as the import token
// by the operator routes (403, not 401); a deleted file accepts no import
// token, even with InsecureNoAuth.
func TestImportTokensRotate(t *testing.T) {
	t.Parallel()
	const oldTok, newTok = "import-token-old-1111", "import-token-new-2222"
	path := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(path, []byte(oldTok+"\n"), 0o600))
	set, err := reloadfile.LoadSecrets(path, "--auth-token-file", nil)
	require.NoError(t, err)
	f := newServer(t, pgtest.NewPool(t), func(c *Config) { c.AuthToken, c.ImportTokens, c.InsecureNoAuth = "", set, true })
	require.Equal(t, http.StatusNotFound, batchStatus(t, f, oldTok))
	require.Equal(t, http.StatusUnauthorized, batchStatus(t, f, newTok))

	require.NoError(t, os.WriteFile(path, []byte("# rotation\n"+oldTok+"\n"+newTok+"\n"), 0o600))
	require.NoError(t, set.Reload())
	require.Equal(t, http.StatusNotFound, batchStatus(t, f, oldTok))
	require.Equal(t, http.StatusNotFound, batchStatus(t, f, newTok))
	status, out := f.post(t, "/v1/imports", "application/json", []byte(`{"folder":"`+tenantFolder("t1", "rotated/1")+`"}`), map[string]string{"Authorization": "Bearer " + newTok})
	require.Equal(t, http.StatusAccepted, status, out)

	require.NoError(t, os.WriteFile(path, []byte(newTok+"\n"), 0o600))
	require.NoError(t, set.Reload())
	require.Equal(t, http.StatusUnauthorized, batchStatus(t, f, oldTok), "the old token is refused once its line is gone")
	require.Equal(t, http.StatusNotFound, batchStatus(t, f, newTok))
	status, out = f.post(t, "/v1/batches/1/cancel", "application/json", []byte(`{"reason":"x"}`), map[string]string{"Authorization": "Bearer " + newTok})
	require.Equal(t, http.StatusForbidden, status, "the operator routes know the new import token: %v", out)

	require.NoError(t, os.Remove(path))
	require.Error(t, set.Reload())
	require.Equal(t, http.StatusUnauthorized, batchStatus(t, f, newTok), "a deleted file accepts no import token")
	require.Equal(t, http.StatusUnauthorized, batchStatus(t, f, ""), "InsecureNoAuth does not open a configured, empty set")
}

// TestHMACSecretsRotate: a signature by either of two secrets in the file
// is accepted; the old secret's line removed, only the new one's are,
// without a new server; a file with no secret accepts no signature.
func TestHMACSecretsRotate(t *testing.T) {
	t.Parallel()
	oldSecret, newSecret := []byte("hmac-secret-old"), []byte("hmac-secret-new")
	path := filepath.Join(t.TempDir(), "hmac")
	require.NoError(t, os.WriteFile(path, append(oldSecret, '\n'), 0o600))
	set, err := reloadfile.LoadSecrets(path, "--hmac-secret-file", nil)
	require.NoError(t, err)
	f := newServer(t, pgtest.NewPool(t), func(c *Config) { c.HMACSecret, c.HMACSecrets = nil, set })
	n := 0
	post := func(secret []byte) int {
		t.Helper()
		n++ // a new body each time: a signature is accepted once
		body := s3Event("fleet-bucket", fmt.Sprintf("tenants/t1/db/c1/rotation/%d/_SUCCESS", n), "ObjectRemoved:Delete")
		sig, ts := Sign(secret, body, time.Now())
		status, out := f.post(t, "/v1/events/s3", "application/json", body, map[string]string{SignatureHeader: sig, TimestampHeader: ts})
		if status != http.StatusUnauthorized {
			require.Equal(t, http.StatusOK, status, out)
		}
		return status
	}
	require.Equal(t, http.StatusOK, post(oldSecret))
	require.Equal(t, http.StatusUnauthorized, post(newSecret))

	require.NoError(t, os.WriteFile(path, []byte(string(oldSecret)+"\n"+string(newSecret)+"\n"), 0o600))
	require.NoError(t, set.Reload())
	require.Equal(t, http.StatusOK, post(oldSecret))
	require.Equal(t, http.StatusOK, post(newSecret))

	require.NoError(t, os.WriteFile(path, []byte(string(newSecret)+"\n"), 0o600))
	require.NoError(t, set.Reload())
	require.Equal(t, http.StatusUnauthorized, post(oldSecret), "the old secret's signatures are refused once its line is gone")
	require.Equal(t, http.StatusOK, post(newSecret))

	require.NoError(t, os.WriteFile(path, []byte("# emptied\n"), 0o600))
	require.ErrorIs(t, set.Reload(), reloadfile.ErrNoSecret)
	require.Equal(t, http.StatusUnauthorized, post(newSecret), "a file without a secret accepts no signature")
}

// TestCredentialSetsAreValidated: a set and a fixed value of one
// credential are refused together, and the operator token may be none of
// the import tokens or HMAC secrets in force.
func TestCredentialSetsAreValidated(t *testing.T) {
	t.Parallel()
	two := fixedSet{[]byte("import-a"), []byte(operatorToken)}
	for name, c := range map[string]Config{
		"token and set":          {AuthToken: token, ImportTokens: two},
		"secret and set":         {AuthToken: token, HMACSecret: secret, HMACSecrets: two},
		"operator among imports": {ImportTokens: two, OperatorToken: operatorToken},
		"operator among secrets": {AuthToken: token, HMACSecrets: two, OperatorToken: operatorToken},
	} {
		require.Error(t, c.Validate(), name)
	}
	require.NoError(t, Config{ImportTokens: two, HMACSecrets: two, OperatorToken: "another-operator-token"}.Validate())
}

// fixedSet is a set of values that never changes.
type fixedSet [][]byte

func (s fixedSet) Current() [][]byte { return s }
