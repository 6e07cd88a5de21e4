package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
)

// Outcomes reported by Enqueuer, as printed by the enqueue command and
// returned by its HTTP listener.
const (
	OutcomeEnqueued      = "enqueued"
	OutcomeConflict      = "conflict"
	OutcomeEnqueueFailed = "enqueue_failed"
	OutcomeResumed       = "resumed"
	OutcomeNotResumable  = "not_resumable"
	OutcomeNotFound      = "not_found"
	// OutcomeAlreadySucceeded: the folder's latest batch succeeded and the
	// request did not ask for a re-import; nothing was started.
	OutcomeAlreadySucceeded = "already_succeeded"
	// OutcomeResumable: the folder's newest batch (BatchID) committed its
	// load to the warehouse and failed in publication, and can still be
	// resumed; nothing was started. Loading the folder again would replace
	// a committed slice that only needs publishing: an operator resumes
	// it (enqueue resume), the rule enqueue retry applies too. A request
	// asking for a re-import loads it anew.
	OutcomeResumable      = "resumable"
	OutcomeCancelled      = "cancelled"
	OutcomeNotCancellable = "not_cancellable"
	OutcomeNotRetryable   = "not_retryable"
	// OutcomeInvalidInput: ImportMany refused this request before writing
	// anything for it (Field and Error say why).
	OutcomeInvalidInput = "invalid_input"
	// OutcomeSuperseded: a re-import of a given batch (ImportRequest.
	// ReimportOf) found a newer batch of the folder (BatchID): another
	// re-import of the same change came first; nothing was reserved.
	OutcomeSuperseded = "superseded"
)

// InputError is a request refused before anything was written. Field names
// the offending input.
type InputError struct {
	Field  string `json:"field"`
	Reason string `json:"reason"`
}

func (e *InputError) Error() string { return e.Field + ": " + e.Reason }

func inputError(err error) error {
	var verr *batch.ValidationError
	if errors.As(err, &verr) {
		return &InputError{Field: verr.Field, Reason: verr.Reason}
	}
	if errors.Is(err, folder.ErrInvalidFolder) {
		return &InputError{Field: "folder", Reason: err.Error()}
	}
	return err
}

// ImportRequest asks to reserve and enqueue a Fleet folder for a tenant.
type ImportRequest struct {
	TenantID       string `json:"tenant_id"`
	TenantDatabase string `json:"tenant_database"`
	CompanyID      string `json:"company_id"`
	Folder         string `json:"folder"`
	// Reimport starts a new batch even if the folder's latest batch
	// succeeded, or is a failed publication that could be resumed.
	// Without it such a request answers already_succeeded (resumable).
	Reimport bool `json:"reimport,omitempty"`
	// ReimportOf, with Reimport, is the Succeeded batch the caller found
	// the folder's newest and differing from the folder (enqueue
	// reconcile): the re-import is made only while that batch is still
	// the newest, else it answers superseded (batch.Reservation.ReimportOf),
	// so two scans that overlap import one change once. Not part of the
	// HTTP API.
	ReimportOf int64 `json:"-"`
	// NoMarker opts out of the completion marker, for a producer that
	// writes none: the worker loads the folder as it finds it. Without
	// it, a folder without its marker fails before any warehouse write
	// (failed_pre_commit, reason folder_incomplete; fleet.Pipeline.Marker).
	NoMarker bool `json:"no_marker,omitempty"`
	// MaxBadRecords is the import's tolerance of bad records (0 to
	// folder.MaxBadRecordsCap): up to this many are skipped and recorded
	// in the warehouse's errors table with the slice; one more fails the
	// batch. 0: the first bad record fails it.
	MaxBadRecords int `json:"max_bad_records,omitempty"`

	// retryOf, if not zero, is the failed batch a retry starts this one
	// for; recorded in the new batch's details.
	retryOf int64
	// enqueued, if set, is called in the burst's transaction once the
	// import is enqueued (its reservation and job written): a retry
	// records its operator action there.
	enqueued func(ctx context.Context, tx pgx.Tx, res Result) error
}

