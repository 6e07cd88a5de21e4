package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgbouncertest"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// scrapeSeries returns every series url's /metrics exports, by its text
// (name and labels, as exported), with its value.
func scrapeSeries(t *testing.T, url string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for line := range strings.Lines(httpGet(t, url+"/metrics")) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] = v
	}
	return out
}

// families returns which of names have at least one series in series.
func families(series map[string]float64, names ...string) []string {
	var found []string
	for _, name := range names {
		for s := range series {
			if s == name || strings.HasPrefix(s, name+"{") {
				found = append(found, name)
				break
			}
		}
	}
	return found
}

// readyz returns the status code and body of url's /readyz.
func readyz(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := httpClient.Get(url + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// databaseGauges are the worker's gauges read from the database.
var databaseGauges = []string{"ingest_running_batches", "ingest_stuck_batches", "ingest_parked_batches",
	"ingest_oldest_running_batch_age_seconds", "ingest_queue_jobs", "ingest_queue_paused", "ingest_river_leader"}

// TestDatabaseOutageIsShownAndSurvived stops PostgreSQL (a cluster of the
// test's own, stopped in immediate mode, as a crash) under a real worker,
// connected directly, and a real enqueue serve, connected through PgBouncer
// in transaction mode, and starts it again, as the operator's review did:
//
//   - down: within two minutes each process exports ingest_database_up 0
//     and its ingest_database_last_success_timestamp_seconds stops
//     advancing; the worker exports none of the gauges read from the
//     database (not their last values: "0 stuck, 0 queued"); both answer
//     /readyz 503 saying the database is unreachable, at once; the door
//     answers an import 503 unavailable; both processes keep running and
//     log the outage once;
//   - back: both export ingest_database_up 1 again, with a timestamp past
//     the outage, the gauges come back, /readyz answers 200, an import
//     through the door is enqueued and the worker loads it to Succeeded.
func TestDatabaseOutageIsShownAndSurvived(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own PostgreSQL cluster; skipped under -short")
	}
	t.Parallel()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fleet-outage-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	cluster, err := chaos.StartCluster(ctx, filepath.Join(dir, "pg"), "fsync=off", "full_page_writes=off")
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop(context.Background()) })
	dbURL := cluster.URL("postgres")
	out, code := runWorkerCommand(t, dbURL, "migrate", "--log-level", "warn")
	require.Equal(t, 0, code, out)
	bouncer := pgbouncertest.Start(t, pgbouncertest.Options{ServerURL: dbURL, PoolSize: 4})

	probeEvery := []string{"--database-probe-interval", "1s"}
	w := startWorker(t, dbURL, append([]string{"--stats-interval", "1s"}, probeEvery...)...)
	serve, base := startServe(t, bouncer.URL(t, dbURL), append([]string{"ENQUEUE_AUTH_TOKEN=tok"}, pooled...),
		append([]string{"--dev-allow-local-folders", "--timeout", "5s"}, probeEvery...)...)
	worker, door := "http://"+w.addr, "http://"+adminAddr(t, serve)

	// Healthy: both reach the database, the worker exports its gauges.
	require.Eventually(t, func() bool {
		ws, ds := scrapeSeries(t, worker), scrapeSeries(t, door)
		return ws["ingest_database_up"] == 1 && ds["ingest_database_up"] == 1 && len(families(ws, databaseGauges...)) == len(databaseGauges)
	}, 2*time.Minute, 200*time.Millisecond, "healthy at first")
	for _, url := range []string{worker, door} {
		code, body := readyz(t, url)
		require.Equal(t, http.StatusOK, code, "%s: %s", url, body)
	}

	require.NoError(t, cluster.Stop(ctx))
	stoppedAt := time.Now()
	var ws, ds map[string]float64
	require.Eventually(t, func() bool {
		ws, ds = scrapeSeries(t, worker), scrapeSeries(t, door)
		return ws["ingest_database_up"] == 0 && ds["ingest_database_up"] == 0 && len(families(ws, databaseGauges...)) == 0
	}, 2*time.Minute, 200*time.Millisecond, "within two minutes both say the database is down and the worker drops its gauges")
	t.Logf("both processes exported ingest_database_up 0 and the worker no database gauge %s after PostgreSQL stopped",
		time.Since(stoppedAt).Round(100*time.Millisecond))
	require.Empty(t, families(ws, databaseGauges...), "no database gauge exported frozen")
	require.Contains(t, ws, "ingest_leases_held", "the worker's own gauges stay")
	for _, url := range []string{worker, door} {
		start := time.Now()
		code, body := readyz(t, url)
		require.Equal(t, http.StatusServiceUnavailable, code, "%s", url)
		require.Contains(t, body, "not ready: database unreachable", url)
		require.Less(t, time.Since(start), 5*time.Second, "%s: /readyz does not wait on the database", url)
	}
	frozen := map[string]float64{
		worker: ws["ingest_database_last_success_timestamp_seconds"],
		door:   ds["ingest_database_last_success_timestamp_seconds"],
	}
	for url, last := range frozen {
		require.NotZero(t, last, url)
		require.LessOrEqual(t, last, float64(stoppedAt.Add(time.Second).UnixMilli())/1000, "%s: no success after the stop", url)
	}
	time.Sleep(3 * time.Second) // three probe intervals
	for url, last := range frozen {
		require.Equal(t, last, scrapeSeries(t, url)["ingest_database_last_success_timestamp_seconds"], "%s: the timestamp stops advancing", url)
	}
	status, body := postJSON(t, base+"/v1/imports", "tok", map[string]any{
		"tenant_id": "tenant-a", "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
	require.Equal(t, http.StatusServiceUnavailable, status, "%v", body)
	require.Equal(t, "unavailable", body["outcome"])
	for _, p := range []*workerProc{w, serve} {
		select {
		case <-p.done:
			t.Fatalf("%s exited while the database was down: %v", p.name, p.err)
		default:
		}
		p.waitLog(`"msg":"database unreachable: ingest_database_up is 0 until it answers again"`, 10*time.Second)
	}

	require.NoError(t, cluster.Start(ctx))
	startedAt := time.Now()
	require.Eventually(t, func() bool {
		ws, ds = scrapeSeries(t, worker), scrapeSeries(t, door)
		return ws["ingest_database_up"] == 1 && ds["ingest_database_up"] == 1 && len(families(ws, databaseGauges...)) == len(databaseGauges)
	}, 2*time.Minute, 200*time.Millisecond, "both reach the database again and the worker's gauges come back")
	t.Logf("both processes exported ingest_database_up 1 and the worker its gauges %s after PostgreSQL started again",
		time.Since(startedAt).Round(100*time.Millisecond))
	require.Greater(t, ws["ingest_database_last_success_timestamp_seconds"], frozen[worker])
	require.Greater(t, ds["ingest_database_last_success_timestamp_seconds"], frozen[door])
	for _, url := range []string{worker, door} {
		require.Eventually(t, func() bool { code, _ := readyz(t, url); return code == http.StatusOK }, time.Minute, 200*time.Millisecond,
			"%s: ready again", url)
	}
	for _, p := range []*workerProc{w, serve} {
		p.waitLog(`"msg":"database reachable again"`, 10*time.Second)
	}

	// The door imports and the worker loads again.
	status, body = postJSON(t, base+"/v1/imports", "tok", map[string]any{
		"tenant_id": "tenant-a", "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
	require.Equal(t, http.StatusAccepted, status, "%v", body)
	waitStatus(t, pgtest.Pool(t, dbURL), int64(body["batch_id"].(float64)), batch.StatusSucceeded, 2*time.Minute)
}
