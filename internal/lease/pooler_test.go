package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgbouncertest"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestFencingHoldsAcrossServerConnectionsOfAPooler: behind PgBouncer in
// transaction mode the transactions of one client connection run on
// whichever server connection is free, so nothing of a lease may live in a
// session. Here one client connection (a worker process's) acquires a term
// on one server connection, renews it and writes under it on another, and
// after a successor took the expired term over, its stale renewal and
// writes are refused both on the successor's own server connection and on
// the other one. Which server connection each transaction ran on is read
// (pg_backend_pid) and forced by pinning the others with open
// transactions, so the test proves it ran across connections.
func TestFencingHoldsAcrossServerConnectionsOfAPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	direct := pgtest.Pool(t, dbURL)
	bouncer := pgbouncertest.Start(t, pgbouncertest.Options{PoolSize: 2})
	bURL := bouncer.URL(t, dbURL)
	connect := func() *pgxpool.Pool {
		p, err := cli.Connect(ctx, bURL, cli.PoolerTransaction, 10*time.Second, func(c *pgxpool.Config) { c.MaxConns = 1 })
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	proc, successor := connect(), connect() // one client connection each

	// inTx runs fn in one transaction of db and returns the server
	// connection (backend pid) it ran on.
	inTx := func(db *pgxpool.Pool, fn func(tx pgx.Tx) error) (int32, error) {
		var pid int32
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			return fn(tx)
		})
		return pid, err
	}
	// pin holds an open transaction on a server connection chosen by
	// keep (the pid it got), so the next transaction of another client
	// lands on the other one of PgBouncer's two. It returns the release.
	pin := func(keep func(pid int32) bool) func() {
		var held []pgx.Tx
		release := func(tx pgx.Tx) { _ = tx.Rollback(ctx) }
		for range 2 {
			tx, err := connect().Begin(ctx)
			require.NoError(t, err)
			var pid int32
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
			if keep(pid) {
				for _, h := range held {
					release(h)
				}
				return func() { release(tx) }
			}
			held = append(held, tx)
		}
		t.Fatal("pin: PgBouncer gave no server connection the test could pin")
		return nil
	}

	b := reserve(t, direct, "tenant-a", "s3://bucket/pooled")
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	const ttl = 2 * time.Second

	var acq lease.Acquisition
	acquiredOn, err := inTx(proc, func(tx pgx.Tx) error {
		var err error
		acq, err = lease.NewStore(tx).Acquire(ctx, b.ID, "proc/delivery-1", ttl)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, acq.Outcome)
	term := acq.Lease

	// The holder renews and writes on the other server connection.
	unpin := pin(func(pid int32) bool { return pid == acquiredOn })
	d.Phase = batch.PhaseLoading
	heldOn, err := inTx(proc, func(tx pgx.Tx) error {
		renewed, held, err := lease.NewStore(tx).Renew(ctx, term, ttl)
		if err != nil {
			return err
		}
		require.True(t, held, "the holder's renewal on another server connection is accepted")
		term = renewed
		_, err = batch.NewStore(tx).WriteDetails(ctx, term.Fence(), d)
		return err
	})
	unpin()
	require.NoError(t, err, "the holder's fenced write on another server connection is accepted")
	require.NotEqual(t, acquiredOn, heldOn, "the holder's transactions ran on two server connections")

	// The holder pauses past its expiry; a successor takes over.
	waitExpired(t, direct, term)
	var next lease.Acquisition
	takenOverOn, err := inTx(successor, func(tx pgx.Tx) error {
		var err error
		next, err = lease.NewStore(tx).Acquire(ctx, b.ID, "successor/delivery-2", 30*time.Second)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, next.Outcome)
	require.True(t, next.TakenOver)
	require.Equal(t, term.Generation+1, next.Lease.Generation)

	// The stale holder wakes: on the successor's server connection and on
	// the other one, its renewal and its writes are refused.
	stale := d
	stale.Phase, stale.RedshiftCommitted = batch.PhaseCommitted, true
	for name, keep := range map[string]func(int32) bool{
		"on the successor's server connection": func(pid int32) bool { return pid != takenOverOn },
		"on the other server connection":       func(pid int32) bool { return pid == takenOverOn },
	} {
		unpin := pin(keep)
		ranOn, err := inTx(proc, func(tx pgx.Tx) error {
			_, held, err := lease.NewStore(tx).Renew(ctx, term, ttl)
			require.NoError(t, err)
			require.False(t, held, "%s: the stale renewal is refused", name)
			_, err = batch.NewStore(tx).WriteDetails(ctx, term.Fence(), stale)
			require.ErrorIs(t, err, batch.ErrStaleLease, "%s: the stale write is refused", name)
			_, err = batch.NewStore(tx).MarkSucceeded(ctx, term.Fence(), stale)
			require.ErrorIs(t, err, batch.ErrStaleLease, "%s: the stale terminal write is refused", name)
			return nil
		})
		unpin()
		require.NoError(t, err)
		if name == "on the successor's server connection" {
			require.Equal(t, takenOverOn, ranOn, name)
		} else {
			require.NotEqual(t, takenOverOn, ranOn, name)
		}
	}

	// The successor's term is intact and its writes land.
	got, err := batch.NewStore(direct).Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, got.Status)
	require.Equal(t, next.Lease.Generation, got.LeaseGeneration)
	gd, err := batch.ParseDetails(got.Details)
	require.NoError(t, err)
	require.False(t, gd.RedshiftCommitted, "no stale write landed")
	_, err = batch.NewStore(successor).WriteDetails(ctx, next.Lease.Fence(), d)
	require.NoError(t, err)
}

// TestRenewalsRunOnTheirOwnConnection: a store WithRenewals renews (Renew,
// RenewMany) on the given connection and does everything else on its own:
// here the renewal connection is closed, so renewals fail while an
// acquisition, a check and a release succeed; on an open one they renew.
func TestRenewalsRunOnTheirOwnConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	closed := pgtest.Pool(t, dbURL)
	closed.Close()
	leases := lease.NewStore(pool).WithRenewals(closed)

	b := reserve(t, pool, "tenant-a", "s3://bucket/renewals")
	a, err := leases.Acquire(ctx, b.ID, "delivery-1", 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, a.Outcome)
	_, err = leases.RenewMany(ctx, []lease.Lease{a.Lease}, 30*time.Second)
	require.Error(t, err, "RenewMany runs on the renewal connection")
	_, _, err = leases.Renew(ctx, a.Lease, 30*time.Second)
	require.Error(t, err, "Renew runs on the renewal connection")
	_, held, _, err := leases.Check(ctx, a.Lease, time.Second)
	require.NoError(t, err)
	require.True(t, held)

	renewed, err := lease.NewStore(pool).WithRenewals(pgtest.Pool(t, dbURL)).RenewMany(ctx, []lease.Lease{a.Lease}, 30*time.Second)
	require.NoError(t, err)
	require.Len(t, renewed, 1)
	require.True(t, renewed[0].Held)
	released, err := leases.Release(ctx, renewed[0].Lease)
	require.NoError(t, err)
	require.True(t, released)
}
