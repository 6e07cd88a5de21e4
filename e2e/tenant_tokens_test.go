package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestTenantTokensThroughTheDoor: enqueue serve with a tokens file of two
// tenant tokens minted by enqueue token mint. Tenant A imports its own
// folder (202), not B's (403), and reads its batch; a token whose line is
// removed from the file stops working within the reload interval, without
// a restart. The file holds no token, and neither do the door's logs nor
// its metrics.
func TestTenantTokensThroughTheDoor(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	mint := func(tenant string) (token, line string) {
		t.Helper()
		out, code := runEnqueue(t, dbURL, "token", "mint", "--tenant-id", tenant)
		require.Equal(t, 0, code, out)
		o := outcome(t, out)
		require.Equal(t, "minted", o["outcome"])
		return o["token"].(string), o["line"].(string)
	}
	tokA, lineA := mint("acme")
	tokB, lineB := mint("globex")
	path := filepath.Join(t.TempDir(), "tenant-tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"+lineB+"\n"), 0o600))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(raw), tokA)
	require.NotContains(t, string(raw), tokB)

	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("import-token\n"), 0o600))
	serve, base := startServe(t, dbURL, nil, "--auth-token-file", tokenFile,
		"--tenant-tokens-file", path, "--tenant-tokens-reload", "1s")
	folderOf := func(tenant string) string {
		return fmt.Sprintf("s3://fleet-uploads/tenants/%s/db_%s/company-1/upload-1", tenant, tenant)
	}
	status, body := postJSON(t, base+"/v1/imports", tokA, map[string]any{"folder": folderOf("acme")})
	require.Equal(t, http.StatusAccepted, status, body)
	id := int64(body["batch_id"].(float64))
	status, body = postJSON(t, base+"/v1/imports", tokA, map[string]any{"folder": folderOf("globex")})
	require.Equal(t, http.StatusForbidden, status, body)

	get := func(tok string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/batches/%d", base, id), nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get(tokA))
	require.Equal(t, http.StatusNotFound, get(tokB), "B asking for A's batch: as a missing one")

	// A's line is removed: A's token stops working within the reload
	// interval, B's still works.
	require.NoError(t, os.WriteFile(path, []byte(lineB+"\n"), 0o600))
	removed := time.Now()
	require.Eventually(t, func() bool { return get(tokA) == http.StatusUnauthorized }, 30*time.Second, 100*time.Millisecond)
	t.Logf("a removed token refused %.1fs after the file changed (reload every 1s)", time.Since(removed).Seconds())
	require.Equal(t, http.StatusNotFound, get(tokB))

	logs := serve.logs.String()
	require.Contains(t, logs, "tenant tokens loaded")
	metrics := httpGet(t, "http://"+adminAddr(t, serve)+"/metrics")
	for _, tok := range []string{tokA, tokB} {
		require.NotContains(t, logs, tok)
		require.NotContains(t, metrics, tok)
		require.NotContains(t, logs, strings.TrimPrefix(tok, "fit_"))
	}
}
