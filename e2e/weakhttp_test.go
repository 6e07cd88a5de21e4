package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/httpserver/httpservertest"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// refusalTime sends head (a request head and the first bytes of a body
// that never ends) on a new connection to addr and returns how long the
// answer took to come, and the answer.
func refusalTime(t *testing.T, addr, head string) (time.Duration, *http.Response) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	_, err = io.WriteString(c, head)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(start.Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, head)
	took := time.Since(start)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return took, resp
}

// TestRefusalsOfThePublicPortNeedNoBody replays the fifth audit's finding
// against a real "enqueue serve": a request the public port refuses
// without reading its body — no token (401), a method the route does not
// take (405), a route that does not exist (404) — was answered only after
// the body stall timeout (3 s), net/http first reading what was left of
// the body, so a flood of slow senders held --max-http-conns connections
// busy and the public port's own probes waited (14 of 19 over 1 s). Each
// refusal is answered at once now, Connection: close; and during a
// reconnecting flood of such senders, three times --max-http-conns, the
// public port's /healthz probes answer within 1 s.
func TestRefusalsOfThePublicPortNeedNoBody(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	const maxConns, clients, floodFor = 32, 96, 4 * time.Second
	serve, _ := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok"}, "--max-http-conns", fmt.Sprint(maxConns))

	for _, tc := range []struct {
		head   string
		status int
	}{
		{"POST /v1/imports HTTP/1.1\r\nHost: serve\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", http.StatusUnauthorized},
		{"POST /v1/imports HTTP/1.1\r\nHost: serve\r\nAuthorization: Bearer wrong\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", http.StatusUnauthorized},
		{"PUT /v1/imports HTTP/1.1\r\nHost: serve\r\nContent-Length: 1000\r\n\r\n{", http.StatusMethodNotAllowed},
		{"POST /v1/nowhere HTTP/1.1\r\nHost: serve\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{", http.StatusNotFound},
	} {
		took, resp := refusalTime(t, serve.addr, tc.head)
		t.Logf("%s: %s after %s", strings.SplitN(tc.head, "\r\n", 2)[0], resp.Status, took.Round(time.Millisecond))
		require.Equal(t, tc.status, resp.StatusCode, tc.head)
		require.Less(t, took, 2*time.Second, "answered at once, not after the 3 s body stall timeout: %s", tc.head)
		require.Equal(t, "close", resp.Header.Get("Connection"))
	}

	flood, err := httpservertest.StartFlood(httpservertest.FloodConfig{
		Addr: serve.addr, Clients: clients, For: floodFor,
		Heads: []string{
			"POST /v1/imports HTTP/1.1\r\nHost: serve\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
			"PUT /v1/imports HTTP/1.1\r\nHost: serve\r\nContent-Length: 1000\r\n\r\n",
			"POST /v1/batches HTTP/1.1\r\nHost: serve\r\nContent-Length: 1000\r\n\r\n",
		},
	})
	require.NoError(t, err)
	t.Cleanup(flood.Stop)
	probes := httpservertest.Probe("http://"+serve.addr+"/healthz", 100*time.Millisecond, flood.Done())
	t.Logf("%d reconnecting slow senders refused without their bodies for %s against --max-http-conns %d (%d connections opened); the public port's /healthz: %s",
		clients, floodFor, maxConns, flood.Dials(), probes)
	require.GreaterOrEqual(t, probes.Total(), 10)
	require.Empty(t, probes.Failures, "every probe of the public port answers 200")
	require.Less(t, probes.Slowest(), 5*time.Second)
	require.GreaterOrEqual(t, probes.Within(time.Second)*10, probes.Total()*9, "at least 90%% of the public port's probes answer within 1 s")
}

