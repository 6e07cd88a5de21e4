package batch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// runningScopeIndex is the unique partial index that makes PostgreSQL the
// arbiter of scope reservations. Errors are recognised by this name, never
// by their text.
const runningScopeIndex = "ux_ingestion_batches_running_scope"

// Reservation is the input of Reserve: one scoped batch to start Running.
type Reservation struct {
	CompanyID      string
	TenantID       string
	TenantDatabase string
	SourceType     SourceType
	IngestionMode  IngestionMode
	PipelineStage  string
	SourceScope    string
	Details        Details
	// SkipIfSucceeded makes Reserve answer AlreadySucceeded, reserving
	// nothing, when the newest batch of the tenant and scope succeeded.
	SkipIfSucceeded bool
	// SkipIfResumable, when positive, makes ReserveMany answer Resumable,
	// reserving nothing, when the newest batch of the tenant and scope is
	// a failed publication committed less than this long ago that can
	// still be resumed (ResumablePublicationSQL): its load is committed,
	// so the folder is resumed, never loaded a second time.
	SkipIfResumable time.Duration
	// ReimportOf, when not zero, is the Succeeded batch a re-import found
	// the folder's newest and differing from the folder (enqueue
	// reconcile): ReserveMany reserves only while that batch is still the
	// folder's newest, and answers Superseded, reserving nothing, once a
	// newer batch exists (another scan's re-import of the same change,
	// running or finished). So scans that overlap import one change once.
	// Reserve does not take it.
	ReimportOf int64
}

// Validate checks every field before anything touches the database. It
// returns a *ValidationError naming the first field refused.
func (r *Reservation) Validate() error {
	for _, err := range []error{
		ValidateCompanyID(r.CompanyID),
		ValidateTenantID(r.TenantID),
		ValidateTenantDatabase(r.TenantDatabase),
		ValidateSourceScope(r.SourceScope),
		checkText("pipeline_stage", r.PipelineStage, MaxPipelineStageLen),
	} {
		if err != nil {
			return err
		}
	}
	if !validSourceType(r.SourceType) {
		return &ValidationError{"source_type", fmt.Sprintf("unknown source type %q", r.SourceType)}
	}
	if !validIngestionMode(r.IngestionMode) {
		return &ValidationError{"ingestion_mode", fmt.Sprintf("unknown ingestion mode %q", r.IngestionMode)}
	}
	return nil
}

// ReserveOutcome is the domain result of Reserve.
type ReserveOutcome int

const (
	// Reserved means a new Running batch now holds the scope.
	Reserved ReserveOutcome = iota + 1
	// Conflict means another Running batch already holds the scope.
	Conflict
	// AlreadySucceeded means SkipIfSucceeded was set and the newest batch of
	// the scope succeeded; nothing was reserved.
	AlreadySucceeded
	// Resumable means SkipIfResumable was set and the newest batch of the
	// scope is a failed publication that can be resumed; nothing was
	// reserved.
	Resumable
	// Superseded means ReimportOf was set and is no longer the newest
	// batch of the scope (BatchID is the newest): the change it was to
	// import is another re-import's; nothing was reserved.
	Superseded
)

func (o ReserveOutcome) String() string {
	switch o {
	case Reserved:
		return "reserved"
	case Conflict:
		return "conflict"
	case AlreadySucceeded:
		return "already_succeeded"
	case Resumable:
		return "resumable"
	case Superseded:
		return "superseded"
	}
	return "unknown"
}

// ReserveResult is what Reserve decided.
type ReserveResult struct {
	Outcome ReserveOutcome
	// Batch is the new batch when Outcome is Reserved.
	Batch Batch
	// RunningBatchID is the batch holding the scope when Outcome is Conflict.
	RunningBatchID int64
	// SucceededBatchID is the newest batch when Outcome is AlreadySucceeded.
	SucceededBatchID int64
}

// maxReserveAttempts bounds the retry when the conflicting batch finishes
// between our insert and our lookup of it.
const maxReserveAttempts = 5

