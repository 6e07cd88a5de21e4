package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
)

// Defaults of Sweeper.
const (
	SweepIntervalDefault = 5 * time.Second
	OrphanAfterDefault   = time.Minute
	sweepLimitDefault    = 100
	sweepLockKey         = int64(0x666c656574_02)
	// SweepTimeoutDefault bounds one sweep's transaction.
	SweepTimeoutDefault = 30 * time.Second
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
// scheduled, retryable or pending) is left to it.
//
// Parked batches (see batch.Store.Park) are never re-delivered as such: the
// build that parked them could not work on them. But the build that parked
// a batch may be an older one, still running beside this one during a
// rollout, that refused what this build understands (a key a newer build
// added to the details, a version it does not know). With Pipelines set,
// a sweep also takes back the parked batches this build can work on: it
// judges each with this build's own rules (pipeline.Judge: details of a
// version it knows, a phase with work, a pipeline for its source type that
// admits it), never by the reason the other build gave, and for each it
// would work on it clears the park and inserts a job, in the sweep's
// transaction, under the row lock, counted as "unparked". A batch is taken
// back only once it has stayed parked, without a live lease or a queued
// job, for OrphanAfter: while older workers still run, one of them may
// park it again, and the batch then waits OrphanAfter before the next take
// back, so the exchange is bounded by the rollout and never loops fast.
// Parked batches are read from the one after the last one judged, so those
// this build would park too cannot hide the others from a sweep.
//
// Decisions are made under the batch's row lock (SELECT … FOR UPDATE SKIP
// LOCKED), in the statement that finds the candidates: a delivery that takes
// the lease over concurrently either committed first (the row no longer
// qualifies) or waits until the sweep committed. A "running" job is dead
// when it was fetched before the lease it died with expired, or more than
// OrphanAfter ago; a running job fetched after that is live: it is taking
// the batch over right now, so the sweep neither cancels it nor inserts a
// job beside it. Dead jobs are marked for cancellation (River never rescues
// them; a paused process whose job is cancelled stops when it wakes).
//
// Every worker process runs a sweeper; a transaction-scoped advisory lock
// lets one sweep at a time, and since each sweep sees the jobs the previous
// one inserted, two sweepers cannot both re-deliver a batch. Run sweeps only
// when no process swept in the last half Interval (ingest_sweeps records
// the last sweep): the fleet sweeps about once per Interval whatever the
// number of pods, and a sweep is never more than Interval behind, since the
// process that swept last ticks again one Interval later.
type Sweeper struct {
	Pool  *pgxpool.Pool
	River *river.Client[pgx.Tx]
	// Interval between Run's ticks. Defaults to SweepIntervalDefault (5 s).
	// A tick sweeps only when no process swept in the last Interval/2.
	Interval time.Duration
	// OrphanAfter is how long a Running batch without a lease and without
	// a queued job may stay untouched before it is re-delivered, and how
	// long a fetched job may take to acquire the lease before it counts as
	// dead. Defaults to OrphanAfterDefault (1 min).
	OrphanAfter time.Duration
	// Limit bounds the batches re-delivered per sweep, and the parked
	// batches judged per sweep. Defaults to 100.
	Limit int
	// Pipelines, when set, are this build's pipelines: the sweep takes back
	// the parked batches they would work on (see Sweeper). Without them
	// parked batches are left to operators.
	Pipelines pipeline.Registry
	// Timeout bounds one sweep's transaction: a sweep whose connection
	// stopped answering (its database host vanished in a failover) gives
	// up, and the next tick sweeps on a connection to the new primary.
	// Without it, Run would wait on that connection for as long as the
	// kernel keeps it (many minutes) and sweep nothing meanwhile.
	// Defaults to SweepTimeoutDefault (30 s).
	Timeout time.Duration
	Metrics *metrics.Metrics
	Logger  *slog.Logger

	// parkedAfter is the id of the last parked batch a sweep of this
	// process judged; the next one reads from the batch after it.
	parkedAfter atomic.Int64

	// beforeAct, if set, runs after the sweep decided and before it acts:
	// tests widen the window a concurrent takeover could slip into.
	beforeAct func()
}

// sweepSQL finds the batches to re-deliver and locks their rows (see
// Sweeper): $1 limit, $2 OrphanAfter in microseconds, $3 the job kind. For
// each it returns the running jobs that are dead (to cancel) and whether a
// live one is taking the batch over. Rows another transaction is writing
// (an acquisition, a renewal, a fenced write) are skipped: they are not
// abandoned, and the next sweep looks again.
const sweepSQL = `
	SELECT b.id, b.tenant_id, b.execution_lease_generation, COALESCE(b.execution_lease_id, ''),
	       now() - COALESCE(b.execution_lease_expires_at, b.updated_at),
	       ARRAY(SELECT j.id FROM river_job j
	             WHERE j.kind = $3 AND j.args @> jsonb_build_object('batch_id', b.id) AND j.state = 'running'
	               AND NOT (j.metadata ? 'cancel_attempted_at')
	               AND NOT ` + liveJob + `),
	       EXISTS (SELECT 1 FROM river_job j
	               WHERE j.kind = $3 AND j.args @> jsonb_build_object('batch_id', b.id) AND j.state = 'running'
	                 AND NOT (j.metadata ? 'cancel_attempted_at')
	                 AND ` + liveJob + `)
	FROM ingestion_batches b
	WHERE b.status = 'Running' AND b.source_scope IS NOT NULL AND b.parked_at IS NULL
	  AND ((b.execution_lease_id IS NOT NULL AND b.execution_lease_expires_at < now())
	    OR (b.execution_lease_id IS NULL AND b.updated_at < now() - $2 * interval '1 microsecond'))
	  AND NOT EXISTS (
	        SELECT 1 FROM river_job j
	        WHERE j.kind = $3 AND j.args @> jsonb_build_object('batch_id', b.id)
	          AND j.state IN ('available', 'scheduled', 'retryable', 'pending'))
	ORDER BY b.updated_at
	LIMIT $1
	FOR UPDATE OF b SKIP LOCKED`

// liveJob says a running job j of batch b may be a live delivery: fetched
// within OrphanAfter, and after the lease the batch holds expired (a job
// fetched while that lease was live found it held and snoozed at once).
const liveJob = `(j.attempted_at >= now() - $2 * interval '1 microsecond'
	AND (b.execution_lease_expires_at IS NULL OR j.attempted_at > b.execution_lease_expires_at))`

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
		sweepCtx, cancel := context.WithTimeout(ctx, cmpOr(s.Timeout, SweepTimeoutDefault))
		_, _, err := s.sweep(sweepCtx, cmpOr(s.Interval, SweepIntervalDefault)/2)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.logger().Warn("lease sweep failed", "error", err)
		}
	}
}

