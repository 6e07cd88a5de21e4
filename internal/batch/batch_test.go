package batch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func fleetReservation(tenant, folder string) batch.Reservation {
	return batch.Reservation{
		CompanyID:      "company-1",
		TenantID:       tenant,
		TenantDatabase: "tenant_db",
		SourceType:     batch.SourceTypeFleetS3,
		IngestionMode:  batch.IngestionModeFileUpload,
		PipelineStage:  batch.PipelineStageFleet,
		SourceScope:    "fleet_s3:" + folder,
		Details:        batch.NewDetails(folder),
	}
}

func reserve(t *testing.T, s *batch.Store, r batch.Reservation) batch.Batch {
	t.Helper()
	res, err := s.Reserve(context.Background(), r)
	require.NoError(t, err)
	require.Equal(t, batch.Reserved, res.Outcome)
	return res.Batch
}

func acquire(t *testing.T, pool *pgxpool.Pool, id int64, holder string) lease.Lease {
	t.Helper()
	a, err := lease.NewStore(pool).Acquire(context.Background(), id, holder, time.Minute)
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, a.Outcome)
	return a.Lease
}

func TestReserve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)

	t.Run("one tenant folder reservation succeeds", func(t *testing.T) {
		b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/one"))
		require.Equal(t, batch.StatusRunning, b.Status)
		require.Equal(t, "fleet_s3:s3://bucket/one", b.Scope())
		require.Nil(t, b.BusinessDate, "Fleet batches have no business date")
		require.Equal(t, batch.SourceTypeFleetS3, b.SourceType)
		require.Equal(t, batch.IngestionModeFileUpload, b.IngestionMode)
		require.Equal(t, batch.PipelineStageFleet, b.PipelineStage)
		require.False(t, b.IsCurrent)
		require.Nil(t, b.LeaseID)
		d, err := batch.ParseDetails(b.Details)
		require.NoError(t, err)
		require.Equal(t, batch.PhaseReserved, d.Phase)
		require.Equal(t, batch.DetailsVersion, d.Version)
		require.NotNil(t, d.UpdatedAt, "store stamps updatedAt from the database clock")

		var stored string
		require.NoError(t, pool.QueryRow(ctx, `SELECT source_type FROM ingestion_batches WHERE id = $1`, b.ID).Scan(&stored))
		require.Equal(t, "FleetS3", stored, "enums are stored by name")
	})

	t.Run("duplicate conflicts with the running batch id", func(t *testing.T) {
		first := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/dup"))
		res, err := s.Reserve(ctx, fleetReservation("tenant-a", "s3://bucket/dup"))
		require.NoError(t, err)
		require.Equal(t, batch.Conflict, res.Outcome)
		require.Equal(t, first.ID, res.RunningBatchID)
	})

	t.Run("different folder for the same tenant succeeds", func(t *testing.T) {
		reserve(t, s, fleetReservation("tenant-b", "s3://bucket/f1"))
		reserve(t, s, fleetReservation("tenant-b", "s3://bucket/f2"))
	})

	t.Run("same folder for a different tenant succeeds", func(t *testing.T) {
		reserve(t, s, fleetReservation("tenant-c", "s3://bucket/shared"))
		reserve(t, s, fleetReservation("tenant-d", "s3://bucket/shared"))
	})

	t.Run("inside a caller transaction a conflict leaves the transaction usable", func(t *testing.T) {
		first := reserve(t, s, fleetReservation("tenant-e", "s3://bucket/tx"))
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		res, err := s.WithTx(tx).Reserve(ctx, fleetReservation("tenant-e", "s3://bucket/tx"))
		require.NoError(t, err)
		require.Equal(t, batch.Conflict, res.Outcome)
		require.Equal(t, first.ID, res.RunningBatchID)
		var one int
		require.NoError(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&one))
	})
}

