package jobs

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/fleet/ingest/internal/metrics"
)

// Defaults of Sweeper.
const (
	SweepIntervalDefault = 5 * time.Second
	sweepLimitDefault    = 100
	sweepLockKey         = int64(0x666c656574_02)
)

// Sweeper re-delivers Running batches whose execution lease expired: their
// worker died (SIGKILL, node loss) or stalled, and River would not re-deliver
// the job it left "running" until RescueStuckJobsAfter (an hour by default).
// Every worker process runs one; a transaction-scoped advisory lock lets only
// one sweep at a time, and River's unique insert by (batch, expired
// generation) makes a second sweep of the same expiry a no-op.
type Sweeper struct {
	Pool  *pgxpool.Pool
	River *river.Client[pgx.Tx]
	// Interval between sweeps. Defaults to SweepIntervalDefault (5 s).
	Interval time.Duration
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

// Sweep inserts one job for every Running batch whose lease has expired by
// the database clock, unless a job for that expiry exists already. It
// returns how many jobs it inserted; it does nothing while another process
// sweeps.
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
			SELECT id, execution_lease_generation, execution_lease_id, now() - execution_lease_expires_at
			FROM ingestion_batches
			WHERE status = 'Running' AND source_scope IS NOT NULL
			  AND execution_lease_id IS NOT NULL AND execution_lease_expires_at < now()
			ORDER BY execution_lease_expires_at
			LIMIT $1`, limit)
		if err != nil {
			return err
		}
		type expired struct {
			id, generation int64
			holder         string
			overdue        time.Duration
		}
		var found []expired
		for rows.Next() {
			var e expired
			if err := rows.Scan(&e.id, &e.generation, &e.holder, &e.overdue); err != nil {
				return err
			}
			found = append(found, e)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, e := range found {
			res, err := s.River.InsertTx(ctx, tx, IngestArgs{BatchID: e.id, RedeliveryOf: e.generation},
				&river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}})
			if err != nil {
				return err
			}
			outcome := "redelivered"
			if res.UniqueSkippedAsDuplicate {
				outcome = "already_queued"
			} else {
				inserted++
				// The expired holder's job may still sit "running" (River
				// never rescues jobs without a timeout): mark it for
				// cancellation, which also stops it if its process wakes up.
				if jobID, ok := holderJobID(e.holder); ok {
					if _, err := s.River.JobCancelTx(ctx, tx, jobID); err != nil && !errors.Is(err, river.ErrNotFound) {
						return err
					}
				}
				s.logger().Warn("re-delivering batch with an expired lease", "batch_id", e.id,
					"expired_holder", e.holder, "lease_generation", e.generation, "overdue", e.overdue, "job_id", res.Job.ID)
			}
			if s.Metrics != nil {
				s.Metrics.SweepRedeliveries.WithLabelValues(outcome).Inc()
			}
		}
		return nil
	})
	if err != nil && errors.Is(err, context.Canceled) {
		return inserted, nil
	}
	return inserted, err
}

// holderJobID extracts the job id from a lease holder id made by
// IngestWorker.holderID: {name}/job-{id}/attempt-{n}/{random}.
func holderJobID(holder string) (int64, bool) {
	parts := strings.Split(holder, "/")
	if len(parts) < 4 {
		return 0, false
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(parts[len(parts)-3], "job-"), 10, 64)
	return id, err == nil && strings.HasPrefix(parts[len(parts)-3], "job-")
}

func (s *Sweeper) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}
