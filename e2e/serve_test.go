package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// startServe starts "enqueue serve" (its admin listener on a port of its
// own too: see adminAddr) and returns its base URL.
func startServe(t *testing.T, dbURL string, env []string, args ...string) (*workerProc, string) {
	t.Helper()
	p := startProcess(t, "serve", "enqueue", append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...),
		append([]string{"DATABASE_URL=" + dbURL}, env...), `"msg":"listening for upload notifications"`)
	return p, "http://" + p.addr
}

func postJSON(t *testing.T, url, token string, body any) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// TestHTTPAndCommandLineShareOutcomes sends the same inputs through
// "enqueue serve" and "enqueue import" and expects the same outcomes.
func TestHTTPAndCommandLineShareOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cr3t-token\n"), 0o600))
	serve, base := startServe(t, dbURL, nil, "--auth-token-file", tokenFile, "--dev-allow-local-folders")

	req := func(tenant, folder string) map[string]any {
		return map[string]any{"tenant_id": tenant, "tenant_database": "tenant_db", "company_id": "company-1", "folder": folder}
	}
	strip := func(m map[string]any) map[string]any {
		c := map[string]any{}
		for k, v := range m {
			c[k] = v
		}
		delete(c, "batch_id")
		delete(c, "job_id")
		delete(c, "running_batch_id")
		return c
	}
	// The door adds a hint in words for an HTTP caller (routes and JSON
	// fields, such as "reimport": true); the command line's caller has its
	// flags and exit codes. Everything else is one schema.
	httpOnly := func(m map[string]any) map[string]any {
		c := strip(m)
		delete(c, "hint")
		return c
	}
	a, b := writeFolder(t, sample), writeFolder(t, sample)

	// enqueued through the CLI, then conflict through HTTP (and vice versa).
	cliOut, code := runEnqueue(t, dbURL, importArgs("tenant-a", a)...)
	require.Equal(t, 0, code)
	cliEnq := outcome(t, cliOut)
	status, httpConflict := postJSON(t, base+"/v1/imports", "s3cr3t-token", req("tenant-a", a))
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, cliEnq["batch_id"], httpConflict["running_batch_id"])

	status, httpEnq := postJSON(t, base+"/v1/imports", "s3cr3t-token", req("tenant-a", b))
	require.Equal(t, http.StatusAccepted, status)
	cliOut, code = runEnqueue(t, dbURL, importArgs("tenant-a", b)...)
	require.Equal(t, 3, code)
	cliConflict := outcome(t, cliOut)
	require.Equal(t, httpEnq["batch_id"], cliConflict["running_batch_id"])
	// Apart from ids and the folder's own scope, the answers are the same.
	require.Equal(t, "enqueued", cliEnq["outcome"])
	require.Equal(t, "enqueued", httpEnq["outcome"])
	require.Equal(t, "conflict", cliConflict["outcome"])
	require.Equal(t, "conflict", httpConflict["outcome"])
	require.Equal(t, "fleet_s3:"+a, httpConflict["source_scope"])
	require.Equal(t, "fleet_s3:"+b, cliConflict["source_scope"])
	require.ElementsMatch(t, keys(strip(cliEnq)), keys(httpOnly(httpEnq)))
	require.NotEmpty(t, httpConflict["hint"], "a conflict answered over HTTP says what to do")
	require.ElementsMatch(t, keys(strip(cliConflict)), keys(httpOnly(httpConflict)))

	// invalid input: the same refusal.
	cliOut, code = runEnqueue(t, dbURL, importArgs("tenant-a", "s3://bucket/a/../b")...)
	require.Equal(t, 2, code)
	status, httpInvalid := postJSON(t, base+"/v1/imports", "s3cr3t-token", req("tenant-a", "s3://bucket/a/../b"))
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, outcome(t, cliOut), httpInvalid)

	// already succeeded: the same answer.
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Succeeded' WHERE id = $1`, int64(cliEnq["batch_id"].(float64)))
	require.NoError(t, err)
	cliOut, code = runEnqueue(t, dbURL, importArgs("tenant-a", a)...)
	require.Equal(t, 0, code)
	status, httpDone := postJSON(t, base+"/v1/imports", "s3cr3t-token", req("tenant-a", a))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, httpDone["hint"], `"reimport": true`)
	delete(httpDone, "hint")
	require.Equal(t, outcome(t, cliOut), httpDone)
	require.Equal(t, "already_succeeded", httpDone["outcome"])

	status, _ = postJSON(t, base+"/v1/imports", "", req("tenant-a", a))
	require.Equal(t, http.StatusUnauthorized, status)

	// Graceful shutdown: clean exit.
	serve.signal(syscall.SIGTERM)
	require.Equal(t, 0, serve.wait(20*time.Second))
	require.Contains(t, serve.logs.String(), "shutting down")
	require.NotContains(t, serve.logs.String(), "s3cr3t-token", "the token never appears in logs")
	_, d := getBatch(t, pool, int64(httpEnq["batch_id"].(float64)))
	require.Equal(t, batch.PhaseReserved, d.Phase)
}

