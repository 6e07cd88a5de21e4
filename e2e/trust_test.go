package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/uploads"
)

// TestHTTPImportAttacksFailClosed replays, through a real "enqueue serve"
// and with the one shared token, the attacks that used to load a host
// directory as tenant "evil", leak host file names, bypass the bucket
// allow-list and load acme's folder as evil. Each is refused 422 with the
// field; nothing is written; a worker running all along loads nothing.
func TestHTTPImportAttacksFailClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	startWorker(t, dbURL, fastLease...)
	secrets := writeFolder(t, map[string]string{"credentials.csv": "user,password\nadmin,hunter2\n", "_SUCCESS": ""})
	_, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok"}, "--bucket", "allowed-bkt")

	acme := "s3://allowed-bkt/tenants/acme/acme_db/c-7/2026-11-30/up-1"
	for name, tc := range map[string]struct {
		body  map[string]any
		field string
	}{
		"another app's directory as evil": {map[string]any{"tenant_id": "evil", "tenant_database": "db", "company_id": "c", "folder": secrets}, "folder"},
		"a host system directory":         {map[string]any{"tenant_id": "evil", "tenant_database": "db", "company_id": "c", "folder": "file:///etc"}, "folder"},
		"an in-process bucket":            {map[string]any{"tenant_id": "evil", "tenant_database": "db", "company_id": "c", "folder": "mem://fleet/x"}, "folder"},
		"a bucket off the allow-list":     {map[string]any{"tenant_id": "acme", "tenant_database": "acme_db", "company_id": "c-7", "folder": "s3://other-bkt/tenants/acme/acme_db/c-7/x"}, "folder"},
		"acme's folder as evil":           {map[string]any{"tenant_id": "evil", "tenant_database": "acme_db", "company_id": "c-7", "folder": acme}, "tenant_id"},
		"acme's folder into evil's db":    {map[string]any{"tenant_database": "evil_db", "folder": acme}, "tenant_database"},
		"acme's folder as evil's company": {map[string]any{"company_id": "evil", "folder": acme}, "company_id"},
	} {
		status, out := postJSON(t, base+"/v1/imports", "tok", tc.body)
		require.Equal(t, http.StatusUnprocessableEntity, status, "%s: %v", name, out)
		require.Equal(t, "invalid_input", out["outcome"], name)
		require.Equal(t, tc.field, out["field"], name)
		require.NotContains(t, fmt.Sprint(out), "/etc", "%s: no host path in the answer", name)
		require.NotContains(t, fmt.Sprint(out), secrets, name)
	}
	status, out := postJSON(t, base+"/v1/events/s3", "tok", json.RawMessage(s3EventBody("other-bkt", "tenants/acme/acme_db/c-7/x/_SUCCESS")))
	require.Equal(t, http.StatusUnprocessableEntity, status, "the allow-list holds on the event route too: %v", out)

	var batches, records int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&batches))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_records`).Scan(&records))
	require.Zero(t, batches, "nothing was reserved")
	require.Zero(t, records, "nothing was loaded")

	// The folder's own tenant, from its path: reserved as acme.
	status, out = postJSON(t, base+"/v1/imports", "tok", map[string]any{"folder": acme})
	require.Equal(t, http.StatusAccepted, status, out)
	b, _ := getBatch(t, pool, int64(out["batch_id"].(float64)))
	require.Equal(t, "acme", b.TenantID)
}

// TestSignedNotificationReplayFailsAcrossReplicasAndRestarts: a signed
// request accepted by one enqueue serve process is refused by another
// replica and by the same service after a restart.
func TestSignedNotificationReplayFailsAcrossReplicasAndRestarts(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	secretFile := filepath.Join(t.TempDir(), "hmac")
	require.NoError(t, os.WriteFile(secretFile, []byte("shared-secret"), 0o600))
	env := []string{"ENQUEUE_AUTH_TOKEN=tok"}
	first, baseA := startServe(t, dbURL, env, "--hmac-secret-file", secretFile)
	_, baseB := startServe(t, dbURL, env, "--hmac-secret-file", secretFile)

	event := s3EventBody("fleet-uploads", "tenants/t1/db1/c1/replayed/_SUCCESS")
	sig, ts := uploads.Sign([]byte("shared-secret"), event, time.Now())
	status, out := postSigned(t, baseA, event, sig, ts)
	require.Equal(t, http.StatusAccepted, status, out)
	status, out = postSigned(t, baseB, event, sig, ts)
	require.Equal(t, http.StatusUnauthorized, status, "another replica: %v", out)
	require.Contains(t, out["error"], "already used")

	first.signal(syscall.SIGTERM)
	require.Equal(t, 0, first.wait(30*time.Second))
	_, baseC := startServe(t, dbURL, env, "--hmac-secret-file", secretFile)
	status, out = postSigned(t, baseC, event, sig, ts)
	require.Equal(t, http.StatusUnauthorized, status, "after a restart: %v", out)
}

// largeFieldFolder writes a CSV whose second row holds one field of n
// bytes.
func largeFieldFolder(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "big.csv"))
	require.NoError(t, err)
	_, err = f.WriteString("id,note\n1,small\n2,")
	require.NoError(t, err)
	chunk := []byte(strings.Repeat("x", 1<<20))
	for written := 0; written < n; written += len(chunk) {
		_, err = f.Write(chunk[:min(len(chunk), n-written)])
		require.NoError(t, err)
	}
	_, err = f.WriteString("\n3,after\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644))
	return "file://" + dir
}

// workerRSSBound is the bound on a worker's peak RSS while it refuses
// oversized records: half the chart's memory limit of 512 MiB.
const workerRSSBound = 256 << 20

// TestHostileFoldersFailClosedInAWorker runs a real worker (built without
// -race) over folders an attacker can upload: a 64 MiB CSV field (which
// took a worker to 767 MiB), NUL escapes, a file name made of terminal
// escape sequences. Each fails failed_pre_commit naming the object and the
// line; the worker's own peak RSS (VmHWM) stays under 256 MiB; the valid
// text \u0000 loads; and the operator's table output stays inert.
func TestHostileFoldersFailClosedInAWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	w := startWorker(t, dbURL, fastLease...)
	pid := w.cmd.Process.Pid

	failed := func(folderURL, wantObject string, wantLine int) (int64, batch.Details) {
		t.Helper()
		id := enqueueBatch(t, dbURL, "tenant-h", folderURL)
		waitStatus(t, pool, id, batch.StatusFailed, 60*time.Second)
		_, d := getBatch(t, pool, id)
		require.Equal(t, batch.PhaseFailedPreCommit, d.Phase)
		require.NotNil(t, d.LastError)
		require.Contains(t, d.LastError.Message, wantObject)
		if wantLine > 0 {
			require.Contains(t, d.LastError.Message, fmt.Sprintf("line %d", wantLine))
		}
		return id, d
	}

	big := largeFieldFolder(t, 64<<20)
	_, d := failed(big, "/big.csv", 3)
	require.Contains(t, d.LastError.Message, "record longer than 16777216 bytes")
	peak, err := testproc.ProcessPeakRSS(pid)
	require.NoError(t, err)
	t.Logf("worker peak RSS after refusing a 64 MiB CSV field: %.1f MiB", float64(peak)/(1<<20))
	require.Less(t, peak, int64(workerRSSBound))

	// Just under the bound: a 15 MiB field loads, still within the bound.
	fits := largeFieldFolder(t, 15<<20)
	id := enqueueBatch(t, dbURL, "tenant-h", fits)
	waitStatus(t, pool, id, batch.StatusSucceeded, 60*time.Second)
	peak, err = testproc.ProcessPeakRSS(pid)
	require.NoError(t, err)
	t.Logf("worker peak RSS after loading a 15 MiB CSV field: %.1f MiB", float64(peak)/(1<<20))
	require.Less(t, peak, int64(workerRSSBound))

	// NUL: the escape \u0000 cannot be stored; the text \u0000 can.
	failed(writeFolder(t, map[string]string{"e.ndjson": "{\"ok\":1}\n{\"note\":\"a\\u0000b\"}\n", "_SUCCESS": ""}), "/e.ndjson", 2)
	text := writeFolder(t, map[string]string{"e.ndjson": "{\"note\":\"\\\\u0000 is how JSON writes NUL\"}\n", "_SUCCESS": ""})
	id = enqueueBatch(t, dbURL, "tenant-h", text)
	waitStatus(t, pool, id, batch.StatusSucceeded, 60*time.Second)
	var note string
	require.NoError(t, pool.QueryRow(ctx, `SELECT record->>'note' FROM curated.fleet_records WHERE batch_id = $1`, id).Scan(&note))
	require.Equal(t, `\u0000 is how JSON writes NUL`, note)

	// An object named with terminal escapes fails its batch when the
	// folder is listed (no door reads a key holding a control character),
	// and the name reaches the last error escaped.
	hostileName := "x\x1b]0;pwned\x07\x1b[2J.csv"
	hostileID, hostile := failed(writeFolder(t, map[string]string{hostileName: "a,b\n1,2\n3\n", "_SUCCESS": ""}), `x\x1b]0;pwned`, 0)
	require.Contains(t, hostile.LastError.Message, strconv.Quote(hostileName))
	require.Contains(t, hostile.LastError.Message, "unreadable object key")
	for _, args := range [][]string{{"list"}, {"list", "--status", "Failed"}, {"list", "--json"}, {"status", "--batch-id", itoa(hostileID)}, {"status", "--batch-id", itoa(hostileID), "--json"}} {
		out, code := runEnqueue(t, dbURL, args...)
		require.Equal(t, 0, code, out)
		require.NotContains(t, out, "\x1b", args)
		require.NotContains(t, out, "\x07", args)
		if args[len(args)-1] == "--json" {
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				require.True(t, json.Valid([]byte(line)), line)
			}
		}
	}
	out, _ := runEnqueue(t, dbURL, "status", "--batch-id", itoa(hostileID), "--json")
	var v struct {
		LastError string `json:"last_error"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Contains(t, v.LastError, strconv.Quote(hostileName), "JSON carries the name as the error quoted it")
}

