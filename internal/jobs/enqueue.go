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
	Error          string `json:"error,omitempty"`
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
// free. Invalid
// input returns an *InputError and writes nothing; other errors are
// infrastructure failures and leave nothing behind.
func (e *Enqueuer) Import(ctx context.Context, req ImportRequest) (Result, error) {
	f, err := folder.Canonicalize(req.Folder)
	if err != nil {
		return Result{}, inputError(err)
	}
	r := batch.Reservation{
		CompanyID: req.CompanyID, TenantID: req.TenantID, TenantDatabase: req.TenantDatabase,
		SourceType: batch.SourceTypeFleetS3, IngestionMode: batch.IngestionModeFileUpload,
		PipelineStage: batch.PipelineStageFleet, SourceScope: f.Scope(), Details: batch.NewDetails(f.String()),
	}
	if err := r.Validate(); err != nil {
		return Result{}, inputError(err)
	}
	r.SkipIfSucceeded = !req.Reimport
	var (
		res       Result
		insertErr error
	)
	err = pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		reserved, err := batch.NewStore(e.Pool).WithTx(tx).Reserve(ctx, r)
		if err != nil {
			return err
		}
		switch reserved.Outcome {
		case batch.Conflict:
			res = Result{Outcome: OutcomeConflict, RunningBatchID: reserved.RunningBatchID, SourceScope: f.Scope()}
			return nil
		case batch.AlreadySucceeded:
			res = Result{Outcome: OutcomeAlreadySucceeded, BatchID: reserved.SucceededBatchID, SourceScope: f.Scope()}
			return nil
		}
		job, err := e.River.InsertTx(ctx, tx, IngestArgs{BatchID: reserved.Batch.ID}, nil)
		if err != nil {
			insertErr = err
			return errRollback // the reservation goes with it
		}
		res = Result{Outcome: OutcomeEnqueued, BatchID: reserved.Batch.ID, JobID: job.Job.ID, SourceScope: f.Scope()}
		return nil
	})
	if errors.Is(err, errRollback) {
		// Nothing of the transaction remains and the scope is free; record
		// the failed enqueue as a Failed batch so the caller can be told.
		failed, err := batch.NewStore(e.Pool).RecordFailedEnqueue(ctx, r, insertErr.Error())
		if err != nil {
			return Result{}, fmt.Errorf("job insert failed (%v), and recording the failure failed: %w", insertErr, err)
		}
		res = Result{Outcome: OutcomeEnqueueFailed, BatchID: failed.ID, SourceScope: f.Scope(), Error: insertErr.Error()}
	} else if err != nil {
		return Result{}, err
	}
	e.observeReservation(res.Outcome)
	e.logger().Info("import", "outcome", res.Outcome, "batch_id", res.BatchID, "job_id", res.JobID,
		"running_batch_id", res.RunningBatchID, "tenant_id", req.TenantID, "source_scope", res.SourceScope)
	return res, nil
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
	label, ok := map[string]string{OutcomeEnqueued: "reserved", OutcomeConflict: "conflict", OutcomeEnqueueFailed: "enqueue_failed"}[outcome]
	if !ok {
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
	f, err := folder.Canonicalize(req.Folder)
	if err != nil {
		return inputError(err)
	}
	r := batch.Reservation{
		CompanyID: req.CompanyID, TenantID: req.TenantID, TenantDatabase: req.TenantDatabase,
		SourceType: batch.SourceTypeFleetS3, IngestionMode: batch.IngestionModeFileUpload,
		PipelineStage: batch.PipelineStageFleet, SourceScope: f.Scope(),
	}
	return inputError(r.Validate())
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
