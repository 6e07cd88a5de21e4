package uploads

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// holdJobInserts locks river_job in a transaction of the test, so every
// import transaction waits at its job insert until release is called.
func holdJobInserts(t *testing.T, pool *pgxpool.Pool) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE river_job IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(release)
	return release
}

type httpAnswer struct {
	status int
	body   map[string]any
}

func (f *fixture) goPost(t *testing.T, path string, body []byte) <-chan httpAnswer {
	ch := make(chan httpAnswer, 1)
	go func() {
		status, out := f.post(t, path, "application/json", body, auth)
		ch <- httpAnswer{status, out}
	}()
	return ch
}

func twoRecords(keys ...string) []byte {
	var records []any
	for _, k := range keys {
		records = append(records, map[string]any{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
			"s3": map[string]any{"bucket": map[string]any{"name": "fleet-bucket"}, "object": map[string]any{"key": k}}})
	}
	b, _ := json.Marshal(map[string]any{"Records": records})
	return b
}

func batchIDOf(a httpAnswer) int64 { return int64(a.body["batch_id"].(float64)) }

// TestGroupCommitSharesATransactionAcrossRequests: requests that arrive
// while another import's transaction is in flight share the next
// transaction, and each is answered as it would be alone: 202 with its own
// folder's batch, 409 for the second request of a folder (naming the
// first's batch) and for a folder a running batch holds, 200
// already_succeeded, and an event notification's records each their own.
func TestGroupCommitSharesATransactionAcrossRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.GroupLinger = time.Minute })
	groups := metrics.NewImportGroups(f.m.Registry) // the server's, shared

	status, running := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "running")), auth)
	require.Equal(t, http.StatusAccepted, status)
	status, done := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "done")), auth)
	require.Equal(t, http.StatusAccepted, status)
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Succeeded' WHERE id = $1`, int64(done["batch_id"].(float64)))
	require.NoError(t, err)
	commitsBefore := testutil.ToFloat64(groups.Commits)

	release := holdJobInserts(t, pool)
	first := f.goPost(t, "/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", "gate")))
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%river_job%'`).Scan(&waiting))
		return waiting > 0
	}, 10*time.Second, 5*time.Millisecond, "the first request's transaction is in flight")

	gathered := 0
	send := func(path string, body []byte) <-chan httpAnswer {
		ch := f.goPost(t, path, body)
		gathered++
		require.Eventually(t, func() bool { return testutil.ToFloat64(groups.Waiting) == float64(gathered) }, 10*time.Second, time.Millisecond)
		return ch
	}
	const fresh = 6
	var news []<-chan httpAnswer
	for i := range fresh {
		news = append(news, send("/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", fmt.Sprintf("new-%d", i)))))
	}
	dupA := send("/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", "dup")))
	dupB := send("/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", "dup/")))
	conflict := send("/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", "running")))
	succeeded := send("/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", "done")))
	event := send("/v1/events/s3", twoRecords("tenants/tenant-a/tenant_db/c1/from-event/_SUCCESS", "tenants/tenant-a/tenant_db/c1/dup/_SUCCESS"))
	release()

	a := <-first
	require.Equal(t, http.StatusAccepted, a.status, a.body)
	var ids []int64
	for i, ch := range news {
		a := <-ch
		require.Equal(t, http.StatusAccepted, a.status, a.body)
		require.Equal(t, "enqueued", a.body["outcome"])
		require.Equal(t, "fleet_s3:"+tenantFolder("tenant-a", fmt.Sprintf("new-%d", i)), a.body["source_scope"], "each request answered with its own folder")
		ids = append(ids, batchIDOf(a))
	}
	da, db := <-dupA, <-dupB
	require.Equal(t, http.StatusAccepted, da.status, da.body)
	require.Equal(t, http.StatusConflict, db.status, db.body)
	require.Equal(t, "conflict", db.body["outcome"])
	require.Equal(t, da.body["batch_id"], db.body["running_batch_id"], "the second request of a folder, as if it came after the first")
	ids = append(ids, batchIDOf(da))
	c := <-conflict
	require.Equal(t, http.StatusConflict, c.status, c.body)
	require.Equal(t, running["batch_id"], c.body["running_batch_id"])
	s := <-succeeded
	require.Equal(t, http.StatusOK, s.status, s.body)
	require.Equal(t, "already_succeeded", s.body["outcome"])
	require.Equal(t, done["batch_id"], s.body["batch_id"])
	e := <-event
	require.Equal(t, http.StatusConflict, e.status, "the worst of its records")
	results := e.body["results"].([]any)
	require.Len(t, results, 2)
	fromEvent, dupAgain := results[0].(map[string]any), results[1].(map[string]any)
	require.Equal(t, "enqueued", fromEvent["outcome"])
	require.Equal(t, "conflict", dupAgain["outcome"])
	require.Equal(t, da.body["batch_id"], dupAgain["running_batch_id"])
	ids = append(ids, int64(fromEvent["batch_id"].(float64)))

	var xids int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(DISTINCT x) FROM (
			SELECT xmin::text AS x FROM ingestion_batches WHERE id = ANY($1)
			UNION ALL
			SELECT xmin::text FROM river_job WHERE (args->>'batch_id')::bigint = ANY($1)) t`, ids).Scan(&xids))
	require.Equal(t, 1, xids, "the gathered requests' batches and jobs were written by one transaction")
	require.Equal(t, commitsBefore+2, testutil.ToFloat64(groups.Commits), "the first request's transaction and the shared one")
	require.Zero(t, testutil.ToFloat64(groups.Waiting))
}

// TestGroupCommitOffIsATransactionPerRequest: GroupLinger 0 keeps one
// transaction per request, concurrent or not.
func TestGroupCommitOffIsATransactionPerRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, nil)
	groups := metrics.NewImportGroups(f.m.Registry)
	const requests = 16
	var answers []<-chan httpAnswer
	for i := range requests {
		answers = append(answers, f.goPost(t, "/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", fmt.Sprintf("alone-%d", i)))))
	}
	var ids []int64
	for _, ch := range answers {
		a := <-ch
		require.Equal(t, http.StatusAccepted, a.status, a.body)
		ids = append(ids, batchIDOf(a))
	}
	var xids int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM ingestion_batches WHERE id = ANY($1)`, ids).Scan(&xids))
	require.Equal(t, requests, xids)
	require.Zero(t, testutil.ToFloat64(groups.Commits))
}

