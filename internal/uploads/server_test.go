package uploads

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

const (
	token         = "test-token-0123456789"
	operatorToken = "operator-token-9876543210"
)

var secret = []byte("hmac-secret")

type fixture struct {
	pool *pgxpool.Pool
	srv  *httptest.Server
	m    *metrics.Metrics
}

func newServer(t *testing.T, pool *pgxpool.Pool, mod func(*Config)) *fixture {
	t.Helper()
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	m := metrics.New()
	cfg := Config{
		Enqueuer:  &jobs.Enqueuer{Pool: pool, River: client, Metrics: m, Logger: slog.New(slog.DiscardHandler)},
		Pool:      pool,
		AuthToken: token, OperatorToken: operatorToken, HMACSecret: secret,
		MaxBodyBytes: 4096,
		Metrics:      m, Logger: slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	s.SetReady(true)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return &fixture{pool: pool, srv: hs, m: m}
}

// get sends a GET of path to the door with headers and returns the status
// and the raw body.
func (f *fixture) get(t *testing.T, path string, headers map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	require.NoError(t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, raw
}

func (f *fixture) post(t *testing.T, path, contentType string, body []byte, headers map[string]string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+path, bytes.NewReader(body))
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	}
	return resp.StatusCode, out
}

var (
	auth         = map[string]string{"Authorization": "Bearer " + token}
	operatorAuth = map[string]string{"Authorization": "Bearer " + operatorToken}
)

func importBody(tenant, folder string) []byte {
	b, _ := json.Marshal(map[string]string{"tenant_id": tenant, "tenant_database": "tenant_db", "company_id": "c1", "folder": folder})
	return b
}

// tenantFolder is an S3 folder of tenant (database tenant_db, company c1)
// under the default path pattern.
func tenantFolder(tenant, rest string) string {
	return "s3://fleet-bucket/tenants/" + tenant + "/tenant_db/c1/" + rest
}

func count(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	return n
}

func TestImportsStatusCodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, nil)

	status, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "up/1")), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	require.Equal(t, "enqueued", out["outcome"])
	id := out["batch_id"]

	status, out = f.post(t, "/v1/imports", "application/json; charset=utf-8", importBody("tenant-a", "s3://FLEET-bucket//tenants/tenant-a/tenant_db/c1/up/1/"), auth)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "conflict", out["outcome"])
	require.Equal(t, id, out["running_batch_id"])

	before := count(t, pool)
	status, out = f.post(t, "/v1/imports", "application/json", importBody("tenant-a", "s3://fleet-bucket/../x"), auth)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "invalid_input", out["outcome"])
	require.Equal(t, "folder", out["field"])
	status, out = f.post(t, "/v1/imports", "application/json", importBody(strings.Repeat("x", 101), tenantFolder(strings.Repeat("x", 101), "a")), auth)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "tenant_id", out["field"])

	for name, tc := range map[string]struct {
		ct     string
		body   []byte
		hdr    map[string]string
		status int
	}{
		"malformed JSON":                      {"application/json", []byte(`{"tenant_id": `), auth, http.StatusBadRequest},
		"trailing garbage":                    {"application/json", append(importBody("t", "s3://fleet-bucket/a"), []byte(`{}`)...), auth, http.StatusBadRequest},
		"unknown field":                       {"application/json", []byte(`{"tenant": "t"}`), auth, http.StatusBadRequest},
		"oversized body":                      {"application/json", []byte(`{"tenant_id":"` + strings.Repeat("a", 5000) + `"}`), auth, http.StatusRequestEntityTooLarge},
		"wrong content type":                  {"text/plain", importBody("t", "s3://fleet-bucket/a"), auth, http.StatusUnsupportedMediaType},
		"no content type":                     {"", importBody("t", "s3://fleet-bucket/a"), auth, http.StatusUnsupportedMediaType},
		"missing auth":                        {"application/json", importBody("t", "s3://fleet-bucket/a"), nil, http.StatusUnauthorized},
		"wrong token":                         {"application/json", importBody("t", "s3://fleet-bucket/a"), map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		"signature is not enough for imports": {"application/json", importBody("t", "s3://fleet-bucket/a"), signed(importBody("t", "s3://fleet-bucket/a")), http.StatusUnauthorized},
	} {
		status, _ := f.post(t, "/v1/imports", tc.ct, tc.body, tc.hdr)
		require.Equal(t, tc.status, status, name)
	}
	require.Equal(t, before, count(t, pool), "refused requests write nothing")

	// Enqueue failure: the job insert fails for real.
	_, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no jobs (injected)'; END $$;
		CREATE TRIGGER refuse_jobs BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION refuse_jobs();`)
	require.NoError(t, err)
	status, out = f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "up/2")), auth)
	require.Equal(t, http.StatusInternalServerError, status)
	require.Equal(t, "enqueue_failed", out["outcome"])
	require.Equal(t, enqueueFailedError, out["error"], "the database's message is not the sender's to read")
	require.NotContains(t, out["error"], "injected")
	b, err := batch.NewStore(pool).Get(ctx, int64(out["batch_id"].(float64)))
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
	_, err = pool.Exec(ctx, `DROP TRIGGER refuse_jobs ON river_job`)
	require.NoError(t, err)

	// Already succeeded: answered without a new batch unless asked.
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Succeeded' WHERE id = $1`, int64(id.(float64)))
	require.NoError(t, err)
	status, out = f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "up/1")), auth)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "already_succeeded", out["outcome"])
	require.Equal(t, id, out["batch_id"])
	reimport, _ := json.Marshal(map[string]any{"folder": tenantFolder("tenant-a", "up/1"), "reimport": true})
	status, out = f.post(t, "/v1/imports", "application/json", reimport, auth)
	require.Equal(t, http.StatusAccepted, status)
	require.NotEqual(t, id, out["batch_id"])
}

