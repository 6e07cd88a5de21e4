package dbhealth

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// gauges returns what m exports, by family name.
func gauges(t *testing.T, m *Monitor) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(m))
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		out[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
	}
	return out
}

// TestMonitorFollowsTheLatestOutcome: down before any success; up after
// one; down once a probe sent after it failed, whatever succeeded before
// the probe was sent; up again after the next success; down once the last
// success is older than StaleAfterIntervals probe intervals. The timestamp
// is the last success's, absent before the first.
func TestMonitorFollowsTheLatestOutcome(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	m := New()
	m.now = func() time.Time { return now }

	require.False(t, m.Up())
	require.Equal(t, map[string]float64{"ingest_database_up": 0}, gauges(t, m), "no timestamp before the first success")
	require.ErrorIs(t, m.Ready(), ErrUnreachable)
	require.ErrorContains(t, m.Ready(), "not reached since this process started")

	m.Reached(now)
	require.True(t, m.Up())
	require.NoError(t, m.Ready())
	require.Equal(t, map[string]float64{"ingest_database_up": 1, "ingest_database_last_success_timestamp_seconds": 1_700_000_000}, gauges(t, m))

	// A probe sent at 5 s fails at 10 s; a query that ended at 3 s, before
	// the probe was sent, is the last success but does not make it up.
	now = now.Add(10 * time.Second)
	m.Unreached(now.Add(-5 * time.Second))
	m.Reached(now.Add(-7 * time.Second))
	require.False(t, m.Up())
	require.ErrorContains(t, m.Ready(), "database unreachable: last reached 7s ago")
	require.Equal(t, map[string]float64{"ingest_database_up": 0, "ingest_database_last_success_timestamp_seconds": 1_700_000_003}, gauges(t, m),
		"the timestamp stays at the last success")

	m.Reached(now)
	require.True(t, m.Up(), "a success after the failed probe's sending")

	now = now.Add(StaleAfterIntervals * ProbeIntervalDefault)
	require.True(t, m.Up())
	now = now.Add(time.Second)
	require.False(t, m.Up(), "a success older than %d probe intervals counts for nothing", StaleAfterIntervals)
}

// TestTracedQueriesCountAsSuccesses: on a pool the monitor traces, a query
// that succeeds counts as a round trip (a process that is busy anyway
// needs no probe to know it reaches its database), one that fails does
// not (only the probe says the database is down).
func TestTracedQueriesCountAsSuccesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := New()
	cfg, err := pgxpool.ParseConfig(pgtest.ServerURL(t))
	require.NoError(t, err)
	m.Trace(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	m.Unreached(time.Now())
	_, err = pool.Exec(ctx, `SELECT 1/0`)
	require.Error(t, err)
	require.False(t, m.Up(), "a query that failed is no success")
	_, err = pool.Exec(ctx, `SELECT 2`)
	require.NoError(t, err)
	require.True(t, m.Up(), "a query that succeeded is")
}

// TestProbeNoticesAStalledDatabaseAndItsReturn runs the probe every second
// on a pool reaching PostgreSQL through a proxy that then holds every byte
// for a while (a network partition: nothing is refused, nothing answers).
// Each probe gives up after its timeout, so the monitor goes down, says so
// once in the log, and the last success's timestamp stops advancing; when
// traffic flows again it comes back up and says so.
func TestProbeNoticesAStalledDatabaseAndItsReturn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	server, err := url.Parse(pgtest.ServerURL(t))
	require.NoError(t, err)
	proxy, err := chaos.NewProxy(server.Host)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	server.Host = proxy.Addr()
	pool, err := pgxpool.New(ctx, server.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	logs := &testproc.SyncBuffer{}
	m := New()
	m.Start(ctx, pool, time.Second, slog.New(slog.NewJSONHandler(logs, nil)))
	require.Eventually(t, m.Up, 30*time.Second, 100*time.Millisecond, "up once the first probe came back")

	const stall = 20 * time.Second
	stalledAt := time.Now()
	proxy.Stall(stall)
	require.Eventually(t, func() bool { return !m.Up() }, stall, 100*time.Millisecond, "down within the stall")
	require.ErrorIs(t, m.Ready(), ErrUnreachable)
	frozen, ok := m.LastSuccess()
	require.True(t, ok)
	require.True(t, frozen.Before(stalledAt.Add(time.Second)), "no success after the stall began (last %s, stall %s)", frozen, stalledAt)
	time.Sleep(2500 * time.Millisecond) // two more probes
	again, _ := m.LastSuccess()
	require.Equal(t, frozen, again, "the last success's time stops advancing")
	require.Equal(t, 0.0, gauges(t, m)["ingest_database_up"])
	require.Equal(t, 1, strings.Count(logs.String(), `"msg":"database unreachable`), "logged once:\n%s", logs.String())

	require.Eventually(t, m.Up, stall+time.Minute, 100*time.Millisecond, "up again once traffic flows")
	back, _ := m.LastSuccess()
	require.True(t, back.After(frozen))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"database reachable again"`) }, 30*time.Second, 100*time.Millisecond,
		"logged:\n%s", logs.String())
}