// Result is the outcome of an import or a resume: one JSON line on the
// command line, the body of an HTTP answer.
type Result struct {
	Outcome string `json:"outcome"`
	BatchID int64  `json:"batch_id,omitempty"`
	// BatchUID is the uid of the batch BatchID names where the answer
	// knows it (an import's): the batch's name for good, which no restore
	// of the coordinator's database hands out again, as the id may be.
	BatchUID       string `json:"batch_uid,omitempty"`
	JobID          int64  `json:"job_id,omitempty"`
	RunningBatchID int64  `json:"running_batch_id,omitempty"`
	// RunningBatchUID is the uid of the batch RunningBatchID names.
	RunningBatchUID string `json:"running_batch_uid,omitempty"`
	SourceScope     string `json:"source_scope,omitempty"`
	Reason          string `json:"reason,omitempty"`
	Error           string `json:"error,omitempty"`
	// RetryOf is the failed batch a retry started this batch for.
	RetryOf int64 `json:"retry_of,omitempty"`
	// Status and Phase describe a batch that was not cancellable or not
	// retryable.
	Status string `json:"status,omitempty"`
	Phase  string `json:"phase,omitempty"`
	// CancelledJobs lists the River jobs a cancel cancelled.
	CancelledJobs []int64 `json:"cancelled_jobs,omitempty"`
	// PreviousHolder is the lease holder a cancel revoked.
	PreviousHolder string `json:"previous_holder,omitempty"`
	// NewerBatchID is the newer batch of the folder a retry was refused
	// for (reason newer_batch_resumable): resume it instead.
	NewerBatchID int64 `json:"newer_batch_id,omitempty"`
	// Field names the refused input of an invalid_input outcome.
	Field string `json:"field,omitempty"`
	// Hint says, in words, what the caller can do about a conflict or an
	// already_succeeded answer (set by the HTTP door, naming JSON fields
	// and routes rather than CLI flags).
	Hint string `json:"hint,omitempty"`
}

// Enqueuer reserves batches and inserts their River jobs in one transaction.
// The command line and the HTTP listener share it.
type Enqueuer struct {
	Pool  *pgxpool.Pool
	River *river.Client[pgx.Tx]
	// Verifier proves warehouse slice ownership for resumes.
	Verifier batch.SliceVerifier
	// PublicationWindow bounds resumes; defaults to 24 h.
	PublicationWindow time.Duration
	Metrics           *metrics.Metrics
	Logger            *slog.Logger
}

// outbox announces the outcomes the enqueuer writes (a cancel) through its
// River client, in the write's transaction: see Outbox.
func (e *Enqueuer) outbox() batch.Outbox {
	if e.River == nil {
		return nil
	}
	return NewOutbox(e.River)
}

// Import reserves a batch for (tenant, folder) and inserts its job in the
// same transaction. Outcomes: enqueued; conflict when a running batch holds
// the scope; already_succeeded when the folder's latest batch succeeded and
// req.Reimport is false; resumable when the folder's newest batch is a
// failed publication that can still be resumed (within PublicationWindow)
// and req.Reimport is false; enqueue_failed when the job insert failed, in which
// case the batch is recorded Failed with failed_enqueue and the scope is
// free. Invalid input returns an *InputError and writes nothing; other
// errors are infrastructure failures and leave nothing behind.
func (e *Enqueuer) Import(ctx context.Context, req ImportRequest) (Result, error) {
	if err := ValidateImport(req); err != nil {
		return Result{}, err
	}
	res, err := e.ImportMany(ctx, []ImportRequest{req})
	if err != nil {
		return Result{}, err
	}
	return res[0], nil
}

// MaxBurst bounds the imports ImportMany commits in one transaction; a
// longer list is imported in consecutive bursts of at most this many.
const MaxBurst = 1000

// ImportMany imports a burst of folders (the records of one upload
// notification, the lines of an import file) with one transaction per
// MaxBurst of them: one statement reserves every scope and one InsertManyTx
// inserts every job, so the burst pays for one commit. Each request keeps
// its own outcome, in order, as Import would answer it alone: enqueued,
// conflict, already_succeeded, resumable, or invalid_input (with Field and Error;
// nothing is written for it). If the job insert fails, every batch the burst
// reserved is recorded Failed with failed_enqueue (enqueue_failed, scope
// free). A folder named twice is reserved once; the second request answers
// conflict with the first one's batch. An error is an infrastructure failure:
// nothing of the failed burst (or of those after it) remains, and the
// outcomes of the bursts committed before it are returned with the error
// (results[:k], in order; k is a multiple of MaxBurst, 0 for a single
// burst), so a caller can tell which folders were imported.
func (e *Enqueuer) ImportMany(ctx context.Context, reqs []ImportRequest) ([]Result, error) {
	results := make([]Result, len(reqs))
	for start := 0; start < len(reqs); start += MaxBurst {
		end := min(start+MaxBurst, len(reqs))
		if err := e.importBurst(ctx, reqs[start:end], results[start:end]); err != nil {
			e.logResults(reqs[:start], results[:start])
			if start > 0 {
				err = fmt.Errorf("importing folders %d to %d of %d (those before were committed): %w", start+1, end, len(reqs), err)
			}
			return results[:start], err
		}
	}
	e.logResults(reqs, results)
	return results, nil
}

// logResults counts and logs the outcomes of committed imports.
func (e *Enqueuer) logResults(reqs []ImportRequest, results []Result) {
	log := e.logger()
	for i, res := range results {
		e.observeReservation(res.Outcome)
		if reqs[i].retryOf != 0 {
			continue // a retry's import is its operator action's line (Retry)
		}
		attrs := []any{"outcome", res.Outcome, "batch_id", res.BatchID, "job_id", res.JobID,
			"running_batch_id", res.RunningBatchID, "tenant_id", reqs[i].TenantID, "source_scope", res.SourceScope}
		if res.Error != "" {
			attrs = append(attrs, "field", res.Field, "error", res.Error)
		}
		log.Info("import", attrs...)
	}
}

