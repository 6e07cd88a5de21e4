package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// databaseFamilies are the families the worker reads from the database.
var databaseFamilies = []string{"ingest_running_batches", "ingest_stuck_batches", "ingest_parked_batches",
	"ingest_oldest_running_batch_age_seconds", "ingest_queue_jobs", "ingest_queue_paused"}

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestDatabaseGaugesExportOnlyFreshValues: a group of database-derived
// gauges exports nothing before its first refresh, its values after a
// refresh that succeeded, nothing after one that failed (not the values
// it had: the point), its values again after the next success, and
// nothing once the last success is older than its maximum age.
func TestDatabaseGaugesExportOnlyFreshValues(t *testing.T) {
	t.Parallel()
	stuck := prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_stuck", Help: "h"})
	queue := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_queue", Help: "h"}, []string{"state"})
	queue.WithLabelValues("available")
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	g := newDatabaseGauges(stuck, queue)
	g.now = clock.now
	g.SetMaxAge(time.Minute)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(g))
	series := func() map[string]float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		out := map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				name := f.GetName()
				for _, l := range m.GetLabel() {
					name += "/" + l.GetValue()
				}
				out[name] = m.GetGauge().GetValue()
			}
		}
		return out
	}

	require.Empty(t, series(), "nothing before the first refresh")
	require.False(t, g.Fresh())

	stuck.Set(2)
	queue.WithLabelValues("available").Set(7)
	g.Refreshed(nil)
	require.Equal(t, map[string]float64{"test_stuck": 2, "test_queue/available": 7}, series())

	clock.t = clock.t.Add(30 * time.Second)
	g.Refreshed(errors.New("connection refused"))
	require.Empty(t, series(), "a failed refresh hides the values it could not renew")

	stuck.Set(0)
	clock.t = clock.t.Add(10 * time.Second)
	g.Refreshed(nil)
	require.Equal(t, map[string]float64{"test_stuck": 0, "test_queue/available": 7}, series())

	clock.t = clock.t.Add(time.Minute)
	require.True(t, g.Fresh(), "fresh for its maximum age")
	clock.t = clock.t.Add(time.Second)
	require.False(t, g.Fresh())
	require.Empty(t, series(), "a success older than the maximum age counts for nothing")
}

// TestWorkerExportsDatabaseGaugesOnlyWhileFresh: in the worker's registry
// the database-derived families come and go with their refreshes (the
// fleet-wide group and the leader's tenant group each with its own), while
// the process's own families and ingest_database_up are always there;
// SetStatsRefresh bounds their age by three refresh intervals and the
// refresh's timeout.
func TestWorkerExportsDatabaseGaugesOnlyWhileFresh(t *testing.T) {
	t.Parallel()
	m := NewWorker()
	m.SetTenantBatches([]TenantBatchCount{{Tenant: "tenant-a", Running: 1}})
	got := exported(t, m)
	for _, name := range append(databaseFamilies, "ingest_tenant_batches", "ingest_river_leader") {
		require.False(t, got[name], "%s is exported before any refresh", name)
	}
	for _, name := range []string{"ingest_leases_held", "ingest_database_up", "ingest_database_stats_errors_total"} {
		require.True(t, got[name], "%s is the process's own: always exported", name)
	}

	m.DatabaseStats.Refreshed(nil)
	got = exported(t, m)
	for _, name := range databaseFamilies {
		require.True(t, got[name], "%s after a refresh", name)
	}
	require.False(t, got["ingest_tenant_batches"], "the tenant group has its own refresh")
	m.TenantStats.Refreshed(nil)
	got = exported(t, m)
	require.True(t, got["ingest_tenant_batches"])
	require.True(t, got["ingest_river_leader"])

	m.DatabaseStats.Refreshed(errors.New("timeout"))
	got = exported(t, m)
	for _, name := range databaseFamilies {
		require.False(t, got[name], "%s after a failed refresh", name)
	}
	require.True(t, got["ingest_tenant_batches"], "the tenant group refreshed fine")

	clock := &fakeClock{t: time.Now()}
	m.TenantStats.now = clock.now
	m.TenantStats.Refreshed(nil)
	m.SetStatsRefresh(10*time.Second, 5*time.Second)
	clock.t = clock.t.Add(35 * time.Second)
	require.True(t, m.TenantStats.Fresh())
	clock.t = clock.t.Add(time.Second)
	require.False(t, m.TenantStats.Fresh(), "3 × 10 s + 5 s")
}