func TestDatabaseUnavailableIs503(t *testing.T) {
	t.Parallel()
	dead, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/x?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(dead.Close)
	f := newServer(t, dead, nil)
	status, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "up/1")), auth)
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, "unavailable", out["outcome"])
	resp, err := http.Get(f.srv.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp, err = http.Get(f.srv.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func s3Event(bucket, key, eventName string) []byte {
	b, _ := json.Marshal(map[string]any{"Records": []any{map[string]any{
		"eventVersion": "2.1", "eventSource": "aws:s3", "eventName": eventName,
		"s3": map[string]any{"bucket": map[string]any{"name": bucket}, "object": map[string]any{"key": key, "size": 0}},
	}}})
	return b
}

func signed(body []byte) map[string]string {
	sig, ts := Sign(secret, body, time.Now())
	return map[string]string{SignatureHeader: sig, TimestampHeader: ts}
}

func TestS3EventEnvelopes(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.Mapping.Buckets = []string{"fleet-uploads"} })

	plain := s3Event("fleet-uploads", "tenants/t1/db_one/c9/2026-11-30/up+1/_SUCCESS", "ObjectCreated:Put")
	status, out := f.post(t, "/v1/events/s3", "application/json", plain, auth)
	require.Equal(t, http.StatusAccepted, status, out)
	res := out["results"].([]any)[0].(map[string]any)
	require.Equal(t, "enqueued", res["outcome"])
	require.Equal(t, "fleet_s3:s3://fleet-uploads/tenants/t1/db_one/c9/2026-11-30/up 1", res["source_scope"], "URL-encoded keys are decoded")
	b, err := batch.NewStore(pool).Get(context.Background(), int64(res["batch_id"].(float64)))
	require.NoError(t, err)
	require.Equal(t, "t1", b.TenantID)
	require.Equal(t, "db_one", b.TenantDatabase)
	require.Equal(t, "c9", b.CompanyID)

	// SNS envelope (delivered as text/plain), same folder: conflict.
	sns, _ := json.Marshal(map[string]any{"Type": "Notification", "MessageId": "m1", "Message": string(plain)})
	status, out = f.post(t, "/v1/events/s3", "text/plain; charset=UTF-8", sns, auth)
	require.Equal(t, http.StatusConflict, status, out)
	require.Equal(t, "conflict", out["results"].([]any)[0].(map[string]any)["outcome"])

	// EventBridge, another folder.
	eb, _ := json.Marshal(map[string]any{"version": "0", "source": "aws.s3", "detail-type": "Object Created",
		"detail": map[string]any{"bucket": map[string]any{"name": "fleet-uploads"}, "object": map[string]any{"key": "tenants/t2/db2/c2/x/_SUCCESS"}}})
	status, out = f.post(t, "/v1/events/s3", "application/json", eb, auth)
	require.Equal(t, http.StatusAccepted, status, out)

	// Ignored: other objects, other event types, test events, confirmations.
	for name, body := range map[string][]byte{
		"data object":     s3Event("fleet-uploads", "tenants/t1/db1/c1/x/part-0.csv", "ObjectCreated:Put"),
		"marker deleted":  s3Event("fleet-uploads", "tenants/t1/db1/c1/x/_SUCCESS", "ObjectRemoved:Delete"),
		"s3 test event":   []byte(`{"Service":"Amazon S3","Event":"s3:TestEvent","Bucket":"fleet-uploads"}`),
		"sns subscribe":   []byte(`{"Type":"SubscriptionConfirmation","Message":"confirm","SubscribeURL":"https://example.invalid"}`),
		"eventbridge del": []byte(`{"source":"aws.s3","detail-type":"Object Deleted","detail":{"bucket":{"name":"fleet-uploads"},"object":{"key":"tenants/t/d/c/x/_SUCCESS"}}}`),
	} {
		status, out := f.post(t, "/v1/events/s3", "application/json", body, auth)
		require.Equal(t, http.StatusOK, status, "%s: %v", name, out)
	}

	// Unmapped folders and buckets: 422 with the reason.
	for name, body := range map[string][]byte{
		"short path":   s3Event("fleet-uploads", "tenants/t1/_SUCCESS", "ObjectCreated:Put"),
		"wrong prefix": s3Event("fleet-uploads", "other/t1/db/c/x/_SUCCESS", "ObjectCreated:Put"),
		"wrong bucket": s3Event("elsewhere", "tenants/t1/db/c/x/_SUCCESS", "ObjectCreated:Put"),
	} {
		status, out := f.post(t, "/v1/events/s3", "application/json", body, auth)
		require.Equal(t, http.StatusUnprocessableEntity, status, name)
		r := out["results"].([]any)[0].(map[string]any)
		require.Equal(t, "unmapped", r["outcome"], name)
		require.Contains(t, r["reason"], "not", name)
	}
	// A mapped folder with an invalid tenant database is invalid input.
	status, out = f.post(t, "/v1/events/s3", "application/json", s3Event("fleet-uploads", "tenants/t1/bad;db/c/x/_SUCCESS", "ObjectCreated:Put"), auth)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "tenant_database", out["results"].([]any)[0].(map[string]any)["field"])

	// Malformed bodies.
	for name, body := range map[string][]byte{
		"not json":          []byte(`Records`),
		"unknown shape":     []byte(`{"hello": "world"}`),
		"record without s3": []byte(`{"Records":[{"eventName":"ObjectCreated:Put"}]}`),
		"bad sns message":   []byte(`{"Type":"Notification","Message":"{nope"}`),
		"bad key escaping":  s3Event("fleet-uploads", "tenants/%zz/_SUCCESS", "ObjectCreated:Put"),
	} {
		status, _ := f.post(t, "/v1/events/s3", "application/json", body, auth)
		require.Equal(t, http.StatusBadRequest, status, name)
	}
	require.Equal(t, float64(3), counterValue(t, f.m, routeEvents, "unmapped"))
}