// reservation turns an import request into the batch reservation it asks
// for, or an *InputError. Unless it asks for a re-import, a folder whose
// newest batch succeeded or is a resumable failed publication (committed
// less than window ago) is not loaded again.
func reservation(req ImportRequest, window time.Duration) (batch.Reservation, error) {
	f, err := folder.Canonicalize(req.Folder)
	if err != nil {
		return batch.Reservation{}, inputError(err)
	}
	r := batch.Reservation{
		CompanyID: req.CompanyID, TenantID: req.TenantID, TenantDatabase: req.TenantDatabase,
		SourceType: batch.SourceTypeFleetS3, IngestionMode: batch.IngestionModeFileUpload,
		PipelineStage: batch.PipelineStageFleet, SourceScope: f.Scope(), Details: batch.NewDetails(f.String()),
		SkipIfSucceeded: !req.Reimport,
	}
	if !req.Reimport {
		r.SkipIfResumable = cmp.Or(window, batch.DefaultPublicationWindow)
	}
	r.Details.RetryOf = req.retryOf
	if req.Reimport {
		r.ReimportOf = req.ReimportOf
	}
	r.Details.MarkerOptional = req.NoMarker
	if req.MaxBadRecords < 0 || req.MaxBadRecords > folder.MaxBadRecordsCap {
		return batch.Reservation{}, &InputError{Field: "max_bad_records", Reason: fmt.Sprintf("must be between 0 and %d", folder.MaxBadRecordsCap)}
	}
	r.Details.MaxBadRecords = req.MaxBadRecords
	if err := r.Validate(); err != nil {
		return batch.Reservation{}, inputError(err)
	}
	return r, nil
}

// burstTx begins a burst's transaction. Its statements take arrays of
// parameters, for which PostgreSQL's generic plans are as good as custom
// ones; left to choose, it plans the reservation statement afresh on every
// call (a custom plan costs it two to three times the statement's own
// execution), so the burst asks for the cached generic plan, in the same
// round trip as BEGIN.
var burstTx = pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan"}

