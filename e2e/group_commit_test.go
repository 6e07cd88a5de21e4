package e2e

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestServeSIGTERMAnswersGatheredGroups: with group commit, requests that
// gathered for the next group while another transaction was in flight are
// all answered when enqueue serve gets SIGTERM: the transaction in flight
// commits, the gathered group goes right after it as one transaction, and
// every request gets its 202 before a clean exit.
func TestServeSIGTERMAnswersGatheredGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	// A linger far longer than the test: the gathered group can only go
	// when the transaction in flight ends.
	serve, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok"}, "--dev-allow-local-folders", "--group-linger", "10m")

	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = blocker.Exec(ctx, `LOCK TABLE river_job IN EXCLUSIVE MODE`)
	require.NoError(t, err)

	type answer struct {
		status int
		body   map[string]any
	}
	post := func() <-chan answer {
		ch := make(chan answer, 1)
		folder := writeFolder(t, sample)
		go func() {
			s, b := postJSON(t, base+"/v1/imports", "tok", map[string]any{"tenant_id": "t", "tenant_database": "db", "company_id": "c", "folder": folder})
			ch <- answer{s, b}
		}()
		return ch
	}
	first := post()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%river_job%'`).Scan(&waiting))
		return waiting > 0
	}, 10*time.Second, 10*time.Millisecond, "the first request's transaction is in flight")
	const gathered = 8
	var answers []<-chan answer
	for range gathered {
		answers = append(answers, post())
	}
	require.Eventually(t, func() bool { return serve.metric("ingest_import_group_waiting") == gathered },
		10*time.Second, 10*time.Millisecond, "the requests gathered for the next group")

	serve.signal(syscall.SIGTERM)
	serve.waitLog("shutting down", 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, blocker.Rollback(ctx))

	a := <-first
	require.Equal(t, http.StatusAccepted, a.status, a.body)
	var ids []int64
	for _, ch := range answers {
		a := <-ch
		require.Equal(t, http.StatusAccepted, a.status, a.body)
		ids = append(ids, int64(a.body["batch_id"].(float64)))
	}
	require.Equal(t, 0, serve.wait(20*time.Second))
	var xids, jobs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM ingestion_batches WHERE id = ANY($1)`, ids).Scan(&xids))
	require.Equal(t, 1, xids, "the gathered requests shared one transaction")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE (args->>'batch_id')::bigint = ANY($1)`, ids).Scan(&jobs))
	require.Equal(t, gathered, jobs, "each reservation has its job")
}
