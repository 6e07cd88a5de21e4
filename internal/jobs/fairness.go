package jobs

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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
// A delivery over the cap is snoozed (River gives the attempt back) and the
// tenant's other available jobs move to River's lowest priority, so the next
// fetches take the waiting tenants' jobs first instead of snoozing their way
// through the capped tenant's backlog. Demoted jobs still run in their order
// whenever no job of a higher priority is available; a job inserted later
// has the default priority again. Nothing of the lease protocol changes: an
// admitted delivery still has to acquire the lease, and a duplicate still
// finds it held.

// fairnessLockClass is the first key of the tenants' advisory locks
// (pg_advisory_xact_lock(int, int)); the second is hashtext(tenant_id).
// Two tenants whose ids hash alike share a lock, which only serialises
// their acquisitions.
const fairnessLockClass = 0x66_6c_74 // "flt"

// demotedPriority is River's lowest job priority.
const demotedPriority = 4

var fairnessLockSQL = `
	SELECT pg_advisory_xact_lock(` + strconv.Itoa(fairnessLockClass) + `, hashtext(tenant_id)) FROM ingestion_batches WHERE id = $1`

// fairnessCheckSQL: $1 batch, $2 cap, $3 queue, $4 kind. It returns the
// batch's tenant, how many other batches of it hold a live lease, and
// whether the delivery must wait. No row: the batch does not exist (the
// acquisition says so).
const fairnessCheckSQL = `
	WITH me AS (
		SELECT tenant_id FROM ingestion_batches WHERE id = $1
	), mine AS (
		SELECT count(*) AS n FROM ingestion_batches r, me
		WHERE r.tenant_id = me.tenant_id AND r.status = 'Running' AND r.id <> $1
		  AND r.execution_lease_id IS NOT NULL AND r.execution_lease_expires_at > now()
	)
	SELECT me.tenant_id, mine.n,
	       mine.n >= $2 AND EXISTS (
	           SELECT 1
	           FROM river_job j
	           JOIN ingestion_batches w ON w.id = (j.args->>'batch_id')::bigint
	           WHERE j.state = 'available' AND j.queue = $3 AND j.kind = $4 AND j.scheduled_at <= now()
	             AND w.tenant_id <> me.tenant_id AND w.status = 'Running' AND w.parked_at IS NULL
	             AND (w.execution_lease_id IS NULL OR w.execution_lease_expires_at <= now())
	             AND (SELECT count(*) FROM ingestion_batches o
	                  WHERE o.tenant_id = w.tenant_id AND o.status = 'Running'
	                    AND o.execution_lease_id IS NOT NULL AND o.execution_lease_expires_at > now()) < $2)
	FROM me, mine`

// fairnessDemoteSQL moves the capped tenant's available jobs, and the job
// being snoozed ($5), to the lowest priority. $1 tenant, $2 queue, $3 kind,
// $4 priority.
const fairnessDemoteSQL = `
	UPDATE river_job j SET priority = $4
	FROM ingestion_batches b
	WHERE b.id = (j.args->>'batch_id')::bigint AND b.tenant_id = $1 AND b.status = 'Running'
	  AND j.queue = $2 AND j.kind = $3 AND j.priority < $4
	  AND (j.state = 'available' OR j.id = $5)`

// deferral describes a delivery the tenant cap sent back.
type deferral struct {
	tenant  string
	running int64
	demoted int64
}

// acquireFair decides the tenant cap and acquires the lease in one
// transaction on db. A nil deferral with a zero Acquisition never happens:
// either the delivery was deferred (and the transaction committed only the
// demotion) or the acquisition's outcome is returned as Acquire's would be.
func (w *IngestWorker) acquireFair(ctx context.Context, batchID, jobID int64, holder string) (lease.Acquisition, *lease.Holding, *deferral, error) {
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
		d    deferral
		wait bool
	)
	err = res.QueryRow().Scan(&d.tenant, &d.running, &wait)
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// No such batch: the acquisition reports NotFound.
	case err != nil:
		return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: %w", err)
	case wait:
		tag, err := tx.Exec(ctx, fairnessDemoteSQL, d.tenant, Queue, IngestArgs{}.Kind(), demotedPriority, jobID)
		if err != nil {
			return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: demoting the tenant's jobs: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return lease.Acquisition{}, nil, nil, fmt.Errorf("tenant cap: %w", err)
		}
		d.demoted = tag.RowsAffected()
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
	return a, held, nil, nil
}
