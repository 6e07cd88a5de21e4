package uploads

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/pgtest"
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
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
		require.NoError(t, err)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, body
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
