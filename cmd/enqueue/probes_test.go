package main

import (
	"bytes"
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/metrics"
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
