package jobs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/ingest/internal/lease"
)

// Fairness between tenants (WorkerConfig.MaxRunningPerTenant).
//
// The cap is decided in PostgreSQL, in the transaction that acquires the
// lease, under a transaction-scoped advisory lock of the batch's tenant:
// two acquisitions of one tenant's batches, in any processes, are decided
// one after the other, so the count one of them reads includes the other's
// lease. It binds only while another tenant has work waiting that it could
// run: a River job available now whose batch holds no live lease, is not
// parked, and whose tenant is itself under the cap. A tenant alone (or with
// every other tenant at its cap too) uses every worker.
//
// A delivery over the cap is snoozed (River gives the attempt back), and
// the tenant's available jobs that River would fetch before the first
// waiting job of the other tenant are moved just behind it (same priority,
// scheduled_at a microsecond after it: still due, so still fetched when
// nothing else is). River fetches in (priority, scheduled_at, id) order, so
// the next fetches take the waiting tenant's jobs instead of snoozing their
// way through the capped tenant's backlog; once nothing of the capped
// tenant is ahead of the waiting job, the move updates no row. The same
// holds the other way round when the tenants change places. Nothing of the
// lease protocol changes: an admitted delivery still has to acquire the
// lease, and a duplicate still finds it held.

// fairnessLockClass is the first key of the tenants' advisory locks
// (pg_advisory_xact_lock(int, int)); the second is hashtext(tenant_id).
// Two tenants whose ids hash alike share a lock, which only serialises
// their acquisitions.
const fairnessLockClass = 0x66_6c_74 // "flt"

var fairnessLockSQL = `
	SELECT pg_advisory_xact_lock(` + strconv.Itoa(fairnessLockClass) + `, hashtext(tenant_id)) FROM ingestion_batches WHERE id = $1`

// fairnessCheckSQL: $1 batch, $2 cap, $3 queue, $4 kind. It returns the
// batch's tenant, how many other batches of it hold a live lease (counted
// on ix_ingestion_batches_tenant_leased: its predicate, source_scope IS NOT
// NULL included, is stated here so that the index serves these counts and
// no lease statement; see migration 00070), and,
// when that reaches the cap, the first job in River's fetch order of
// another tenant under the cap whose batch waits (NULLs: none, the
// delivery may go on). No row: the batch does not exist (the acquisition
// says so).
const fairnessCheckSQL = `
	WITH me AS (
		SELECT tenant_id FROM ingestion_batches WHERE id = $1
	), mine AS (
		SELECT count(*) AS n FROM ingestion_batches r, me
		WHERE r.tenant_id = me.tenant_id AND r.status = 'Running' AND r.id <> $1
		  AND r.execution_lease_id IS NOT NULL AND r.source_scope IS NOT NULL AND r.execution_lease_expires_at > now()
	)
	SELECT me.tenant_id, mine.n, w.tenant_id, w.priority, w.scheduled_at, w.id
	FROM me CROSS JOIN mine
	LEFT JOIN LATERAL (
		SELECT b.tenant_id, j.priority, j.scheduled_at, j.id
		FROM river_job j
		JOIN ingestion_batches b ON b.id = (j.args->>'batch_id')::bigint
		WHERE mine.n >= $2
		  AND j.state = 'available' AND j.queue = $3 AND j.kind = $4 AND j.scheduled_at <= now()
		  AND b.tenant_id <> me.tenant_id AND b.status = 'Running' AND b.parked_at IS NULL
		  AND (b.execution_lease_id IS NULL OR b.execution_lease_expires_at <= now())
		  AND (SELECT count(*) FROM ingestion_batches o
		       WHERE o.tenant_id = b.tenant_id AND o.status = 'Running'
		         AND o.execution_lease_id IS NOT NULL AND o.source_scope IS NOT NULL AND o.execution_lease_expires_at > now()) < $2
		ORDER BY j.priority, j.scheduled_at, j.id
		LIMIT 1
	) w ON true`

// fairnessMoveSQL moves the capped tenant's ($1) available jobs that River
// would fetch before the waiting job ($2 priority, $3 scheduled_at, $4 id)
// just behind it. $5 queue, $6 kind.
const fairnessMoveSQL = `
	UPDATE river_job j
	SET priority = $2, scheduled_at = $3::timestamptz + interval '1 microsecond'
	FROM ingestion_batches b
	WHERE j.state = 'available' AND j.queue = $5 AND j.kind = $6
	  AND (j.priority, j.scheduled_at, j.id) < ($2::smallint, $3::timestamptz, $4::bigint)
	  AND b.id = (j.args->>'batch_id')::bigint AND b.tenant_id = $1`

// deferral describes a delivery the tenant cap sent back.
type deferral struct {
	tenant  string
	running int64
	waiting string // the tenant whose job it waits for
	moved   int64  // jobs of tenant moved behind that job
}

// acquireFair decides the tenant cap and acquires the lease in one
// transaction: either the delivery is deferred (and the transaction
// commits only the move of the tenant's queued jobs) or the acquisition's
// outcome is returned as Renewer.Acquire's would be.
func (w *IngestWorker) acquireFair(ctx context.Context, batchID int64, holder string) (lease.Acquisition, *lease.Holding, *deferral, error) {
	db := w.cfg.FairnessDB
	tx, err := db.Begin(ctx)
	if err != nil {
		return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// One round trip: the lock, then the check, which takes its snapshot
	// after the lock is granted (READ COMMITTED: one per statement).
	b := &pgx.Batch{}
	b.Queue(fairnessLockSQL, batchID)
	b.Queue(fairnessCheckSQL, batchID, w.cfg.MaxRunningPerTenant, Queue, IngestArgs{}.Kind())
	res := tx.SendBatch(ctx, b)
	if _, err := res.Exec(); err != nil {
		_ = res.Close()
		return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: locking the tenant: %w", err)
	}
	var (
		d       deferral
		wTenant *string
		wPrio   *int16
		wAt     *time.Time
		wJob    *int64
	)
	err = res.QueryRow().Scan(&d.tenant, &d.running, &wTenant, &wPrio, &wAt, &wJob)
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// No such batch: the acquisition reports NotFound.
	case err != nil:
		return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: %w", err)
	case wJob != nil:
		tag, err := tx.Exec(ctx, fairnessMoveSQL, d.tenant, *wPrio, *wAt, *wJob, Queue, IngestArgs{}.Kind())
		if err != nil {
			return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: moving the tenant's jobs behind the waiting one: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: %w", err)
		}
		d.waiting, d.moved = *wTenant, tag.RowsAffected()
		return lease.Acquisition{}, nil, &d, nil
	}

	a, held, err := w.renewer.AcquireOn(ctx, tx, batchID, holder)
	if err != nil {
		return a, nil, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		if held != nil {
			held.Close()
		}
		return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: committing the acquisition: %w", err)
	}
	if held != nil {
		held.Committed()
	}
	return a, held, nil, nil
}
