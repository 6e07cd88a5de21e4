package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func countBatches(t *testing.T, dbURL string) int {
	t.Helper()
	pool := pgtest.Pool(t, dbURL)
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	return n
}

func TestImportCommandContract(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	folderURL := writeFolder(t, sample)

	out, code := runEnqueue(t, dbURL, importArgs("tenant-a", folderURL)...)
	require.Equal(t, 0, code, out)
	o := outcome(t, out)
	require.Equal(t, "enqueued", o["outcome"])
	require.NotZero(t, o["batch_id"])
	require.NotZero(t, o["job_id"])
	require.Equal(t, "fleet_s3:"+folderURL, o["source_scope"])
	first := o["batch_id"]

	// The same folder spelled differently is the same scope: conflict.
	out, code = runEnqueue(t, dbURL, importArgs("tenant-a", folderURL+"//")...)
	require.Equal(t, 3, code, out)
	o = outcome(t, out)
	require.Equal(t, "conflict", o["outcome"])
	require.Equal(t, first, o["running_batch_id"])
	require.Equal(t, "fleet_s3:"+folderURL, o["source_scope"])

	before := countBatches(t, dbURL)
	for name, args := range map[string][]string{
		"bad folder":          importArgs("tenant-a", "s3://bucket/a/../b"),
		"query string":        importArgs("tenant-a", "s3://bucket/a?x=1"),
		"over-long tenant":    importArgs(strings.Repeat("t", 101), folderURL),
		"tenant with newline": importArgs("ten\nant", folderURL),
		"bad database":        {"import", "--tenant-id", "t", "--tenant-database", "db; drop", "--company-id", "c", "--folder", folderURL},
		"missing flag":        {"import", "--tenant-id", "t", "--company-id", "c", "--folder", folderURL},
		"unknown command":     {"frobnicate"},
	} {
		out, code := runEnqueue(t, dbURL, args...)
		require.Equal(t, 2, code, "%s: %s", name, out)
		if strings.Contains(out, "{") {
			require.Equal(t, "invalid_input", outcome(t, out)["outcome"], name)
		}
	}
	require.Equal(t, before, countBatches(t, dbURL), "invalid input writes nothing")

	out, code = runEnqueue(t, "", importArgs("tenant-a", folderURL)...)
	require.Equal(t, 2, code, "no database URL is invalid input: %s", out)

	out, code = runEnqueue(t, "postgres://postgres:pw-should-not-leak@127.0.0.1:1/x?connect_timeout=2", importArgs("tenant-a", folderURL)...)
	require.Equal(t, 1, code, "an unreachable database is an infrastructure failure: %s", out)
	require.Equal(t, "error", outcome(t, out)["outcome"])
	require.NotContains(t, out, "pw-should-not-leak")
}