func TestS3EventSignatures(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, nil)
	body := s3Event("fleet-uploads", "tenants/t1/db1/c1/sig/_SUCCESS", "ObjectCreated:Put")
	hdr := signed(body)

	status, out := f.post(t, "/v1/events/s3", "application/json", body, hdr)
	require.Equal(t, http.StatusAccepted, status, out)
	status, out = f.post(t, "/v1/events/s3", "application/json", body, hdr)
	require.Equal(t, http.StatusUnauthorized, status, "a replayed signature is refused")
	require.Contains(t, out["error"], "already used")

	old, ts := Sign(secret, body, time.Now().Add(-10*time.Minute))
	status, _ = f.post(t, "/v1/events/s3", "application/json", body, map[string]string{SignatureHeader: old, TimestampHeader: ts})
	require.Equal(t, http.StatusUnauthorized, status, "an expired signature is refused")

	forged, ts := Sign([]byte("wrong"), body, time.Now())
	status, _ = f.post(t, "/v1/events/s3", "application/json", body, map[string]string{SignatureHeader: forged, TimestampHeader: ts})
	require.Equal(t, http.StatusUnauthorized, status)

	tampered := signed(body)
	status, _ = f.post(t, "/v1/events/s3", "application/json", s3Event("fleet-uploads", "tenants/t9/db9/c9/sig/_SUCCESS", "ObjectCreated:Put"), tampered)
	require.Equal(t, http.StatusUnauthorized, status, "the signature covers the body")

	status, _ = f.post(t, "/v1/events/s3", "application/json", body, nil)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, 1, count(t, pool))
}

// TestDuplicateEventStorm sends 100 identical notifications at once: one
// batch, the rest conflicts.
func TestDuplicateEventStorm(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, nil)
	body := s3Event("fleet-uploads", "tenants/t1/db1/c1/storm/_SUCCESS", "ObjectCreated:Put")
	const n = 100
	statuses := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			statuses[i], _ = f.post(t, "/v1/events/s3", "application/json", body, auth)
		})
	}
	close(start)
	wg.Wait()
	counts := map[int]int{}
	for _, s := range statuses {
		counts[s]++
	}
	require.Equal(t, map[int]int{http.StatusAccepted: 1, http.StatusConflict: n - 1}, counts)
	require.Equal(t, 1, count(t, pool))
}

func TestServerRefusesToStartWithoutAuth(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Enqueuer: &jobs.Enqueuer{}})
	require.ErrorContains(t, err, "auth token is required")
	_, err = New(Config{Enqueuer: &jobs.Enqueuer{}, InsecureNoAuth: true, Mapping: folder.Mapping{Pattern: "tenants/{tenant_id}/"}})
	require.ErrorContains(t, err, "{tenant_database}")
	s, err := New(Config{Enqueuer: &jobs.Enqueuer{}, InsecureNoAuth: true})
	require.NoError(t, err)
	require.True(t, s.bearerOK(httptest.NewRequest(http.MethodPost, "/", nil)))
}

func counterValue(t *testing.T, m *metrics.Metrics, route, outcome string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		if fam.GetName() != "ingest_http_request_outcomes_total" {
			continue
		}
		for _, mt := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["outcome"] == outcome {
				return mt.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series for %s/%s", route, outcome)
	return 0
}