// importBurst imports reqs in one transaction, writing their outcomes into
// results.
func (e *Enqueuer) importBurst(ctx context.Context, reqs []ImportRequest, results []Result) error {
	var (
		rs  []batch.Reservation
		idx []int // rs[k] is reqs[idx[k]]
	)
	for i, req := range reqs {
		r, err := reservation(req, e.PublicationWindow)
		var in *InputError
		if errors.As(err, &in) {
			results[i] = Result{Outcome: OutcomeInvalidInput, Field: in.Field, Error: in.Reason}
			continue
		}
		if err != nil {
			return err
		}
		rs, idx = append(rs, r), append(idx, i)
	}
	if len(rs) == 0 {
		return nil
	}
	var (
		reserved    []batch.ReserveManyResult
		reservedRs  []batch.Reservation
		reservedIdx []int
		insertErr   error
		// use are the reservations the burst makes (useIdx[k] is reqs'
		// index of use[k]): rs less the retries whose batch is gone.
		use    []batch.Reservation
		useIdx []int
	)
	burst := func(tx pgx.Tx) error {
		gone, err := lockRetried(ctx, tx, rs)
		if err != nil {
			return err
		}
		use, useIdx = rs, idx
		if len(gone) > 0 {
			use, useIdx = nil, nil
			for k, r := range rs {
				if gone[r.Details.RetryOf] {
					results[idx[k]] = Result{Outcome: OutcomeNotFound, SourceScope: r.SourceScope,
						Reason: fmt.Sprintf("batch %d, which this retry retries, was deleted meanwhile (enqueue prune)", r.Details.RetryOf)}
					continue
				}
				use, useIdx = append(use, r), append(useIdx, idx[k])
			}
		}
		reserved, err = batch.NewStore(tx).ReserveMany(ctx, use)
		if err != nil {
			return err
		}
		reservedRs, reservedIdx, insertErr = reservedRs[:0], reservedIdx[:0], nil
		var params []river.InsertManyParams
		for k, rr := range reserved {
			i, scope := useIdx[k], use[k].SourceScope
			switch rr.Outcome {
			case batch.Conflict:
				results[i] = Result{Outcome: OutcomeConflict, RunningBatchID: rr.BatchID, RunningBatchUID: rr.BatchUID, SourceScope: scope}
			case batch.AlreadySucceeded:
				results[i] = Result{Outcome: OutcomeAlreadySucceeded, BatchID: rr.BatchID, BatchUID: rr.BatchUID, SourceScope: scope}
			case batch.Superseded:
				results[i] = Result{Outcome: OutcomeSuperseded, BatchID: rr.BatchID, BatchUID: rr.BatchUID, SourceScope: scope}
			case batch.Resumable:
				results[i] = Result{Outcome: OutcomeResumable, BatchID: rr.BatchID, BatchUID: rr.BatchUID, SourceScope: scope,
					Status: string(batch.StatusFailed), Phase: string(batch.PhaseFailedPublication), Reason: ReasonResumeInstead}
			case batch.Reserved:
				results[i] = Result{Outcome: OutcomeEnqueued, BatchID: rr.BatchID, BatchUID: rr.BatchUID, SourceScope: scope}
				reservedRs, reservedIdx = append(reservedRs, use[k]), append(reservedIdx, i)
				params = append(params, river.InsertManyParams{Args: IngestArgs{BatchID: rr.BatchID}, InsertOpts: insertOpts(use[k].TenantID, rr.BatchID)})
			}
		}
		if len(params) == 0 {
			return nil
		}
		jobs, err := e.River.InsertManyTx(ctx, tx, params)
		if err != nil {
			insertErr = err
			return errRollback // the reservations go with it
		}
		for n, j := range jobs {
			results[reservedIdx[n]].JobID = j.Job.ID
		}
		for _, i := range reservedIdx {
			if reqs[i].enqueued != nil {
				if err := reqs[i].enqueued(ctx, tx, results[i]); err != nil {
					return err
				}
			}
		}
		return nil
	}
	// A deadlock or serialization failure rolled everything back: the
	// burst is tried again as a whole (it wrote nothing).
	var err error
	for attempt := 1; ; attempt++ {
		err = pgx.BeginTxFunc(ctx, e.Pool, burstTx, burst)
		if !batch.IsTransactionConflict(err) || attempt == maxBurstAttempts {
			break
		}
		e.logger().Warn("burst rolled back by a transaction conflict: trying again", "attempt", attempt, "imports", len(rs), "error", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 10 * time.Millisecond):
		}
	}
	if !errors.Is(err, errRollback) {
		return err
	}
	// An insert that failed because the database went away or was busy (a
	// dropped connection, a restart, a pooler that lost its server, a
	// timeout, a deadlock) took the reservations with it: nothing is
	// reserved, so nothing needs releasing, and the caller retries as for
	// any unavailable database (exit 1, HTTP 503, the SQS message left).
	// Only an insert the database refused is recorded as Failed batches.
	if pipeline.IsTransient(insertErr) {
		return fmt.Errorf("inserting the jobs (nothing was reserved): %w", insertErr)
	}
	// Nothing of the transaction remains and the scopes are free; record
	// the failed enqueues as Failed batches so the callers can be told.
	failed, err := batch.NewStore(e.Pool).RecordFailedEnqueueMany(ctx, reservedRs, insertErr.Error())
	if err != nil {
		return fmt.Errorf("job insert failed (%v), and recording the failure failed: %w", insertErr, err)
	}
	for n, i := range reservedIdx {
		results[i] = Result{Outcome: OutcomeEnqueueFailed, BatchID: failed[n], SourceScope: reservedRs[n].SourceScope, Error: insertErr.Error()}
	}
	// A later copy of a folder whose reservation was rolled back answered
	// conflict with a batch that no longer exists: it shares the first
	// copy's failure instead.
	for k, rr := range reserved {
		if rr.DuplicateOf >= 0 && reserved[rr.DuplicateOf].Outcome == batch.Reserved {
			results[useIdx[k]] = results[useIdx[rr.DuplicateOf]]
		}
	}
	return nil
}

