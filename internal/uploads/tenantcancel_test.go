package uploads

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestTenantCancelsItsParkedBatch: a re-import of a folder whose batch is
// parked answers 409 naming "parked" and how to free it; another tenant's
// token gets 404 on the cancel; the tenant's own token cancels it
// (cancelled_by tenant:<id>, its reason kept, the outcome announced by the
// outbox, no row of the operators' audit), and the folder then imports
// again (a new batch); a batch a delivery holds is refused 409 (only
// operators cancel running work); already_succeeded says how to re-import.
func TestTenantCancelsItsParkedBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	tokA, lineA, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	tokB, lineB, err := MintTenantToken("tenant-b")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"+lineB+"\n"), 0o600))
	tokens, err := LoadTenantTokens(path, nil)
	require.NoError(t, err)
	f := newServer(t, pool, func(c *Config) { c.TenantTokens = tokens })
	asA := map[string]string{"Authorization": "Bearer " + tokA}
	asB := map[string]string{"Authorization": "Bearer " + tokB}
	folder := tenantFolder("tenant-a", "up/parked")

	status, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", folder), asA)
	require.Equal(t, http.StatusAccepted, status, out)
	id := int64(out["batch_id"].(float64))
	cancelPath := "/v1/batches/" + strconv.FormatInt(id, 10) + "/cancel"

	// Not parked yet: a conflict says the batch is still running.
	status, out = f.post(t, "/v1/imports", "application/json", importBody("tenant-a", folder), asA)
	require.Equal(t, http.StatusConflict, status, out)
	require.NotEqual(t, ReasonParked, out["reason"])
	require.Contains(t, out["hint"], "still running")

	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET parked_at = now(), parked_reason = 'details of an unknown version' WHERE id = $1`, id)
	require.NoError(t, err)
	status, out = f.post(t, "/v1/imports", "application/json", importBody("tenant-a", folder), asA)
	require.Equal(t, http.StatusConflict, status, out)
	require.Equal(t, "conflict", out["outcome"])
	require.Equal(t, ReasonParked, out["reason"])
	require.Equal(t, float64(id), out["running_batch_id"])
	require.Contains(t, out["hint"], "parked")
	require.Contains(t, out["hint"], "POST "+cancelPath)
	require.Contains(t, out["hint"], "ask an operator to resume")

	// Another tenant: 404, exactly as a read of the batch answers it.
	status, out = f.post(t, cancelPath, "application/json", []byte(`{"reason":"not mine"}`), asB)
	require.Equal(t, http.StatusNotFound, status, out)
	require.Equal(t, "not_found", out["outcome"])
	readStatus, _ := f.get(t, "/v1/batches/"+strconv.FormatInt(id, 10), asB)
	require.Equal(t, readStatus, status)
	status, out = f.post(t, cancelPath, "application/json", []byte(`{"tenant_id":"tenant-b"}`), asA)
	require.Equal(t, http.StatusForbidden, status, out)
	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.True(t, b.Parked(), "refusals touch nothing")

	status, out = f.post(t, cancelPath, "application/json", []byte(`{"reason":"wrong upload"}`), asA)
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, "cancelled", out["outcome"])
	require.NotContains(t, out, "previous_holder")
	b, err = batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
	require.Equal(t, "tenant:tenant-a", *b.CancelledBy)
	require.Equal(t, "wrong upload", *b.CancelReason)
	var announced int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1 AND (args->'notification'->>'batch_id')::bigint = $2`,
		jobs.OutcomeArgs{}.Kind(), id).Scan(&announced))
	require.Equal(t, 1, announced, "the outbox announces a tenant's cancel as any cancel")
	entries, err := audit.List(ctx, pool, audit.Filter{})
	require.NoError(t, err)
	require.Empty(t, entries, "no operator acted")
	status, out = f.post(t, cancelPath, "", nil, asA)
	require.Equal(t, http.StatusConflict, status, "cancelled already: %v", out)
	require.Equal(t, "not_cancellable", out["outcome"])

	// The folder is free: a new batch is reserved.
	status, out = f.post(t, "/v1/imports", "application/json", importBody("tenant-a", folder), asA)
	require.Equal(t, http.StatusAccepted, status, out)
	next := int64(out["batch_id"].(float64))
	require.Greater(t, next, id)

	// A delivery holds the new batch: running work is the operators'.
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET execution_lease_id = 'worker-1/job-9', execution_lease_expires_at = now() + interval '5 minutes' WHERE id = $1`, next)
	require.NoError(t, err)
	status, out = f.post(t, "/v1/batches/"+strconv.FormatInt(next, 10)+"/cancel", "", nil, asA)
	require.Equal(t, http.StatusConflict, status, out)
	require.Equal(t, "not_cancellable", out["outcome"])
	require.Equal(t, jobs.ReasonLeased, out["reason"])
	require.Contains(t, out["error"], "only an operator cancels running work")
	raw, _ := json.Marshal(out)
	require.NotContains(t, string(raw), "worker-1", "no lease holder in a tenant's answer")
	b, err = batch.NewStore(pool).Get(ctx, next)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, b.Status)
	require.Nil(t, b.CancelledAt)

	// Succeeded: the answer says how to load the folder again.
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Succeeded', completed_at = now(), execution_lease_id = NULL, execution_lease_expires_at = NULL WHERE id = $1`, next)
	require.NoError(t, err)
	status, out = f.post(t, "/v1/imports", "application/json", importBody("tenant-a", folder), asA)
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, "already_succeeded", out["outcome"])
	require.Contains(t, out["hint"], `"reimport": true`)
}