// Sweep inserts one job for every expired or orphaned Running batch (see
// Sweeper) and marks the dead deliveries' "running" jobs for cancellation.
// It returns how many jobs it inserted; it does nothing while another
// process sweeps.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	inserted, _, err := s.sweep(ctx, 0)
	return inserted, err
}

// claimSweepSQL records a sweep starting now unless one started less than
// $1 microseconds ago; it returns a row only when it recorded.
const claimSweepSQL = `
	INSERT INTO ingest_sweeps AS s (name, swept_at) VALUES ('lease_sweeper', now())
	ON CONFLICT (name) DO UPDATE SET swept_at = excluded.swept_at
	WHERE s.swept_at <= now() - $1 * interval '1 microsecond'
	RETURNING true`

// sweep is Sweep, skipped (swept false) when another process swept less
// than gap ago or sweeps now.
func (s *Sweeper) sweep(ctx context.Context, gap time.Duration) (int, bool, error) {
	limit := s.Limit
	if limit <= 0 {
		limit = sweepLimitDefault
	}
	inserted, swept := 0, false
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, sweepLockKey).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			return nil
		}
		var due bool
		if err := tx.QueryRow(ctx, claimSweepSQL, gap.Microseconds()).Scan(&due); errors.Is(err, pgx.ErrNoRows) {
			return nil // another process swept within the gap
		} else if err != nil {
			return fmt.Errorf("recording the sweep: %w", err)
		}
		swept = true
		rows, err := tx.Query(ctx, sweepSQL, limit, cmpOr(s.OrphanAfter, OrphanAfterDefault).Microseconds(), IngestArgs{}.Kind())
		if err != nil {
			return err
		}
		type candidate struct {
			id, generation int64
			tenant, holder string
			overdue        time.Duration
			dead           []int64
			live           bool
		}
		var found []candidate
		for rows.Next() {
			var c candidate
			if err := rows.Scan(&c.id, &c.tenant, &c.generation, &c.holder, &c.overdue, &c.dead, &c.live); err != nil {
				return err
			}
			found = append(found, c)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if s.beforeAct != nil {
			s.beforeAct()
		}
		for _, c := range found {
			// The dead deliveries' jobs would stay "running" forever (River
			// never rescues jobs without a timeout): mark them for
			// cancellation, which also stops one whose process wakes up.
			for _, jobID := range c.dead {
				if _, err := s.River.JobCancelTx(ctx, tx, jobID); err != nil && !errors.Is(err, river.ErrNotFound) {
					return err
				}
			}
			if c.live {
				s.logger().Info("not re-delivering batch: a live delivery is taking it over", "batch_id", c.id,
					"expired_holder", c.holder, "lease_generation", c.generation, "cancelled_jobs", c.dead)
				if s.Metrics != nil {
					s.Metrics.SweepRedeliveries.WithLabelValues("skipped_live_delivery").Inc()
				}
				continue
			}
			res, err := s.River.InsertTx(ctx, tx, IngestArgs{BatchID: c.id, RedeliveryOf: c.generation}, insertOpts(c.tenant, c.id))
			if err != nil {
				return err
			}
			inserted++
			kind := "expired lease"
			if c.holder == "" {
				kind = "orphaned (no lease, no queued job)"
			}
			s.logger().Warn("re-delivering batch: "+kind, "batch_id", c.id, "expired_holder", c.holder,
				"lease_generation", c.generation, "idle_seconds", c.overdue.Seconds(), "job_id", res.Job.ID, "cancelled_jobs", c.dead)
			if s.Metrics != nil {
				s.Metrics.SweepRedeliveries.WithLabelValues("redelivered").Inc()
			}
		}
		unparked, err := s.takeBack(ctx, tx, limit)
		if err != nil {
			return fmt.Errorf("taking back parked batches: %w", err)
		}
		inserted += unparked
		return s.finalizeSuperseded(ctx, tx)
	})
	if err == nil && swept && s.Metrics != nil {
		s.Metrics.Sweeps.Inc()
	}
	if err != nil && errors.Is(err, context.Canceled) {
		return inserted, swept, nil
	}
	return inserted, swept, err
}

