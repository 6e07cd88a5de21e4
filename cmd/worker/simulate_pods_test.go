package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// freePorts finds n consecutive free loopback ports and returns the first.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		base := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if base+n > 65535 {
			continue
		}
		ok := true
		for i := 1; i < n && ok; i++ {
			p, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				continue
			}
			p.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// runWorker runs `worker` with args in this process until stop, which
// ends it and requires it to exit OK within 60 s; the test's end cancels
// it too. stderr is its log.
func runWorker(t *testing.T, args ...string) (stderr *testproc.SyncBuffer, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var stdout testproc.SyncBuffer
	stderr = &testproc.SyncBuffer{}
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, args, &stdout, stderr) }()
	return stderr, func() {
		t.Helper()
		cancel()
		select {
		case code := <-exited:
			require.Equal(t, cli.ExitOK, code, stderr.String())
		case <-time.After(60 * time.Second):
			t.Fatalf("worker %s did not stop; logs: %s", strings.Join(args, " "), stderr.String())
		}
	}
}

// scrapeMetrics returns the /metrics page of the worker listening on
// port.
func scrapeMetrics(port int) (string, error) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// TestSimulatePodsRunsIndependentWorkers: worker run --simulate-pods 3 runs
// three workers in one process, each with its own name and its own metrics
// listener (the port of --metrics-addr plus its number), and stops them all
// on the signal.
func TestSimulatePodsRunsIndependentWorkers(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabaseURL(t)
	base := freePorts(t, 3)
	stderr, stop := runWorker(t, "run", "--database-url", url, "--metrics-addr", "127.0.0.1:"+strconv.Itoa(base),
		"--name", "sim", "--simulate-pods", "3", "--log-format", "json")
	client := &http.Client{Timeout: 2 * time.Second}
	for i := range 3 {
		addr := fmt.Sprintf("http://127.0.0.1:%d", base+i)
		require.Eventually(t, func() bool {
			resp, err := client.Get(addr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, 30*time.Second, 50*time.Millisecond, "pod %d never ready on %s; logs: %s", i, addr, stderr.String())
		resp, err := client.Get(addr + "/metrics")
		require.NoError(t, err)
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		require.Contains(t, body.String(), "ingest_lease_acquisitions_total", "pod %d serves its own metrics", i)
	}
	stop()
	started, stopped := map[string]bool{}, map[string]bool{}
	for _, line := range strings.Split(stderr.String(), "\n") {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		name, _ := entry["worker"].(string)
		switch entry["msg"] {
		case "worker started":
			started[name] = true
		case "worker stopped":
			stopped[name] = true
		}
	}
	want := map[string]bool{"sim-000": true, "sim-001": true, "sim-002": true}
	require.Equal(t, want, started, "each simulated pod starts as a worker of its own name")
	require.Equal(t, want, stopped, "each simulated pod stops")
}

func TestSimulatePodsNeedsAPortPerPod(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabaseURL(t)
	for name, args := range map[string][]string{
		"port 0":   {"--simulate-pods", "2", "--metrics-addr", "127.0.0.1:0"},
		"negative": {"--simulate-pods", "-1", "--metrics-addr", "127.0.0.1:0"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"run", "--database-url", url}, args...), &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, "%s: %s", name, stderr.String())
		require.Contains(t, stderr.String(), "--simulate-pods", name)
	}
}