// TestGroupCommitFailingFolderFailsOnlyItsRequest: a folder whose
// reservation fails in the database fails the shared transaction; its
// request answers 503 and every other request of the group is enqueued.
func TestGroupCommitFailingFolderFailsOnlyItsRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	_, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_tenant() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN IF NEW.tenant_id = 'tenant-boom' THEN RAISE EXCEPTION 'storage refuses (injected)'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_tenant BEFORE INSERT ON ingestion_batches FOR EACH ROW EXECUTE FUNCTION refuse_tenant();`)
	require.NoError(t, err)
	f := newServer(t, pool, func(c *Config) { c.GroupLinger = time.Minute })
	groups := metrics.NewImportGroups(f.m.Registry)

	release := holdJobInserts(t, pool)
	first := f.goPost(t, "/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", "gate")))
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%river_job%'`).Scan(&waiting))
		return waiting > 0
	}, 10*time.Second, 5*time.Millisecond)
	var answers []<-chan httpAnswer
	for i := range 5 {
		tenant := "tenant-a"
		if i == 2 {
			tenant = "tenant-boom"
		}
		answers = append(answers, f.goPost(t, "/v1/imports", importBody(tenant, tenantFolder(tenant, fmt.Sprintf("f-%d", i)))))
		require.Eventually(t, func() bool { return testutil.ToFloat64(groups.Waiting) == float64(i+1) }, 10*time.Second, time.Millisecond)
	}
	release()
	require.Equal(t, http.StatusAccepted, (<-first).status)
	for i, ch := range answers {
		a := <-ch
		if i == 2 {
			require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
			continue
		}
		require.Equal(t, http.StatusAccepted, a.status, a.body)
	}
	require.Equal(t, 1.0, testutil.ToFloat64(groups.Fallbacks))
}
