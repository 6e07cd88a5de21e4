package uploads

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestBatchAnswerRefusesBadInputAndOtherTenants: GET /v1/batches/{id}
// answers the batch of the tenant it names with the import token; a wrong
// token 401, a bad id or tenant id 422 naming the field, another tenant's
// batch or none 404 — each counted under route batch.
func TestBatchAnswerRefusesBadInputAndOtherTenants(t *testing.T) {
	t.Parallel()
	f := newServer(t, pgtest.NewPool(t), nil)
	status, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "up/b1")), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	id := strconv.FormatInt(int64(out["batch_id"].(float64)), 10)

	get := func(path string, hdr map[string]string) (int, map[string]any) {
		t.Helper()
		status, raw := f.get(t, path, hdr)
		var body map[string]any
		require.NoError(t, json.Unmarshal(raw, &body), string(raw))
		return status, body
	}
	status, body := get("/v1/batches/"+id+"?tenant_id=tenant-a", auth)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "Running", body["status"])
	require.Equal(t, "reserved", body["phase"])
	require.Equal(t, "tenant-a", body["tenant_id"])

	status, _ = get("/v1/batches/"+id+"?tenant_id=tenant-a", map[string]string{"Authorization": "Bearer wrong"})
	require.Equal(t, http.StatusUnauthorized, status)
	status, body = get("/v1/batches/x?tenant_id=tenant-a", auth)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "batch_id", body["field"])
	status, body = get("/v1/batches/"+id, auth)
	require.Equal(t, http.StatusUnprocessableEntity, status, "the tenant is required")
	require.Equal(t, "tenant_id", body["field"])
	status, _ = get("/v1/batches/"+id+"?tenant_id=tenant-b", auth)
	require.Equal(t, http.StatusNotFound, status)
	status, _ = get("/v1/batches/999999?tenant_id=tenant-a", auth)
	require.Equal(t, http.StatusNotFound, status)

	require.Equal(t, 1.0, testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeBatch, "found")))
	require.Equal(t, 2.0, testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeBatch, "not_found")))
	require.Equal(t, 2.0, testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeBatch, "invalid")))
}

// TestBatchPagesThroughTheDoor: GET /v1/batches pages a tenant's batches
// newest first with a cursor, by folder with the folder's last Succeeded
// batch; a tenant token lists its own tenant only; bad parameters are 422
// naming the field.
func TestBatchPagesThroughTheDoor(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	tokA, lineA, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"), 0o600))
	tokens, err := LoadTenantTokens(path, nil)
	require.NoError(t, err)
	f := newServer(t, pool, func(c *Config) { c.TenantTokens = tokens })
	var ids []int64
	for i := range 5 {
		status, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", fmt.Sprintf("up/%d", i))), auth)
		require.Equal(t, http.StatusAccepted, status, out)
		ids = append(ids, int64(out["batch_id"].(float64)))
	}
	status, _ := f.post(t, "/v1/imports", "application/json", importBody("tenant-b", tenantFolder("tenant-b", "up/0")), auth)
	require.Equal(t, http.StatusAccepted, status)
	_, err = pool.Exec(context.Background(), `UPDATE ingestion_batches SET status = 'Succeeded', completed_at = now() WHERE id = $1`, ids[1])
	require.NoError(t, err)

	list := func(query, token string) (int, BatchPage, map[string]any) {
		t.Helper()
		status, raw := f.get(t, "/v1/batches?"+query, map[string]string{"Authorization": "Bearer " + token})
		var page BatchPage
		var m map[string]any
		require.NoError(t, json.Unmarshal(raw, &page))
		require.NoError(t, json.Unmarshal(raw, &m))
		return status, page, m
	}
	var got []int64
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		status, page, _ := list("limit=2&cursor="+cursor, tokA)
		require.Equal(t, http.StatusOK, status)
		for _, b := range page.Batches {
			require.Equal(t, "tenant-a", b.TenantID)
			got = append(got, b.BatchID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []int64{ids[4], ids[3], ids[2], ids[1], ids[0]}, got, "every batch of the tenant once, newest first")

	status, page, _ := list("tenant_id=tenant-a&folder="+url.QueryEscape(tenantFolder("tenant-a", "up/1")), token)
	require.Equal(t, http.StatusOK, status)
	require.Len(t, page.Batches, 1)
	require.Equal(t, ids[1], page.LastSucceededBatchID)
	status, page, _ = list("tenant_id=tenant-a&status=Succeeded", token)
	require.Equal(t, http.StatusOK, status)
	require.Len(t, page.Batches, 1)
	status, page, _ = list("tenant_id=tenant-b", tokA)
	require.Equal(t, http.StatusOK, status)
	require.Empty(t, page.Batches, "a tenant token sees no other tenant's batches")

	for query, field := range map[string]string{
		"":                                 "tenant_id",
		"tenant_id=tenant-a&status=Broken": "status",
		"tenant_id=tenant-a&since=monday":  "since",
		"tenant_id=tenant-a&limit=0":       "limit",
		"tenant_id=tenant-a&limit=1001":    "limit",
		"tenant_id=tenant-a&cursor=zzz":    "cursor",
		"tenant_id=tenant-a&folder=ftp://": "folder",
	} {
		status, _, m := list(query, token)
		require.Equal(t, http.StatusUnprocessableEntity, status, query)
		require.Equal(t, field, m["field"], query)
	}
	status, _, _ = list("tenant_id=tenant-a", "wrong")
	require.Equal(t, http.StatusUnauthorized, status)
}