// TestReserveConcurrentDuplicates releases 32 reservations of one scope
// together, each on its own connection, and expects exactly one winner per
// round.
func TestReserveConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const (
		clients = 32
		rounds  = 20
	)
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	conns := acquireConns(t, pool, clients)

	for round := range rounds {
		folder := fmt.Sprintf("s3://bucket/race-%d", round)
		results := make([]batch.ReserveResult, clients)
		errs := make([]error, clients)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				<-start
				results[i], errs[i] = batch.NewStore(conns[i]).Reserve(ctx, fleetReservation("tenant-race", folder))
			})
		}
		close(start)
		wg.Wait()

		var winners []int64
		for i := range clients {
			require.NoError(t, errs[i])
			if results[i].Outcome == batch.Reserved {
				winners = append(winners, results[i].Batch.ID)
			}
		}
		require.Len(t, winners, 1, "round %d: exactly one reservation must win", round)
		for i := range clients {
			if results[i].Outcome == batch.Conflict {
				require.Equal(t, winners[0], results[i].RunningBatchID)
			}
		}
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE source_scope = $1`, "fleet_s3:"+folder).Scan(&n))
		require.Equal(t, 1, n)
	}
}

// acquireConns holds n distinct pool connections for the whole test, so
// concurrent goroutines really run on separate server sessions.
func acquireConns(t *testing.T, pool *pgxpool.Pool, n int) []*pgxpool.Conn {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns[i] = c
		t.Cleanup(c.Release)
	}
	return conns
}

func TestTerminalRowsReleaseTheReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	r := fleetReservation("tenant-a", "s3://bucket/terminal")

	failed := reserve(t, s, r)
	l := acquire(t, pool, failed.ID, "delivery-1")
	_, err := s.MarkFailed(ctx, l.Fence(), batch.NewDetails("x"), batch.PhaseFailedPreCommit, "boom")
	require.NoError(t, err)

	succeeded := reserve(t, s, r)
	require.NotEqual(t, failed.ID, succeeded.ID)
	l = acquire(t, pool, succeeded.ID, "delivery-2")
	done, err := s.MarkSucceeded(ctx, l.Fence(), batch.NewDetails("x"))
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, done.Status)
	require.NotNil(t, done.CompletedAt)
	require.Nil(t, done.LeaseID, "a terminal write releases the lease")

	third := reserve(t, s, r)

	// An operator's cancel releases the scope too.
	res, err := s.Cancel(ctx, batch.CancelRequest{BatchID: third.ID, TenantID: "tenant-a", By: "test"})
	require.NoError(t, err)
	require.Equal(t, batch.Cancelled, res.Outcome)
	reserve(t, s, r)
}

// committedFailedPublication drives a reserved batch to Failed with
// failed_publication after a warehouse commit, as the pipeline would.
func committedFailedPublication(t *testing.T, pool *pgxpool.Pool, s *batch.Store, r batch.Reservation) batch.Batch {
	t.Helper()
	ctx := context.Background()
	b := reserve(t, s, r)
	l := acquire(t, pool, b.ID, fmt.Sprintf("delivery-%d", b.ID))
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	now := time.Now().UTC()
	d.Phase, d.RedshiftCommitted, d.CommittedAt, d.RecordCount = batch.PhaseCommitted, true, &now, 10
	_, err = s.WriteDetails(ctx, l.Fence(), d)
	require.NoError(t, err)
	b, err = s.MarkFailed(ctx, l.Fence(), d, batch.PhaseFailedPublication, "publication failed")
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
	return b
}

func ownedBy(id int64) batch.SliceVerifier {
	return batch.SliceVerifierFunc(func(context.Context, string, string) (batch.Ref, bool, error) { return batch.Ref{ID: id}, true, nil })
}

func resumeRequest(b batch.Batch) batch.ResumeRequest {
	return batch.ResumeRequest{BatchID: b.ID, TenantID: b.TenantID, SourceType: b.SourceType, SourceScope: b.Scope()}
}

func TestResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)

	t.Run("valid publication resume reacquires the reservation", func(t *testing.T) {
		r := fleetReservation("tenant-a", "s3://bucket/resume-ok")
		b := committedFailedPublication(t, pool, s, r)

		// The scope is free while the batch is Failed ...
		var held int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE source_scope = $1 AND status = 'Running'`, b.Scope()).Scan(&held))
		require.Zero(t, held)

		res, err := s.Resume(ctx, resumeRequest(b), ownedBy(b.ID))
		require.NoError(t, err)
		require.Equal(t, batch.Resumed, res.Outcome, res.Reason)
		require.Equal(t, batch.StatusRunning, res.Batch.Status)
		require.Nil(t, res.Batch.CompletedAt)
		d, err := batch.ParseDetails(res.Batch.Details)
		require.NoError(t, err)
		require.True(t, d.RedshiftCommitted)
		require.Equal(t, batch.PhaseCommitted, d.Phase)
		require.Equal(t, 1, d.Resumes)

		// ... and held again once resumed.
		again, err := s.Reserve(ctx, r)
		require.NoError(t, err)
		require.Equal(t, batch.Conflict, again.Outcome)
		require.Equal(t, b.ID, again.RunningBatchID)
	})

	t.Run("resume conflicts with a newer running batch", func(t *testing.T) {
		r := fleetReservation("tenant-a", "s3://bucket/resume-conflict")
		old := committedFailedPublication(t, pool, s, r)
		newer := reserve(t, s, r)

		res, err := s.Resume(ctx, resumeRequest(old), ownedBy(old.ID))
		require.NoError(t, err)
		require.Equal(t, batch.ResumeConflict, res.Outcome)
		require.Equal(t, newer.ID, res.RunningBatchID)
		got, err := s.Get(ctx, old.ID)
		require.NoError(t, err)
		require.Equal(t, batch.StatusFailed, got.Status, "a conflicting resume changes nothing")
	})

	t.Run("resume inside a caller transaction survives a conflict", func(t *testing.T) {
		r := fleetReservation("tenant-b", "s3://bucket/resume-tx")
		old := committedFailedPublication(t, pool, s, r)
		newer := reserve(t, s, r)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := s.WithTx(tx).Resume(ctx, resumeRequest(old), ownedBy(old.ID))
			require.NoError(t, err)
			require.Equal(t, batch.ResumeConflict, res.Outcome)
			require.Equal(t, newer.ID, res.RunningBatchID)
			_, err = tx.Exec(ctx, `SELECT 1`)
			return err
		})
		require.NoError(t, err)
	})
}

func TestResumeRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)

	setDetails := func(t *testing.T, id int64, raw string) {
		t.Helper()
		// Out of band, as another build (or a person with psql) would: the
		// store's own generic update refuses scoped batches.
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = $2 WHERE id = $1`, id, raw)
		require.NoError(t, err)
	}
	setStatus := func(t *testing.T, id int64, status batch.Status) {
		t.Helper()
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET status = $2 WHERE id = $1`, id, status)
		require.NoError(t, err)
	}
	mutate := func(t *testing.T, b batch.Batch, f func(*batch.Details)) {
		t.Helper()
		d, err := batch.ParseDetails(b.Details)
		require.NoError(t, err)
		f(&d)
		raw, err := d.Marshal()
		require.NoError(t, err)
		setDetails(t, b.ID, string(raw))
	}
	n := 0
	fresh := func(t *testing.T) batch.Batch {
		n++
		return committedFailedPublication(t, pool, s, fleetReservation("tenant-r", fmt.Sprintf("s3://bucket/refuse-%d-%s", n, t.Name())))
	}

	tests := []struct {
		name    string
		prepare func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier)
		outcome batch.ResumeOutcome
		reason  string
		phase   batch.Phase // phase recorded afterwards, if the refusal records one
	}{
		{
			name: "wrong source type",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				req := resumeRequest(b)
				req.SourceType = batch.SourceTypeKdsCdc
				return req, ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonSourceTypeMismatch,
		},
		{
			name: "wrong scope",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				req := resumeRequest(b)
				req.SourceScope = "fleet_s3:s3://bucket/other"
				return req, ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonScopeMismatch,
		},
		{
			name: "details unparsable",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				setDetails(t, b.ID, `{"version": 1, "phase": "failed_publication", "redshiftCommitted": "yes"}`)
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonDetailsInvalid,
		},
		{
			name: "details not an object",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				setDetails(t, b.ID, `[1, 2, 3]`)
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonDetailsInvalid,
		},
		{
			name: "details of an unknown version",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				setDetails(t, b.ID, `{"version": 2, "phase": "failed_publication", "redshiftCommitted": true}`)
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonDetailsUnknownVersion,
		},
		{
			name: "warehouse commit not recorded",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				mutate(t, b, func(d *batch.Details) { d.RedshiftCommitted = false; d.Phase = batch.PhaseFailedPreCommit })
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonNotCommitted,
		},
		{
			name: "already published",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				mutate(t, b, func(d *batch.Details) { d.Publication.Completed = true })
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonAlreadyPublished,
		},
		{
			name: "succeeded",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				setStatus(t, b.ID, batch.StatusSucceeded)
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonSucceeded,
		},
		{
			name: "still running",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				setStatus(t, b.ID, batch.StatusRunning)
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonRunning,
		},
		{
			name: "already superseded",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				mutate(t, b, func(d *batch.Details) { d.Phase = batch.PhaseSuperseded })
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonSuperseded,
		},
		{
			name: "publication already expired",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				mutate(t, b, func(d *batch.Details) { d.Phase = batch.PhasePublicationExpired })
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonPublicationExpired,
		},
		{
			name: "warehouse slice stamped by another batch marks it superseded",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				return resumeRequest(b), ownedBy(b.ID + 1000)
			},
			outcome: batch.NotResumable, reason: batch.ReasonSuperseded, phase: batch.PhaseSuperseded,
		},
		{
			// A batch the operational database forgot (a restore) was
			// handed this batch's id: its stamp names the id with another
			// uid, and is not this batch's slice.
			name: "warehouse slice stamped with the batch's id and another uid marks it superseded",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				require.NotEmpty(t, b.UID)
				return resumeRequest(b), batch.SliceVerifierFunc(func(context.Context, string, string) (batch.Ref, bool, error) {
					return batch.Ref{ID: b.ID, UID: "00000000-0000-4000-8000-000000000000"}, true, nil
				})
			},
			outcome: batch.NotResumable, reason: batch.ReasonSuperseded, phase: batch.PhaseSuperseded,
		},
		{
			name: "warehouse slice missing",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				return resumeRequest(b), batch.SliceVerifierFunc(func(context.Context, string, string) (batch.Ref, bool, error) { return batch.Ref{}, false, nil })
			},
			outcome: batch.NotResumable, reason: batch.ReasonWarehouseSliceMissing,
		},
		{
			name: "publication window passed marks it expired",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				mutate(t, b, func(d *batch.Details) {
					old := time.Now().Add(-25 * time.Hour)
					d.CommittedAt = &old
				})
				return resumeRequest(b), ownedBy(b.ID)
			},
			outcome: batch.NotResumable, reason: batch.ReasonPublicationExpired, phase: batch.PhasePublicationExpired,
		},
		{
			name: "another tenant's batch is not found",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				req := resumeRequest(b)
				req.TenantID = "tenant-other"
				return req, ownedBy(b.ID)
			},
			outcome: batch.ResumeNotFound,
		},
		{
			name: "unknown batch id",
			prepare: func(t *testing.T, b batch.Batch) (batch.ResumeRequest, batch.SliceVerifier) {
				req := resumeRequest(b)
				req.BatchID = b.ID + 1_000_000
				return req, ownedBy(b.ID)
			},
			outcome: batch.ResumeNotFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := fresh(t)
			req, verifier := tt.prepare(t, b)
			before, err := s.Get(ctx, b.ID)
			require.NoError(t, err)

			res, err := s.Resume(ctx, req, verifier)
			require.NoError(t, err)
			require.Equal(t, tt.outcome, res.Outcome)
			require.Equal(t, tt.reason, res.Reason)

			after, err := s.Get(ctx, b.ID)
			require.NoError(t, err)
			require.Equal(t, before.Status, after.Status, "a refused resume never changes the status")
			if tt.phase != "" {
				d, err := batch.ParseDetails(after.Details)
				require.NoError(t, err)
				require.Equal(t, tt.phase, d.Phase)
				// Recorded refusals are final: a second resume is refused
				// for the same reason even with a good verifier.
				res, err = s.Resume(ctx, req, ownedBy(b.ID))
				require.NoError(t, err)
				require.Equal(t, tt.reason, res.Reason)
			}
			var running int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE source_scope = $1 AND status = 'Running' AND id = $2`, b.Scope(), b.ID).Scan(&running))
			if before.Status != batch.StatusRunning {
				require.Zero(t, running, "a refused resume never reacquires the scope")
			}
		})
	}
}

func TestResumeRequiresVerifier(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	_, err := batch.NewStore(pool).Resume(context.Background(), batch.ResumeRequest{BatchID: 1, TenantID: "t", SourceType: batch.SourceTypeFleetS3, SourceScope: "fleet_s3:x"}, nil)
	require.Error(t, err)
}

func TestDateScopedCurrentBehaviourUnchanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)

	day := time.Date(2026, 3, 14, 0, 0, 0, 0, time.UTC)
	nextDay := day.AddDate(0, 0, 1)
	create := func(source batch.SourceType, date *time.Time, stage string) batch.Batch {
		b, err := s.Create(ctx, batch.NewBatch{
			CompanyID: "c", TenantID: "tenant-a", TenantDatabase: "db",
			IngestionMode: batch.IngestionModeAPI, SourceType: source,
			BusinessDate: date, PipelineStage: stage, Details: json.RawMessage(`{"rows": 3}`),
		})
		require.NoError(t, err)
		require.Nil(t, b.SourceScope, "date-scoped batches reserve no scope")
		return b
	}
	b1 := create(batch.SourceTypeBrinkPos, &day, "brink_raw")
	b2 := create(batch.SourceTypeBrinkPos, &day, "brink_raw")
	other := create(batch.SourceTypeBrinkPos, &nextDay, "brink_raw")
	kds := create(batch.SourceTypeKdsCdc, &day, "kds_cdc")

	// Two date-scoped batches for the same tenant, date and stage may run at
	// once: they hold no scope.
	require.Equal(t, batch.StatusRunning, b1.Status)
	require.Equal(t, batch.StatusRunning, b2.Status)

	require.NoError(t, s.SetCurrent(ctx, b1.ID))
	require.NoError(t, s.SetCurrent(ctx, other.ID))
	require.NoError(t, s.SetCurrent(ctx, kds.ID))
	cur, err := s.GetCurrent(ctx, "tenant-a", day, "brink_raw")
	require.NoError(t, err)
	require.Equal(t, b1.ID, cur.ID)

	require.NoError(t, s.SetCurrent(ctx, b2.ID))
	cur, err = s.GetCurrent(ctx, "tenant-a", day, "brink_raw")
	require.NoError(t, err)
	require.Equal(t, b2.ID, cur.ID)
	old, err := s.Get(ctx, b1.ID)
	require.NoError(t, err)
	require.False(t, old.IsCurrent, "the previous current batch is cleared")

	for _, id := range []int64{other.ID, kds.ID} {
		b, err := s.Get(ctx, id)
		require.NoError(t, err)
		require.True(t, b.IsCurrent, "other dates and stages are untouched")
	}

	// The database still refuses two current batches for one date and stage.
	_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET is_current = true WHERE id = $1`, b1.ID)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "ux_ingestion_batches_current", pgErr.ConstraintName)

	// Fleet batches never enter the date-scoped helpers.
	fleet := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/dated"))
	require.ErrorIs(t, s.SetCurrent(ctx, fleet.ID), batch.ErrNotDateScoped)
	require.ErrorIs(t, s.SetCurrent(ctx, 1_000_000), batch.ErrNotFound)

	// Status and details updates keep working for date-scoped batches.
	require.NoError(t, s.UpdateStatusAndDetails(ctx, b2.ID, batch.StatusSucceeded, json.RawMessage(`{"rows": 4}`)))
	b, err := s.Get(ctx, b2.ID)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, b.Status)
	require.JSONEq(t, `{"rows": 4}`, string(b.Details))
	require.True(t, b.IsCurrent)
}

