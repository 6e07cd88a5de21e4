// Package e2e runs the real binaries as separate OS processes against a real
// PostgreSQL: the command-line contract, duplicate deliveries, crashes,
// pauses and shutdowns.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fleet-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("go", "build", "-o", dir, "../cmd/worker", "../cmd/enqueue")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runEnqueue runs the enqueue binary and returns its stdout and exit code.
func runEnqueue(t *testing.T, dbURL string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "enqueue"), args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "LOG_LEVEL=warn")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("running enqueue: %v", err)
	}
	if testing.Verbose() && stderr.Len() > 0 {
		t.Logf("enqueue %s stderr: %s", strings.Join(args, " "), stderr.String())
	}
	return stdout.String(), code
}

// outcome parses the single JSON line an enqueue command printed.
func outcome(t *testing.T, stdout string) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 1, "exactly one JSON line on stdout: %q", stdout)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &m), lines[0])
	return m
}

func importArgs(tenant, folderURL string) []string {
	return []string{"import", "--tenant-id", tenant, "--tenant-database", "tenant_db", "--company-id", "company-1", "--folder", folderURL}
}

// writeFolder writes files into a new directory and returns its file URL.
func writeFolder(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return "file://" + dir
}

var sample = map[string]string{
	"_SUCCESS":         "",
	"trips.csv":        "vehicle,km\nV1,10\nV2,20\nV3,30\n",
	"events/d1.ndjson": "{\"vehicle\":\"V1\",\"event\":\"start\"}\n{\"vehicle\":\"V2\",\"event\":\"stop\"}\n",
}

const sampleRecords = 5

// workerProc is a worker process under test.
type workerProc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	logs *testproc.SyncBuffer
	addr string
	done chan struct{}
	err  error
}

var workerSeq atomic.Int64

// fastLease are worker flags that make lease expiry and takeover quick.
var fastLease = []string{"--lease-ttl", "3s", "--lease-renew-every", "1s", "--sweep-interval", "1s", "--poll-interval", "200ms", "--stats-interval", "1s"}

// startProcess starts one of the binaries (or, given an absolute path, a
// command that execs one, such as prlimit) as a process under test, killed
// (and its logs shown if the test failed) when the test ends, and waits for
// the log line that carries its listening address.
func startProcess(t *testing.T, name, binary string, args, env []string, addrLine string) *workerProc {
	t.Helper()
	path := binary
	if !filepath.IsAbs(path) {
		path = filepath.Join(binDir, binary)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &workerProc{t: t, name: name, cmd: cmd, logs: &testproc.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, p.logs.String())
		}
	})
	line := p.waitLog(addrLine, 30*time.Second)
	var entry struct{ Addr string }
	require.NoError(t, json.Unmarshal([]byte(line), &entry))
	p.addr = entry.Addr
	return p
}

// startWorker starts a worker process and waits until it is ready.
func startWorker(t *testing.T, dbURL string, extra ...string) *workerProc {
	t.Helper()
	return startWorkerEnv(t, dbURL, nil, extra...)
}

// startWorkerEnv is startWorker with environment beyond DATABASE_URL.
func startWorkerEnv(t *testing.T, dbURL string, env []string, extra ...string) *workerProc {
	t.Helper()
	name := fmt.Sprintf("w%d", workerSeq.Add(1))
	p := startProcess(t, name, "worker", append([]string{"run", "--metrics-addr", "127.0.0.1:0", "--name", name, "--dev-allow-local-folders"}, extra...),
		append([]string{"DATABASE_URL=" + dbURL}, env...), `"msg":"metrics listener started"`)
	p.waitLog(`"msg":"worker started"`, 30*time.Second)
	return p
}