// parkedSQL reads, without locking, the parked batches a sweep may take
// back, in id order from the one after $4 (see Sweeper): Running, parked
// for OrphanAfter ($2 in microseconds), without a live lease and without
// a queued job of kind $3; at most $1. It reads the index of parked
// batches (migration 00105, whose predicate parkedIdle states): a few
// entries in id order, never the batches' history, whatever the
// statistics say (TestTakeBackReadsTheParkedBatchesOnly).
const parkedSQL = `
	SELECT ` + batch.Columns + `
	FROM ingestion_batches b
	WHERE ` + parkedIdle + ` AND b.id > $4
	ORDER BY b.id
	LIMIT $1`

// parkedIdle is the condition on a parked batch b that a sweep may take
// back: parked for OrphanAfter ($2 µs), no live lease, no queued job of
// kind $3.
const parkedIdle = `b.status = 'Running' AND b.source_scope IS NOT NULL AND b.parked_at IS NOT NULL
	  AND b.parked_at < now() - $2 * interval '1 microsecond'
	  AND (b.execution_lease_id IS NULL OR b.execution_lease_expires_at < now())
	  AND NOT EXISTS (
	        SELECT 1 FROM river_job j
	        WHERE j.kind = $3 AND j.args @> jsonb_build_object('batch_id', b.id)
	          AND j.state IN ('available', 'scheduled', 'retryable', 'pending'))`

