package batch

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Bounds of what an operator's cancel records.
const (
	MaxCancelReasonLen = 500
	MaxCancelledByLen  = 200
	maxParkReasonLen   = 500
)

// CancelRequest asks to cancel a Running scoped batch.
type CancelRequest struct {
	BatchID  int64
	TenantID string
	// By says who asked (an operator, a host, an HTTP client); required.
	By string
	// Reason is free text recorded with the cancel; optional.
	Reason string
	// Unleased cancels only a batch no delivery holds (no lease, or one
	// that expired): a tenant's cancel of its own parked or not yet
	// started batch. A batch under a live lease answers CancelLeased.
	Unleased bool
}

// Validate checks the request before anything touches the database. It
// returns a *ValidationError naming the first field refused.
func (r *CancelRequest) Validate() error {
	if r.BatchID <= 0 {
		return &ValidationError{"batch_id", "must be a positive batch id"}
	}
	if err := ValidateTenantID(r.TenantID); err != nil {
		return err
	}
	return ValidateOperator(r.By, r.Reason)
}

// ValidateOperator checks who asks for an operator action (required) and
// why (optional), under the rules Cancel records them by: printable text of
// at most MaxCancelledByLen and MaxCancelReasonLen.
func ValidateOperator(by, reason string) error {
	if err := checkText("by", by, MaxCancelledByLen); err != nil {
		return err
	}
	if reason != "" {
		if err := checkText("reason", reason, MaxCancelReasonLen); err != nil {
			return err
		}
	}
	return nil
}

// CancelOutcome is the domain result of Cancel.
type CancelOutcome int

const (
	// Cancelled means the batch is now Failed with phase cancelled, its
	// lease revoked and its scope free.
	Cancelled CancelOutcome = iota + 1
	// NotCancellable means the batch is terminal already, not scoped, or
	// its publication committed (its details record publication.completed).
	NotCancellable
	// CancelNotFound means no batch of the tenant has the id.
	CancelNotFound
	// CancelLeased means an Unleased cancel found a delivery holding the
	// batch's lease: running work, which only an operator cancels.
	CancelLeased
)

func (o CancelOutcome) String() string {
	switch o {
	case Cancelled:
		return "cancelled"
	case NotCancellable:
		return "not_cancellable"
	case CancelNotFound:
		return "not_found"
	case CancelLeased:
		return "leased"
	}
	return "unknown"
}

// CancelResult is what Cancel decided.
type CancelResult struct {
	Outcome CancelOutcome
	// Batch is the batch as it now stands, when found.
	Batch Batch
	// PreviousHolder is the lease holder that was revoked, "" if none.
	PreviousHolder string
	// DetailsKept is true when the details document could not be parsed by
	// this build and was left untouched (the cancel is in the columns only).
	DetailsKept bool
}

// cancelSQL is the fenced transition of an operator's cancel: Running →
// Failed, the lease revoked by bumping the generation (so the holder's
// renewals and fenced writes are refused from now on and its warehouse load
// fails its lease check before committing) and its term closed in the lease
// trail as released now (one clock_timestamp() reading, c.at, for the
// release, completed_at and cancelled_at: the operator's transaction may
// have begun before the term it revokes), the scope freed by the status,
// and who and why recorded. The details document gets phase cancelled and
// the message as its last error only when $4 says this build can read it;
// a document of an unknown version is never rewritten.
var cancelSQL = `
	UPDATE ingestion_batches
	SET status = 'Failed', completed_at = c.at, updated_at = now(),
	    execution_lease_terms = ` + LeaseTermsClosed("ingestion_batches", "c.at") + `,
	    execution_lease_id = NULL, execution_lease_expires_at = NULL,
	    execution_lease_generation = execution_lease_generation + 1,
	    cancelled_at = c.at, cancelled_by = $2, cancel_reason = NULLIF($3, ''),
	    details = CASE WHEN $4::bool
	        THEN details || jsonb_build_object(
	            'phase', 'cancelled',
	            'lastError', jsonb_build_object('phase', 'cancelled', 'message', $5::text, 'at', c.at),
	            'updatedAt', now())
	        ELSE details END
	FROM (SELECT clock_timestamp() AS at) c
	WHERE id = $1 AND status = 'Running'
	  AND (NOT $6::bool OR execution_lease_id IS NULL OR execution_lease_expires_at <= now())
	RETURNING ` + columns

