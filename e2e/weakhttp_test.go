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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
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
// refusal is answered at once now, Connection: close; and while 96 such
// senders (three times --max-http-conns 32) reconnect whenever they are
// closed, every one of 30 probes of the public port's /healthz answers
// within 1 s.
func TestRefusalsOfThePublicPortNeedNoBody(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	const maxConns = 32
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
		require.True(t, resp.Close, "Connection: close")
	}

	// 96 slow senders, three times --max-http-conns, each refused 401 as
	// soon as its head is read, reconnecting 200 ms after it is closed.
	head := "POST /v1/imports HTTP/1.1\r\nHost: serve\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
	res, _ := underAttack(t, serve.addr, head, 3*maxConns, "http://"+serve.addr+"/healthz")
	require.Equal(t, res.total, res.answered, "every probe of the public port answers within 1 s: %s", strings.Join(res.failures[:min(3, len(res.failures))], "; "))
}

// TestSlowBodyFloodSparesTheAdminListener: enqueue serve's admin listener
// (64 connections) starved under slow senders at twice its cap: a POST
// /metrics with a body was answered 405 by the mux after the 3 s body
// stall timeout, where the README says 413 at once, and the cancel
// route's 401 came as late, each holding its connection until then. Now a
// body on /healthz, /readyz or /metrics is refused 413 at once whatever the
// method, every refusal is sent without the body, and with 192 slow
// senders (three times the cap; half with a body for /metrics, half for
// the cancel route without the operator token) reconnecting whenever they
// are closed, every one of 30 probes of /healthz and 30 scrapes of
// /metrics answers within 1 s.
func TestSlowBodyFloodSparesTheAdminListener(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	const adminCap = 64
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
		require.True(t, resp.Close, "Connection: close")
	}

	// 192 slow senders, three times the cap: half send a body to
	// /metrics, half to the cancel route without the operator token, each
	// reconnecting 200 ms after it is closed.
	metricsHead := "POST /metrics HTTP/1.1\r\nHost: admin\r\nContent-Length: 1000\r\n\r\n"
	cancelHead := "POST /v1/batches/1/cancel HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
	scrapers := startSlowSenders(t, admin, metricsHead, adminCap*3/2)
	cancellers := startSlowSenders(t, admin, cancelHead, adminCap*3/2)
	require.Eventually(t, func() bool { return scrapers.opened.Load()+cancellers.opened.Load() >= 3*adminCap }, 30*time.Second, 20*time.Millisecond,
		"the %d slow senders connect", 3*adminCap)
	time.Sleep(time.Second) // their bodies are under way
	var healthz, scrapes probeResult
	var wg sync.WaitGroup
	wg.Go(func() { healthz = probe("http://"+admin+"/healthz", 30, 500*time.Millisecond) })
	wg.Go(func() { scrapes = probe("http://"+admin+"/metrics", 30, 500*time.Millisecond) })
	wg.Wait()
	lives := append(scrapers.lifetimes(), cancellers.lifetimes()...)
	slices.Sort(lives)
	t.Logf("%d slow senders against the admin listener (cap %d): %d/%d probes of /healthz and %d/%d scrapes of /metrics answered 200 within 1 s (slowest %s, %s); the listener closed %d slow connections, lifetimes p50 %s max %s",
		3*adminCap, adminCap, healthz.answered, healthz.total, scrapes.answered, scrapes.total, healthz.slowest.Round(time.Millisecond), scrapes.slowest.Round(time.Millisecond),
		len(lives), percentile(lives, 50), percentile(lives, 100))
	for name, res := range map[string]probeResult{"/healthz": healthz, "/metrics": scrapes} {
		require.Equal(t, res.total, res.answered, "every probe of %s answers within 1 s: %s", name, strings.Join(res.failures[:min(3, len(res.failures))], "; "))
	}
	require.NotEmpty(t, lives)
	require.Less(t, percentile(lives, 50), time.Second, "refused at once, not after the 3 s body stall timeout")
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
