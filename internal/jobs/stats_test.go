package jobs

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/metrics/metricstest"
)

// TestTenantStatsOnlyFromRiversLeader: two workers' River clients and
// stats loops on one database; only the one River elected exports
// ingest_tenant_batches (the other exports none of its series, though both
// export the fleet-wide gauges), and when the leader stops, the other
// takes over and the former exports none.
func TestTenantStatsOnlyFromRiversLeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	f.importBatch(t, "tenant-a")
	f.importBatch(t, "tenant-b")
	// The clients are here for River's election, not the jobs: the
	// batches stay Running and waiting.
	_, err := f.pool.Exec(ctx, `DELETE FROM river_job`)
	require.NoError(t, err)

	type pod struct {
		m    *metrics.Metrics
		stop func()
	}
	pods := map[string]*pod{}
	for _, id := range []string{"pod-a", "pod-b"} {
		client, err := NewWorkerClient(f.pool, f.worker, ClientConfig{Concurrency: 1, ID: id, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		require.NoError(t, client.Start(ctx))
		loop, cancel := context.WithCancel(ctx)
		m := metrics.NewWorker()
		done := make(chan struct{})
		go func() {
			defer close(done)
			RunStats(loop, f.pool, m, 50*time.Millisecond, slog.New(slog.DiscardHandler), client.ID())
		}()
		stopped := false
		pods[id] = &pod{m: m, stop: func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			<-done
			stopCtx, c := context.WithTimeout(ctx, 10*time.Second)
			defer c()
			require.NoError(t, client.Stop(stopCtx))
		}}
		t.Cleanup(pods[id].stop)
	}
	tenants := func(p *pod) int { return len(tenantSeries(t, p.m)) }
	leader := func() string {
		var id string
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT coalesce(max(leader_id), '') FROM river_leader WHERE expires_at > now()`).Scan(&id))
		return id
	}
	// Until the election and a refresh after it, neither or one exports;
	// never both.
	var first string
	var both atomic.Bool
	require.Eventually(t, func() bool {
		if tenants(pods["pod-a"]) > 0 && tenants(pods["pod-b"]) > 0 {
			both.Store(true)
		}
		first = leader()
		return first != "" && tenants(pods[first]) == 2
	}, 30*time.Second, 20*time.Millisecond, "River's leader exports both tenants")
	require.False(t, both.Load(), "both workers exported tenant series")
	other := map[string]string{"pod-a": "pod-b", "pod-b": "pod-a"}[first]
	time.Sleep(200 * time.Millisecond) // several refreshes of both loops
	require.Zero(t, tenants(pods[other]), "the worker that does not lead exports no tenant series")
	require.Equal(t, 2.0, tenantSeries(t, pods[first].m)["tenant-a"]["waiting"]+tenantSeries(t, pods[first].m)["tenant-b"]["waiting"])
	require.Equal(t, 1.0, gaugeValue(t, pods[first].m, "ingest_river_leader", ""))
	require.Equal(t, 0.0, gaugeValue(t, pods[other].m, "ingest_river_leader", ""))
	for _, p := range pods {
		require.Equal(t, 2.0, gaugeValue(t, p.m, "ingest_running_batches", ""), "the fleet-wide gauges come from every worker")
	}

	// The leader stops (River resigns); the other is elected and takes the
	// series over.
	pods[first].stop()
	require.Eventually(t, func() bool { return leader() == other && tenants(pods[other]) == 2 }, 30*time.Second, 20*time.Millisecond,
		"the other worker is elected and exports the tenant series")
	require.Equal(t, 1.0, gaugeValue(t, pods[other].m, "ingest_river_leader", ""))
}

// TestRefreshTenantStatsEmptiesOnLostLeadership: a worker that led and
// no longer does drops every tenant series at its next refresh.
func TestRefreshTenantStatsEmptiesOnLostLeadership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	f.importBatch(t, "tenant-a")
	m := metrics.NewWorker()
	_, err := f.pool.Exec(ctx, `INSERT INTO river_leader (leader_id, elected_at, expires_at) VALUES ('me', now(), now() + interval '1 minute')`)
	require.NoError(t, err)
	leader, err := RefreshTenantStats(ctx, f.pool, m, "me")
	require.NoError(t, err)
	require.True(t, leader)
	require.Len(t, tenantSeries(t, m), 1)

	_, err = f.pool.Exec(ctx, `UPDATE river_leader SET leader_id = 'someone-else'`)
	require.NoError(t, err)
	leader, err = RefreshTenantStats(ctx, f.pool, m, "me")
	require.NoError(t, err)
	require.False(t, leader)
	require.Empty(t, tenantSeries(t, m))
	require.Equal(t, 0.0, gaugeValue(t, m, "ingest_river_leader", ""))

	// An expired term is no leadership either.
	_, err = f.pool.Exec(ctx, `UPDATE river_leader SET leader_id = 'me', expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	leader, err = RefreshTenantStats(ctx, f.pool, m, "me")
	require.NoError(t, err)
	require.False(t, leader)
	require.Empty(t, tenantSeries(t, m))
}

// tenantSeries returns ingest_tenant_batches by tenant and state.
func tenantSeries(t *testing.T, m *metrics.Metrics) map[string]map[string]float64 {
	return metricstest.TenantBatches(t, m.Registry)
}
