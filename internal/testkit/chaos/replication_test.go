package chaos_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/chaos"
)

// startPair starts a replicated pair in a temporary directory, stopped and
// removed when the test ends.
func startPair(t *testing.T, opts chaos.PairOptions) *chaos.Pair {
	t.Helper()
	if testing.Short() {
		t.Skip("starts two PostgreSQL clusters; skipped under -short")
	}
	dir, err := os.MkdirTemp("", "fleet-pair-")
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	opts.Settings = append(opts.Settings, "fsync=off")
	p, err := chaos.StartPair(context.Background(), filepath.Join(dir, "pair"), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

// connect opens a connection on url, closed when the test ends.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func count(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM commits`).Scan(&n))
	return n
}

// serverPort is the port of the server conn reached.
func serverPort(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var port int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT inet_server_port()`).Scan(&port))
	return port
}

// TestPairLosesTheTailTheStandbyNeverReceived: commits while the standby's
// link is partitioned are missing after the primary crashed and the
// standby was promoted, and the standby is known to lack them before the
// promote (its received WAL position is behind the primary's). The
// multi-host URL reaches the new primary; once the old primary rejoined as
// a standby (pg_rewind), the URL's first host answers read-only and is
// passed over.
func TestPairLosesTheTailTheStandbyNeverReceived(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := startPair(t, chaos.PairOptions{})
	first := p.Primary().Port
	conn := connect(t, p.URL("postgres"))
	require.Equal(t, first, serverPort(t, conn))
	_, err := conn.Exec(ctx, `CREATE TABLE commits (n int)`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO commits SELECT generate_series(1, 100)`)
	require.NoError(t, err)
	require.NoError(t, p.WaitCaughtUp(ctx, time.Minute))

	p.Link().Partition(time.Minute)
	for range 50 { // the tail: committed on the primary alone
		_, err = conn.Exec(ctx, `INSERT INTO commits VALUES (0)`)
		require.NoError(t, err)
	}
	require.Equal(t, 150, count(t, conn))
	tail, err := p.Crash(ctx, chaos.CrashProcess)
	require.NoError(t, err)
	require.Positive(t, tail.Lost, "the standby received less WAL than the primary wrote: %+v", tail)
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the crash dropped the connection")

	took, err := p.Promote(ctx)
	require.NoError(t, err)
	t.Logf("lost %d bytes of WAL (%s received of %s); promoted in %s", tail.Lost, tail.ReceivedLSN, tail.PrimaryLSN, took.Round(time.Millisecond))
	after := connect(t, p.URL("postgres"))
	require.Equal(t, p.Primary().Port, serverPort(t, after))
	require.NotEqual(t, first, p.Primary().Port)
	require.Equal(t, 100, count(t, after), "the tail is lost")

	took, err = p.Rejoin(ctx)
	require.NoError(t, err)
	t.Logf("old primary rejoined as a standby in %s", took.Round(time.Millisecond))
	standby := connect(t, p.Standby().URL("postgres"))
	var recovering bool
	require.NoError(t, standby.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovering))
	require.True(t, recovering)
	_, err = after.Exec(ctx, `INSERT INTO commits VALUES (1)`)
	require.NoError(t, err)
	require.NoError(t, p.WaitCaughtUp(ctx, time.Minute))
	require.Equal(t, 101, count(t, standby), "the rejoined standby follows the new primary, without the old tail")
	again := connect(t, p.URL("postgres"))
	require.Equal(t, p.Primary().Port, serverPort(t, again), "the read-only first host is passed over")
}

// TestSynchronousPairLosesNothing: with synchronous replication every
// commit the primary confirmed is on the standby when it is promoted,
// without waiting for it to catch up.
func TestSynchronousPairLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := startPair(t, chaos.PairOptions{Synchronous: true})
	conn := connect(t, p.URL("postgres"))
	_, err := conn.Exec(ctx, `CREATE TABLE commits (n int)`)
	require.NoError(t, err)
	for range 50 {
		_, err = conn.Exec(ctx, `INSERT INTO commits VALUES (0)`)
		require.NoError(t, err)
	}
	tail, err := p.Crash(ctx, chaos.CrashProcess)
	require.NoError(t, err)
	_, err = p.Promote(ctx)
	require.NoError(t, err)
	t.Logf("synchronous: %+v", tail)
	require.Equal(t, 50, count(t, connect(t, p.URL("postgres"))))
}

// TestCrashedHostAnswersNothing: in CrashHost mode a connection to the
// lost primary neither answers nor fails until its client's own deadline,
// and a new connection skips the vanished first host only after its
// connect_timeout.
func TestCrashedHostAnswersNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := startPair(t, chaos.PairOptions{Synchronous: true})
	conn := connect(t, p.URL("postgres"))
	_, err := p.Crash(ctx, chaos.CrashHost)
	require.NoError(t, err)
	_, err = p.Promote(ctx)
	require.NoError(t, err)

	start := time.Now()
	deadline, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = conn.Exec(deadline, `SELECT 1`)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), 2*time.Second, "nothing reset the connection: only the deadline ended the wait")

	start = time.Now()
	after := connect(t, p.URL("postgres")+"&connect_timeout=2")
	require.Equal(t, p.Primary().Port, serverPort(t, after))
	require.GreaterOrEqual(t, time.Since(start), 2*time.Second, "the vanished first host cost the connect timeout")
}
