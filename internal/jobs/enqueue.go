package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/metrics"
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
	// OutcomeInvalidInput: ImportMany refused this request before writing
	// anything for it (Field and Error say why).
	OutcomeInvalidInput = "invalid_input"
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
	// succeeded. Without it such a request answers already_succeeded.
	Reimport bool `json:"reimport,omitempty"`
}

// Result is the outcome of an import or a resume: one JSON line on the
// command line, the body of an HTTP answer.
type Result struct {
	Outcome        string `json:"outcome"`
	BatchID        int64  `json:"batch_id,omitempty"`
	JobID          int64  `json:"job_id,omitempty"`
	RunningBatchID int64  `json:"running_batch_id,omitempty"`
	SourceScope    string `json:"source_scope,omitempty"`
	Reason         string `json:"reason,omitempty"`
	// Field names the refused input of an invalid_input outcome.
	Field string `json:"field,omitempty"`
	Error string `json:"error,omitempty"`
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

// Import reserves a batch for (tenant, folder) and inserts its job in the
// same transaction. Outcomes: enqueued; conflict when a running batch holds
// the scope; already_succeeded when the folder's latest batch succeeded and
// req.Reimport is false; enqueue_failed when the job insert failed, in which
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
// conflict, already_succeeded, or invalid_input (with Field and Error;
// nothing is written for it). If the job insert fails, every batch the burst
// reserved is recorded Failed with failed_enqueue (enqueue_failed, scope
// free). A folder named twice is reserved once; the second request answers
// conflict with the first one's batch. An error is an infrastructure failure:
// nothing of the failed burst remains, and the results are not returned.
func (e *Enqueuer) ImportMany(ctx context.Context, reqs []ImportRequest) ([]Result, error) {
	results := make([]Result, len(reqs))
	for start := 0; start < len(reqs); start += MaxBurst {
		end := min(start+MaxBurst, len(reqs))
		if err := e.importBurst(ctx, reqs[start:end], results[start:end]); err != nil {
			return nil, err
		}
	}
	log := e.logger()
	for i, res := range results {
		e.observeReservation(res.Outcome)
		attrs := []any{"outcome", res.Outcome, "batch_id", res.BatchID, "job_id", res.JobID,
			"running_batch_id", res.RunningBatchID, "tenant_id", reqs[i].TenantID, "source_scope", res.SourceScope}
		if res.Error != "" {
			attrs = append(attrs, "field", res.Field, "error", res.Error)
		}
		log.Info("import", attrs...)
	}
	return results, nil
}

// reservation turns an import request into the batch reservation it asks
// for, or an *InputError.
func reservation(req ImportRequest) (batch.Reservation, error) {
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
		r, err := reservation(req)
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
		reservedRs  []batch.Reservation
		reservedIdx []int
		insertErr   error
	)
	err := pgx.BeginTxFunc(ctx, e.Pool, burstTx, func(tx pgx.Tx) error {
		reserved, err := batch.NewStore(tx).ReserveMany(ctx, rs)
		if err != nil {
			return err
		}
		reservedRs, reservedIdx = reservedRs[:0], reservedIdx[:0]
		var params []river.InsertManyParams
		for k, rr := range reserved {
			i, scope := idx[k], rs[k].SourceScope
			switch rr.Outcome {
			case batch.Conflict:
				results[i] = Result{Outcome: OutcomeConflict, RunningBatchID: rr.BatchID, SourceScope: scope}
			case batch.AlreadySucceeded:
				results[i] = Result{Outcome: OutcomeAlreadySucceeded, BatchID: rr.BatchID, SourceScope: scope}
			case batch.Reserved:
				results[i] = Result{Outcome: OutcomeEnqueued, BatchID: rr.BatchID, SourceScope: scope}
				reservedRs, reservedIdx = append(reservedRs, rs[k]), append(reservedIdx, i)
				params = append(params, river.InsertManyParams{Args: IngestArgs{BatchID: rr.BatchID}})
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
		return nil
	})
	if !errors.Is(err, errRollback) {
		return err
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
	return nil
}

// errRollback rolls a transaction back on purpose.
var errRollback = errors.New("rolled back")

// ResumeRequest asks to resume a batch whose publication failed.
type ResumeRequest struct {
	BatchID  int64  `json:"batch_id"`
	TenantID string `json:"tenant_id"`
	Folder   string `json:"folder"`
}

// Resume moves a failed-publication batch back to Running under the resume
// rules (see batch.Store.Resume, including the warehouse slice proof) and
// inserts a job for it, in one transaction. Outcomes: resumed, conflict,
// not_resumable (with a reason), not_found; enqueue_failed when the job
// insert failed, in which case nothing changed.
func (e *Enqueuer) Resume(ctx context.Context, req ResumeRequest) (Result, error) {
	f, err := folder.Canonicalize(req.Folder)
	if err != nil {
		return Result{}, inputError(err)
	}
	if req.BatchID <= 0 {
		return Result{}, &InputError{Field: "batch_id", Reason: "must be a positive batch id"}
	}
	if err := batch.ValidateTenantID(req.TenantID); err != nil {
		return Result{}, inputError(err)
	}
	var res Result
	err = pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		rr, err := batch.NewStore(e.Pool).WithTx(tx).Resume(ctx, batch.ResumeRequest{
			BatchID: req.BatchID, TenantID: req.TenantID, SourceType: batch.SourceTypeFleetS3,
			SourceScope: f.Scope(), PublicationWindow: e.PublicationWindow,
		}, e.Verifier)
		if err != nil {
			return err
		}
		res = Result{Outcome: rr.Outcome.String(), BatchID: req.BatchID, SourceScope: f.Scope()}
		switch rr.Outcome {
		case batch.ResumeConflict:
			res.RunningBatchID = rr.RunningBatchID
		case batch.NotResumable:
			res.Reason = rr.Reason
		case batch.ResumeNotFound:
			res.BatchID = 0
		case batch.Resumed:
			job, err := e.River.InsertTx(ctx, tx, IngestArgs{BatchID: req.BatchID}, nil)
			if err != nil {
				res = Result{Outcome: OutcomeEnqueueFailed, BatchID: req.BatchID, SourceScope: f.Scope(), Error: err.Error()}
				return errRollback // the resume goes with it: the batch stays resumable
			}
			res.JobID = job.Job.ID
		}
		return nil
	})
	if err != nil && !errors.Is(err, errRollback) {
		return Result{}, err
	}
	if e.Metrics != nil {
		e.Metrics.Resumes.WithLabelValues(res.Outcome).Inc()
	}
	e.logger().Info("resume", "outcome", res.Outcome, "reason", res.Reason, "batch_id", req.BatchID, "job_id", res.JobID,
		"running_batch_id", res.RunningBatchID, "tenant_id", req.TenantID)
	return res, nil
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
	_, err := reservation(req)
	return err
}

// ValidateResume checks a resume request without touching the database.
func ValidateResume(req ResumeRequest) error {
	if _, err := folder.Canonicalize(req.Folder); err != nil {
		return inputError(err)
	}
	if req.BatchID <= 0 {
		return &InputError{Field: "batch_id", Reason: "must be a positive batch id"}
	}
	return inputError(batch.ValidateTenantID(req.TenantID))
}
