package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// failoverDatabase is the operational database's name on a replicated pair.
const failoverDatabase = "fleet"

// startFailoverPair starts a primary and a streaming standby (synchronous:
// a failover loses nothing a client saw committed; otherwise asynchronous)
// under dir, creates the operational database and returns the pair and
// the multi-host URL (target_session_attrs=read-write) every process is
// given. The pair is stopped when the test ends.
func startFailoverPair(t *testing.T, dir string, synchronous bool) (*chaos.Pair, string) {
	t.Helper()
	ctx := context.Background()
	pair, err := chaos.StartPair(ctx, dir, chaos.PairOptions{Synchronous: synchronous, Settings: []string{"fsync=off", "max_connections=300"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pair.Stop(context.Background()) })
	admin, err := pgxpool.New(ctx, pair.URL("postgres"))
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+failoverDatabase)
	require.NoError(t, err)
	return pair, pair.URL(failoverDatabase)
}

// failover crashes the pair's primary as mode says and promotes the
// standby, and logs what the standby lacked and how long the promote took.
func failover(t *testing.T, pair *chaos.Pair, mode chaos.CrashMode) chaos.Tail {
	t.Helper()
	ctx := context.Background()
	tail, err := pair.Crash(ctx, mode)
	require.NoError(t, err)
	took, err := pair.Promote(ctx)
	require.NoError(t, err)
	t.Logf("failover: primary on port %d crashed (the standby had received %s of %s: %d bytes of WAL lost); standby on port %d promoted in %s",
		pair.Standby().Port, tail.ReceivedLSN, tail.PrimaryLSN, tail.Lost, pair.Primary().Port, took.Round(time.Millisecond))
	return tail
}

// requireRunning fails the test if p exited: nothing was restarted.
func requireRunning(t *testing.T, p *workerProc) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("%s exited (%v) across the failover: it should have kept running", p.name, p.err)
	default:
	}
}

// s3Folder writes a completed folder (a data object and the marker) under
// tenants/<tenant>/db_<tenant>/company-1/<name>/ and returns its s3:// URL.
func s3Folder(t *testing.T, srv *s3test.Server, bucket, tenant, name string) string {
	t.Helper()
	prefix := fmt.Sprintf("tenants/%s/db_%s/company-1/%s/", tenant, tenant, name)
	srv.Put(t, bucket, prefix+"trips.csv", []byte("vehicle,km\nV1,10\nV2,20\nV3,30\n"))
	srv.Put(t, bucket, prefix+"_SUCCESS", nil)
	return "s3://" + bucket + "/" + prefix
}

// batchOf waits until the folder's tenant has a batch for it and returns
// its id.
func batchOf(t *testing.T, pool *pgxpool.Pool, tenant, folderURL string, within time.Duration) int64 {
	t.Helper()
	f, err := folder.Canonicalize(folderURL)
	require.NoError(t, err)
	var id int64
	require.Eventually(t, func() bool {
		return pool.QueryRow(context.Background(), `SELECT max(id) FROM ingestion_batches WHERE tenant_id = $1 AND source_scope = $2 HAVING max(id) IS NOT NULL`,
			tenant, f.Scope()).Scan(&id) == nil
	}, within, 100*time.Millisecond, "no batch for %s of %s", folderURL, tenant)
	return id
}

