package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestMetricsMoveAsDocumented drives reservations, a conflict, a contended
// lease and a takeover through real processes and scrapes their /metrics.
func TestMetricsMoveAsDocumented(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	serve, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok"}, "--dev-allow-local-folders")
	holder := startWorker(t, dbURL, append([]string{"--concurrency", "1"}, fastLease...)...)

	release := blockLoads(t, pool)
	folderURL := writeFolder(t, sample)
	req := map[string]any{"tenant_id": "tenant-a", "tenant_database": "db", "company_id": "c", "folder": folderURL}
	status, out := postJSON(t, base+"/v1/imports", "tok", req)
	require.Equal(t, http.StatusAccepted, status)
	id := int64(out["batch_id"].(float64))
	status, _ = postJSON(t, base+"/v1/imports", "tok", req)
	require.Equal(t, http.StatusConflict, status)

	waitLoadBlocked(t, pool, id, holder.name+"/")
	other := startWorker(t, dbURL, fastLease...)
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, err = client.Insert(ctx, jobs.IngestArgs{BatchID: id}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return other.metric(`ingest_lease_acquisitions_total{outcome="contended"}`) >= 1
	}, 15*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		return other.metric(`ingest_stuck_batches`) == 0 && other.metric(`ingest_running_batches`) == 1
	},
		10*time.Second, 100*time.Millisecond, "database gauges refresh")

	// The batch's row is locked until the gauge has shown the expired
	// lease, so the takeover (the snoozed duplicate wakes about a second
	// after the expiry) cannot end the stuck state before a refresh saw it:
	// that window, about one --stats-interval long, was missed under load.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `SELECT 1 FROM ingestion_batches WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)
	holder.signal(syscall.SIGKILL)
	holder.wait(10 * time.Second)
	require.Eventually(t, func() bool { return other.metric(`ingest_stuck_batches`) == 1 }, 15*time.Second, 100*time.Millisecond,
		"the expired lease shows as a stuck batch before the takeover")
	require.NoError(t, lock.Rollback(ctx))
	require.Eventually(t, func() bool {
		return other.metric(`ingest_lease_acquisitions_total{outcome="taken_over"}`) >= 1
	}, 20*time.Second, 100*time.Millisecond)
	// The held-up load keeps the lease, renewed every second.
	require.Eventually(t, func() bool {
		return other.metric(`ingest_lease_renewals_total{outcome="renewed"}`) >= 1
	}, 20*time.Second, 100*time.Millisecond, "the holder's lease is renewed while its load waits")
	release()
	waitStatus(t, pool, id, batch.StatusSucceeded, 20*time.Second)
	require.Eventually(t, func() bool { return other.metric(`ingest_deliveries_total{outcome="worked"}`) >= 1 }, 10*time.Second, 50*time.Millisecond)

	// The takeover came from the snoozed duplicate or from a sweep,
	// whichever woke first; either way the series exists.
	require.GreaterOrEqual(t, other.metric(`ingest_sweep_redeliveries_total{outcome="redelivered"}`), float64(0))
	require.GreaterOrEqual(t, other.metric(`ingest_takeover_delay_seconds_count`), float64(1))
	require.GreaterOrEqual(t, other.metric(`ingest_phase_duration_seconds_count{phase="load"}`), float64(1))
	require.GreaterOrEqual(t, other.metric(`ingest_phase_duration_seconds_count{phase="publish"}`), float64(1))
	require.GreaterOrEqual(t, other.metric(`ingest_batch_duration_seconds_count{outcome="succeeded"}`), float64(1))
	require.Equal(t, float64(0), other.metric(`ingest_leases_held`))
	require.Eventually(t, func() bool { return other.metric(`ingest_running_batches`) == 0 }, 10*time.Second, 100*time.Millisecond)

	// Reservations are counted where they happen: in enqueue serve.
	serveMetric := func(series string) float64 {
		body := httpGet(t, base+"/metrics")
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, series+" "); ok {
				var f float64
				_, err := fmtSscan(v, &f)
				require.NoError(t, err)
				return f
			}
		}
		t.Fatalf("%s not exported by enqueue serve", series)
		return 0
	}
	require.Equal(t, float64(1), serveMetric(`ingest_reservations_total{outcome="reserved",source_type="FleetS3"}`))
	require.Equal(t, float64(1), serveMetric(`ingest_reservations_total{outcome="conflict",source_type="FleetS3"}`))
	require.Equal(t, float64(0), serveMetric(`ingest_reservations_total{outcome="enqueue_failed",source_type="FleetS3"}`))
	require.Equal(t, float64(1), serveMetric(`ingest_http_request_outcomes_total{outcome="conflict",route="POST /v1/imports"}`))
	// The door is measured by route pattern and code; serve exports none
	// of the worker's lease metrics or database gauges.
	require.Equal(t, float64(1), serveMetric(`ingest_http_requests_total{code="202",route="POST /v1/imports"}`))
	require.Equal(t, float64(1), serveMetric(`ingest_http_requests_total{code="409",route="POST /v1/imports"}`))
	require.Equal(t, float64(2), serveMetric(`ingest_http_request_duration_seconds_count{route="POST /v1/imports"}`))
	serveBody := httpGet(t, base+"/metrics")
	for _, workerOnly := range []string{"ingest_leases_held", "ingest_lease_acquisitions_total", "ingest_lease_renewals_total",
		"ingest_running_batches", "ingest_queue_jobs", "ingest_deliveries_total", "ingest_queue_wait_seconds"} {
		require.NotContains(t, serveBody, workerOnly+"{", "enqueue serve exports no %s", workerOnly)
		require.NotContains(t, serveBody, workerOnly+" ", "enqueue serve exports no %s", workerOnly)
	}
	// The duplicate delivery the other worker fetched waited in the queue.
	require.GreaterOrEqual(t, other.metric(`ingest_queue_wait_seconds_count`), float64(1))
	_ = serve

	// Every documented series exists, zeros included.
	body := httpGet(t, "http://"+other.addr+"/metrics")
	for _, series := range []string{
		`ingest_resumes_total{outcome="failed"}`, `ingest_lease_acquisitions_total{outcome="not_found"}`,
		`ingest_lease_renewals_total{outcome="error"}`, `ingest_deliveries_total{outcome="skipped_terminal"}`,
		`ingest_stale_writes_rejected_total`, `ingest_oldest_running_batch_age_seconds`, `ingest_queue_jobs{state="available"}`,
		`ingest_batch_duration_seconds_bucket{outcome="failed",le="+Inf"}`, `go_goroutines`, `process_resident_memory_bytes`,
	} {
		require.Contains(t, body, series)
	}
	// The worker exports none of the doors' families, which it never
	// moves, and its connection pools' statistics.
	for _, line := range strings.Split(body, "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			for _, door := range []string{"ingest_http_", "ingest_sqs_", "ingest_reconcile_", "ingest_sns_", "ingest_reservations_",
				"ingest_late_object_events_", "ingest_events_ignored_", "ingest_tenant_tokens_", "ingest_import_group_"} {
				require.False(t, strings.HasPrefix(name, door), "the worker exports %s", name)
			}
		}
	}
	for _, pool := range []string{"shared", "renewals", "loads"} {
		require.Contains(t, body, `ingest_pgxpool_max_connections{pool="`+pool+`"}`)
		require.Contains(t, body, `ingest_pgxpool_acquires_total{pool="`+pool+`"}`)
	}
	require.Contains(t, serveBody, `ingest_pgxpool_acquired_connections{pool="enqueue"}`)
	require.Greater(t, serveMetric(`ingest_pgxpool_acquires_total{pool="enqueue"}`), float64(0), "enqueue serve's imports acquired connections")
	// One route vocabulary: the outcomes' routes are the mux patterns.
	require.NotContains(t, serveBody, `route="imports"`)
}

func fmtSscan(s string, f *float64) (int, error) { return fmt.Sscan(strings.TrimSpace(s), f) }
