package metrics_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestPoolMetricsPerPool: each pool added is exported under its own pool
// label, from pgxpool's statistics at the scrape, on a real PostgreSQL.
func TestPoolMetricsPerPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabaseURL(t)
	open := func(max int32) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = max
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	shared, renewals := open(3), open(1)
	m := metrics.NewWorker()
	m.AddPool(metrics.PoolShared, shared)
	m.AddPool(metrics.PoolRenewals, renewals)

	conn, err := shared.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, renewals.Ping(ctx))

	value := func(family, pool string) float64 {
		t.Helper()
		families, err := m.Registry.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() != family {
				continue
			}
			for _, s := range f.GetMetric() {
				if s.GetLabel()[0].GetValue() == pool {
					if s.GetCounter() != nil {
						return s.GetCounter().GetValue()
					}
					return s.GetGauge().GetValue()
				}
			}
		}
		t.Fatalf("%s{pool=%q} not exported", family, pool)
		return 0
	}
	require.Equal(t, 3.0, value("ingest_pgxpool_max_connections", metrics.PoolShared))
	require.Equal(t, 1.0, value("ingest_pgxpool_max_connections", metrics.PoolRenewals))
	require.Equal(t, 1.0, value("ingest_pgxpool_acquired_connections", metrics.PoolShared))
	require.Equal(t, 0.0, value("ingest_pgxpool_acquired_connections", metrics.PoolRenewals))
	require.Equal(t, 1.0, value("ingest_pgxpool_idle_connections", metrics.PoolRenewals))
	require.GreaterOrEqual(t, value("ingest_pgxpool_acquires_total", metrics.PoolShared), 1.0)
	require.GreaterOrEqual(t, value("ingest_pgxpool_new_connections_total", metrics.PoolRenewals), 1.0)
	conn.Release()
	require.Equal(t, 0.0, value("ingest_pgxpool_acquired_connections", metrics.PoolShared))
	require.Equal(t, 1.0, value("ingest_pgxpool_total_connections", metrics.PoolShared))

	// An acquire that times out on the exhausted pool is counted.
	held, err := renewals.Acquire(ctx)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 50_000_000)
	_, err = renewals.Acquire(short)
	cancel()
	require.Error(t, err)
	held.Release()
	require.Equal(t, 1.0, value("ingest_pgxpool_canceled_acquires_total", metrics.PoolRenewals))

	// Every family, one series per pool.
	n, err := testutil.GatherAndCount(m.Registry, "ingest_pgxpool_acquires_total", "ingest_pgxpool_acquire_duration_seconds_total",
		"ingest_pgxpool_empty_acquires_total", "ingest_pgxpool_total_connections")
	require.NoError(t, err)
	require.Equal(t, 4*2, n)
}
