package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestCancelStopsTheWorkerAndFreesTheScope cancels a batch whose worker
// process is in the middle of its load: the scope is free at once (a new
// import of the folder is enqueued before the old load even returns), the
// worker stops without committing or writing anything more, its River job
// ends cancelled, and the new batch owns the slice.
func TestCancelStopsTheWorkerAndFreesTheScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	w := startWorker(t, dbURL, fastLease...)
	release := blockLoads(t, pool)
	folderURL := writeFolder(t, sample)
	id := enqueueBatch(t, dbURL, "tenant-a", folderURL)
	held := waitLoadBlocked(t, pool, id, w.name+"/")

	out, code := runEnqueue(t, dbURL, "cancel", "--batch-id", fmt.Sprint(id), "--tenant-id", "tenant-b")
	require.Equal(t, 5, code, out)
	require.Equal(t, "not_found", outcome(t, out)["outcome"])

	out, code = runEnqueue(t, dbURL, "cancel", "--batch-id", fmt.Sprint(id), "--tenant-id", "tenant-a", "--reason", "wrong upload", "--by", "alice")
	require.Equal(t, 0, code, out)
	o := outcome(t, out)
	require.Equal(t, "cancelled", o["outcome"])
	require.Equal(t, *held.LeaseID, o["previous_holder"])
	require.Len(t, o["cancelled_jobs"], 1)

	// The scope is free at once, while the old load is still in flight.
	newer := enqueueBatch(t, dbURL, "tenant-a", folderURL)

	// The worker notices (River's cancel and its next renewal) and stops,
	// saying in one line who cancelled the batch and why.
	var cancelLine map[string]any
	require.NoError(t, json.Unmarshal([]byte(w.waitLog(`"msg":"batch cancelled by an operator: stopped without further writes"`, 30*time.Second)), &cancelLine))
	require.Equal(t, "cli:"+loginName(t, dbURL), cancelLine["cancelled_by"], "who is the database login; --by is a note")
	require.Equal(t, "wrong upload", cancelLine["reason"])
	require.Equal(t, "tenant-a", cancelLine["tenant_id"])
	require.Equal(t, float64(id), cancelLine["batch_id"])
	require.NotEmpty(t, cancelLine["cancelled_at"])
	// The delivery's acquire line named its tenant.
	var acquired map[string]any
	require.NoError(t, json.Unmarshal([]byte(w.waitLog(`"msg":"lease acquired: working on batch"`, time.Second)), &acquired))
	require.Equal(t, "tenant-a", acquired["tenant_id"])
	require.Equal(t, float64(id), acquired["batch_id"])
	require.Eventually(t, func() bool { return jobStates(t, pool, id)["cancelled"] == 1 }, 30*time.Second, 50*time.Millisecond,
		"the cancelled delivery's job ends cancelled: %v", jobStates(t, pool, id))
	release()

	done := waitStatus(t, pool, newer, batch.StatusSucceeded, 30*time.Second)
	total, distinct := recordCopies(t, pool, done.Scope())
	require.Equal(t, sampleRecords, total)
	require.Equal(t, sampleRecords, distinct)
	var stamped int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT batch_id FROM curated.fleet_slices WHERE source_scope = $1`, done.Scope()).Scan(&stamped))
	require.Equal(t, newer, stamped, "the cancelled load never committed")

	b, d := getBatch(t, pool, id)
	require.Equal(t, batch.StatusFailed, b.Status)
	require.Equal(t, batch.PhaseCancelled, d.Phase)
	require.Equal(t, held.LeaseGeneration+1, b.LeaseGeneration)
	require.Equal(t, "cancelled by cli:"+loginName(t, dbURL)+": wrong upload", d.LastError.Message)
	for _, wr := range d.Writes {
		require.False(t, wr.At.After(*b.CancelledAt), "no write landed after the cancel")
	}
	require.GreaterOrEqual(t, w.metric(`ingest_deliveries_total{outcome="cancelled"}`), float64(1))

	out, code = runEnqueue(t, dbURL, "cancel", "--batch-id", fmt.Sprint(id), "--tenant-id", "tenant-a")
	require.Equal(t, 5, code, out)
	o = outcome(t, out)
	require.Equal(t, "not_cancellable", o["outcome"])
	require.Equal(t, "cancelled", o["phase"])

	// Retry starts a new batch for the cancelled batch's folder; the folder's
	// newest batch succeeded meanwhile, so the answer is that of an import.
	out, code = runEnqueue(t, dbURL, "retry", "--batch-id", fmt.Sprint(id), "--tenant-id", "tenant-a")
	require.Equal(t, 0, code, out)
	require.Equal(t, "already_succeeded", outcome(t, out)["outcome"])
}

// TestParkedBatchIsNotRedeliveredInALoop: a Running batch whose details are
// of an (older) version this build does not know used to be re-delivered by
// the sweeper every --orphan-after, forever, holding its folder. Now the
// first delivery parks it; sweeps leave it alone (their take-back of parked
// batches judges it as the delivery did: this build cannot work on it);
// operators see it with the reason (list --stuck, status,
// ingest_parked_batches) and cancel releases it. (A version newer than this
// build's is not parked but left to a newer build:
// TestANewerDetailsVersionIsSnoozedNotParked.)
func TestParkedBatchIsNotRedeliveredInALoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	folderURL := writeFolder(t, sample)
	id := enqueueBatch(t, dbURL, "tenant-a", folderURL)
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = details || '{"version": 0}' WHERE id = $1`, id)
	require.NoError(t, err)

	w := startWorker(t, dbURL, append([]string{"--orphan-after", "1s"}, fastLease...)...)
	var parkedAt time.Time
	require.Eventually(t, func() bool {
		b, err := getBatchRaw(pool, id)
		if err != nil || b.ParkedAt == nil {
			return false
		}
		parkedAt = *b.ParkedAt
		return true
	}, 30*time.Second, 50*time.Millisecond, "the batch is parked")
	// Let several sweeps run well past the orphan window.
	sweeps := w.metric(`ingest_sweeps_total`)
	require.Eventually(t, func() bool {
		var past bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT now() > $1::timestamptz + interval '4 seconds'`, parkedAt).Scan(&past))
		return past && w.metric(`ingest_sweeps_total`) >= sweeps+4
	}, 60*time.Second, 100*time.Millisecond)
	require.Equal(t, map[string]int{"cancelled": 1}, jobStates(t, pool, id), "one delivery, no re-delivery")
	b, err := getBatchRaw(pool, id)
	require.NoError(t, err)
	require.Equal(t, int64(1), b.LeaseGeneration, "leased once")
	require.Equal(t, batch.StatusRunning, b.Status)
	require.Equal(t, "details version 0 unknown to this build", *b.ParkedReason)
	require.Equal(t, float64(1), w.metric(`ingest_deliveries_total{outcome="parked"}`))
	require.Zero(t, w.metric(`ingest_sweep_redeliveries_total{outcome="unparked"}`), "not taken back: this build cannot work on it")
	require.Eventually(t, func() bool { return w.metric(`ingest_parked_batches`) == 1 }, 15*time.Second, 100*time.Millisecond)

	out, code := runEnqueue(t, dbURL, "list", "--stuck", "--json")
	require.Equal(t, 0, code, out)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &v), out)
	require.Equal(t, float64(id), v["batch_id"])
	require.Equal(t, true, v["parked"])
	require.Equal(t, "details version 0 unknown to this build", v["parked_reason"])
	out, code = runEnqueue(t, dbURL, "status", "--batch-id", fmt.Sprint(id))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "parked: details version 0 unknown to this build")

	// The folder is blocked until an operator cancels the parked batch.
	out, code = runEnqueue(t, dbURL, importArgs("tenant-a", folderURL)...)
	require.Equal(t, 3, code, out)
	out, code = runEnqueue(t, dbURL, "cancel", "--batch-id", fmt.Sprint(id), "--tenant-id", "tenant-a", "--reason", "unknown version")
	require.Equal(t, 0, code, out)
	b, err = getBatchRaw(pool, id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
	var version int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (details->>'version')::int FROM ingestion_batches WHERE id = $1`, id).Scan(&version))
	require.Equal(t, 0, version, "the unknown document was never rewritten")
	newer := enqueueBatch(t, dbURL, "tenant-a", folderURL)
	waitStatus(t, pool, newer, batch.StatusSucceeded, 30*time.Second)
	require.Eventually(t, func() bool { return w.metric(`ingest_parked_batches`) == 0 }, 15*time.Second, 100*time.Millisecond)
}