// Reserve atomically inserts a Running batch holding (tenant, scope), or
// reports Conflict with the id of the Running batch that already holds it
// (or AlreadySucceeded, see Reservation.SkipIfSucceeded). One statement
// decides, so the common path is a single round trip.
// PostgreSQL's unique partial index decides between concurrent callers; a
// concurrent reservation still in flight is waited for. Validation failures
// return a *ValidationError and write nothing; other errors are
// infrastructure failures.
func (s *Store) Reserve(ctx context.Context, r Reservation) (ReserveResult, error) {
	if err := r.Validate(); err != nil {
		return ReserveResult{}, err
	}
	if r.ReimportOf != 0 {
		return ReserveResult{}, &ValidationError{"reimport_of", "only ReserveMany reserves a re-import of a given batch"}
	}
	details, err := r.Details.Marshal()
	if err != nil {
		return ReserveResult{}, err
	}
	for range maxReserveAttempts {
		b, err := scanBatch(s.db.QueryRow(ctx, `
			WITH latest AS (
				SELECT status FROM ingestion_batches
				WHERE tenant_id = $2 AND source_scope = $8 AND source_scope IS NOT NULL
				ORDER BY id DESC LIMIT 1
			), ins AS (
				INSERT INTO ingestion_batches
					(company_id, tenant_id, tenant_database, ingestion_mode, source_type,
					 business_date, pipeline_stage, status, details, source_scope)
				SELECT $1, $2, $3, $4, $5, NULL, $6, 'Running',
				       $7::jsonb || jsonb_build_object('updatedAt', now()), $8
				WHERE NOT ($9::bool AND EXISTS (SELECT 1 FROM latest WHERE status = 'Succeeded'))
				ON CONFLICT (tenant_id, source_scope) WHERE status = 'Running' AND source_scope IS NOT NULL
				DO NOTHING
				RETURNING `+columns+`
			)
			SELECT `+columns+` FROM ins`,
			r.CompanyID, r.TenantID, r.TenantDatabase, r.IngestionMode, r.SourceType,
			r.PipelineStage, string(details), r.SourceScope, r.SkipIfSucceeded))
		if err == nil {
			return ReserveResult{Outcome: Reserved, Batch: b}, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return ReserveResult{}, fmt.Errorf("reserving scope: %w", err)
		}
		if r.SkipIfSucceeded {
			latest, err := s.Latest(ctx, r.TenantID, r.SourceScope)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return ReserveResult{}, err
			}
			if err == nil && latest.Status == StatusSucceeded {
				return ReserveResult{Outcome: AlreadySucceeded, SucceededBatchID: latest.ID}, nil
			}
		}
		id, found, err := s.runningBatchID(ctx, r.TenantID, r.SourceScope)
		if err != nil {
			return ReserveResult{}, err
		}
		if found {
			return ReserveResult{Outcome: Conflict, RunningBatchID: id}, nil
		}
		// The holder finished between the two statements: try again.
	}
	return ReserveResult{}, fmt.Errorf("reserving scope: gave up after %d attempts racing a finishing batch", maxReserveAttempts)
}

func (s *Store) runningBatchID(ctx context.Context, tenantID, scope string) (int64, bool, error) {
	var id int64
	err := s.db.QueryRow(ctx, `
		SELECT id FROM ingestion_batches
		WHERE tenant_id = $1 AND source_scope = $2 AND status = 'Running'`, tenantID, scope).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("looking up running batch: %w", err)
	}
	return id, true, nil
}

// IsTransactionConflict reports whether err is a deadlock (40P01) or a
// serialization failure (40001): the transaction was rolled back as a
// whole and may be tried again.
func IsTransactionConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// isRunningScopeViolation reports whether err is the unique violation of the
// running-scope index. It is, with IsTransactionConflict, the one place a
// driver error is interpreted.
func isRunningScopeViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == runningScopeIndex
}

// SliceVerifier proves who owns a warehouse slice. SliceOwner returns the
// identity (Ref) of the batch the warehouse slice for (tenant, scope) is
// stamped with, and found false when there is no slice. Resume calls it
// before reacquiring a scope: an operational reservation alone is not
// proof that old publication may resume, and neither is a stamp that names
// the batch's id with another batch's uid (a batch the operational
// database forgot, which was handed the same id).
type SliceVerifier interface {
	SliceOwner(ctx context.Context, tenantID, sourceScope string) (owner Ref, found bool, err error)
}