// TestIdleConnectionsDoNotKillWorkerHealthz holds 600 idle connections
// (half of them kept alive after one request, half silent) open against a
// worker limited to 256 file descriptors (where 1,008 idle
// connections used to exhaust a worker's descriptors, kill /healthz and
// fail a valid batch because its directory could not be listed). /healthz
// still answers, the worker keeps its descriptors, and a batch loads. The
// probe waits its turn behind the connections queued before it: at the
// cap of 32, a slot changes hands once its connection has been idle for
// 100 ms (httpserver.EvictableAfterProbes), so about (600 - 32) / 32 / 10
// s; with the public port's second it would be ten times that.
func TestIdleConnectionsDoNotKillWorkerHealthz(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	prlimit, err := exec.LookPath("prlimit")
	require.NoError(t, err, "this test needs prlimit (util-linux)")
	name := fmt.Sprintf("w%d", workerSeq.Add(1))
	const fdLimit = 256
	w := startProcess(t, name, prlimit, append([]string{fmt.Sprintf("--nofile=%d:%d", fdLimit, fdLimit), "--",
		filepath.Join(binDir, "worker"), "run", "--metrics-addr", "127.0.0.1:0", "--name", name, "--metrics-max-conns", "32", "--dev-allow-local-folders"}, fastLease...),
		[]string{"DATABASE_URL=" + dbURL}, `"msg":"metrics listener started"`)
	w.waitLog(`"msg":"worker started"`, 30*time.Second)

	const idle = 600
	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range idle {
		c, err := net.DialTimeout("tcp", w.addr, 30*time.Second)
		require.NoError(t, err)
		conns = append(conns, c)
		if i%2 == 0 {
			// Half ask once and then idle on a kept-alive connection, the
			// rest never send a byte.
			_, err = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: worker\r\n\r\n"))
			require.NoError(t, err)
		}
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	probed := time.Now()
	resp, err := client.Get("http://" + w.addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "/healthz answers under the flood")
	waited := time.Since(probed)
	t.Logf("/healthz answered after %s, behind %d idle connections", waited.Round(time.Millisecond), idle)
	require.Less(t, waited, 10*time.Second, "a slot of the probes' listener changes hands every 100 ms at most: about (600 - 32) / 32 / 10 s")

	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", w.cmd.Process.Pid))
	require.NoError(t, err)
	t.Logf("worker open descriptors with %d idle connections held against it: %d (limit %d)", idle, len(fds), fdLimit)
	require.Less(t, len(fds), fdLimit/2, "the connection cap keeps descriptors for the database and the folders")

	id := enqueueBatch(t, dbURL, "tenant-a", writeFolder(t, sample))
	waitStatus(t, pool, id, batch.StatusSucceeded, 30*time.Second)
	require.NotContains(t, w.logs.String(), "too many open files")
}