// lockRetried takes the batches that the retries among rs retry
// (Details.RetryOf) FOR KEY SHARE, in the burst's transaction, and returns
// those that no longer exist. enqueue prune deletes a batch only after
// locking it (its DELETE), and checks, once it holds the lock, that no
// batch names it as the one it retries (retention.Prune): so a retry and
// a prune of its batch are serialised. The retry waits for a prune that
// locked its batch first and then finds it gone (not_found: no new batch
// names a deleted one); a prune that comes second sees the retry and keeps
// the batch. A burst without a retry sends nothing.
func lockRetried(ctx context.Context, tx pgx.Tx, rs []batch.Reservation) (map[int64]bool, error) {
	var ids []int64
	for _, r := range rs {
		if r.Details.RetryOf != 0 {
			ids = append(ids, r.Details.RetryOf)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, `SELECT id FROM ingestion_batches WHERE id = ANY($1) ORDER BY id FOR KEY SHARE`, ids)
	if err != nil {
		return nil, fmt.Errorf("locking the batches retried: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("locking the batches retried: %w", err)
	}
	gone := map[int64]bool{}
	for _, id := range ids {
		if !slices.Contains(found, id) {
			gone[id] = true
		}
	}
	return gone, nil
}

// maxBurstAttempts bounds how often a burst rolled back by a deadlock or a
// serialization failure is tried again.
const maxBurstAttempts = 4

// errRollback rolls a transaction back on purpose.
var errRollback = errors.New("rolled back")

// ResumeRequest asks to resume a batch whose publication failed. Folder is
// optional: the batch knows its folder; if given, it must be the batch's.
type ResumeRequest struct {
	BatchID  int64  `json:"batch_id"`
	TenantID string `json:"tenant_id"`
	Folder   string `json:"folder,omitempty"`
	// By and Reason say who asks and why: logged with the action
	// (OperatorLog). By defaults to Actor.By().
	By     string `json:"-"`
	Reason string `json:"reason,omitempty"`
	// Actor is who asks, from the credential: recorded with the action
	// in the operators' audit, in its transaction.
	Actor audit.Actor `json:"-"`
}

// Resume moves a failed-publication batch back to Running under the resume
// rules (see batch.Store.Resume, including the warehouse slice proof) and
// inserts a job for it, in one transaction. Without req.Folder the batch's
// own folder is used; a folder that is not the batch's is scope_mismatch.
// Outcomes: resumed, conflict, not_resumable (with a reason), not_found;
// enqueue_failed when the job insert failed, in which case nothing changed.
func (e *Enqueuer) Resume(ctx context.Context, req ResumeRequest) (Result, error) {
	if err := ValidateResume(req); err != nil {
		return Result{}, err
	}
	var res Result
	err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		store := batch.NewStore(e.Pool).WithTx(tx)
		scope := ""
		if req.Folder != "" {
			f, _ := folder.Canonicalize(req.Folder) // validated above
			scope = f.Scope()
		} else {
			b, err := store.Get(ctx, req.BatchID)
			if errors.Is(err, batch.ErrNotFound) || (err == nil && b.TenantID != req.TenantID) {
				res = Result{Outcome: OutcomeNotFound}
				return recordAction(ctx, tx, audit.ActionResume, req.Actor, req.Reason, req.BatchID, req.TenantID, res)
			}
			if err != nil {
				return err
			}
			if scope = b.Scope(); scope == "" {
				res = Result{Outcome: OutcomeNotResumable, BatchID: req.BatchID, Reason: batch.ReasonSourceTypeMismatch}
				return recordAction(ctx, tx, audit.ActionResume, req.Actor, req.Reason, req.BatchID, req.TenantID, res)
			}
		}
		rr, err := store.Resume(ctx, batch.ResumeRequest{
			BatchID: req.BatchID, TenantID: req.TenantID, SourceType: batch.SourceTypeFleetS3,
			SourceScope: scope, PublicationWindow: e.PublicationWindow,
		}, e.Verifier)
		if err != nil {
			return err
		}
		res = Result{Outcome: rr.Outcome.String(), BatchID: req.BatchID, SourceScope: scope}
		switch rr.Outcome {
		case batch.ResumeConflict:
			res.RunningBatchID = rr.RunningBatchID
		case batch.NotResumable:
			res.Reason = rr.Reason
		case batch.ResumeNotFound:
			res.BatchID, res.SourceScope = 0, ""
		case batch.Resumed:
			job, err := e.River.InsertTx(ctx, tx, IngestArgs{BatchID: req.BatchID}, insertOpts(req.TenantID, req.BatchID))
			if err != nil {
				res = Result{Outcome: OutcomeEnqueueFailed, BatchID: req.BatchID, SourceScope: scope, Error: err.Error()}
				return errRollback // the resume goes with it: the batch stays resumable
			}
			res.JobID = job.Job.ID
		}
		return recordAction(ctx, tx, audit.ActionResume, req.Actor, req.Reason, req.BatchID, req.TenantID, res)
	})
	if errors.Is(err, errRollback) { // nothing changed: the refusal is recorded on its own
		err = recordAction(ctx, e.Pool, audit.ActionResume, req.Actor, req.Reason, req.BatchID, req.TenantID, res)
	}
	if err != nil {
		return Result{}, err
	}
	e.operatorLog("resume", cmp.Or(req.By, req.Actor.By()), req.Actor.Note, req.Reason, req.BatchID, req.TenantID, res)
	return res, nil
}

// recordAction writes an operator action on a batch, answered res, to the
// operators' audit through db (the action's transaction).
func recordAction(ctx context.Context, db audit.Execer, action string, actor audit.Actor, reason string, batchID int64, tenant string, res Result) error {
	return audit.Record(ctx, db, audit.Action{
		Actor: actor, Action: action, Outcome: res.Outcome, BatchID: batchID, TenantID: tenant, Reason: reason, Details: res,
	})
}