// Cancel cancels a Running scoped batch for an operator: see cancelSQL. It
// answers CancelNotFound for a missing batch or another tenant's, and
// NotCancellable for a terminal or unscoped batch or one whose publication
// committed. It runs in one transaction (a savepoint inside the caller's),
// so callers can cancel the batch's queued jobs in the same commit (see
// jobs.Enqueuer.Cancel).
func (s *Store) Cancel(ctx context.Context, req CancelRequest) (CancelResult, error) {
	if err := req.Validate(); err != nil {
		return CancelResult{}, err
	}
	var res CancelResult
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		b, now, err := lockBatch(ctx, tx, req.BatchID)
		if errors.Is(err, ErrNotFound) || (err == nil && b.TenantID != req.TenantID) {
			res = CancelResult{Outcome: CancelNotFound}
			return nil
		}
		if err != nil {
			return err
		}
		d, perr := ParseDetails(b.Details)
		if b.Terminal() || b.SourceScope == nil || (perr == nil && d.Publication.Completed) {
			// A publication committed is not undone by a cancel: the
			// delivery is only left to record Succeeded.
			res = CancelResult{Outcome: NotCancellable, Batch: b}
			return nil
		}
		if req.Unleased && b.LeaseID != nil && b.LeaseExpiresAt != nil && b.LeaseExpiresAt.After(now) {
			res = CancelResult{Outcome: CancelLeased, Batch: b}
			return nil
		}
		msg := "cancelled by " + req.By
		if req.Reason != "" {
			msg += ": " + req.Reason
		}
		cancelled, err := scanBatch(tx.QueryRow(ctx, cancelSQL, b.ID, req.By, req.Reason, perr == nil, msg, req.Unleased))
		if req.Unleased && errors.Is(err, ErrNotFound) {
			// A delivery took the lease after the read (the door's login
			// could not lock a leased row: its policy hides it).
			res = CancelResult{Outcome: CancelLeased, Batch: b}
			return nil
		}
		if errors.Is(err, ErrNotFound) {
			// The row lockBatch read is not this login's to change: its
			// row-level security hides it (the door's login, which may
			// cancel only a tenant's batch no delivery holds).
			return fmt.Errorf("cancelling batch %d: permission denied for this database login (row-level security); an operator cancels with the operator login (fleet_operator)", b.ID)
		}
		if err != nil {
			return fmt.Errorf("cancelling batch %d: %w", b.ID, err)
		}
		if s.outbox != nil {
			if err := s.outbox.Outcome(ctx, tx, cancelled); err != nil {
				return fmt.Errorf("cancelling batch %d: %w", b.ID, err)
			}
		}
		res = CancelResult{Outcome: Cancelled, Batch: cancelled, DetailsKept: perr != nil}
		if b.LeaseID != nil {
			res.PreviousHolder = *b.LeaseID
		}
		return nil
	})
	if err != nil {
		return CancelResult{}, err
	}
	return res, nil
}

// Park records, under the lease term f, that this build cannot work on the
// Running batch, and why. It touches neither the details document (which may
// be of a version this build must not rewrite) nor the status: the batch
// keeps its scope, the sweeper stops re-delivering it, and operators see it
// in list --stuck until they cancel it. It returns ErrStaleLease, writing
// nothing, when f no longer holds the lease.
func (s *Store) Park(ctx context.Context, f Fence, reason string) (Batch, error) {
	// Parking a batch parked already (another delivery of the same build)
	// is no new outcome: only the first park is announced.
	b, err := s.announced(ctx, true, func(db DB) (Batch, bool, error) {
		var newly bool
		b, err := scanBatch(db.QueryRow(ctx, `
			WITH prev AS (SELECT parked_at FROM ingestion_batches WHERE id = $1)
			UPDATE ingestion_batches
			SET parked_at = now(), parked_reason = $4, updated_at = now()
			WHERE id = $1 AND status = 'Running'
			  AND execution_lease_id = $2 AND execution_lease_generation = $3
			  AND execution_lease_expires_at > now()
			RETURNING `+columns+`, (SELECT parked_at IS NULL FROM prev)`,
			f.BatchID, f.LeaseID, f.Generation, truncate(reason, maxParkReasonLen)), &newly)
		return b, newly, err
	})
	if errors.Is(err, ErrNotFound) {
		return Batch{}, ErrStaleLease
	}
	return b, err
}

// Unpark clears a parked mark under the lease term f, when a delivery finds
// it can work on the batch after all (a build that understands it was
// deployed). It returns ErrStaleLease when f no longer holds the lease.
func (s *Store) Unpark(ctx context.Context, f Fence) (Batch, error) {
	b, err := scanBatch(s.db.QueryRow(ctx, `
		UPDATE ingestion_batches
		SET parked_at = NULL, parked_reason = NULL, updated_at = now()
		WHERE id = $1 AND status = 'Running'
		  AND execution_lease_id = $2 AND execution_lease_generation = $3
		  AND execution_lease_expires_at > now()
		RETURNING `+columns, f.BatchID, f.LeaseID, f.Generation))
	if errors.Is(err, ErrNotFound) {
		return Batch{}, ErrStaleLease
	}
	return b, err
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