// TestSlowBodyFloodSparesTheAdminListener: enqueue serve's admin listener
// (64 connections) under a reconnecting flood of 192 slow senders, three
// times its cap, for 4 s — bodies announced to /metrics and /healthz
// (which take none), to the cancel route and the River UI without the
// operator token, and silent or half-sent heads — while /healthz and
// /metrics are probed every 100 ms. It starved at twice its cap: a POST
// /metrics with a body was answered 405 by the mux after the 3 s body
// stall timeout, where the README says 413 at once, and so were the other
// refusals. Now a body on /healthz, /readyz or /metrics is refused 413 at
// once whatever the method, every refusal is sent without the body, and
// the probes answer.
func TestSlowBodyFloodSparesTheAdminListener(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	const adminCap, clients, floodFor = 64, 192, 4 * time.Second
	serve, _ := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=tok", "ENQUEUE_OPERATOR_TOKEN=op-tok"})
	admin := adminAddr(t, serve)

	for _, tc := range []struct {
		head   string
		status int
	}{
		{"POST /metrics HTTP/1.1\r\nHost: admin\r\nContent-Length: 1000\r\n\r\nx", http.StatusRequestEntityTooLarge},
		{"GET /metrics HTTP/1.1\r\nHost: admin\r\nContent-Length: 1000\r\n\r\nx", http.StatusRequestEntityTooLarge},
		{"PUT /healthz HTTP/1.1\r\nHost: admin\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nx", http.StatusRequestEntityTooLarge},
		{"POST /readyz HTTP/1.1\r\nHost: admin\r\nContent-Length: 1000\r\n\r\nx", http.StatusRequestEntityTooLarge},
		{"POST /v1/batches/1/cancel HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", http.StatusUnauthorized},
	} {
		took, resp := refusalTime(t, admin, tc.head)
		t.Logf("admin %s: %s after %s", strings.SplitN(tc.head, "\r\n", 2)[0], resp.Status, took.Round(time.Millisecond))
		require.Equal(t, tc.status, resp.StatusCode, tc.head)
		require.Less(t, took, 2*time.Second, "answered at once, not after the 3 s body stall timeout: %s", tc.head)
		require.Equal(t, "close", resp.Header.Get("Connection"))
	}

	flood, err := httpservertest.StartFlood(httpservertest.FloodConfig{
		Addr: admin, Clients: clients, For: floodFor,
		Heads: []string{
			"POST /metrics HTTP/1.1\r\nHost: admin\r\nContent-Length: 1000\r\n\r\n",
			"POST /healthz HTTP/1.1\r\nHost: admin\r\nContent-Length: 1000\r\n\r\n",
			"POST /v1/batches/1/cancel HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
			"POST /riverui/api/jobs/cancel HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
			"",
			"GET /healthz HTTP/1.1\r\nHost: admin\r\nContent-Le",
		},
	})
	require.NoError(t, err)
	t.Cleanup(flood.Stop)
	var healthz, scrapes httpservertest.Probes
	var wg sync.WaitGroup
	wg.Go(func() { healthz = httpservertest.Probe("http://"+admin+"/healthz", 100*time.Millisecond, flood.Done()) })
	wg.Go(func() { scrapes = httpservertest.Probe("http://"+admin+"/metrics", 100*time.Millisecond, flood.Done()) })
	wg.Wait()
	t.Logf("%d reconnecting slow senders for %s against the admin listener (cap %d) opened %d connections; /healthz: %s; /metrics: %s",
		clients, floodFor, adminCap, flood.Dials(), healthz, scrapes)
	for name, p := range map[string]httpservertest.Probes{"/healthz": healthz, "/metrics": scrapes} {
		require.GreaterOrEqual(t, p.Total(), 10, name)
		require.Empty(t, p.Failures, "every probe of %s answers 200", name)
		require.Less(t, p.Slowest(), 5*time.Second, name)
		require.GreaterOrEqual(t, p.Within(time.Second)*10, p.Total()*9, "at least 90%% of the probes of %s answer within 1 s", name)
	}
}