func TestEnqueueFailureMarksBatchFailedAndFreesScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	folderURL := writeFolder(t, sample)

	// Make River's job insert fail for real, inside the database.
	_, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'job queue refuses inserts (injected)'; END $$;
		CREATE TRIGGER refuse_jobs BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION refuse_jobs();`)
	require.NoError(t, err)

	out, code := runEnqueue(t, dbURL, importArgs("tenant-a", folderURL)...)
	require.Equal(t, 4, code, out)
	o := outcome(t, out)
	require.Equal(t, "enqueue_failed", o["outcome"])
	require.Contains(t, o["error"], "job queue refuses inserts (injected)")
	id := int64(o["batch_id"].(float64))

	b, d := getBatch(t, pool, id)
	require.Equal(t, batch.StatusFailed, b.Status)
	require.Equal(t, batch.PhaseFailedEnqueue, d.Phase)
	require.Contains(t, d.LastError.Message, "injected")

	_, err = pool.Exec(ctx, `DROP TRIGGER refuse_jobs ON river_job`)
	require.NoError(t, err)
	out, code = runEnqueue(t, dbURL, importArgs("tenant-a", folderURL)...)
	require.Equal(t, 0, code, "the scope was released: %s", out)
	require.NotEqual(t, float64(id), outcome(t, out)["batch_id"])
}

func TestFiftyConcurrentImportsOneBatch(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	folderURL := writeFolder(t, sample)
	const n = 50
	codes := make([]int, n)
	outs := make([]string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			outs[i], codes[i] = runEnqueue(t, dbURL, importArgs("tenant-a", folderURL)...)
		})
	}
	close(start)
	wg.Wait()
	enqueued, conflicts := 0, 0
	var winner any
	for i := range n {
		o := outcome(t, outs[i])
		switch o["outcome"] {
		case "enqueued":
			require.Equal(t, 0, codes[i])
			enqueued++
			winner = o["batch_id"]
		case "conflict":
			require.Equal(t, 3, codes[i])
			conflicts++
		default:
			t.Fatalf("unexpected outcome: %s", outs[i])
		}
	}
	require.Equal(t, 1, enqueued)
	require.Equal(t, n-1, conflicts)
	for i := range n {
		if o := outcome(t, outs[i]); o["outcome"] == "conflict" {
			require.Equal(t, winner, o["running_batch_id"])
		}
	}
	require.Equal(t, 1, countBatches(t, dbURL))
}

func TestResumeCommandContract(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	w := startWorker(t, dbURL, fastLease...)

	failPublication := func(on bool) {
		sql := `DROP TRIGGER fail_publication ON curated.fleet_publications`
		if on {
			sql = `CREATE OR REPLACE FUNCTION curated.fail_publication() RETURNS trigger LANGUAGE plpgsql AS
				$$ BEGIN RAISE EXCEPTION 'outbox down (injected)'; END $$;
				CREATE TRIGGER fail_publication BEFORE INSERT ON curated.fleet_publications
				FOR EACH ROW EXECUTE FUNCTION curated.fail_publication();`
		}
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	resume := func(id int64, tenant, folderURL string, extra ...string) (map[string]any, int) {
		args := append([]string{"resume", "--batch-id", itoa(id), "--tenant-id", tenant, "--folder", folderURL}, extra...)
		out, code := runEnqueue(t, dbURL, args...)
		return outcome(t, out), code
	}

	// A batch whose publication failed resumes and then succeeds.
	f1 := writeFolder(t, sample)
	failPublication(true)
	id := enqueueBatch(t, dbURL, "tenant-a", f1)
	waitStatus(t, pool, id, batch.StatusFailed, 30*time.Second)
	failPublication(false)
	o, code := resume(id, "tenant-a", f1)
	require.Equal(t, 0, code, o)
	require.Equal(t, "resumed", o["outcome"])
	require.NotZero(t, o["job_id"])
	waitStatus(t, pool, id, batch.StatusSucceeded, 30*time.Second)
	total, distinct := recordCopies(t, pool, "fleet_s3:"+f1)
	require.Equal(t, sampleRecords, total)
	require.Equal(t, sampleRecords, distinct)

	// not_resumable: already succeeded, wrong folder (scope mismatch).
	o, code = resume(id, "tenant-a", f1)
	require.Equal(t, 5, code)
	require.Equal(t, "not_resumable", o["outcome"])
	require.Equal(t, "succeeded", o["reason"])
	o, code = resume(id, "tenant-a", writeFolder(t, sample))
	require.Equal(t, 5, code)
	require.Equal(t, "scope_mismatch", o["reason"])

	// not_found: unknown id, or another tenant's batch.
	o, code = resume(id+1000, "tenant-a", f1)
	require.Equal(t, 5, code)
	require.Equal(t, "not_found", o["outcome"])
	o, code = resume(id, "tenant-b", f1)
	require.Equal(t, 5, code)
	require.Equal(t, "not_found", o["outcome"])

	// not_committed: a pre-commit failure is terminal.
	bad := writeFolder(t, map[string]string{"_SUCCESS": "", "a.csv": "x,y\n1\n"})
	badID := enqueueBatch(t, dbURL, "tenant-a", bad)
	waitStatus(t, pool, badID, batch.StatusFailed, 30*time.Second)
	o, code = resume(badID, "tenant-a", bad)
	require.Equal(t, 5, code)
	require.Equal(t, "not_committed", o["reason"])

	// conflict, then superseded once the newer batch committed.
	f2 := writeFolder(t, sample)
	failPublication(true)
	oldID := enqueueBatch(t, dbURL, "tenant-a", f2)
	waitStatus(t, pool, oldID, batch.StatusFailed, 30*time.Second)
	release := blockLoads(t, pool)
	// An import of a folder whose newest batch is a resumable failed
	// publication names that batch and starts nothing; a re-import
	// loads the folder anew.
	out, code := runEnqueue(t, dbURL, importArgs("tenant-a", f2)...)
	require.Equal(t, 7, code, out)
	require.Equal(t, float64(oldID), outcome(t, out)["batch_id"])
	out, code = runEnqueue(t, dbURL, append(importArgs("tenant-a", f2), "--reimport")...)
	require.Equal(t, 0, code, out)
	newID := int64(outcome(t, out)["batch_id"].(float64))
	o, code = resume(oldID, "tenant-a", f2)
	require.Equal(t, 3, code, o)
	require.Equal(t, "conflict", o["outcome"])
	require.Equal(t, float64(newID), o["running_batch_id"])
	failPublication(false)
	release()
	waitStatus(t, pool, newID, batch.StatusSucceeded, 30*time.Second)
	o, code = resume(oldID, "tenant-a", f2)
	require.Equal(t, 5, code)
	require.Equal(t, "superseded", o["reason"])

	// publication_expired.
	f3 := writeFolder(t, sample)
	failPublication(true)
	expID := enqueueBatch(t, dbURL, "tenant-a", f3)
	waitStatus(t, pool, expID, batch.StatusFailed, 30*time.Second)
	failPublication(false)
	o, code = resume(expID, "tenant-a", f3, "--publication-window", "1ms")
	require.Equal(t, 5, code)
	require.Equal(t, "publication_expired", o["reason"])

	// Invalid input.
	_, code = runEnqueue(t, dbURL, "resume", "--batch-id", "0", "--tenant-id", "t", "--folder", f3)
	require.Equal(t, 2, code)
	_, code = runEnqueue(t, dbURL, "resume", "--batch-id", "x", "--tenant-id", "t", "--folder", f3)
	require.Equal(t, 2, code)
	require.GreaterOrEqual(t, w.metric(`ingest_deliveries_total{outcome="worked"}`), float64(5))
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }
