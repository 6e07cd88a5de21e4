package uploads

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestImportsMaxBadRecords: POST /v1/imports takes the import's tolerance
// of bad records (max_bad_records) into the batch's details; absent, the
// door's default (Config.MaxBadRecords) applies; -1 and 10001 (over the
// cap) are refused 422 invalid_input naming max_bad_records, with nothing
// written.
func TestImportsMaxBadRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.MaxBadRecords = 3 })
	body := func(rest string, maxBad any) []byte {
		m := map[string]any{"tenant_id": "tenant-a", "tenant_database": "tenant_db", "company_id": "c1", "folder": tenantFolder("tenant-a", rest)}
		if maxBad != nil {
			m["max_bad_records"] = maxBad
		}
		b, _ := json.Marshal(m)
		return b
	}
	for _, bad := range []int{-1, 10001} {
		before := count(t, pool)
		status, out := f.post(t, "/v1/imports", "application/json", body("refused", bad), auth)
		require.Equal(t, http.StatusUnprocessableEntity, status, "%d: %v", bad, out)
		require.Equal(t, "invalid_input", out["outcome"])
		require.Equal(t, "max_bad_records", out["field"])
		require.Contains(t, out["error"], "10000")
		require.Equal(t, before, count(t, pool), "%d: nothing written", bad)
	}

	maxBad := func(id any) int {
		t.Helper()
		b, err := batch.NewStore(pool).Get(ctx, int64(id.(float64)))
		require.NoError(t, err)
		d, err := batch.ParseDetails(b.Details)
		require.NoError(t, err)
		return d.MaxBadRecords
	}
	status, out := f.post(t, "/v1/imports", "application/json", body("seven", 7), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	require.Equal(t, 7, maxBad(out["batch_id"]))
	status, out = f.post(t, "/v1/imports", "application/json", body("default", nil), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	require.Equal(t, 3, maxBad(out["batch_id"]), "absent: the door's default")
	status, out = f.post(t, "/v1/imports", "application/json", body("none", 0), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	require.Equal(t, 0, maxBad(out["batch_id"]), "0 says none, whatever the default")
}
