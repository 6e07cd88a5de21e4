package uploads

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestTenantTokensFileHoldsHashesOnly: the tokens file names a token by
// its SHA-256; a line holding anything else — a token pasted by mistake,
// above all — is refused naming the line, never its content, and the
// other lines stand; a hash may appear once (twice for two tenants: every
// line of it is refused); a tenant may have two tokens (rotation).
func TestTenantTokensFileHoldsHashesOnly(t *testing.T) {
	t.Parallel()
	tokA, lineA, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(tokA, TenantTokenPrefix))
	require.NotContains(t, lineA, tokA)
	tokA2, lineA2, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	require.NotEqual(t, tokA, tokA2)

	check := CheckTenantTokens([]byte("# tenants\n\n" + lineA + "\n" + lineA2 + "\n"))
	require.Equal(t, TenantTokensCheck{Tokens: 2, Tenants: 1}, check)

	for name, tc := range map[string]struct {
		file    string
		refused []int
		tokens  int
	}{
		"a token instead of its hash":   {lineA2 + "\ntenant-a " + tokA + "\n", []int{2}, 1},
		"a short hash":                  {"tenant-a sha256:abcd\n" + lineA, []int{1}, 1},
		"a bad tenant id":               {"-tenant sha256:" + strings.Repeat("0", 64) + "\n", []int{1}, 0},
		"three fields":                  {lineA + " extra\n", []int{1}, 0},
		"a hash twice, one tenant":      {lineA + "\n" + lineA2 + "\n" + lineA + "\n", []int{3}, 2},
		"a hash twice, two tenants":     {lineA + "\n" + lineA2 + "\n" + strings.Replace(lineA, "tenant-a", "tenant-b", 1) + "\n", []int{1, 3}, 1},
		"CRLF line ends, a bad one too": {lineA + "\r\nnonsense\r\n", []int{2}, 1},
	} {
		check := CheckTenantTokens([]byte(tc.file))
		var lines []int
		for _, r := range check.Refused {
			lines = append(lines, r.Line)
			require.NotContains(t, r.Reason, tokA, "%s: the reason never repeats the line", name)
			require.NotContains(t, r.String(), strings.TrimPrefix(tokA, TenantTokenPrefix), name)
		}
		require.Equal(t, tc.refused, lines, name)
		require.Equal(t, tc.tokens, check.Tokens, name)
	}
	_, _, err = MintTenantToken("no/slash")
	require.Error(t, err)
}

// TestTenantTokensScopeImportsAndReads: with tenant tokens A and B, A
// imports its own folder (202) and not B's (403, nothing written), reads
// its batch with or without naming its tenant, and gets for B's batch the
// same 404 as for a missing one; the event route does not take a tenant
// token; a token removed from the file stops working once it is read
// again (creds_test.go: whatever else is wrong with the file).
func TestTenantTokensScopeImportsAndReads(t *testing.T) {
	t.Parallel()
	tokA, lineA, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	tokB, lineB, err := MintTenantToken("tenant-b")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"+lineB+"\n"), 0o600))
	tokens, err := LoadTenantTokens(path, nil)
	require.NoError(t, err)
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.TenantTokens = tokens })
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	get := func(path, tok string) (int, string) {
		t.Helper()
		status, raw := f.get(t, path, bearer(tok))
		var body map[string]any
		require.NoError(t, json.Unmarshal(raw, &body), string(raw))
		norm, _ := json.Marshal(body)
		return status, string(norm)
	}

	status, out := f.post(t, "/v1/imports", "application/json", []byte(`{"folder":"`+tenantFolder("tenant-a", "up/1")+`"}`), bearer(tokA))
	require.Equal(t, http.StatusAccepted, status, out)
	idA := strconv.FormatInt(int64(out["batch_id"].(float64)), 10)
	status, out = f.post(t, "/v1/imports", "application/json", []byte(`{"folder":"`+tenantFolder("tenant-b", "up/1")+`"}`), bearer(tokA))
	require.Equal(t, http.StatusForbidden, status, out)
	require.Equal(t, "tenant_id", out["field"])
	require.Equal(t, 1, count(t, pool), "nothing written for B's folder")
	status, out = f.post(t, "/v1/imports", "application/json", []byte(`{"folder":"`+tenantFolder("tenant-b", "up/2")+`"}`), bearer(tokB))
	require.Equal(t, http.StatusAccepted, status, out)
	idB := strconv.FormatInt(int64(out["batch_id"].(float64)), 10)

	status, body := get("/v1/batches/"+idA, tokA)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, `"tenant_id":"tenant-a"`)
	status, _ = get("/v1/batches/"+idA+"?tenant_id=tenant-a", tokA)
	require.Equal(t, http.StatusOK, status)
	statusOther, bodyOther := get("/v1/batches/"+idB, tokA)
	statusMissing, bodyMissing := get("/v1/batches/999999", tokA)
	require.Equal(t, http.StatusNotFound, statusOther)
	require.Equal(t, statusMissing, statusOther)
	require.Equal(t, bodyMissing, bodyOther, "another tenant's batch answers exactly as a missing one")
	status, _ = get("/v1/batches/"+idB+"?tenant_id=tenant-b", tokA)
	require.Equal(t, http.StatusNotFound, status, "naming the other tenant does not help")

	status, _ = f.post(t, "/v1/events/s3", "application/json", []byte(`{"Records":[]}`), bearer(tokA))
	require.Equal(t, http.StatusUnauthorized, status, "the event route takes no tenant token")

	// B's token is removed from the file.
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"), 0o600))
	require.NoError(t, tokens.Reload())
	status, _ = get("/v1/batches/"+idB, tokB)
	require.Equal(t, http.StatusUnauthorized, status)
	status, _ = get("/v1/batches/"+idA, tokA)
	require.Equal(t, http.StatusOK, status)
}
