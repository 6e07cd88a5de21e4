package batch_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func TestCancelIsAFencedTransition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	leases := lease.NewStore(pool)
	r := fleetReservation("tenant-a", "s3://bucket/cancel")
	b := reserve(t, s, r)
	held := acquire(t, pool, b.ID, "holder")
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	d.Phase = batch.PhaseLoading
	_, err = s.WriteDetails(ctx, held.Fence(), d)
	require.NoError(t, err)

	// Another tenant cannot see, let alone cancel, the batch.
	res, err := s.Cancel(ctx, batch.CancelRequest{BatchID: b.ID, TenantID: "tenant-b", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, batch.CancelNotFound, res.Outcome)
	res, err = s.Cancel(ctx, batch.CancelRequest{BatchID: 1_000_000, TenantID: "tenant-a", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, batch.CancelNotFound, res.Outcome)

	res, err = s.Cancel(ctx, batch.CancelRequest{BatchID: b.ID, TenantID: "tenant-a", By: "alice@ops-host", Reason: "folder re-uploaded"})
	require.NoError(t, err)
	require.Equal(t, batch.Cancelled, res.Outcome)
	require.Equal(t, "holder", res.PreviousHolder)
	got := res.Batch
	require.Equal(t, batch.StatusFailed, got.Status)
	require.Nil(t, got.LeaseID)
	require.Equal(t, held.Generation+1, got.LeaseGeneration, "the generation moved past the holder's term")
	require.NotNil(t, got.CompletedAt)
	require.Equal(t, "alice@ops-host", *got.CancelledBy)
	require.Equal(t, "folder re-uploaded", *got.CancelReason)
	gd, err := batch.ParseDetails(got.Details)
	require.NoError(t, err)
	require.Equal(t, batch.PhaseCancelled, gd.Phase)
	require.Equal(t, "cancelled by alice@ops-host: folder re-uploaded", gd.LastError.Message)
	// The revoked term is closed in the lease trail, ended by the cancel.
	var rawTerms []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT execution_lease_terms FROM ingestion_batches WHERE id = $1`, b.ID).Scan(&rawTerms))
	terms, err := lease.ParseTerms(rawTerms)
	require.NoError(t, err)
	require.Len(t, terms, 1)
	require.Equal(t, held.Generation, terms[0].Generation)
	require.True(t, terms[0].Closed, "a cancel closes the term it revokes")
	require.NotNil(t, terms[0].ReleasedAt)
	require.False(t, terms[0].End().After(*got.CompletedAt), "the term ends at the cancel")

	// The holder self-fences: its renewal and every write are refused.
	_, ok, err := leases.Renew(ctx, held, time.Minute)
	require.NoError(t, err)
	require.False(t, ok)
	_, err = s.WriteDetails(ctx, held.Fence(), d)
	require.ErrorIs(t, err, batch.ErrStaleLease)
	_, err = s.MarkSucceeded(ctx, held.Fence(), d)
	require.ErrorIs(t, err, batch.ErrStaleLease)
	// Nobody can lease a cancelled batch.
	a, err := leases.Acquire(ctx, b.ID, "successor", time.Minute)
	require.NoError(t, err)
	require.Equal(t, lease.Terminal, a.Outcome)

	// The scope is free at once.
	reserve(t, s, r)

	// A terminal batch is not cancellable, and nothing changes.
	again, err := s.Cancel(ctx, batch.CancelRequest{BatchID: b.ID, TenantID: "tenant-a", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, batch.NotCancellable, again.Outcome)
	require.Equal(t, got.UpdatedAt, again.Batch.UpdatedAt)

	// Bad input writes nothing.
	for _, req := range []batch.CancelRequest{
		{BatchID: 0, TenantID: "tenant-a", By: "ops"},
		{BatchID: b.ID, TenantID: "", By: "ops"},
		{BatchID: b.ID, TenantID: "tenant-a", By: ""},
		{BatchID: b.ID, TenantID: "tenant-a", By: "ops", Reason: "line\nbreak"},
		{BatchID: b.ID, TenantID: "tenant-a", By: "ops", Reason: strings.Repeat("r", batch.MaxCancelReasonLen+1)},
	} {
		_, err := s.Cancel(ctx, req)
		var verr *batch.ValidationError
		require.ErrorAs(t, err, &verr, "%+v", req)
	}
}

// TestCancelNeverRewritesAnUnknownDetailsVersion: a batch this build cannot
// read is cancelled in its columns only; its document stays as it was.
func TestCancelNeverRewritesAnUnknownDetailsVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/v99"))
	const future = `{"version": 99, "stage": "somewhere new", "phase": "quantum"}`
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = $2 WHERE id = $1`, b.ID, future)
	require.NoError(t, err)

	res, err := s.Cancel(ctx, batch.CancelRequest{BatchID: b.ID, TenantID: "tenant-a", By: "ops", Reason: "parked"})
	require.NoError(t, err)
	require.Equal(t, batch.Cancelled, res.Outcome)
	require.True(t, res.DetailsKept)
	require.Equal(t, batch.StatusFailed, res.Batch.Status)
	require.JSONEq(t, future, string(res.Batch.Details))
	require.NotNil(t, res.Batch.CancelledAt)
}

func TestParkIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/park"))
	l := acquire(t, pool, b.ID, "delivery-1")
	b, err := s.Get(ctx, b.ID)
	require.NoError(t, err)
	parked, err := s.Park(ctx, l.Fence(), "details version 99 unknown to this build")
	require.NoError(t, err)
	require.True(t, parked.Parked())
	require.Equal(t, "details version 99 unknown to this build", *parked.ParkedReason)
	require.Equal(t, b.Details, parked.Details, "parking never touches the details document")

	stale := l.Fence()
	stale.Generation++
	_, err = s.Park(ctx, stale, "x")
	require.ErrorIs(t, err, batch.ErrStaleLease)
	_, err = s.Unpark(ctx, stale)
	require.ErrorIs(t, err, batch.ErrStaleLease)

	unparked, err := s.Unpark(ctx, l.Fence())
	require.NoError(t, err)
	require.False(t, unparked.Parked())
	require.Nil(t, unparked.ParkedReason)

	// A long reason is cut on a rune boundary to fit its column.
	long := strings.Repeat("é", 400)
	parked, err = s.Park(ctx, l.Fence(), long)
	require.NoError(t, err)
	require.LessOrEqual(t, len(*parked.ParkedReason), 500)
	require.True(t, strings.HasPrefix(long, *parked.ParkedReason))
}

// TestCancelledBatchIsNotResumable: a batch an operator cancelled after its
// warehouse commit is not moved back to Running by a resume (that would
// undo the cancel); retry starts a new batch instead.
func TestCancelledBatchIsNotResumable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/cancel-committed"))
	held := acquire(t, pool, b.ID, "holder")
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	now := time.Now().UTC()
	d.Phase, d.RedshiftCommitted, d.CommittedAt, d.RecordCount = batch.PhasePublishing, true, &now, 10
	_, err = s.WriteDetails(ctx, held.Fence(), d)
	require.NoError(t, err)
	res, err := s.Cancel(ctx, batch.CancelRequest{BatchID: b.ID, TenantID: "tenant-a", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, batch.Cancelled, res.Outcome)

	rr, err := s.Resume(ctx, resumeRequest(b), ownedBy(b.ID))
	require.NoError(t, err)
	require.Equal(t, batch.NotResumable, rr.Outcome)
	require.Equal(t, batch.ReasonCancelled, rr.Reason)
	got, err := s.Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, got.Status, "still cancelled")
}