// SliceVerifierFunc adapts a function to SliceVerifier.
type SliceVerifierFunc func(ctx context.Context, tenantID, sourceScope string) (Ref, bool, error)

// SliceOwner calls f.
func (f SliceVerifierFunc) SliceOwner(ctx context.Context, tenantID, sourceScope string) (Ref, bool, error) {
	return f(ctx, tenantID, sourceScope)
}

// ResumeRequest names the failed batch to resume and what the caller
// believes it is.
type ResumeRequest struct {
	BatchID     int64
	TenantID    string
	SourceType  SourceType
	SourceScope string
	// PublicationWindow is how long after its warehouse commit a publication
	// may still be resumed. Defaults to DefaultPublicationWindow.
	PublicationWindow time.Duration
}

// DefaultPublicationWindow is the default ResumeRequest.PublicationWindow.
const DefaultPublicationWindow = 24 * time.Hour

// ResumeOutcome is the domain result of Resume.
type ResumeOutcome int

const (
	// Resumed means the batch is Running again and holds its scope.
	Resumed ResumeOutcome = iota + 1
	// ResumeConflict means another Running batch holds the scope.
	ResumeConflict
	// NotResumable means a resume rule refused; Reason says which.
	NotResumable
	// ResumeNotFound means no batch of the tenant has the id.
	ResumeNotFound
)

func (o ResumeOutcome) String() string {
	switch o {
	case Resumed:
		return "resumed"
	case ResumeConflict:
		return "conflict"
	case NotResumable:
		return "not_resumable"
	case ResumeNotFound:
		return "not_found"
	}
	return "unknown"
}

// Reasons a resume is refused.
const (
	ReasonSourceTypeMismatch    = "source_type_mismatch"
	ReasonScopeMismatch         = "scope_mismatch"
	ReasonRunning               = "running"
	ReasonSucceeded             = "succeeded"
	ReasonDetailsInvalid        = "details_invalid"
	ReasonDetailsUnknownVersion = "details_unknown_version"
	ReasonSuperseded            = "superseded"
	ReasonPublicationExpired    = "publication_expired"
	ReasonNotCommitted          = "not_committed"
	ReasonAlreadyPublished      = "already_published"
	ReasonWarehouseSliceMissing = "warehouse_slice_missing"
	// ReasonCancelled: an operator cancelled the batch; resuming would undo
	// the cancel (a new batch for its folder is enqueue retry).
	ReasonCancelled = "cancelled"
)

// ResumeResult is what Resume decided.
type ResumeResult struct {
	Outcome ResumeOutcome
	// Reason says which rule refused when Outcome is NotResumable.
	Reason string
	// Batch is the batch as it now stands when it was found.
	Batch Batch
	// RunningBatchID is the batch holding the scope on ResumeConflict.
	RunningBatchID int64
}