// RetryRequest asks for a new batch for the folder of a failed batch.
type RetryRequest struct {
	BatchID  int64  `json:"batch_id"`
	TenantID string `json:"tenant_id"`
	// By and Reason say who asks and why: logged with the action
	// (OperatorLog). By defaults to Actor.By().
	By     string `json:"-"`
	Reason string `json:"reason,omitempty"`
	// Actor is who asks, from the credential: recorded with the action
	// in the operators' audit (in the new batch's transaction when it
	// starts one).
	Actor audit.Actor `json:"-"`
	// Admit, if set, is the door's rule for the import a retry would
	// start (the batch's tenant, database, company and folder): an error
	// (an *InputError) refuses the retry before anything is written. The
	// command line checks the folder's path against its tenant with it,
	// as enqueue serve does an import.
	Admit func(ImportRequest) error `json:"-"`
}

// Reasons a retry is refused (besides the resume reasons it shares).
const (
	// ReasonResumeInstead: the batch committed to the warehouse and failed
	// in publication; resume it rather than load the folder again.
	ReasonResumeInstead = "failed_publication_resume_instead"
)

// Retry starts a new batch for the folder of a batch that failed before its
// warehouse commit (failed_pre_commit, failed_enqueue), was cancelled, or
// committed too long ago to be published (publication_expired), with the
// tenant, database and company of the failed batch, through the same
// reservation as Import: outcomes enqueued (with retry_of), conflict,
// already_succeeded (a later batch of the folder succeeded) and
// enqueue_failed. A batch that is not such a failure answers not_retryable
// with the reason (running, succeeded, failed_publication_resume_instead,
// superseded, details_invalid, details_unknown_version,
// source_type_mismatch), and so does one with a newer batch of its folder
// that can still be resumed (newer_batch_resumable, see newerBatchRefusal);
// a missing batch or another tenant's answers not_found. A retry req.Admit
// refuses returns its error (invalid input) and writes nothing.
func (e *Enqueuer) Retry(ctx context.Context, req RetryRequest) (Result, error) {
	if err := ValidateRetry(req); err != nil {
		return Result{}, err
	}
	res, err := e.retry(ctx, req)
	by := cmp.Or(req.By, req.Actor.By())
	var in *InputError
	switch {
	case err == nil:
		// An enqueued retry was recorded in its batch's transaction; a
		// refusal (nothing written) is recorded here.
		if res.Outcome != OutcomeEnqueued {
			if err := recordAction(ctx, e.Pool, audit.ActionRetry, req.Actor, req.Reason, req.BatchID, req.TenantID, res); err != nil {
				return Result{}, err
			}
		}
		e.operatorLog("retry", by, req.Actor.Note, req.Reason, req.BatchID, req.TenantID, res)
	case errors.As(err, &in): // refused (req.Admit): logged with the refusal, as other refusals are
		e.operatorLog("retry", by, req.Actor.Note, req.Reason, req.BatchID, req.TenantID, Result{Outcome: OutcomeInvalidInput, Reason: in.Error()})
	}
	return res, err
}

// retry is Retry after validation, without its operator action line.
func (e *Enqueuer) retry(ctx context.Context, req RetryRequest) (Result, error) {
	b, err := batch.NewStore(e.Pool).Get(ctx, req.BatchID)
	if errors.Is(err, batch.ErrNotFound) || (err == nil && b.TenantID != req.TenantID) {
		return Result{Outcome: OutcomeNotFound}, nil
	}
	if err != nil {
		return Result{}, err
	}
	refuse := func(reason string) (Result, error) {
		res := Result{Outcome: OutcomeNotRetryable, BatchID: b.ID, SourceScope: b.Scope(), Reason: reason, Status: string(b.Status)}
		if d, err := batch.ParseDetails(b.Details); err == nil {
			res.Phase = string(d.Phase)
		}
		return res, nil
	}
	switch {
	case b.SourceType != batch.SourceTypeFleetS3 || b.Scope() == "":
		return refuse(batch.ReasonSourceTypeMismatch)
	case b.Status == batch.StatusRunning:
		return refuse(batch.ReasonRunning)
	case b.Status == batch.StatusSucceeded:
		return refuse(batch.ReasonSucceeded)
	}
	if b.CancelledAt == nil { // a cancel is retryable whatever its details say
		d, err := batch.ParseDetails(b.Details)
		switch {
		case errors.Is(err, batch.ErrDetailsUnknownVersion):
			return refuse(batch.ReasonDetailsUnknownVersion)
		case err != nil:
			return refuse(batch.ReasonDetailsInvalid)
		}
		switch d.Phase {
		case batch.PhaseFailedPreCommit, batch.PhaseFailedEnqueue, batch.PhaseCancelled,
			batch.PhasePublicationExpired: // committed, but too long ago to publish: load it again
		case batch.PhaseFailedPublication:
			return refuse(ReasonResumeInstead)
		default:
			return refuse(string(d.Phase))
		}
	}
	if res, refused, err := e.newerBatchRefusal(ctx, b); err != nil || refused {
		return res, err
	}
	// The retry meets the marker rule as the batch it retries did (an
	// import that opted out of the marker is retried without it), and
	// tolerates as many bad records.
	var (
		noMarker bool
		maxBad   int
	)
	if d, err := batch.ParseDetails(b.Details); err == nil {
		noMarker, maxBad = d.MarkerOptional, d.MaxBadRecords
	}
	imp := ImportRequest{
		TenantID: b.TenantID, TenantDatabase: b.TenantDatabase, CompanyID: b.CompanyID,
		Folder: strings.TrimPrefix(b.Scope(), folder.ScopePrefix), retryOf: b.ID, NoMarker: noMarker, MaxBadRecords: maxBad,
		enqueued: func(ctx context.Context, tx pgx.Tx, res Result) error {
			res.RetryOf = b.ID
			return recordAction(ctx, tx, audit.ActionRetry, req.Actor, req.Reason, req.BatchID, req.TenantID, res)
		},
	}
	if req.Admit != nil {
		if err := req.Admit(imp); err != nil {
			return Result{}, err
		}
	}
	res, err := e.Import(ctx, imp)
	if err != nil {
		return Result{}, err
	}
	res.RetryOf = b.ID
	return res, nil
}

