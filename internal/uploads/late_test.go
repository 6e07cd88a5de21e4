package uploads

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/s3events"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// TestDataObjectEventsOfAPublishedFolder: an event notification whose
// records name data objects of a folder whose newest batch Succeeded
// answers them late_object, naming the folder and the batch, and counts
// and logs the folder once for the request, however many of its objects
// the records name; data objects of a folder with a running batch or none,
// and markers other than the completion marker, stay ignored. The same
// through SNS's envelope, and for each later request.
func TestDataObjectEventsOfAPublishedFolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	var logs testproc.SyncBuffer
	f := newServer(t, pool, func(c *Config) {
		c.Mapping.Buckets = []string{"fleet-uploads"}
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	const (
		published = "tenants/t1/db1/c1/up-1"
		running   = "tenants/t1/db1/c1/up-2"
		none      = "tenants/t1/db1/c1/up-3"
	)
	batchOf := map[string]float64{}
	for _, dir := range []string{published, running} {
		status, out := f.post(t, "/v1/events/s3", "application/json", s3Event("fleet-uploads", dir+"/_SUCCESS", "ObjectCreated:Put"), auth)
		require.Equal(t, http.StatusAccepted, status, out)
		batchOf[dir] = out["results"].([]any)[0].(map[string]any)["batch_id"].(float64)
	}
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Succeeded' WHERE id = $1`, int64(batchOf[published]))
	require.NoError(t, err)

	var records []any
	for _, key := range []string{published + "/part-1.csv", published + "/part-2.csv", published + "/_temporary/0/x.csv",
		running + "/part-1.csv", none + "/part-1.csv"} {
		var one map[string][]any
		require.NoError(t, json.Unmarshal(s3Event("fleet-uploads", key, "ObjectCreated:Put"), &one))
		records = append(records, one["Records"]...)
	}
	body, _ := json.Marshal(map[string]any{"Records": records})
	status, out := f.post(t, "/v1/events/s3", "application/json", body, auth)
	require.Equal(t, http.StatusOK, status, out)
	var outcomes []string
	for _, r := range out["results"].([]any) {
		res := r.(map[string]any)
		outcomes = append(outcomes, res["outcome"].(string))
		if res["outcome"] == s3events.OutcomeLateObject {
			require.Equal(t, batchOf[published], res["batch_id"], "the answer names the published batch")
			require.Contains(t, res["reason"], "s3://fleet-uploads/"+published+" was published by batch")
		}
	}
	require.Equal(t, []string{"late_object", "late_object", "ignored", "ignored", "ignored"}, outcomes)
	require.Equal(t, 1.0, testutil.ToFloat64(f.m.LateObjectEvents.WithLabelValues("events_s3")), "once per folder and request")
	require.Equal(t, 2.0, counterValue(t, f.m, routeEvents, "late_object"))
	lines := lateLogLines(t, logs.String())
	require.Len(t, lines, 1)
	require.Equal(t, "s3://fleet-uploads/"+published, lines[0]["folder"])
	require.Equal(t, batchOf[published], lines[0]["batch_id"])
	require.Equal(t, 2.0, lines[0]["events"])
	require.Equal(t, []any{published + "/part-1.csv", published + "/part-2.csv"}, lines[0]["keys"])
	require.Equal(t, 2, count(t, pool), "nothing imported")

	// Through SNS: the same answer, counted again (another request).
	sns, _ := json.Marshal(map[string]any{"Type": "Notification", "MessageId": "m1", "Message": string(s3Event("fleet-uploads", published+"/part-3.csv", "ObjectCreated:Put"))})
	status, out = f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", sns, auth)
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, s3events.OutcomeLateObject, out["results"].([]any)[0].(map[string]any)["outcome"])
	require.Equal(t, 2.0, testutil.ToFloat64(f.m.LateObjectEvents.WithLabelValues("events_s3")))
	require.Len(t, lateLogLines(t, logs.String()), 2)
}

func lateLogLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["msg"] == "object events for a published folder: its slice does not hold these objects as they are now" {
			out = append(out, m)
		}
	}
	return out
}
