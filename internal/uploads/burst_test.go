package uploads

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestS3EventWithManyRecordsIsOneBurst posts one S3 notification carrying a
// hundred completed folders, a data object and an unmapped folder: the
// hundred are reserved and enqueued in one transaction, and every record
// keeps its own answer.
func TestS3EventWithManyRecordsIsOneBurst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.MaxBodyBytes = 1 << 20 })

	const folders = 100
	var records []any
	record := func(key string) map[string]any {
		return map[string]any{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
			"s3": map[string]any{"bucket": map[string]any{"name": "fleet-bucket"}, "object": map[string]any{"key": key}}}
	}
	for i := range folders {
		records = append(records, record(fmt.Sprintf("tenants/tenant-a/tenant_db/c1/burst-%d/_SUCCESS", i)))
	}
	records = append(records, record("tenants/tenant-a/tenant_db/c1/burst-0/data.csv"), record("elsewhere/x/_SUCCESS"))
	body, err := json.Marshal(map[string]any{"Records": records})
	require.NoError(t, err)

	status, out := f.post(t, "/v1/events/s3", "application/json", body, auth)
	require.Equal(t, http.StatusUnprocessableEntity, status, "the worst answer: the unmapped folder")
	results := out["results"].([]any)
	require.Len(t, results, folders+2)
	var ids []int64
	for i := range folders {
		r := results[i].(map[string]any)
		require.Equal(t, "enqueued", r["outcome"], r)
		ids = append(ids, int64(r["batch_id"].(float64)))
	}
	require.Equal(t, "ignored", results[folders].(map[string]any)["outcome"])
	require.Equal(t, "unmapped", results[folders+1].(map[string]any)["outcome"])

	var xids, jobs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM ingestion_batches WHERE id = ANY($1)`, ids).Scan(&xids))
	require.Equal(t, 1, xids, "one transaction reserved every folder")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE (args->>'batch_id')::bigint = ANY($1)`, ids).Scan(&jobs))
	require.Equal(t, folders, jobs)
	require.Equal(t, float64(folders), counterValue(t, f.m, routeEvents, "enqueued"))

	// The same notification again: every folder answers conflict.
	status, out = f.post(t, "/v1/events/s3", "application/json", body, auth)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	for i, r := range out["results"].([]any)[:folders] {
		require.Equal(t, "conflict", r.(map[string]any)["outcome"])
		require.Equal(t, float64(ids[i]), r.(map[string]any)["running_batch_id"])
	}
}