func TestServeRefusesToStartWithoutAuth(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	cmd := exec.Command(filepath.Join(binDir, "enqueue"), "serve", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "ENQUEUE_AUTH_TOKEN=")
	out, _ := cmd.CombinedOutput()
	require.Equal(t, 2, cmd.ProcessState.ExitCode(), string(out))
	require.True(t, strings.Contains(string(out), "refusing to serve without authentication"), string(out))
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestServeFinishesInFlightRequestsOnSIGTERM holds a request inside its
// reservation transaction, sends SIGTERM, and expects the request to complete
// (reservation and job both committed) before a clean exit.
func TestServeFinishesInFlightRequestsOnSIGTERM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	serve, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok"}, "--dev-allow-local-folders")

	// Block River's job insert so the request waits inside its transaction.
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = blocker.Exec(ctx, `LOCK TABLE river_job IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	type answer struct {
		status int
		body   map[string]any
	}
	done := make(chan answer, 1)
	folder := writeFolder(t, sample)
	go func() {
		s, b := postJSON(t, base+"/v1/imports", "tok", map[string]any{"tenant_id": "t", "tenant_database": "db", "company_id": "c", "folder": folder})
		done <- answer{s, b}
	}()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%river_job%'`).Scan(&waiting))
		return waiting > 0
	}, 10*time.Second, 10*time.Millisecond)

	serve.signal(syscall.SIGTERM)
	serve.waitLog("shutting down", 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, blocker.Rollback(ctx))

	a := <-done
	require.Equal(t, http.StatusAccepted, a.status, a.body)
	require.Equal(t, 0, serve.wait(20*time.Second))
	id := int64(a.body["batch_id"].(float64))
	b, d := getBatch(t, pool, id)
	require.Equal(t, batch.StatusRunning, b.Status)
	require.Equal(t, batch.PhaseReserved, d.Phase)
	require.Equal(t, map[string]int{"available": 1}, jobStates(t, pool, id), "the reservation has its job")
}

// TestServeTimeoutBoundsEachRequest: --timeout bounds the database work of
// each request (it was always 30 s): an import stuck behind a lock answers
// 503 once it is over, long before the client gives up.
func TestServeTimeoutBoundsEachRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	_, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok"}, "--timeout", "3s", "--dev-allow-local-folders")

	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = blocker.Exec(ctx, `LOCK TABLE ingestion_batches IN EXCLUSIVE MODE`)
	require.NoError(t, err)

	body, err := json.Marshal(map[string]any{"tenant_id": "t", "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, base+"/v1/imports", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer tok")
	// Well under the old fixed 30 s, well over --timeout on a loaded machine.
	client := &http.Client{Timeout: 25 * time.Second}
	resp, err := client.Do(req)
	require.NoError(t, err, "the request outlived --timeout")
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%v", out)
	require.Equal(t, "unavailable", out["outcome"])
	require.NoError(t, blocker.Rollback(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	require.Zero(t, n, "the timed-out import left nothing behind")
}
