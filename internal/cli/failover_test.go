package cli_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestAnIdleConnectionToAVanishedHostIsReplaced: the database host
// vanishes (a failover in which nothing resets the old primary's
// connections) while a pool's connection is idle. The pool's check of
// that connection gives up within cli.PingTimeoutDefault and the
// acquisition goes on to a new connection, here to the next host of a
// multi-host URL, instead of waiting on the dead one for the caller's
// whole deadline.
func TestAnIdleConnectionToAVanishedHostIsReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(pgtest.NewDatabaseURL(t))
	require.NoError(t, err)
	lost, err := chaos.NewProxy(u.Host)
	require.NoError(t, err)
	t.Cleanup(lost.Close)
	next, err := chaos.NewProxy(u.Host)
	require.NoError(t, err)
	t.Cleanup(next.Close)
	u.Host = lost.Addr() + "," + next.Addr()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	pool, err := cli.Connect(ctx, u.String(), cli.PoolerNone, 10*time.Second, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Equal(t, cli.PingTimeoutDefault, pool.Config().PingTimeout)

	time.Sleep(1100 * time.Millisecond) // idle long enough to be checked
	lost.Blackhole(time.Minute)
	t.Cleanup(lost.EndBlackhole) // before the pool closes: its close waits on the dead connections
	start := time.Now()
	acquire, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var one int
	require.NoError(t, pool.QueryRow(acquire, `SELECT 1`).Scan(&one))
	took := time.Since(start)
	t.Logf("answered by the next host after %s", took.Round(time.Millisecond))
	require.Less(t, took, cli.PingTimeoutDefault+5*time.Second, "the dead connection held the caller")
}
