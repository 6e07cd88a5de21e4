package uploads

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// storeRecord is one S3 event record as a store writes it.
func storeRecord(source, eventName, key string) map[string]any {
	return map[string]any{"eventVersion": "2.0", "eventSource": source, "awsRegion": "", "eventName": eventName,
		"s3": map[string]any{"bucket": map[string]any{"name": "fleet-uploads"}, "object": map[string]any{"key": key}}}
}

// TestS3CompatibleStoresAndEventsOfUnknownShape: MinIO's webhook envelope
// (s3:-prefixed event name, source minio:s3, empty region, a key escaped
// as a form value) imports its folder; every event that completes none
// answers 200 "ignored" with its ignored_reason and a reason in words, and
// moves ingest_events_ignored_total{door="events_s3",reason}; an event of
// an unknown shape is also logged with what the store sent.
func TestS3CompatibleStoresAndEventsOfUnknownShape(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	var logs testproc.SyncBuffer
	f := newServer(t, pool, func(c *Config) {
		c.Mapping.Buckets = []string{"fleet-uploads"}
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	ignored := func(reason string) float64 {
		return testutil.ToFloat64(f.m.EventsIgnored.WithLabelValues("events_s3", reason))
	}

	minio, _ := json.Marshal(map[string]any{"EventName": "s3:ObjectCreated:Put", "Key": "fleet-uploads/tenants/t1/db1/c1/up 1/_SUCCESS",
		"Records": []any{storeRecord("minio:s3", "s3:ObjectCreated:Put", "tenants%2Ft1%2Fdb1%2Fc1%2Fup+1%2F_SUCCESS")}})
	status, out := f.post(t, "/v1/events/s3", "application/json", minio, auth)
	require.Equal(t, http.StatusAccepted, status, out)
	res := out["results"].([]any)[0].(map[string]any)
	require.Equal(t, "enqueued", res["outcome"])
	require.Equal(t, "tenants/t1/db1/c1/up 1/_SUCCESS", res["key"])
	require.Equal(t, 1, count(t, pool))

	const marker = "tenants/t1/db1/c1/up-2/_SUCCESS"
	body, _ := json.Marshal(map[string]any{"Records": []any{
		storeRecord("minio:s3", "s3:ObjectCreated:Put", "tenants/t1/db1/c1/up-2/trips.csv"),
		storeRecord("minio:s3", "s3:ObjectRemoved:Delete", marker),
		storeRecord("minio:s3", "s3:ObjectTeleported:Put", marker),
		storeRecord("garage:sqs", "ObjectCreated:Put", marker),
		storeRecord("ceph:s3", "ObjectCreated:Put", "tenants/t1/db1/c1/up-3/_SUCCESS"),
	}})
	status, out = f.post(t, "/v1/events/s3", "application/json", body, auth)
	require.Equal(t, http.StatusAccepted, status, out)
	results := out["results"].([]any)
	require.Len(t, results, 5)
	for i, want := range []struct{ reason, says string }{
		{"data_object", "not the folder's completion marker (_SUCCESS)"},
		{"not_created", `event "s3:ObjectRemoved:Delete" creates no object`},
		{"unknown_event", `event name "s3:ObjectTeleported:Put" is not one`},
		{"unknown_source", `eventSource "garage:sqs" is not an S3 store's`},
	} {
		res := results[i].(map[string]any)
		require.Equal(t, "ignored", res["outcome"], res)
		require.Equal(t, want.reason, res["ignored_reason"], res)
		require.Contains(t, res["reason"], want.says)
		require.Equal(t, 1.0, ignored(want.reason), want.reason)
	}
	require.Equal(t, "enqueued", results[4].(map[string]any)["outcome"], "Ceph's record imports its folder")
	require.NotContains(t, results[4].(map[string]any), "ignored_reason")
	require.Equal(t, 2, count(t, pool))
	require.Equal(t, 4.0, counterValue(t, f.m, routeEvents, "ignored"))

	// One log line for the request's events of an unknown shape.
	var unknown []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		if m["msg"] == "object event of an unknown shape ignored" {
			unknown = append(unknown, m)
		}
	}
	require.Len(t, unknown, 1)
	require.Equal(t, "unknown_event", unknown[0]["ignored_reason"])
	require.Equal(t, marker, unknown[0]["key"])

	// Unexpected events alone: answered 200, ignored, counted again.
	status, out = f.post(t, "/v1/events/s3", "application/json", []byte(`{"Records":[`+
		`{"eventSource":"aws:s3","eventName":"ObjectMutated:Put","s3":{"bucket":{"name":"fleet-uploads"},"object":{"key":"`+marker+`"}}}]}`), auth)
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, "unknown_event", out["results"].([]any)[0].(map[string]any)["ignored_reason"])
	require.Equal(t, 2.0, ignored("unknown_event"))
	require.Equal(t, 2, count(t, pool), "nothing imported")
}