// Resume moves a Failed batch whose warehouse commit succeeded but whose
// publication did not complete back to Running, reacquiring its scope. It
// holds the row lock while it checks, in order: the batch exists for the
// tenant; source type and scope match the request; it is not Running or
// Succeeded; its details parse; it is not superseded or expired; the
// warehouse commit happened; publication is incomplete; the publication
// window has not passed (else the batch is marked publication_expired); the
// warehouse slice is still stamped with this batch (else it is marked
// superseded); and no other Running batch holds the scope.
func (s *Store) Resume(ctx context.Context, req ResumeRequest, verifier SliceVerifier) (ResumeResult, error) {
	if verifier == nil {
		return ResumeResult{}, errors.New("resume: a SliceVerifier is required")
	}
	if err := ValidateTenantID(req.TenantID); err != nil {
		return ResumeResult{}, err
	}
	if err := ValidateSourceScope(req.SourceScope); err != nil {
		return ResumeResult{}, err
	}
	window := req.PublicationWindow
	if window <= 0 {
		window = DefaultPublicationWindow
	}
	var res ResumeResult
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		b, now, err := lockBatch(ctx, tx, req.BatchID)
		if errors.Is(err, ErrNotFound) || (err == nil && b.TenantID != req.TenantID) {
			res = ResumeResult{Outcome: ResumeNotFound}
			return nil
		}
		if err != nil {
			return err
		}
		refuse := func(reason string) error {
			res = ResumeResult{Outcome: NotResumable, Reason: reason, Batch: b}
			return nil
		}
		switch {
		case b.SourceType != req.SourceType:
			return refuse(ReasonSourceTypeMismatch)
		case b.Scope() != req.SourceScope:
			return refuse(ReasonScopeMismatch)
		case b.Status == StatusSucceeded:
			return refuse(ReasonSucceeded)
		case b.Status == StatusRunning:
			return refuse(ReasonRunning)
		case b.CancelledAt != nil:
			return refuse(ReasonCancelled)
		}
		d, err := ParseDetails(b.Details)
		switch {
		case errors.Is(err, ErrDetailsUnknownVersion):
			return refuse(ReasonDetailsUnknownVersion)
		case err != nil:
			return refuse(ReasonDetailsInvalid)
		}
		switch {
		case d.Phase == PhaseSuperseded:
			return refuse(ReasonSuperseded)
		case d.Phase == PhasePublicationExpired:
			return refuse(ReasonPublicationExpired)
		case !d.RedshiftCommitted:
			return refuse(ReasonNotCommitted)
		case d.Publication.Completed || d.Phase == PhasePublished:
			return refuse(ReasonAlreadyPublished)
		case d.CommittedAt == nil:
			return refuse(ReasonDetailsInvalid)
		}
		if now.Sub(*d.CommittedAt) > window {
			b, err = markRefused(ctx, tx, b, d, PhasePublicationExpired)
			if err != nil {
				return err
			}
			return refuse(ReasonPublicationExpired)
		}
		owner, found, err := verifier.SliceOwner(ctx, b.TenantID, b.Scope())
		if err != nil {
			return fmt.Errorf("resume: verifying warehouse slice: %w", err)
		}
		if !found {
			return refuse(ReasonWarehouseSliceMissing)
		}
		if !owner.Names(b.Ref()) {
			b, err = markRefused(ctx, tx, b, d, PhaseSuperseded)
			if err != nil {
				return err
			}
			return refuse(ReasonSuperseded)
		}

		d.Phase = PhaseCommitted
		d.Resumes++
		raw, err := d.Marshal()
		if err != nil {
			return err
		}
		// The reacquisition runs in a savepoint so a unique violation leaves
		// the caller's transaction usable.
		var resumed Batch
		err = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			resumed, err = scanBatch(sp.QueryRow(ctx, `
				UPDATE ingestion_batches
				SET status = 'Running', completed_at = NULL,
				    details = $2::jsonb || jsonb_build_object('updatedAt', now()),
				    execution_lease_id = NULL, execution_lease_expires_at = NULL,
				    updated_at = now()
				WHERE id = $1
				RETURNING `+columns, b.ID, string(raw)))
			return err
		})
		if isRunningScopeViolation(err) {
			id, found, err := NewStore(tx).runningBatchID(ctx, b.TenantID, b.Scope())
			if err != nil {
				return err
			}
			if !found {
				return errors.New("resume: scope conflict reported but no running batch found")
			}
			res = ResumeResult{Outcome: ResumeConflict, Batch: b, RunningBatchID: id}
			return nil
		}
		if err != nil {
			return fmt.Errorf("resume: reacquiring scope: %w", err)
		}
		res = ResumeResult{Outcome: Resumed, Batch: resumed}
		return nil
	})
	if err != nil {
		return ResumeResult{}, err
	}
	return res, nil
}

// markRefused records a terminal refusal phase on a Failed batch.
func markRefused(ctx context.Context, tx pgx.Tx, b Batch, d Details, phase Phase) (Batch, error) {
	d.Phase = phase
	raw, err := d.Marshal()
	if err != nil {
		return Batch{}, err
	}
	return scanBatch(tx.QueryRow(ctx, `
		UPDATE ingestion_batches
		SET details = $2::jsonb || jsonb_build_object('updatedAt', now()), updated_at = now()
		WHERE id = $1 AND status = 'Failed'
		RETURNING `+columns, b.ID, string(raw)))
}
