package reconcile_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/reconcile"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// TestPeriodGivesUpOnAConnectionThatStopsAnswering: the database host
// vanishes between two periods (a failover in which nothing resets the
// old primary's connections). The next period fails within its Timeout,
// rather than waiting on its transaction's connection for as long as the
// kernel keeps it, which held the periodic loop and every later period
// (enqueue reconcile --every found no folder after such a failover).
func TestPeriodGivesUpOnAConnectionThatStopsAnswering(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	u, err := url.Parse(f.pool.Config().ConnString())
	require.NoError(t, err)
	proxy, err := chaos.NewProxy(u.Host)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	u.Host = proxy.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f.cfg.Pool, f.cfg.Timeout = pool, 2*time.Second

	p, err := reconcile.RunPeriod(context.Background(), f.cfg, time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "scanned", p.Outcome)
	proxy.Blackhole(time.Minute)
	t.Cleanup(proxy.EndBlackhole)     // before the pool closes: its close waits on the dead connections
	time.Sleep(10 * time.Millisecond) // the next period is due
	ended := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := reconcile.RunPeriod(context.Background(), f.cfg, time.Millisecond)
		ended <- err
	}()
	require.Error(t, testproc.Await(t, ended, "the period on the vanished host to give up"))
	require.Less(t, time.Since(start), 30*time.Second)
}