// waitLog waits for a log line containing substr and returns it.
func (p *workerProc) waitLog(substr string, timeout time.Duration) string {
	p.t.Helper()
	var found string
	require.Eventually(p.t, func() bool {
		sc := bufio.NewScanner(strings.NewReader(p.logs.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if strings.Contains(sc.Text(), substr) {
				found = sc.Text()
				return true
			}
		}
		return false
	}, timeout, 20*time.Millisecond, "worker %s never logged %q", p.name, substr)
	return found
}

func (p *workerProc) signal(sig syscall.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
}

// wait waits for the process to exit and returns its exit code.
func (p *workerProc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("worker %s did not exit within %s", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// metric scrapes the worker's /metrics and returns the value of the series
// whose text (name and labels) is series, e.g. `ingest_deliveries_total{outcome="worked"}`.
func (p *workerProc) metric(series string) float64 {
	p.t.Helper()
	body := httpGet(p.t, "http://"+p.addr+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			require.NoError(p.t, err)
			return v
		}
	}
	p.t.Fatalf("series %s not exported", series)
	return 0
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func getBatch(t *testing.T, pool *pgxpool.Pool, id int64) (batch.Batch, batch.Details) {
	t.Helper()
	b, err := batch.NewStore(pool).Get(context.Background(), id)
	require.NoError(t, err)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	return b, d
}

// waitStatus waits until the batch has the status.
func waitStatus(t *testing.T, pool *pgxpool.Pool, id int64, status batch.Status, timeout time.Duration) batch.Batch {
	t.Helper()
	var b batch.Batch
	require.Eventually(t, func() bool {
		b, _ = getBatch(t, pool, id)
		return b.Status == status
	}, timeout, 50*time.Millisecond, "batch %d never became %s", id, status)
	return b
}

// recordCopies returns how many records the slice holds and how many of
// them are distinct (object, line) pairs.
func recordCopies(t *testing.T, pool *pgxpool.Pool, scope string) (total, distinct int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*), count(DISTINCT (object_key, line_number)) FROM curated.fleet_records WHERE source_scope = $1`,
		scope).Scan(&total, &distinct))
	return total, distinct
}

// blockLoads holds a lock that makes every warehouse load wait, until the
// returned release is called.
func blockLoads(t *testing.T, pool *pgxpool.Pool) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE curated.fleet_records IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { require.NoError(t, tx.Rollback(ctx)) }) }
	t.Cleanup(release)
	return release
}

// waitLoadBlocked waits until a load by the given lease holder prefix waits
// on the blocking lock, and returns the lease the batch is held under.
func waitLoadBlocked(t *testing.T, pool *pgxpool.Pool, id int64, holderPrefix string) batch.Batch {
	t.Helper()
	var b batch.Batch
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'fleet-load:%' AND wait_event_type = 'Lock'`).Scan(&waiting))
		if waiting == 0 {
			return false
		}
		b, _ = getBatch(t, pool, id)
		return b.LeaseID != nil && strings.HasPrefix(*b.LeaseID, holderPrefix)
	}, 30*time.Second, 20*time.Millisecond, "no load of batch %d by %s blocked", id, holderPrefix)
	return b
}

func enqueueBatch(t *testing.T, dbURL, tenant, folderURL string) int64 {
	t.Helper()
	out, code := runEnqueue(t, dbURL, importArgs(tenant, folderURL)...)
	require.Equal(t, 0, code, out)
	o := outcome(t, out)
	require.Equal(t, "enqueued", o["outcome"])
	return int64(o["batch_id"].(float64))
}

func jobStates(t *testing.T, pool *pgxpool.Pool, batchID int64) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT state::text, count(*) FROM river_job WHERE (args->>'batch_id')::bigint = $1 GROUP BY 1`, batchID)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		s string
		n int
	}, error) {
		var v struct {
			s string
			n int
		}
		err := r.Scan(&v.s, &v.n)
		return v, err
	})
	require.NoError(t, err)
	m := map[string]int{}
	for _, v := range out {
		m[v.s] = v.n
	}
	return m
}

// runWorkerCommand runs the worker binary to completion and returns its
// combined output and exit code.
func runWorkerCommand(t *testing.T, dbURL string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "worker"), args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running worker: %v", err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

func newRequest(url, body string) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

func s3EventBody(bucket, key string) []byte {
	b, _ := json.Marshal(map[string]any{"Records": []any{map[string]any{
		"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
		"s3": map[string]any{"bucket": map[string]any{"name": bucket}, "object": map[string]any{"key": key}},
	}}})
	return b
}