// runBinary runs one of the binaries to its end (within a minute) and
// returns its stdout, stderr and exit code.
func runBinary(t *testing.T, binary string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, binary), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running %s: %v", binary, err)
	}
	require.NoError(t, ctx.Err(), "%s %s did not exit", binary, strings.Join(args, " "))
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// TestBinariesSayWhyTheyCannotStart: a binary that cannot bind a
// listener, reach its database or read a file exits with the code of that
// failure after saying which and why: an error in its log (stderr), and,
// for enqueue, its outcome line on stdout. "enqueue serve" whose admin
// port was taken (a second serve on one host, default :8081) exited 2 and
// printed nothing at all (the error was logged at debug level); a listener
// that cannot be bound is exit 9 (cannot_listen) now, on every binary.
func TestBinariesSayWhyTheyCannotStart(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { taken.Close() })
	busy := taken.Addr().String()
	unreachable := "postgres://fleet@127.0.0.1:1/fleet?sslmode=disable&connect_timeout=5"
	missing := filepath.Join(t.TempDir(), "no-such-file")
	aws := []string{"AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true"}

	for _, tc := range []struct {
		name, binary string
		env, args    []string
		code         int
		field        string   // enqueue's outcome line: its field ("" for the error outcome)
		says         []string // in stderr, on an error line
	}{
		{"serve, admin port taken", "enqueue", []string{"DATABASE_URL=" + dbURL, "ENQUEUE_AUTH_TOKEN=tok"},
			[]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", busy}, cli.ExitListen, "admin_listen", []string{"--admin-listen", busy, "address already in use"}},
		{"serve, public port taken", "enqueue", []string{"DATABASE_URL=" + dbURL, "ENQUEUE_AUTH_TOKEN=tok"},
			[]string{"serve", "--listen", busy, "--admin-listen", "127.0.0.1:0"}, cli.ExitListen, "listen", []string{"--listen", busy, "address already in use"}},
		{"sqs, admin port taken", "enqueue", append([]string{"DATABASE_URL=" + dbURL}, aws...),
			[]string{"sqs", "--queue-url", "http://127.0.0.1:1/000000000000/uploads", "--admin-listen", busy}, cli.ExitListen, "admin_listen", []string{"--admin-listen", busy, "address already in use"}},
		{"worker, metrics port taken", "worker", []string{"DATABASE_URL=" + dbURL},
			[]string{"run", "--metrics-addr", busy}, cli.ExitListen, "", []string{"--metrics-addr", busy, "address already in use"}},
		{"serve, database unreachable", "enqueue", []string{"DATABASE_URL=" + unreachable, "ENQUEUE_AUTH_TOKEN=tok"},
			[]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, cli.ExitInfra, "", []string{"127.0.0.1", "connection refused"}},
		{"worker, database unreachable", "worker", []string{"DATABASE_URL=" + unreachable},
			[]string{"run", "--metrics-addr", "127.0.0.1:0"}, cli.ExitInfra, "", []string{"127.0.0.1", "connection refused"}},
		{"serve, token file missing", "enqueue", []string{"DATABASE_URL=" + dbURL},
			[]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--auth-token-file", missing}, cli.ExitInvalidInput, "auth_token_file", []string{"--auth-token-file", missing, "no such file"}},
		{"serve, tenant tokens file missing", "enqueue", []string{"DATABASE_URL=" + dbURL, "ENQUEUE_AUTH_TOKEN=tok"},
			[]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--tenant-tokens-file", missing}, cli.ExitInvalidInput, "tenant_tokens_file", []string{missing}},
		{"worker, notifications file missing", "worker", []string{"DATABASE_URL=" + dbURL},
			[]string{"run", "--metrics-addr", "127.0.0.1:0", "--notifications-file", missing}, cli.ExitInvalidInput, "", []string{"--notifications-file", missing, "no such file"}},
	} {
		stdout, stderr, code := runBinary(t, tc.binary, append([]string{"LOG_LEVEL=info"}, tc.env...), tc.args...)
		t.Logf("%s: exit %d; stdout %q; stderr's error lines: %s", tc.name, code, strings.TrimSpace(stdout), errorLines(stderr))
		require.Equal(t, tc.code, code, "%s: %s", tc.name, stderr)
		errs := errorLines(stderr)
		require.NotEmpty(t, errs, "%s: an error is logged", tc.name)
		for _, s := range tc.says {
			require.Contains(t, errs, s, "%s: the log says which and why", tc.name)
		}
		if tc.binary != "enqueue" {
			continue
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		var out map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &out), "%s: %q", tc.name, stdout)
		switch {
		case tc.code == cli.ExitListen:
			require.Equal(t, "cannot_listen", out["outcome"], tc.name)
		case tc.code == cli.ExitInvalidInput:
			require.Equal(t, "invalid_input", out["outcome"], tc.name)
		default:
			require.Equal(t, "error", out["outcome"], tc.name)
		}
		if tc.field != "" {
			require.Equal(t, tc.field, out["field"], tc.name)
		}
		for _, s := range tc.says[1:] {
			require.Contains(t, out["error"], s, "%s: the outcome line says why", tc.name)
		}
	}
}

// errorLines returns the log lines of level ERROR in stderr (JSON lines).
func errorLines(stderr string) string {
	var out []string
	for _, line := range strings.Split(stderr, "\n") {
		var entry struct{ Level string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Level == "ERROR" {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
