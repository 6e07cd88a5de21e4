package jobs

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/fleet/ingest/internal/metrics"
)

// Defaults of Sweeper.
const (
	SweepIntervalDefault = 5 * time.Second
	OrphanAfterDefault   = time.Minute
	sweepLimitDefault    = 100
	sweepLockKey         = int64(0x666c656574_02)
)

// Sweeper re-delivers Running batches that no delivery is working on and no
// queued job will pick up:
//
//   - expired: the lease expired; its worker died (SIGKILL, node loss) or
//     stalled;
//   - orphaned: no lease at all and no write for OrphanAfter; the worker
//     died between fetching the job and taking the lease, or before River
//     recorded the job's retry.
//
// In both cases River would never re-deliver the job left "running": jobs
// without a timeout are not rescued. A batch with a queued job (available,
// scheduled, retryable or pending) is left to it; a "running" job never
// counts, because a live delivery holds the lease within milliseconds of
// starting. Every worker process runs a sweeper; a transaction-scoped
// advisory lock lets one sweep at a time, and since each sweep sees the jobs
// the previous one inserted, two sweepers cannot both re-deliver a batch.
type Sweeper struct {
	Pool  *pgxpool.Pool
	River *river.Client[pgx.Tx]
	// Interval between sweeps. Defaults to SweepIntervalDefault (5 s).
	Interval time.Duration
	// OrphanAfter is how long a Running batch without a lease and without
	// a queued job may stay untouched before it is re-delivered. Defaults
	// to OrphanAfterDefault (1 min).
	OrphanAfter time.Duration
	// Limit bounds the batches re-delivered per sweep. Defaults to 100.
	Limit   int
	Metrics *metrics.Metrics
	Logger  *slog.Logger
}

// Run sweeps every Interval until ctx is done.
func (s *Sweeper) Run(ctx context.Context) {
	t := time.NewTicker(cmpOr(s.Interval, SweepIntervalDefault))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.logger().Warn("lease sweep failed", "error", err)
		}
	}
}

// Sweep inserts one job for every expired or orphaned Running batch (see
// Sweeper) and marks the dead deliveries' "running" jobs for cancellation.
// It returns how many jobs it inserted; it does nothing while another
// process sweeps.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	limit := s.Limit
	if limit <= 0 {
		limit = sweepLimitDefault
	}
	inserted := 0
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, sweepLockKey).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			return nil
		}
		rows, err := tx.Query(ctx, `
			SELECT b.id, b.execution_lease_generation, COALESCE(b.execution_lease_id, ''),
			       now() - COALESCE(b.execution_lease_expires_at, b.updated_at),
			       ARRAY(SELECT j.id FROM river_job j
			             WHERE j.kind = $3 AND j.args @> jsonb_build_object('batch_id', b.id) AND j.state = 'running')
			FROM ingestion_batches b
			WHERE b.status = 'Running' AND b.source_scope IS NOT NULL
			  AND ((b.execution_lease_id IS NOT NULL AND b.execution_lease_expires_at < now())
			    OR (b.execution_lease_id IS NULL AND b.updated_at < now() - $2 * interval '1 microsecond'))
			  AND NOT EXISTS (
			        SELECT 1 FROM river_job j
			        WHERE j.kind = $3 AND j.args @> jsonb_build_object('batch_id', b.id)
			          AND j.state IN ('available', 'scheduled', 'retryable', 'pending'))
			ORDER BY b.updated_at
			LIMIT $1`, limit, cmpOr(s.OrphanAfter, OrphanAfterDefault).Microseconds(), IngestArgs{}.Kind())
		if err != nil {
			return err
		}
		type expired struct {
			id, generation int64
			holder         string
			overdue        time.Duration
			running        []int64
		}
		var found []expired
		for rows.Next() {
			var e expired
			if err := rows.Scan(&e.id, &e.generation, &e.holder, &e.overdue, &e.running); err != nil {
				return err
			}
			found = append(found, e)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, e := range found {
			res, err := s.River.InsertTx(ctx, tx, IngestArgs{BatchID: e.id, RedeliveryOf: e.generation}, nil)
			if err != nil {
				return err
			}
			inserted++
			// The dead deliveries' jobs would stay "running" forever (River
			// never rescues jobs without a timeout): mark them for
			// cancellation, which also stops one whose process wakes up.
			for _, jobID := range e.running {
				if _, err := s.River.JobCancelTx(ctx, tx, jobID); err != nil && !errors.Is(err, river.ErrNotFound) {
					return err
				}
			}
			kind := "expired lease"
			if e.holder == "" {
				kind = "orphaned (no lease, no queued job)"
			}
			s.logger().Warn("re-delivering batch: "+kind, "batch_id", e.id, "expired_holder", e.holder,
				"lease_generation", e.generation, "idle", e.overdue, "job_id", res.Job.ID, "cancelled_jobs", e.running)
			if s.Metrics != nil {
				s.Metrics.SweepRedeliveries.WithLabelValues("redelivered").Inc()
			}
		}
		return nil
	})
	if err != nil && errors.Is(err, context.Canceled) {
		return inserted, nil
	}
	return inserted, err
}

func (s *Sweeper) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}
