package batch_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestEveryBatchHasAUID: a reservation gets a random
// uid from the column's default (migration 00100), distinct per batch,
// returned with the row.
func TestEveryBatchHasAUID(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	a := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/uid-a"))
	b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/uid-b"))
	require.Len(t, a.UID, 36)
	require.NotEqual(t, a.UID, b.UID)
	got, err := s.Get(context.Background(), a.ID)
	require.NoError(t, err)
	require.Equal(t, a.UID, got.UID)
}

// TestKnows: the operational database knows a batch by its id, uid,
// tenant and scope; a stamp naming the id with another uid, or another
// folder's batch, is a batch it does not know; a legacy name (no uid)
// names the batch of that id.
func TestKnows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/knows"))
	for _, c := range []struct {
		name          string
		ref           batch.Ref
		tenant, scope string
		known         bool
	}{
		{"id and uid", b.Ref(), b.TenantID, b.Scope(), true},
		{"legacy name", batch.Ref{ID: b.ID}, b.TenantID, b.Scope(), true},
		{"another uid", batch.Ref{ID: b.ID, UID: "00000000-0000-4000-8000-000000000000"}, b.TenantID, b.Scope(), false},
		{"another folder", b.Ref(), b.TenantID, "fleet_s3:s3://bucket/other", false},
		{"another tenant", b.Ref(), "tenant-b", b.Scope(), false},
		{"no such id", batch.Ref{ID: b.ID + 1000, UID: b.UID}, b.TenantID, b.Scope(), false},
	} {
		known, err := s.Knows(ctx, c.ref, c.tenant, c.scope)
		require.NoError(t, err)
		require.Equal(t, c.known, known, c.name)
	}
}

// TestAdvanceIDsNeverHandsOutAnIDTwice: moving the sequence past an id
// the warehouse names while reservations draw ids concurrently leaves no
// id handed out twice and every later id past the one named; a sequence
// already past it is left alone; a nonsense gap is refused.
func TestAdvanceIDsNeverHandsOutAnIDTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	first := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/advance-0"))

	const past = 5000
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = map[int64]bool{first.ID: true}
	)
	for w := range 4 {
		wg.Go(func() {
			for i := range 25 {
				res, err := s.Reserve(ctx, fleetReservation("tenant-a", fmt.Sprintf("s3://bucket/advance-%d/%d", w, i)))
				require.NoError(t, err)
				require.Equal(t, batch.Reserved, res.Outcome)
				mu.Lock()
				require.False(t, ids[res.Batch.ID], "id %d handed out twice", res.Batch.ID)
				ids[res.Batch.ID] = true
				mu.Unlock()
			}
		})
	}
	last, err := s.AdvanceIDs(ctx, past)
	require.NoError(t, err)
	require.GreaterOrEqual(t, last, int64(past))
	wg.Wait()
	next := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/advance-next"))
	require.Greater(t, next.ID, int64(past))
	require.False(t, ids[next.ID])

	again, err := s.AdvanceIDs(ctx, 10)
	require.NoError(t, err)
	require.GreaterOrEqual(t, again, next.ID, "a sequence past the id is left as it is")

	_, err = s.AdvanceIDs(ctx, next.ID+60_000_000)
	require.ErrorContains(t, err, "refusing to draw them")
	_, err = s.AdvanceIDs(ctx, -1)
	require.Error(t, err)
}

// TestResumeProvesTheSliceByIDAndUID: a failed publication resumes when
// the slice's stamp names its id and uid.
func TestResumeProvesTheSliceByIDAndUID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	b := committedFailedPublication(t, pool, s, fleetReservation("tenant-a", "s3://bucket/resume-uid"))
	res, err := s.Resume(ctx, resumeRequest(b), batch.SliceVerifierFunc(func(context.Context, string, string) (batch.Ref, bool, error) {
		return b.Ref(), true, nil
	}))
	require.NoError(t, err)
	require.Equal(t, batch.Resumed, res.Outcome)
	require.Equal(t, b.UID, res.Batch.UID, "a resume keeps the batch's identity")
}