// CancelRequest asks to cancel a Running batch. By says who asked.
type CancelRequest struct {
	BatchID  int64  `json:"batch_id"`
	TenantID string `json:"tenant_id"`
	Reason   string `json:"reason,omitempty"`
	// By is recorded in the batch (cancelled_by) and logged; it defaults
	// to Actor.By().
	By string `json:"-"`
	// Actor is who asks, from the credential: recorded with the cancel
	// in the operators' audit, in its transaction.
	Actor audit.Actor `json:"-"`
	// Tenant marks a tenant's cancel of its own batch (the public cancel
	// route with a tenant token; By is TenantActor(tenant)): only a batch
	// no delivery holds (parked, or not yet started) is cancelled, a
	// leased one answers not_cancellable with reason leased. It writes no
	// row of the operators' audit (no operator acted; the batch's
	// cancelled_by, cancel_reason and the log line record it) and cancels
	// no River job (the door's login may not change a job): a queued
	// delivery finds the batch terminal and ends without a write.
	Tenant bool `json:"-"`
}

// ReasonLeased is the reason of a tenant's cancel refused because a
// delivery holds the batch: only an operator cancels running work.
const ReasonLeased = "leased"

// TenantActor is the cancelled_by of a tenant's own cancel.
func TenantActor(tenant string) string { return "tenant:" + tenant }

// Cancel cancels a Running batch for an operator, in one transaction: the
// fenced transition of batch.Store.Cancel (lease revoked, status Failed with
// phase cancelled, scope free at once) and every River job of the batch that
// is queued or running marked cancelled, so a running delivery is told to
// stop at once besides self-fencing at its next renewal or write. Outcomes:
// cancelled, not_cancellable (terminal already, with its status and phase),
// not_found (also for another tenant's batch).
func (e *Enqueuer) Cancel(ctx context.Context, req CancelRequest) (Result, error) {
	req.By = cmp.Or(req.By, req.Actor.By())
	breq := batch.CancelRequest{BatchID: req.BatchID, TenantID: req.TenantID, By: req.By, Reason: req.Reason, Unleased: req.Tenant}
	if err := breq.Validate(); err != nil {
		return Result{}, inputError(err)
	}
	var res Result
	err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		cr, err := batch.NewStore(e.Pool).WithOutbox(e.outbox()).WithTx(tx).Cancel(ctx, breq)
		if err != nil {
			return err
		}
		res = Result{Outcome: cr.Outcome.String(), BatchID: req.BatchID, SourceScope: cr.Batch.Scope()}
		record := func() error {
			if req.Tenant {
				return nil // no operator acted
			}
			return recordAction(ctx, tx, audit.ActionCancel, req.Actor, req.Reason, req.BatchID, req.TenantID, res)
		}
		switch cr.Outcome {
		case batch.CancelLeased:
			res.Outcome, res.Reason, res.Status = OutcomeNotCancellable, ReasonLeased, string(cr.Batch.Status)
			res.Error = fmt.Sprintf("batch %d is being loaded (a delivery holds it): only an operator cancels running work; wait for its outcome, or ask an operator", req.BatchID)
			return nil
		case batch.CancelNotFound:
			res.BatchID = 0
			return record()
		case batch.NotCancellable:
			res.Status = string(cr.Batch.Status)
			if d, err := batch.ParseDetails(cr.Batch.Details); err == nil {
				res.Phase = string(d.Phase)
			}
			return record()
		}
		res.PreviousHolder = cr.PreviousHolder
		if req.Tenant {
			return nil
		}
		rows, err := tx.Query(ctx, `
			SELECT id FROM river_job
			WHERE kind = $1 AND args @> jsonb_build_object('batch_id', $2::bigint)
			  AND state IN ('available', 'scheduled', 'retryable', 'pending', 'running')
			ORDER BY id`, IngestArgs{}.Kind(), req.BatchID)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, err := e.River.JobCancelTx(ctx, tx, id); err != nil && !errors.Is(err, river.ErrNotFound) {
				return fmt.Errorf("cancelling job %d: %w", id, err)
			}
		}
		res.CancelledJobs = ids
		return record()
	})
	if err != nil {
		return Result{}, err
	}
	if req.Tenant {
		e.logger().Warn(TenantLog, "action", "cancel", "by", req.By, "reason", req.Reason, "batch_id", req.BatchID,
			"tenant_id", req.TenantID, "outcome", res.Outcome, "refusal", res.Reason)
		return res, nil
	}
	e.operatorLog("cancel", req.By, req.Actor.Note, req.Reason, req.BatchID, req.TenantID, res)
	return res, nil
}

