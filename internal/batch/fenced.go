package batch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// fencedUpdate is the one statement every lease holder's state write goes
// through. It writes only while the batch is Running and held by exactly the
// fence's lease id and generation, unexpired by the database clock
// (clock_timestamp, not now(): the write may be the last statement of a
// long warehouse transaction, see warehouse.WithRecord), with more than the
// fence's Margin left. Terminal
// statuses stamp completed_at and release the lease in the same statement,
// closing its term in the lease trail (LeaseTermsClosed).
//
// The write audit trail in details belongs to the database: the write itself
// is appended to details.writes with its generation and the database time
// of the write, whatever the writer's copy held. That time, and the release
// time of a term a terminal write ends, is one clock reading of the
// statement (c.at), not now(): the transaction may have started before the
// term it writes under (an acquisition stamps its term with the clock of
// its own statement, and the first checkpoint shares its transaction).
var fencedUpdate = `
	UPDATE ingestion_batches
	SET status = $4::text,
	    details = jsonb_set(
	        ($5::jsonb - 'leases' - 'writes') || jsonb_build_object('updatedAt', now()),
	        '{writes}',
	        ` + AuditAppend("details->'writes'") + ` || jsonb_build_array(jsonb_build_object(
	            'phase', $5::jsonb->>'phase', 'status', $4::text, 'leaseId', $2::text,
	            'generation', $3::bigint, 'at', c.at))),
	    execution_lease_terms = CASE WHEN $4::text = 'Running' THEN execution_lease_terms
	        ELSE ` + LeaseTermsClosed("ingestion_batches", "c.at") + ` END,
	    completed_at = CASE WHEN $4::text = 'Running' THEN NULL ELSE c.at END,
	    execution_lease_id = CASE WHEN $4::text = 'Running' THEN execution_lease_id END,
	    execution_lease_expires_at = CASE WHEN $4::text = 'Running' THEN execution_lease_expires_at END,
	    updated_at = now()
	FROM (SELECT clock_timestamp() AS at) c
	WHERE id = $1
	  AND status = 'Running'
	  AND execution_lease_id = $2
	  AND execution_lease_generation = $3
	  AND execution_lease_expires_at > clock_timestamp() + $6 * interval '1 microsecond'
	RETURNING ` + columns

// AuditAppend returns SQL for the audit array at expr (NULL or missing
// means empty), with its oldest entry dropped once it holds AuditLimit
// entries, ready for "|| new entry".
func AuditAppend(expr string) string {
	arr := `COALESCE(CASE WHEN jsonb_typeof(` + expr + `) = 'array' THEN ` + expr + ` END, '[]'::jsonb)`
	return `(CASE WHEN jsonb_array_length(` + arr + `) >= ` + strconv.Itoa(AuditLimit) + ` THEN ` + arr + ` - 0 ELSE ` + arr + ` END)`
}

// LeaseTermsClosed returns SQL for the execution_lease_terms column of the
// row named by table (a table name or alias) with the term of the row's
// current generation closed: its final expiry recorded from
// execution_lease_expires_at and, when releasedAt (an SQL expression of
// the release time, such as clock_timestamp()) is not empty, its release
// time. A trail whose last term belongs to another generation or is closed
// already is unchanged. The lease store closes terms with it on release and
// takeover; a terminal fenced write closes the term it ends. Any other
// statement that clears a held lease must close its term the same way, or the
// term's end is lost.
func LeaseTermsClosed(table, releasedAt string) string {
	t := table + ".execution_lease_terms"
	extra := ""
	if releasedAt != "" {
		extra = ", 'releasedAt', " + releasedAt
	}
	return `(CASE WHEN (` + t + `->-1->>'generation')::bigint = ` + table + `.execution_lease_generation
	             AND NOT COALESCE((` + t + `->-1->>'closed')::boolean, false)
	        THEN jsonb_set(` + t + `, '{-1}', (` + t + `->-1) || jsonb_build_object(
	             'expiresAt', ` + table + `.execution_lease_expires_at, 'closed', true` + extra + `))
	        ELSE ` + t + ` END)`
}