// TestEveryBinaryKeepsServingAcrossAFailover runs every long-running
// binary on a multi-host URL naming both nodes of a replicated pair
// (target_session_attrs=read-write): worker run (warehouse in a database
// of its own, which does not fail over), enqueue serve with the River UI,
// enqueue sqs and a periodic enqueue reconcile. A load is in flight
// (blocked in the warehouse) when the primary crashes; the standby,
// synchronous, is promoted. No process is restarted: each serves on the
// new primary — the door imports, sqs consumes, reconcile's next period
// enqueues, the River UI lists the new jobs, the worker completes every
// batch, the in-flight one under the lease protocol (its term kept, or
// taken over after it expired; chaos.CheckWith holds every invariant). The
// old primary then rejoins as a standby (the URL's first host answers
// again, read-only, and is passed over) and every door still imports.
//
// server-crash: the primary's server dies and its connections are reset;
// everything resumes within a second or two. host-lost: its host
// vanishes (connections hang, new ones are never answered), so each
// process learns only by its own deadlines: the door's first request
// after the failover waits its --timeout (30 s) on a connection the pool
// had just used, sqs and reconcile resume after their rounds' deadlines
// (about 40 s), a lease held through the loss is taken over. Before the
// deadlines of reconcile's periods, no period finished after such a loss.
func TestEveryBinaryKeepsServingAcrossAFailover(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		mode chaos.CrashMode
	}{{"server-crash", chaos.CrashProcess}, {"host-lost", chaos.CrashHost}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			keepServingAcrossAFailover(t, c.mode)
		})
	}
}