// getBatchRaw reads a batch without parsing its details.
func getBatchRaw(pool *pgxpool.Pool, id int64) (batch.Batch, error) {
	return batch.NewStore(pool).Get(context.Background(), id)
}

// TestCancelRouteNeedsTheOperatorToken replays, through a real enqueue
// serve, the tenant spoofing the shared token allowed: a notification
// sender naming a tenant (tenant ids are in S3 paths) and a batch id (they
// are sequential) in the body of POST /v1/batches/{id}/cancel. The import
// token is refused 403 and the batch keeps running; the operator token
// (from --operator-token-file) cancels it. Without an operator token the
// route is not served.
func TestCancelRouteNeedsTheOperatorToken(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	operatorFile := filepath.Join(t.TempDir(), "operator-token")
	require.NoError(t, os.WriteFile(operatorFile, []byte("op-s3cr3t\n"), 0o600))
	serve, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=import-tok"}, "--operator-token-file", operatorFile, "--dev-allow-local-folders")
	status, out := postJSON(t, base+"/v1/imports", "import-tok",
		map[string]any{"tenant_id": "victim", "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
	require.Equal(t, http.StatusAccepted, status, "%v", out)
	id := int64(out["batch_id"].(float64))
	admin := "http://" + adminAddr(t, serve)
	cancelURL := fmt.Sprintf("%s/v1/batches/%d/cancel", admin, id)

	// The public port does not serve it: the admin listener does.
	status, out = postJSON(t, fmt.Sprintf("%s/v1/batches/%d/cancel", base, id), "op-s3cr3t", map[string]any{"tenant_id": "victim"})
	require.Equal(t, http.StatusNotFound, status, "%v", out)
	require.Equal(t, "not_served", out["outcome"])
	require.Contains(t, out["error"], "--admin-listen")

	for name, tc := range map[string]struct {
		token  string
		status int
	}{
		"import token": {"import-tok", http.StatusForbidden},
		"no token":     {"", http.StatusUnauthorized},
		"wrong token":  {"op-s3cr3", http.StatusUnauthorized},
	} {
		status, out := postJSON(t, cancelURL, tc.token, map[string]any{"tenant_id": "victim", "reason": "spoofed"})
		require.Equal(t, tc.status, status, "%s: %v", name, out)
	}
	b, _ := getBatch(t, pool, id)
	require.Equal(t, batch.StatusRunning, b.Status, "the spoofed cancels changed nothing")
	require.Equal(t, map[string]int{"available": 1}, jobStates(t, pool, id))

	status, out = postJSON(t, cancelURL, "op-s3cr3t", map[string]any{"tenant_id": "victim", "reason": "operator"})
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.Equal(t, "cancelled", out["outcome"])
	b, _ = getBatch(t, pool, id)
	require.Equal(t, batch.StatusFailed, b.Status)
	require.NotContains(t, serve.logs.String(), "op-s3cr3t", "the operator token never appears in logs")

	// Without an operator token: not served, whatever the token.
	bareServe, bare := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=import-tok"}, "--dev-allow-local-folders")
	bareAdmin := "http://" + adminAddr(t, bareServe)
	status, out = postJSON(t, bare+"/v1/imports", "import-tok",
		map[string]any{"tenant_id": "victim", "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
	require.Equal(t, http.StatusAccepted, status, "%v", out)
	other := int64(out["batch_id"].(float64))
	status, out = postJSON(t, fmt.Sprintf("%s/v1/batches/%d/cancel", bareAdmin, other), "import-tok", map[string]any{"tenant_id": "victim"})
	require.Equal(t, http.StatusNotFound, status, "%v", out)
	require.Equal(t, "not_served", out["outcome"])
	require.Contains(t, out["error"], "--operator-token-file")
	b, _ = getBatch(t, pool, other)
	require.Equal(t, batch.StatusRunning, b.Status)
}

// TestServeRefusesAnOperatorTokenEqualToTheImportToken: the operator token
// would then be in every notification sender's hands; serve exits 2 before
// listening, saying why.
func TestServeRefusesAnOperatorTokenEqualToTheImportToken(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	// A build that started anyway would serve until killed: fail, not hang.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "enqueue"), "serve", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "ENQUEUE_AUTH_TOKEN=same-tok", "ENQUEUE_OPERATOR_TOKEN=same-tok")
	out, _ := cmd.CombinedOutput()
	require.Equal(t, 2, cmd.ProcessState.ExitCode(), string(out))
	require.Contains(t, string(out), "the operator token must differ from the import token")
	require.Contains(t, string(out), `"field":"operator_token_file"`)
	require.NotContains(t, string(out), "listening")
	require.NotContains(t, string(out), "same-tok")
}
