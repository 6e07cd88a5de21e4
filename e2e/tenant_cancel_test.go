package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestTenantCancelsItsParkedBatchOnThePublicPort: enqueue serve with two
// tenant tokens and an operator token. Tenant A's folder is held by a
// parked batch: its re-import answers 409 naming "parked"; B's token gets
// 404 on the cancel; A's token cancels it on the public port (cancelled_by
// tenant:acme) and imports the folder again (a new batch). The operator
// token is still refused on the public port (its cancel is the admin
// listener's).
func TestTenantCancelsItsParkedBatchOnThePublicPort(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	mint := func(tenant string) (token, line string) {
		t.Helper()
		out, code := runEnqueue(t, dbURL, "token", "mint", "--tenant-id", tenant)
		require.Equal(t, 0, code, out)
		o := outcome(t, out)
		return o["token"].(string), o["line"].(string)
	}
	tokA, lineA := mint("acme")
	tokB, lineB := mint("globex")
	path := filepath.Join(t.TempDir(), "tenant-tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"+lineB+"\n"), 0o600))
	operatorFile := filepath.Join(t.TempDir(), "operator-token")
	require.NoError(t, os.WriteFile(operatorFile, []byte("op-s3cr3t\n"), 0o600))
	_, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=import-tok"}, "--operator-token-file", operatorFile,
		"--tenant-tokens-file", path, "--tenant-tokens-reload", "1s")
	folder := map[string]any{"folder": "s3://fleet-uploads/tenants/acme/db_acme/company-1/upload-1"}

	status, body := postJSON(t, base+"/v1/imports", tokA, folder)
	require.Equal(t, http.StatusAccepted, status, body)
	id := int64(body["batch_id"].(float64))
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET parked_at = now(), parked_reason = 'details version 0 unknown to this build' WHERE id = $1`, id)
	require.NoError(t, err)
	status, body = postJSON(t, base+"/v1/imports", tokA, folder)
	require.Equal(t, http.StatusConflict, status, body)
	require.Equal(t, "parked", body["reason"])
	require.Contains(t, body["hint"], fmt.Sprintf("POST /v1/batches/%d/cancel", id))

	cancelURL := fmt.Sprintf("%s/v1/batches/%d/cancel", base, id)
	status, body = postJSON(t, cancelURL, "op-s3cr3t", map[string]any{"tenant_id": "acme"})
	require.Equal(t, http.StatusNotFound, status, body)
	require.Equal(t, "not_served", body["outcome"], "the operators' cancel stays on the admin listener")
	status, body = postJSON(t, cancelURL, tokB, map[string]any{"reason": "not mine"})
	require.Equal(t, http.StatusNotFound, status, body)
	require.Equal(t, "not_found", body["outcome"])
	status, body = postJSON(t, cancelURL, tokA, map[string]any{"reason": "wrong upload"})
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "cancelled", body["outcome"])
	var by, reason, st string
	require.NoError(t, pool.QueryRow(ctx, `SELECT cancelled_by, cancel_reason, status FROM ingestion_batches WHERE id = $1`, id).Scan(&by, &reason, &st))
	require.Equal(t, "tenant:acme", by)
	require.Equal(t, "wrong upload", reason)
	require.Equal(t, "Failed", st)

	status, body = postJSON(t, base+"/v1/imports", tokA, folder)
	require.Equal(t, http.StatusAccepted, status, body)
	require.Greater(t, int64(body["batch_id"].(float64)), id)
}