func keepServingAcrossAFailover(t *testing.T, mode chaos.CrashMode) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fleet-failover-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	pair, dbURL := startFailoverPair(t, filepath.Join(dir, "pair"), true)
	whURL := pgtest.EmptyDatabaseURL(t)
	out, code := runWorkerCommand(t, dbURL, "migrate", "--warehouse-url", whURL)
	require.Equal(t, 0, code, out)
	pool := pgtest.Pool(t, pair.AdminURL(failoverDatabase))
	wh := pgtest.Pool(t, whURL)

	s3 := s3test.Start(t)
	const bucket = "fleet-failover"
	s3.CreateBucket(t, bucket)
	sqs := sqstest.Start(t)
	queue := sqs.CreateQueue(t, "uploads", map[string]string{"VisibilityTimeout": "30"})

	worker := startWorkerEnv(t, dbURL, s3.Env(), append([]string{"--warehouse-url", whURL, "--concurrency", "4"}, fastLease...)...)
	serve, public := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok", "ENQUEUE_OPERATOR_TOKEN=op-tok"}, "--dev-allow-local-folders")
	admin := "http://" + adminAddr(t, serve)
	consumer := startProcess(t, "sqs", "enqueue",
		[]string{"sqs", "--queue-url", queue, "--bucket", bucket, "--wait-time", "1s", "--admin-listen", "127.0.0.1:0", "--backoff-max", "2s"},
		append([]string{"DATABASE_URL=" + dbURL}, sqs.Env()...), `"msg":"consuming upload notifications"`)
	reconciler := startProcess(t, "reconcile", "enqueue",
		[]string{"reconcile", "--bucket", bucket, "--prefix", "tenants/reconciled/", "--every", "1s", "--admin-listen", "127.0.0.1:0"},
		append([]string{"DATABASE_URL=" + dbURL}, s3.Env()...), `"msg":"reconciling periodically"`)
	processes := []*workerProc{worker, serve, consumer, reconciler}

	type imported struct {
		tenant, url string
		id          int64
	}
	var all []imported
	// Each door imports one folder: the door over HTTP, sqs from a queued
	// S3 event, reconcile a folder nobody notified. importEach retries a
	// door while the database is unavailable, as their clients do.
	importEach := func(round string, within time.Duration) {
		t.Helper()
		start := time.Now()
		f := writeFolder(t, sample)
		var id int64
		var refused []string
		require.Eventually(t, func() bool {
			status, o := postJSON(t, public+"/v1/imports", "tok", map[string]any{"tenant_id": "door", "tenant_database": "db", "company_id": "c", "folder": f})
			if status != http.StatusAccepted {
				refused = append(refused, fmt.Sprintf("%d %v", status, o["outcome"]))
				return false
			}
			id = int64(o["batch_id"].(float64))
			return true
		}, within, 200*time.Millisecond, "enqueue serve never imported after %s", round)
		all = append(all, imported{"door", f, id})
		t.Logf("%s: enqueue serve imported batch %d after %s (answers before: %v)", round, id, time.Since(start).Round(time.Millisecond), refused)

		queued := s3Folder(t, s3, bucket, "queued", "upload-"+round)
		sqs.Send(t, queue, sqstest.S3Event(bucket, strings.TrimPrefix(queued, "s3://"+bucket+"/")+"_SUCCESS"))
		id = batchOf(t, pool, "queued", queued, within)
		all = append(all, imported{"queued", queued, id})
		t.Logf("%s: enqueue sqs imported batch %d after %s", round, id, time.Since(start).Round(time.Millisecond))

		missed := s3Folder(t, s3, bucket, "reconciled", "upload-"+round)
		id = batchOf(t, pool, "reconciled", missed, within)
		all = append(all, imported{"reconciled", missed, id})
		t.Logf("%s: enqueue reconcile imported batch %d after %s", round, id, time.Since(start).Round(time.Millisecond))
	}
	waitSucceeded := func(round string, within time.Duration) {
		t.Helper()
		start := time.Now()
		for _, b := range all {
			waitStatus(t, pool, b.id, batch.StatusSucceeded, within)
		}
		t.Logf("%s: every batch so far Succeeded after %s", round, time.Since(start).Round(time.Millisecond))
	}
	// riverUIJobs waits until the River UI's API lists the completed jobs
	// of the batches.
	riverUIJobs := func(round string, ids ...int64) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			req, err := http.NewRequest(http.MethodGet, admin+"/riverui/api/jobs?state=completed&limit=100", nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer op-tok")
			resp, err := httpClient.Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
			listed := resp.StatusCode == http.StatusOK
			for _, id := range ids {
				listed = listed && strings.Contains(string(body), fmt.Sprintf(`"batch_%d"`, id)) // the job's tag
			}
			if listed {
				return
			}
			require.False(t, time.Now().After(deadline), "%s: the River UI never listed the completed jobs of batches %v; it answered %s", round, ids, last)
		}
	}

	importEach("before", time.Minute)
	waitSucceeded("before", time.Minute)
	riverUIJobs("before", all[0].id, all[1].id, all[2].id)

	// A load in flight: blocked in the warehouse while the primary crashes.
	release := blockLoads(t, wh)
	inFlight := writeFolder(t, sample)
	id := enqueueBatch(t, dbURL, "in-flight", inFlight)
	all = append(all, imported{"in-flight", inFlight, id})
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, wh.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'fleet-load:%' AND wait_event_type = 'Lock'`).Scan(&waiting))
		return waiting > 0
	}, 30*time.Second, 50*time.Millisecond, "the load of batch %d never started", id)
	held, _ := getBatch(t, pool, id)
	require.NotNil(t, held.LeaseID)

	failover(t, pair, mode)
	promoted := time.Now()
	release()

	importEach("after the failover", time.Minute)
	waitSucceeded("after the failover", 2*time.Minute)
	after, _ := getBatch(t, pool, id)
	t.Logf("in-flight batch %d: lease generation %d before the failover, %d at the end (%s)", id, held.LeaseGeneration, after.LeaseGeneration, time.Since(promoted).Round(time.Millisecond))
	riverUIJobs("after the failover", all[len(all)-3].id, all[len(all)-2].id, all[len(all)-1].id)

	took, err := pair.Rejoin(ctx)
	require.NoError(t, err)
	t.Logf("the old primary (port %d) rejoined as a standby in %s", pair.Standby().Port, took.Round(time.Millisecond))
	importEach("after the rejoin", time.Minute)
	waitSucceeded("after the rejoin", time.Minute)
	for _, p := range processes {
		requireRunning(t, p)
	}

	expect := make([]chaos.Expectation, 0, len(all))
	for _, b := range all {
		f, err := folder.Canonicalize(b.url)
		require.NoError(t, err)
		records := sampleRecords
		if b.tenant == "queued" || b.tenant == "reconciled" {
			records = 3
		}
		expect = append(expect, chaos.Expectation{TenantID: b.tenant, Scope: f.Scope(), Records: int64(records)})
	}
	report, err := chaos.CheckWith(ctx, pool, wh, expect)
	require.NoError(t, err)
	require.Empty(t, report.Violations)
	require.Equal(t, len(all), report.Succeeded)
}
