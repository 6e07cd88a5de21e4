package uploads

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

func TestCancelRoute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	logs := &testproc.SyncBuffer{}
	f := newServer(t, pool, func(c *Config) { c.Enqueuer.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	status, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "up/c1")), auth)
	require.Equal(t, http.StatusAccepted, status)
	id := int64(out["batch_id"].(float64))
	path := "/v1/batches/" + strconv.FormatInt(id, 10) + "/cancel"
	body := func(v map[string]any) []byte { b, _ := json.Marshal(v); return b }

	status, _ = f.post(t, path, "application/json", body(map[string]any{"tenant_id": "tenant-a"}), nil)
	require.Equal(t, http.StatusUnauthorized, status)
	// The import token, whatever tenant the body names: refused.
	status, out = f.post(t, path, "application/json", body(map[string]any{"tenant_id": "tenant-a"}), auth)
	require.Equal(t, http.StatusForbidden, status, "the import token does not cancel: %v", out)
	require.Equal(t, "forbidden", out["outcome"])
	basicImport := map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+token))}
	basicOperator := map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+operatorToken))}
	for name, hdr := range map[string]map[string]string{
		"wrong token":                       {"Authorization": "Bearer " + operatorToken + "x"},
		"operator token as HTTP Basic":      basicOperator,
		"operator token prefix":             {"Authorization": "Bearer " + operatorToken[:10]},
		"operator token without the scheme": {"Authorization": operatorToken},
	} {
		status, _ = f.post(t, path, "application/json", body(map[string]any{"tenant_id": "tenant-a"}), hdr)
		require.Equal(t, http.StatusUnauthorized, status, name)
	}
	status, _ = f.post(t, path, "application/json", body(map[string]any{"tenant_id": "tenant-a"}), basicImport)
	require.Equal(t, http.StatusForbidden, status, "the import token as HTTP Basic")
	status, out = f.post(t, path, "application/json", body(map[string]any{"tenant_id": "tenant-b"}), operatorAuth)
	require.Equal(t, http.StatusNotFound, status, "another tenant's batch")
	require.Equal(t, "not_found", out["outcome"])
	status, out = f.post(t, "/v1/batches/0/cancel", "application/json", body(map[string]any{"tenant_id": "tenant-a"}), operatorAuth)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "batch_id", out["field"])
	status, out = f.post(t, path, "application/json", body(map[string]any{"tenant_id": ""}), operatorAuth)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "tenant_id", out["field"])
	status, _ = f.post(t, path, "application/json", []byte(`{"tenant_id":"tenant-a","force":true}`), operatorAuth)
	require.Equal(t, http.StatusBadRequest, status)
	status, _ = f.post(t, path, "text/plain", body(map[string]any{"tenant_id": "tenant-a"}), operatorAuth)
	require.Equal(t, http.StatusUnsupportedMediaType, status)
	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, b.Status, "refusals touch nothing")

	// Who cancels is the operator the token names (the static token is
	// LegacyOperatorName's); the header is only a note.
	headers := map[string]string{"Authorization": "Bearer " + operatorToken, OperatorHeader: "alice"}
	status, out = f.post(t, path, "application/json", body(map[string]any{"tenant_id": "tenant-a", "reason": "bad upload"}), headers)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "cancelled", out["outcome"])
	require.Len(t, out["cancelled_jobs"], 1)
	b, err = batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
	require.True(t, strings.HasPrefix(*b.CancelledBy, "http:"+LegacyOperatorName+"@"), *b.CancelledBy)
	require.Equal(t, "bad upload", *b.CancelReason)
	// Logged once, as every operator action is (refused ones too),
	// whatever its door.
	require.Equal(t, 1, strings.Count(logs.String(), `"reason":"bad upload"`), logs.String())
	require.Regexp(t, `"msg":"`+jobs.OperatorLog+`","action":"cancel","by":"http:`+LegacyOperatorName+`@[^"]+","reason":"bad upload","batch_id":`+strconv.FormatInt(id, 10)+`,"tenant_id":"tenant-a","outcome":"cancelled","note":"says alice; from [^"]+"`, logs.String())
	// And recorded in the operators' audit, in the cancel's transaction.
	entries, err := audit.List(ctx, pool, audit.Filter{})
	require.NoError(t, err)
	require.Len(t, entries, 2, "the cancel of another tenant's batch (not_found) and this one; refused requests are no actions")
	require.Equal(t, "not_found", entries[1].Outcome)
	require.Equal(t, LegacyOperatorName, entries[0].Actor)
	require.Equal(t, audit.DoorHTTP, entries[0].Door)
	require.Equal(t, "cancelled", entries[0].Outcome)
	require.Equal(t, id, entries[0].BatchID)
	require.Equal(t, "bad upload", entries[0].Reason)
	require.Contains(t, entries[0].Note, "says alice")

	status, out = f.post(t, path, "application/json", body(map[string]any{"tenant_id": "tenant-a"}), operatorAuth)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "not_cancellable", out["outcome"])
	require.Equal(t, "cancelled", out["phase"])
	require.Equal(t, float64(1), testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeCancel, "cancelled")))
	require.Equal(t, float64(1), testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeCancel, "not_cancellable")))
	require.Equal(t, float64(2), testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeCancel, "forbidden")))
}

// TestCancelRouteIsNotServedWithoutAnOperatorToken: without an operator
// token nothing opens the cancel route, the import token included; the
// answer says what it needs.
func TestCancelRouteIsNotServedWithoutAnOperatorToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.OperatorToken = "" })
	status, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "up/c2")), auth)
	require.Equal(t, http.StatusAccepted, status)
	id := int64(out["batch_id"].(float64))
	for name, hdr := range map[string]map[string]string{"import token": auth, "none": nil, "an operator token of another listener": operatorAuth} {
		status, out = f.post(t, "/v1/batches/"+strconv.FormatInt(id, 10)+"/cancel", "application/json", []byte(`{"tenant_id":"tenant-a"}`), hdr)
		require.Equal(t, http.StatusNotFound, status, name)
		require.Equal(t, "not_served", out["outcome"], name)
		require.Contains(t, out["error"], "--operator-token-file", name)
	}
	b, err := batch.NewStore(pool).Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, b.Status)
	require.Equal(t, float64(3), testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeCancel, "not_served")))
}

// TestClientDisconnectIsNotADatabaseOutage: a client that gives up while its
// import waits in the database is logged as a disconnect, not as "database
// unavailable".
func TestClientDisconnectIsNotADatabaseOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	logs := &testproc.SyncBuffer{}
	f := newServer(t, pool, func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })

	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = blocker.Exec(ctx, `LOCK TABLE ingestion_batches IN EXCLUSIVE MODE`)
	require.NoError(t, err)

	reqCtx, hangUp := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, f.srv.URL+"/v1/imports", bytes.NewReader(importBody("tenant-a", tenantFolder("tenant-a", "up/gone"))))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		return n > 0
	}, 30*time.Second, 5*time.Millisecond, "the import waits in the database")
	hangUp()
	require.Error(t, <-done)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeImports, "client_closed")) == 1
	}, 30*time.Second, 10*time.Millisecond)
	require.Contains(t, logs.String(), "client disconnected before the import finished")
	require.NotContains(t, logs.String(), "database unavailable")
	require.Zero(t, testutil.ToFloat64(f.m.HTTPRequests.WithLabelValues(routeImports, "unavailable")))
}