// lockParkedSQL locks the parked batches of $1 (ids a sweep judged it can
// take back) that still qualify (parkedIdle), skipping rows another
// transaction is writing, and returns each row, as the lock found it,
// with its running jobs that are dead (to cancel) and whether a live one
// is working on it (as sweepSQL does).
const lockParkedSQL = `
	SELECT ` + batch.Columns + `,
	       ARRAY(SELECT j.id FROM river_job j
	             WHERE j.kind = $3 AND j.args @> jsonb_build_object('batch_id', b.id) AND j.state = 'running'
	               AND NOT (j.metadata ? 'cancel_attempted_at')
	               AND NOT ` + liveJob + `),
	       EXISTS (SELECT 1 FROM river_job j
	               WHERE j.kind = $3 AND j.args @> jsonb_build_object('batch_id', b.id) AND j.state = 'running'
	                 AND NOT (j.metadata ? 'cancel_attempted_at')
	                 AND ` + liveJob + `)
	FROM ingestion_batches b
	WHERE b.id = ANY($1::bigint[]) AND ` + parkedIdle + `
	ORDER BY b.id
	FOR UPDATE OF b SKIP LOCKED`

// unparkSQL clears the park of a batch the sweep holds the row lock of.
const unparkSQL = `
	UPDATE ingestion_batches SET parked_at = NULL, parked_reason = NULL, updated_at = now()
	WHERE id = $1 AND status = 'Running' AND parked_at IS NOT NULL`

