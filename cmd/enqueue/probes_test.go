package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestSQSAndReconcileReadyzCheckTheSchema: the probes of enqueue sqs and
// reconcile --every answer 503 with why when the database's schema is
// behind this build, and ready once it is current.
func TestSQSAndReconcileReadyzCheckTheSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	var ready atomic.Bool
	ready.Store(true)
	var out bytes.Buffer
	e := &cli.Env{Ctx: ctx, Stdout: &out, Stderr: &out, Logger: slog.New(slog.DiscardHandler)}
	m := metrics.NewSQS()
	t.Cleanup(startDatabaseProbe(e, m, pool, cli.DatabaseProbeFlags{DatabaseProbeInterval: time.Second}))
	srv, _, err := startProbes("127.0.0.1:0", m, pool, &ready, e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	pgtest.RequireReadyzFollowsSchema(t, pool, "http://"+srv.Addr().String()+"/readyz")
}

// TestSQSAndReconcileProbesFollowTheDatabase: behind a proxy that then
// holds every byte (the database unreachable, nothing refused), the
// /readyz of enqueue sqs and reconcile --every answers 503 saying so, at
// once, and /metrics says ingest_database_up 0, within a few probe
// intervals; once traffic flows again, 200 and 1.
func TestSQSAndReconcileProbesFollowTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(pgtest.NewDatabaseURL(t))
	require.NoError(t, err)
	proxy, err := chaos.NewProxy(u.Host)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	u.Host = proxy.Addr()
	pool := pgtest.Pool(t, u.String())
	var ready atomic.Bool
	ready.Store(true)
	var out bytes.Buffer
	e := &cli.Env{Ctx: ctx, Stdout: &out, Stderr: &out, Logger: slog.New(slog.DiscardHandler)}
	m := metrics.NewReconcile()
	t.Cleanup(startDatabaseProbe(e, m, pool, cli.DatabaseProbeFlags{DatabaseProbeInterval: time.Second}))
	srv, _, err := startProbes("127.0.0.1:0", m, pool, &ready, e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	base := "http://" + srv.Addr().String()
	get := func(path string) (int, string) {
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	up := func() string {
		_, body := get("/metrics")
		for line := range strings.Lines(body) {
			if v, ok := strings.CutPrefix(line, "ingest_database_up "); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatalf("no ingest_database_up in:\n%s", body)
		return ""
	}
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK && up() == "1" }, time.Minute, 100*time.Millisecond)

	proxy.Stall(20 * time.Second)
	require.Eventually(t, func() bool { return up() == "0" }, 20*time.Second, 100*time.Millisecond, "down within the stall")
	start := time.Now()
	code, body := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "not ready: database unreachable: last reached")
	require.Less(t, time.Since(start), 5*time.Second, "/readyz does not wait on the stalled database")

	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK && up() == "1" }, 2*time.Minute, 200*time.Millisecond,
		"ready and up once traffic flows again")
}