func (s *Store) fenced(ctx context.Context, f Fence, status Status, d Details) (Batch, error) {
	raw, err := d.Marshal()
	if err != nil {
		return Batch{}, err
	}
	b, err := s.announced(ctx, status != StatusRunning, func(db DB) (Batch, bool, error) {
		b, err := scanBatch(db.QueryRow(ctx, fencedUpdate, f.BatchID, f.LeaseID, f.Generation, status, string(raw), max(f.Margin, 0).Microseconds()))
		return b, status != StatusRunning, err
	})
	if errors.Is(err, ErrNotFound) {
		return Batch{}, ErrStaleLease
	}
	if err != nil {
		return Batch{}, fmt.Errorf("fenced write of batch %d: %w", f.BatchID, err)
	}
	return b, nil
}

// WriteDetails records progress (a new phase, publication state) of a Running
// batch under the lease term f. It returns ErrStaleLease, writing nothing,
// when f no longer holds the lease.
func (s *Store) WriteDetails(ctx context.Context, f Fence, d Details) (Batch, error) {
	return s.fenced(ctx, f, StatusRunning, d)
}

// MarkSucceeded marks the batch Succeeded with phase published and releases
// the lease, under the lease term f. Call it only after publication.
func (s *Store) MarkSucceeded(ctx context.Context, f Fence, d Details) (Batch, error) {
	d.Phase = PhasePublished
	return s.fenced(ctx, f, StatusSucceeded, d)
}

// MarkFailed marks the batch Failed with the given failed_* phase and error
// message and releases the lease, under the lease term f. Use
// PhaseFailedPreCommit before the warehouse commit (terminal: recovery is a
// new batch) and PhaseFailedPublication after it (resumable), or
// PhaseSuperseded / PhasePublicationExpired when the slice is no longer the
// batch's own.
func (s *Store) MarkFailed(ctx context.Context, f Fence, d Details, phase Phase, message string) (Batch, error) {
	return s.MarkFailedBecause(ctx, f, d, phase, "", message)
}

// MarkFailedBecause is MarkFailed recording the failure's reason too
// (ErrorRecord.Reason), such as ReasonFolderIncomplete.
func (s *Store) MarkFailedBecause(ctx context.Context, f Fence, d Details, phase Phase, reason Reason, message string) (Batch, error) {
	d.Phase = phase
	d.LastError = &ErrorRecord{Phase: phase, Reason: reason, Message: message, At: time.Now().UTC()}
	return s.fenced(ctx, f, StatusFailed, d)
}

// RecordFailedEnqueue records a reservation whose job could not be
// enqueued: a batch that is Failed from the start, with phase failed_enqueue
// and the error, holding no scope. Callers reserve and insert the job in one
// transaction; when the insert fails that transaction rolls back (releasing
// the reservation) and this records what happened, so the caller can be told
// which batch failed.
func (s *Store) RecordFailedEnqueue(ctx context.Context, r Reservation, message string) (Batch, error) {
	if err := r.Validate(); err != nil {
		return Batch{}, err
	}
	d := r.Details
	d.Phase = PhaseFailedEnqueue
	d.LastError = &ErrorRecord{Phase: PhaseFailedEnqueue, Message: message, At: time.Now().UTC()}
	raw, err := d.Marshal()
	if err != nil {
		return Batch{}, err
	}
	return scanBatch(s.db.QueryRow(ctx, `
		INSERT INTO ingestion_batches
			(company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			 business_date, pipeline_stage, status, details, source_scope, completed_at)
		VALUES ($1, $2, $3, $4, $5, NULL, $6, 'Failed',
		        $7::jsonb || jsonb_build_object('updatedAt', now()), $8, now())
		RETURNING `+columns,
		r.CompanyID, r.TenantID, r.TenantDatabase, r.IngestionMode, r.SourceType,
		r.PipelineStage, string(raw), r.SourceScope))
}