// TenantLog is the message of the one log line a tenant's own action (a
// cancel through the public route) writes.
const TenantLog = "tenant action"

// OperatorLog is the message of the one log line every operator action
// (cancel, retry, resume) writes, whichever door it came through (the
// CLI, the HTTP cancel route, the River UI): who (by: the door, cli:,
// http: or riverui:, and the name from the credential), what the caller
// said of itself (note), what (action, batch_id, tenant_id, and the
// outcome with what it changed) and why (reason). The same action is a
// row of the operators' audit (internal/audit).
const OperatorLog = "operator action"

// operatorLog writes an action's OperatorLog line.
func (e *Enqueuer) operatorLog(action, by, note, reason string, batchID int64, tenant string, res Result) {
	attrs := []any{"action", action, "by", cmp.Or(by, "unnamed"), "reason", reason, "batch_id", batchID, "tenant_id", tenant, "outcome", res.Outcome}
	if note != "" {
		attrs = append(attrs, "note", note)
	}
	add := func(key string, v int64) {
		if v != 0 {
			attrs = append(attrs, key, v)
		}
	}
	if res.BatchID != batchID {
		add("new_batch_id", res.BatchID)
	}
	add("job_id", res.JobID)
	add("running_batch_id", res.RunningBatchID)
	add("newer_batch_id", res.NewerBatchID)
	for _, kv := range [][2]string{{"refusal", res.Reason}, {"status", res.Status}, {"phase", res.Phase}, {"previous_holder", res.PreviousHolder}, {"error", res.Error}} {
		if kv[1] != "" {
			attrs = append(attrs, kv[0], kv[1])
		}
	}
	if len(res.CancelledJobs) > 0 {
		attrs = append(attrs, "cancelled_jobs", res.CancelledJobs)
	}
	e.logger().Warn(OperatorLog, attrs...)
}

func (e *Enqueuer) observeReservation(outcome string) {
	if e.Metrics == nil {
		return
	}
	var label string
	switch outcome {
	case OutcomeEnqueued:
		label = "reserved"
	case OutcomeConflict:
		label = "conflict"
	case OutcomeEnqueueFailed:
		label = "enqueue_failed"
	case OutcomeResumable:
		label = "resumable"
	default:
		return
	}
	e.Metrics.Reservations.WithLabelValues(string(batch.SourceTypeFleetS3), label).Inc()
}

func (e *Enqueuer) logger() *slog.Logger {
	if e.Logger == nil {
		return slog.Default()
	}
	return e.Logger
}

// ValidateImport checks an import request without touching the database.
// It returns an *InputError naming the first field refused.
func ValidateImport(req ImportRequest) error {
	_, err := reservation(req, 0)
	return err
}

// ValidateResume checks a resume request without touching the database.
func ValidateResume(req ResumeRequest) error {
	if req.Folder != "" {
		if _, err := folder.Canonicalize(req.Folder); err != nil {
			return inputError(err)
		}
	}
	if req.BatchID <= 0 {
		return &InputError{Field: "batch_id", Reason: "must be a positive batch id"}
	}
	if err := batch.ValidateTenantID(req.TenantID); err != nil {
		return inputError(err)
	}
	return validateOperator(req.By, req.Reason)
}

// ValidateRetry checks a retry request without touching the database.
func ValidateRetry(req RetryRequest) error {
	if req.BatchID <= 0 {
		return &InputError{Field: "batch_id", Reason: "must be a positive batch id"}
	}
	if err := batch.ValidateTenantID(req.TenantID); err != nil {
		return inputError(err)
	}
	return validateOperator(req.By, req.Reason)
}

// validateOperator checks who asks for a retry or a resume and why, as a
// cancel's are checked; an empty By is logged as "unnamed".
func validateOperator(by, reason string) error {
	return inputError(batch.ValidateOperator(cmp.Or(by, "unnamed"), reason))
}

// ValidateCancel checks a cancel request without touching the database.
func ValidateCancel(req CancelRequest) error {
	r := batch.CancelRequest{BatchID: req.BatchID, TenantID: req.TenantID, By: cmp.Or(req.By, req.Actor.By()), Reason: req.Reason}
	return inputError(r.Validate())
}
