package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/fleet/ingest/internal/batch"
)

// ReasonNewerBatchResumable refuses a retry: a newer batch of the same
// folder committed to the warehouse and its publication can still be
// resumed (Result.NewerBatchID names it). A new batch would load the folder
// again and replace that batch's slice, so it could never be resumed:
// resume the newer batch instead.
const ReasonNewerBatchResumable = "newer_batch_resumable"

// newerBatches lists the batches of b's tenant and folder newer than b,
// newest first, with the database clock.
const newerBatchesSQL = `
	SELECT id, COALESCE(batch_uid::text, ''), status, details::text, cancelled_at IS NOT NULL, now()
	FROM ingestion_batches
	WHERE tenant_id = $1 AND source_scope = $2 AND id > $3 AND status IN ('Succeeded', 'Failed')
	ORDER BY id DESC`

// newerBatchRefusal applies the rule that a retry acts on a folder only
// when no newer batch of it did better: it answers already_succeeded when a
// newer batch succeeded, and not_retryable (ReasonNewerBatchResumable) when
// a newer batch is a resumable failed publication. A newer Running batch is
// left to the reservation, which answers conflict. ok false means the retry
// may go on.
//
// Resumable is judged as batch.Store.Resume would: Failed in phase
// failed_publication (not cancelled, superseded or expired), committed,
// not published, committed within the publication window by the database
// clock, and, when the Enqueuer has a Verifier, the warehouse slice still
// stamped with it. Without a Verifier (the command line's retry does not
// reach the warehouse) a batch whose row says all that is taken as
// resumable: a resume of it then answers superseded if it is not, and the
// retry goes through after that.
func (e *Enqueuer) newerBatchRefusal(ctx context.Context, b batch.Batch) (res Result, refused bool, err error) {
	window := e.PublicationWindow
	if window <= 0 {
		window = batch.DefaultPublicationWindow
	}
	rows, err := e.Pool.Query(ctx, newerBatchesSQL, b.TenantID, b.Scope(), b.ID)
	if err != nil {
		return Result{}, false, fmt.Errorf("looking up newer batches of the folder: %w", err)
	}
	type newer struct {
		id        int64
		uid       string
		status    batch.Status
		details   string
		cancelled bool
		now       time.Time
	}
	var ns []newer
	for rows.Next() {
		var n newer
		if err := rows.Scan(&n.id, &n.uid, &n.status, &n.details, &n.cancelled, &n.now); err != nil {
			rows.Close()
			return Result{}, false, err
		}
		ns = append(ns, n)
	}
	if err := rows.Err(); err != nil {
		return Result{}, false, fmt.Errorf("looking up newer batches of the folder: %w", err)
	}
	for _, n := range ns {
		if n.status == batch.StatusSucceeded {
			e.logger().Info("retry", "outcome", OutcomeAlreadySucceeded, "batch_id", b.ID, "newer_batch_id", n.id, "tenant_id", b.TenantID)
			return Result{Outcome: OutcomeAlreadySucceeded, BatchID: n.id, SourceScope: b.Scope(), RetryOf: b.ID}, true, nil
		}
		d, err := batch.ParseDetails([]byte(n.details))
		if err != nil || n.cancelled || d.Phase != batch.PhaseFailedPublication || !d.RedshiftCommitted ||
			d.Publication.Completed || d.CommittedAt == nil || n.now.Sub(*d.CommittedAt) > window {
			continue
		}
		if e.Verifier != nil {
			owner, found, err := e.Verifier.SliceOwner(ctx, b.TenantID, b.Scope())
			if err != nil {
				return Result{}, false, fmt.Errorf("verifying warehouse slice: %w", err)
			}
			if !found || !owner.Names(batch.Ref{ID: n.id, UID: n.uid}) {
				continue
			}
		}
		e.logger().Info("retry", "outcome", OutcomeNotRetryable, "reason", ReasonNewerBatchResumable,
			"batch_id", b.ID, "newer_batch_id", n.id, "tenant_id", b.TenantID)
		res := Result{Outcome: OutcomeNotRetryable, BatchID: b.ID, SourceScope: b.Scope(), Status: string(b.Status),
			Reason: ReasonNewerBatchResumable, NewerBatchID: n.id}
		if d, err := batch.ParseDetails(b.Details); err == nil {
			res.Phase = string(d.Phase)
		}
		return res, true, nil
	}
	return Result{}, false, nil
}