// takeBack takes back, in tx (the sweep's), the parked batches this build
// can work on (see Sweeper), judging at most limit of them, and returns
// how many it took back.
func (s *Sweeper) takeBack(ctx context.Context, tx pgx.Tx, limit int) (int, error) {
	if len(s.Pipelines) == 0 {
		return 0, nil
	}
	orphanAfter, kind := cmpOr(s.OrphanAfter, OrphanAfterDefault).Microseconds(), IngestArgs{}.Kind()
	after := s.parkedAfter.Load()
	rows, err := tx.Query(ctx, parkedSQL, limit, orphanAfter, kind, after)
	if err != nil {
		return 0, err
	}
	var (
		workable []int64
		read     int
	)
	for rows.Next() {
		b, err := batch.Scan(rows)
		if err != nil {
			rows.Close()
			return 0, err
		}
		read, after = read+1, b.ID
		if _, _, refusal := pipeline.Judge(b, s.Pipelines); refusal == nil {
			workable = append(workable, b.ID)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if read < limit {
		after = 0 // the end of the list: the next sweep starts again
	}
	s.parkedAfter.Store(after)
	if len(workable) == 0 {
		return 0, nil
	}

	type candidate struct {
		b    batch.Batch
		dead []int64
		live bool
	}
	var found []candidate
	rows, err = tx.Query(ctx, lockParkedSQL, workable, orphanAfter, kind)
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		var c candidate
		if c.b, err = batch.Scan(rows, &c.dead, &c.live); err != nil {
			rows.Close()
			return 0, err
		}
		found = append(found, c)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	taken := 0
	for _, c := range found {
		b := c.b
		// Judged again as the lock found it: what was read before the lock
		// may have changed.
		if _, _, refusal := pipeline.Judge(b, s.Pipelines); refusal != nil {
			continue
		}
		for _, jobID := range c.dead {
			if _, err := s.River.JobCancelTx(ctx, tx, jobID); err != nil && !errors.Is(err, river.ErrNotFound) {
				return taken, err
			}
		}
		if c.live {
			s.logger().Info("not taking back parked batch: a live delivery is working on it", "batch_id", b.ID, "cancelled_jobs", c.dead)
			continue
		}
		if _, err := tx.Exec(ctx, unparkSQL, b.ID); err != nil {
			return taken, err
		}
		res, err := s.River.InsertTx(ctx, tx, IngestArgs{BatchID: b.ID, RedeliveryOf: b.LeaseGeneration}, insertOpts(b.TenantID, b.ID))
		if err != nil {
			return taken, err
		}
		taken++
		s.logger().Warn("taking back a parked batch: this build can work on it (it was parked by a build that could not, an older one during a rollout, say)",
			"batch_id", b.ID, "tenant_id", b.TenantID, "parked_reason", deref(b.ParkedReason), "parked_at", b.ParkedAt,
			"lease_generation", b.LeaseGeneration, "job_id", res.Job.ID, "cancelled_jobs", c.dead)
		if s.Metrics != nil {
			s.Metrics.SweepRedeliveries.WithLabelValues("unparked").Inc()
		}
	}
	return taken, nil
}

func (s *Sweeper) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}

// supersededSQL finalizes the "running" River jobs whose delivery lost the
// batch to a takeover: the job's own lease term (its holder id names the
// job and attempt) is in the batch's term trail, closed without a release
// (another delivery took it over after it expired), and the batch's
// current lease is not the job's. Such a job's process died or was paused
// past its lease; it can write nothing (every write is fenced), and River
// would show it running for ever (it never rescues a job whose timeout is
// disabled). It becomes "cancelled", with an error saying why; should its
// process wake, River's completion of it changes nothing (River finalizes
// only running jobs). $1 the job kind.
const supersededSQL = `
	UPDATE river_job j
	SET state = 'cancelled', finalized_at = now(),
	    errors = array_append(j.errors, jsonb_build_object(
	        'at', now(), 'attempt', j.attempt, 'trace', '',
	        'error', 'superseded: this delivery''s lease on batch ' || b.id || ' expired and was taken over by another delivery' ||
	                 CASE WHEN b.status = 'Running' THEN '' ELSE ', which ended the batch ' || b.status END))
	FROM ingestion_batches b
	WHERE j.kind = $1 AND j.state = 'running'
	  AND b.id = (j.args->>'batch_id')::bigint
	  AND strpos(COALESCE(b.execution_lease_id, ''), '/job-' || j.id || '/attempt-' || j.attempt || '/') = 0
	  AND EXISTS (
	        SELECT 1 FROM jsonb_array_elements(b.execution_lease_terms) t
	        WHERE strpos(t->>'leaseId', '/job-' || j.id || '/attempt-' || j.attempt || '/') > 0
	          AND COALESCE((t->>'closed')::boolean, false) AND NOT (t ? 'releasedAt'))
	RETURNING j.id, b.id, b.status`

// finalizeSuperseded applies supersededSQL in the sweep's transaction.
func (s *Sweeper) finalizeSuperseded(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, supersededSQL, IngestArgs{}.Kind())
	if err != nil {
		return fmt.Errorf("finalizing superseded jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			jobID, batchID int64
			status         string
		)
		if err := rows.Scan(&jobID, &batchID, &status); err != nil {
			return err
		}
		s.logger().Info("finalized the River job of a delivery whose lease was taken over", "job_id", jobID, "batch_id", batchID, "batch_status", status)
		if s.Metrics != nil {
			s.Metrics.SupersededJobs.Inc()
		}
	}
	return rows.Err()
}