func TestGetForUpdate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/gfu"))

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		st := s.WithTx(tx)
		got, err := st.GetForUpdate(ctx, b.ID, batch.Expect{TenantID: "tenant-a", SourceType: batch.SourceTypeFleetS3, SourceScope: b.Scope(), Status: batch.StatusRunning})
		require.NoError(t, err)
		require.Equal(t, b.ID, got.ID)

		_, err = st.GetForUpdate(ctx, b.ID, batch.Expect{SourceType: batch.SourceTypeBrinkPos})
		require.ErrorIs(t, err, batch.ErrUnexpectedBatch)
		require.ErrorContains(t, err, "source_type")
		_, err = st.GetForUpdate(ctx, b.ID, batch.Expect{SourceScope: "fleet_s3:other"})
		require.ErrorContains(t, err, "source_scope")
		_, err = st.GetForUpdate(ctx, b.ID, batch.Expect{Status: batch.StatusFailed})
		require.ErrorContains(t, err, "status")
		_, err = st.GetForUpdate(ctx, b.ID+99, batch.Expect{})
		require.ErrorIs(t, err, batch.ErrNotFound)
		return nil
	})
	require.NoError(t, err)
}

func TestReserveRefusesBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)

	long := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = 'a'
		}
		return string(b)
	}
	tests := []struct {
		name  string
		edit  func(r *batch.Reservation)
		field string
	}{
		{"empty tenant", func(r *batch.Reservation) { r.TenantID = "" }, "tenant_id"},
		{"tenant with control character", func(r *batch.Reservation) { r.TenantID = "ten\x00ant" }, "tenant_id"},
		{"tenant with newline", func(r *batch.Reservation) { r.TenantID = "ten\nant" }, "tenant_id"},
		{"tenant too long", func(r *batch.Reservation) { r.TenantID = long(101) }, "tenant_id"},
		{"tenant invalid utf-8", func(r *batch.Reservation) { r.TenantID = "bad\xff" }, "tenant_id"},
		{"tenant padded", func(r *batch.Reservation) { r.TenantID = " t" }, "tenant_id"},
		{"empty company", func(r *batch.Reservation) { r.CompanyID = "" }, "company_id"},
		{"company too long", func(r *batch.Reservation) { r.CompanyID = long(101) }, "company_id"},
		{"database with quote", func(r *batch.Reservation) { r.TenantDatabase = `db"; DROP TABLE x; --` }, "tenant_database"},
		{"database too long", func(r *batch.Reservation) { r.TenantDatabase = long(64) }, "tenant_database"},
		{"database starting with digit", func(r *batch.Reservation) { r.TenantDatabase = "1db" }, "tenant_database"},
		{"empty scope", func(r *batch.Reservation) { r.SourceScope = "" }, "source_scope"},
		{"scope over 200 characters", func(r *batch.Reservation) { r.SourceScope = "fleet_s3:" + long(192) }, "source_scope"},
		{"scope with control character", func(r *batch.Reservation) { r.SourceScope = "fleet_s3:a\tb" }, "source_scope"},
		{"unknown source type", func(r *batch.Reservation) { r.SourceType = "Fleet" }, "source_type"},
		{"unknown ingestion mode", func(r *batch.Reservation) { r.IngestionMode = "Upload" }, "ingestion_mode"},
	}
	for _, tt := range tests {
		r := fleetReservation("tenant-a", "s3://bucket/ok")
		tt.edit(&r)
		_, err := s.Reserve(ctx, r)
		var verr *batch.ValidationError
		require.ErrorAs(t, err, &verr, tt.name)
		require.Equal(t, tt.field, verr.Field, tt.name)
	}
	ok := fleetReservation("tenant-a", "s3://bucket/"+long(200-len("fleet_s3:s3://bucket/")))
	reserve(t, s, ok) // exactly 200 characters fits

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches`).Scan(&n))
	require.Equal(t, 1, n, "refused reservations write nothing")
}

// TestSourceTypesAppendOnly is a golden test: existing names keep their
// spelling and position; new source types may only be appended.
func TestSourceTypesAppendOnly(t *testing.T) {
	t.Parallel()
	golden := []batch.SourceType{"BrinkPos", "KdsCdc", "FleetS3"}
	require.GreaterOrEqual(t, len(batch.SourceTypes), len(golden))
	require.Equal(t, golden, batch.SourceTypes[:len(golden)])
	require.Equal(t, []batch.IngestionMode{"Api", "Cdc", "FileUpload"}, batch.IngestionModes[:3])
	require.Equal(t, batch.Status("Running"), batch.StatusRunning)
	require.Equal(t, batch.Status("Succeeded"), batch.StatusSucceeded)
	require.Equal(t, batch.Status("Failed"), batch.StatusFailed)
}

func TestParseDetails(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{``, `nul`, `[]`, `"x"`, `{}`, `{"version": null}`, `{"version": 1}`, `{"version": 1, "phase": 3}`, `{"version": 1, "phase": "loading", "redshiftCommitted": 1}`} {
		_, err := batch.ParseDetails([]byte(raw))
		require.ErrorIs(t, err, batch.ErrDetailsInvalid, raw)
	}
	_, err := batch.ParseDetails([]byte(`{"version": 7, "phase": "loading"}`))
	require.ErrorIs(t, err, batch.ErrDetailsUnknownVersion)
	require.ErrorIs(t, err, batch.ErrDetailsNewerVersion, "a newer build's")
	require.EqualError(t, err, "details version 7 is newer than this build's (1)")
	// The version is read before the shape: a newer version's document may
	// have another shape.
	_, err = batch.ParseDetails([]byte(`{"version": 2, "phase": {"name": "staged"}, "redshiftCommitted": "maybe"}`))
	require.ErrorIs(t, err, batch.ErrDetailsNewerVersion)
	for _, older := range []string{`{"version": 0, "phase": "loading"}`, `{"version": -1}`} {
		_, err = batch.ParseDetails([]byte(older))
		require.ErrorIs(t, err, batch.ErrDetailsUnknownVersion, older)
		require.NotErrorIs(t, err, batch.ErrDetailsNewerVersion, older)
		require.NotErrorIs(t, err, batch.ErrDetailsInvalid, older)
	}

	d := batch.NewDetails("s3://b/f")
	raw, err := d.Marshal()
	require.NoError(t, err)
	got, err := batch.ParseDetails(raw)
	require.NoError(t, err)
	require.Equal(t, d, got)
	require.False(t, errors.Is(err, batch.ErrDetailsInvalid))
}

// TestParseDetailsIsStrict: encoding/json alone matches keys without regard
// to case and takes the last of repeated keys, and any string passes as a
// phase. A details document that is ambiguous or broken is refused instead
// of half-understood. Keys this build does not know are not among those:
// they are a newer build's, kept and ignored (TestParseDetailsKeepsUnknownKeys).
func TestParseDetailsIsStrict(t *testing.T) {
	t.Parallel()
	for name, raw := range map[string]string{
		"unknown phase":               `{"version":1,"phase":"loaded","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"key in another case":         `{"version":1,"Phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"shadowing key":               `{"version":1,"phase":"loading","PHASE":"published","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"Kelvin sign for k":           `{"version":1,"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false},"mar\u212aerOptional":true}`,
		"repeated key":                `{"version":1,"phase":"loading","phase":"published","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"repeated unknown key":        `{"version":1,"phase":"loading","x":1,"x":2,"redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"version in another case":     `{"version":1,"VERSION":2,"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"repeated version":            `{"version":1,"version":1,"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"nested key in other case":    `{"version":1,"phase":"publishing","redshiftCommitted":true,"publication":{"Started":true,"completed":false}}`,
		"nested repeated key":         `{"version":1,"phase":"publishing","redshiftCommitted":true,"publication":{"started":true,"started":false}}`,
		"wrong type":                  `{"version":1,"phase":"loading","redshiftCommitted":"yes","publication":{"started":false,"completed":false}}`,
		"nested wrong type":           `{"version":1,"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false},"progress":{"objectsDone":"1"}}`,
		"object of the wrong kind":    `{"version":1,"phase":"loading","redshiftCommitted":false,"publication":[]}`,
		"unknown phase of an error":   `{"version":1,"phase":"failed_pre_commit","redshiftCommitted":false,"publication":{"started":false,"completed":false},"lastError":{"phase":"exploded","message":"x","at":"2026-11-30T10:00:00Z"}}`,
		"lease term key case":         `{"version":1,"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false},"leases":[{"leaseid":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z"}]}`,
		"write of unknown phase":      `{"version":1,"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false},"writes":[{"phase":"x","status":"Running","leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z"}]}`,
		"no version":                  `{"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"no phase":                    `{"version":1,"redshiftCommitted":false,"publication":{"started":false,"completed":false}}`,
		"trailing data":               `{"version":1,"phase":"loading"} {}`,
		"unknown key of invalid JSON": `{"version":1,"phase":"loading","x":tru}`,
	} {
		_, err := batch.ParseDetails([]byte(raw))
		require.ErrorIs(t, err, batch.ErrDetailsInvalid, name)
	}

	// The lease trail left details for its own column (migration 30). A
	// document that still carries it (a finished batch's history, or an
	// older worker during a rolling upgrade) parses, checked as strictly as
	// the rest, and the trail is dropped: this build never writes it back.
	legacy := `{"version":1,"phase":"loading","redshiftCommitted":false,"publication":{"started":false,"completed":false},` +
		`"leases":[{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","releasedAt":"2026-11-30T10:00:02Z","renewals":3}]}`
	d, err := batch.ParseDetails([]byte(legacy))
	require.NoError(t, err)
	require.Nil(t, d.LegacyLeases)
	out, err := d.Marshal()
	require.NoError(t, err)
	require.NotContains(t, string(out), "leases")
	_, err = batch.ParseDetails([]byte(strings.Replace(legacy, `"renewals"`, `"Renewals"`, 1)))
	require.ErrorIs(t, err, batch.ErrDetailsInvalid, "the legacy trail is checked like the rest")

	// What the database statements write today parses: the write audit
	// trail with every key it sets, updatedAt, progress, retryOf.
	for _, raw := range []string{
		`{"version":1,"phase":"loading","sourceFolder":"s3://b/f","redshiftCommitted":false,"publication":{"started":false,"completed":false},` +
			`"updatedAt":"2026-11-30T10:00:01Z","resumes":1,"retryOf":7,` +
			`"progress":{"objectsDone":1,"objectsTotal":3,"recordsDone":120,"at":"2026-11-30T10:00:01Z"},` +
			`"writes":[{"phase":"loading","status":"Running","leaseId":"w1/job-1/attempt-1/ab","generation":1,"at":"2026-11-30T10:00:01Z"}]}`,
		`{"version":1,"phase":"cancelled","redshiftCommitted":false,"publication":{"started":false,"completed":false},"lastError":{"phase":"cancelled","message":"cancelled by ops: stuck","at":"2026-11-30T10:00:00Z"}}`,
	} {
		d, err := batch.ParseDetails([]byte(raw))
		require.NoError(t, err, raw)
		again, err := d.Marshal()
		require.NoError(t, err)
		_, err = batch.ParseDetails(again)
		require.NoError(t, err, "what this build writes, it reads")
	}
}

// TestParseDetailsKeepsUnknownKeys: a newer build may add keys within a
// version (DetailsVersion). This build reads such a document — before, it
// refused it ("$: unknown key", and parked the batch) — ignores the keys it
// does not know, at the top level and in nested objects, and writes them
// back, as they were, with everything it writes itself. A nested object
// this build replaces takes the keys of the object it replaced with it.
func TestParseDetailsKeepsUnknownKeys(t *testing.T) {
	t.Parallel()
	raw := `{"version":1,"phase":"publishing","sourceFolder":"s3://b/f","redshiftCommitted":true,"committedAt":"2026-11-30T10:00:00Z",` +
		`"publication":{"started":true,"completed":false,"channel":{"name":"fast","weight":[1,2]}},` +
		`"objects":{"count":2,"bytes":30,"digest":"ab","shards":4},` +
		`"progress":{"objectsDone":2,"objectsTotal":2,"recordsDone":5,"at":"2026-11-30T10:00:00Z","bytesDone":30},` +
		`"warehouseStatement":{"kind":"load","generation":1,"submittedAt":"2026-11-30T10:00:00Z","queue":"q1"},` +
		`"lastError":{"phase":"publishing","message":"x","at":"2026-11-30T10:00:00Z","retryable":true},` +
		`"tookOver":{"batchId":3,"generation":1,"at":"2026-11-30T10:00:00Z","why":"restore"},` +
		`"writes":[{"phase":"publishing","status":"Running","leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","host":"pod-7"}],` +
		`"lineage":{"upstream":["s3://b/g"],"note":"a newer build's key"},"priority":7,"Lineage":null}`
	d, err := batch.ParseDetails([]byte(raw))
	require.NoError(t, err)
	require.Equal(t, batch.PhasePublishing, d.Phase)
	require.True(t, d.Publication.Started)
	require.Equal(t, int64(2), d.Objects.Count)

	// A write of this build: a new phase and publication progress.
	d.Phase = batch.PhasePublished
	d.Publication.Completed = true
	out, err := d.Marshal()
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(out, &got))
	require.Equal(t, "published", got["phase"])
	require.Equal(t, map[string]any{"upstream": []any{"s3://b/g"}, "note": "a newer build's key"}, got["lineage"])
	require.Equal(t, float64(7), got["priority"])
	require.Contains(t, got, "Lineage", "two unknown keys that differ in case only are both kept: neither is this build's")
	sub := func(key string) map[string]any { return got[key].(map[string]any) }
	require.Equal(t, true, sub("publication")["completed"])
	require.Equal(t, map[string]any{"name": "fast", "weight": []any{float64(1), float64(2)}}, sub("publication")["channel"])
	require.Equal(t, float64(4), sub("objects")["shards"])
	require.Equal(t, float64(30), sub("progress")["bytesDone"])
	require.Equal(t, "q1", sub("warehouseStatement")["queue"])
	require.Equal(t, true, sub("lastError")["retryable"])
	require.Equal(t, "restore", sub("tookOver")["why"])

	// What it writes, it reads again, to the same document.
	again, err := batch.ParseDetails(out)
	require.NoError(t, err)
	twice, err := again.Marshal()
	require.NoError(t, err)
	require.JSONEq(t, string(out), string(twice))

	// A nested object replaced takes its members with it.
	d.Progress = &batch.Progress{ObjectsDone: 1, ObjectsTotal: 1}
	d.LastError = nil
	out, err = d.Marshal()
	require.NoError(t, err)
	require.NotContains(t, string(out), "bytesDone")
	require.NotContains(t, string(out), "retryable")
	require.Contains(t, string(out), `"lineage"`)
}

// TestPhasesAppendOnly is a golden test: phase names keep their spelling
// and position; new phases may only be appended.
func TestPhasesAppendOnly(t *testing.T) {
	t.Parallel()
	golden := []batch.Phase{"reserved", "loading", "committed", "publishing", "published", "failed_enqueue",
		"failed_pre_commit", "failed_publication", "superseded", "publication_expired", "cancelled"}
	require.GreaterOrEqual(t, len(batch.Phases), len(golden))
	require.Equal(t, golden, batch.Phases[:len(golden)])
	require.True(t, batch.PhaseCancelled.NoWork())
}

// TestGenericUpdatesRefuseScopedBatches: the unfenced, date-scoped updates
// used to accept a Fleet batch, so a caller could mark it Failed under a
// live lease holder (freeing its scope for a second Running batch) or move
// it back to Running without the resume rules. They refuse and write nothing.
func TestGenericUpdatesRefuseScopedBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/generic"))

	require.ErrorIs(t, s.UpdateStatus(ctx, b.ID, batch.StatusFailed), batch.ErrScopedBatch)
	require.ErrorIs(t, s.UpdateDetails(ctx, b.ID, json.RawMessage(`{"version":1,"phase":"published"}`)), batch.ErrScopedBatch)
	require.ErrorIs(t, s.UpdateStatusAndDetails(ctx, b.ID, batch.StatusSucceeded, json.RawMessage(`{}`)), batch.ErrScopedBatch)
	got, err := s.Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, got.Status)
	require.Equal(t, b.Details, got.Details)
	require.Equal(t, b.UpdatedAt, got.UpdatedAt, "nothing was written")

	require.ErrorIs(t, s.UpdateStatus(ctx, 1_000_000, batch.StatusFailed), batch.ErrNotFound)
	require.ErrorIs(t, s.UpdateDetails(ctx, 1_000_000, json.RawMessage(`{}`)), batch.ErrNotFound)
}

// TestIdentifiersAreCheckedByRune: whitespace at either end is found by
// rune, not by byte (U+2003 used to pass, full-width letters whose last
// byte is 0x85 used to be refused as NEL), and invisible formatting
// characters are refused anywhere.
func TestIdentifiersAreCheckedByRune(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"acme", "ａｃｍｅ", "ｅ", "tenant ｅ", "Zoë", "租户"} {
		require.NoError(t, batch.ValidateTenantID(ok), "%q", ok)
		require.NoError(t, batch.ValidateCompanyID(ok), "%q", ok)
	}
	for _, bad := range []string{"acme\u2003", "\u2003acme", "acme\u00a0", "\u3000acme", "ac\u202eme", "acme\u200b", "\u2066acme\u2069", "\ufeffacme", "a\u2028b", "acme\u00ad"} {
		require.Error(t, batch.ValidateTenantID(bad), "%q", bad)
		require.Error(t, batch.ValidateCompanyID(bad), "%q", bad)
	}
	for _, bad := range []string{"ac\u202eme", "acme\u200b", "\u2066acme\u2069", "a\u2028b", "acme\u00ad", "ac\u034fme", "acme\u3164"} {
		require.Error(t, batch.ValidateSourceScope("fleet_s3:s3://bucket/"+bad), "%q", bad)
	}
}

// TestIdentifiersAreAnAllowList: the red team's U+034F (combining grapheme
// joiner, a mark) and U+3164 (Hangul filler, a letter) render as nothing or
// as a blank and passed the deny-list of format characters. Tenant and
// company ids now hold only the characters of IdentifierCharacters, and
// the error names the field, the character and the allow-list. Every id the
// tests and the demo use stays valid.
func TestIdentifiersAreAnAllowList(t *testing.T) {
	t.Parallel()
	for bad, why := range map[string]string{
		"ac\u034fme":     "U+034F",
		"\u3164":         "U+3164",
		"acme\u3164":     "U+3164",
		"\u115facme":     "U+115F",
		"acme\uffa0":     "U+FFA0",
		"acme\ufe0f":     "U+FE0F",
		"acme\u2800":     "U+2800",
		"ac\u00a0me":     "U+00A0",
		"\u0301acme":     "must not start with U+0301",
		"-acme":          `must not start with '-'`,
		"_acme":          `must not start with '_'`,
		"o'hara":         `'\''`,
		"acme/evil":      `'/'`,
		"acme:1":         `':'`,
		"acme\U0001F600": "U+1F600",
		"acme ":          "must not start or end with a space",
	} {
		for _, check := range []func(string) error{batch.ValidateTenantID, batch.ValidateCompanyID} {
			err := check(bad)
			var verr *batch.ValidationError
			require.ErrorAs(t, err, &verr, "%q", bad)
			require.Contains(t, []string{"tenant_id", "company_id"}, verr.Field)
			require.ErrorContains(t, err, why, "%q", bad)
			require.ErrorContains(t, err, "only letters, digits", "%q: the allow-list is stated", bad)
		}
	}
	for _, ok := range []string{"acme", "t", "t1", "tenant-a", "tenant-bench", "tenant-demo", "victim", "company-42", "c-7", "c1",
		"ａｃｍｅ", "tenant ｅ", "Zoë", "租户", "देवनागरी", "a.b_c-d", "9lives"} {
		require.NoError(t, batch.ValidateTenantID(ok), "%q", ok)
		require.NoError(t, batch.ValidateCompanyID(ok), "%q", ok)
	}
}
