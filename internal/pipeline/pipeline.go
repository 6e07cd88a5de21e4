// Package pipeline is the seam between the queue and the work of one source
// type. The queue side (package jobs) finds the batch, holds its execution
// lease and keeps it alive; a Pipeline continues the batch from the phase its
// details record and reports how it ended; Execute turns that report into
// the batch's fenced state writes.
//
// Adding a source type means writing a Pipeline and registering it; the
// lease and queue code do not change.
//
// Transient or terminal: an error a Pipeline returns is one of
//
//   - a *Failure (made with Fail): a handled failure with the failed_* phase
//     to record. Execute marks the batch Failed; it is not retried.
//   - batch.ErrStaleLease: the lease was lost; nothing more is written.
//   - anything else: transient. The batch stays Running with its progress
//     in details, and the delivery is retried.
//
// Pipelines decide with IsTransient: connection-level failures (refused,
// reset, timeouts, SQLSTATE class 08), serialization failures and deadlocks
// (40001, 40P01), server shutdown or overload (57P01–57P03, 53300), a
// write refused by a read-only server (25006: a standby or a demoted
// primary reached during a failover), a prepared statement missing or duplicated (26000, 42P05: pgx's statement
// cache behind a transaction pooler without --database-pooler transaction),
// storage unavailability, AWS errors the AWS SDK itself would retry (throttling such
// as S3's 503 SlowDown or the Data API's ThrottlingException, 5xx answers,
// request timeouts) or that report a busy Redshift Data API (too many active
// statements or sessions, internal errors), and warehouse failures marked
// warehouse.ErrTransient (Redshift's serializable isolation violation 1023,
// an aborted statement, a statement whose outcome is unknown) are transient;
// everything else (bad data, missing folders or buckets, permission errors,
// constraint or trigger errors) is terminal.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/warehouse"
)

// Pipeline does the work of one source type for a Running batch.
type Pipeline interface {
	// Execute continues run's batch from the phase its details record,
	// saving progress with run.Checkpoint. It returns nil when the work is
	// complete (published), leaving the final details in run.Details; a
	// *Failure for a handled terminal failure; batch.ErrStaleLease when the
	// lease was lost; any other error for a transient failure.
	Execute(ctx context.Context, run *Run) error
}

// Settler is a Pipeline that can prove, when a batch's transient failures
// have outlasted every attempt, how far the work really got. A commit whose
// outcome the last attempt never learned (a warehouse statement that can
// commit after its client gave up) must not be recorded as a pre-commit
// failure: Settle reads the truth back (the warehouse stamp) and returns d
// with any commit it proves recorded.
type Settler interface {
	Settle(ctx context.Context, b batch.Batch, d batch.Details) (batch.Details, error)
}

// CommitCheck is a lease check that a fenced write inside the committing
// transaction completes (Run.CheckpointTx): the holder's checks that need
// no database, and the time the term must have left by the database clock,
// which the write requires. *lease.Holding implements it.
type CommitCheck interface {
	VerifyLocal() error
	SafetyMargin() time.Duration
}

// Registry maps source types to their pipelines.
type Registry map[batch.SourceType]Pipeline

// Run is one delivery's view of a batch it holds the lease on.
type Run struct {
	Batch   batch.Batch
	Details batch.Details
	Lease   lease.Lease

	store     *batch.Store
	verify    func(context.Context) error
	check     CommitCheck // nil: CheckpointTx and SucceedTx check through verify
	succeeded bool        // the pipeline's own transaction recorded Succeeded (AdoptSucceeded)
}

// Checkpoint durably records d as the batch's details, fenced on the lease.
// It returns batch.ErrStaleLease, writing nothing, if the lease was lost.
func (r *Run) Checkpoint(ctx context.Context, d batch.Details) error {
	b, err := r.store.WriteDetails(ctx, r.Lease.Fence(), d)
	if err != nil {
		return err
	}
	r.Batch, r.Details = b, d
	return nil
}

// CheckpointTx writes d as Checkpoint does, fenced on the lease, but inside
// tx: the write commits or rolls back with tx (a warehouse transaction in
// the operational database, see warehouse.WithRecord). Run is unchanged
// until the caller, once tx committed, passes the returned batch to Adopt.
//
// It is also the lease check before tx's commit (warehouse.Record): with a
// CommitCheck (ExecuteChecked) the holder's local checks and, in the write
// itself, the safety margin by the database clock; without one, VerifyLease.
func (r *Run) CheckpointTx(ctx context.Context, tx pgx.Tx, d batch.Details) (batch.Batch, error) {
	f, err := r.commitFence(ctx)
	if err != nil {
		return batch.Batch{}, err
	}
	return r.store.WithTx(tx).WriteDetails(ctx, f, d)
}

// commitFence is the fence of a write that is the lease check before its
// transaction's commit (CheckpointTx, SucceedTx).
func (r *Run) commitFence(ctx context.Context) (batch.Fence, error) {
	f := r.Lease.Fence()
	if r.check == nil {
		return f, r.VerifyLease(ctx)
	}
	if err := r.check.VerifyLocal(); err != nil {
		return f, err
	}
	f.Margin = r.check.SafetyMargin()
	return f, nil
}

// SucceedTx marks the batch Succeeded with details d (phase published),
// releasing the lease, fenced on it, inside tx: the terminal write that
// Execute would otherwise make after the pipeline returns, committed with
// the publication itself. Once tx committed the caller passes the returned
// batch to AdoptSucceeded, and Execute writes nothing more. Like
// CheckpointTx it is the lease check before tx's commit.
func (r *Run) SucceedTx(ctx context.Context, tx pgx.Tx, d batch.Details) (batch.Batch, error) {
	f, err := r.commitFence(ctx)
	if err != nil {
		return batch.Batch{}, err
	}
	return r.store.WithTx(tx).MarkSucceeded(ctx, f, d)
}

// Knows reports whether the operational database knows the batch ref
// names as a batch of this batch's folder (batch.Store.Knows): a
// warehouse stamp of a batch it does not know was written by a batch a
// restore or a failover made it forget.
func (r *Run) Knows(ctx context.Context, ref batch.Ref) (bool, error) {
	return r.store.Knows(ctx, ref, r.Batch.TenantID, r.Batch.Scope())
}

// AdvanceIDs moves the batches' id sequence past id (batch.Store.AdvanceIDs).
func (r *Run) AdvanceIDs(ctx context.Context, id int64) (int64, error) {
	return r.store.AdvanceIDs(ctx, id)
}

// Adopt records that a CheckpointTx write of d, returning b, committed.
func (r *Run) Adopt(b batch.Batch, d batch.Details) { r.Batch, r.Details = b, d }

// AdoptSucceeded records that a SucceedTx write of d, returning b,
// committed: the batch is Succeeded and its lease released.
func (r *Run) AdoptSucceeded(b batch.Batch, d batch.Details) {
	r.Batch, r.Details, r.succeeded = b, d, true
}

// VerifyLease checks that the lease is still held (a read when the term was
// renewed within the last renewal period, a renewal otherwise), for use
// right before an irreversible step such as a warehouse commit. It returns
// batch.ErrStaleLease if the lease was lost.
func (r *Run) VerifyLease(ctx context.Context) error {
	if r.verify == nil {
		return nil
	}
	return r.verify(ctx)
}

// Admitter is implemented by a Pipeline that re-validates each batch
// before any work on it: the batch row may have been written by any door,
// or by a database role directly, and a worker reads what the row names.
// Execute calls Admit after the details parse and before anything is read
// or written for the batch; an error parks the batch with it as the
// reason, unread (Parked).
type Admitter interface {
	Admit(b batch.Batch, d batch.Details) error
}

// Failure is a handled, terminal failure of a batch.
type Failure struct {
	Phase batch.Phase
	// Reason names the kind of failure, where one is distinguished
	// (batch.ReasonFolderIncomplete); empty otherwise.
	Reason batch.Reason
	Err    error
}

func (f *Failure) Error() string { return fmt.Sprintf("%s: %v", f.Phase, f.Err) }
func (f *Failure) Unwrap() error { return f.Err }

// Fail returns a *Failure recording phase (failed_pre_commit,
// failed_publication, superseded or publication_expired).
func Fail(phase batch.Phase, err error) error { return &Failure{Phase: phase, Err: err} }

// FailBecause is Fail naming the failure's reason, recorded with it
// (batch.ErrorRecord.Reason).
func FailBecause(phase batch.Phase, reason batch.Reason, err error) error {
	return &Failure{Phase: phase, Reason: reason, Err: err}
}

// Outcome is how one execution of a batch ended.
type Outcome string

// Outcomes of Execute.
const (
	// Succeeded: the work completed and the batch is Succeeded.
	Succeeded Outcome = "succeeded"
	// Failed: a handled failure; the batch is Failed with Result.Phase.
	Failed Outcome = "failed"
	// SkippedTerminal: the batch was already terminal; nothing was done.
	SkippedTerminal Outcome = "skipped_terminal"
	// Parked: this build cannot work on the Running batch (its details do
	// not parse or are of an older version it does not know, it is Running
	// in a no-work phase, no pipeline serves its source type, or the
	// pipeline's Admit refused it). The batch was parked with the reason
	// (batch.Store.Park), its details untouched; Err says why. It is not
	// to be delivered again until an operator acts or a build that can
	// work on it takes it back (see jobs.Sweeper).
	Parked Outcome = "parked"
	// LeftToNewer: the batch's details are of a version newer than this
	// build's (batch.ErrDetailsNewerVersion): a newer build wrote them,
	// with a change this build cannot honour. Nothing was written (no
	// park, no status, no details); the caller releases its lease and
	// leaves the batch to a newer build's delivery. Err says why.
	LeftToNewer Outcome = "left_to_newer_release"
	// LeaseLost: the lease was lost mid-way; nothing more was written.
	LeaseLost Outcome = "lease_lost"
	// Retry: a transient failure or cancellation; the batch is still Running
	// with its progress recorded, to be continued by a later delivery.
	Retry Outcome = "retry"
)

// Result is what Execute did.
type Result struct {
	Outcome Outcome
	// Phase is the failed phase when Outcome is Failed.
	Phase batch.Phase
	// Reason is the failure's reason when Outcome is Failed and the
	// pipeline named one.
	Reason batch.Reason
	// Batch is the batch as last read or written.
	Batch batch.Batch
	// Err is the failure or transient error, if any.
	Err error
}

// maxErrorMessage bounds an error message recorded in details.
const maxErrorMessage = 2000

// Starter is implemented by a Pipeline whose first state write of a
// delivery can be made in the lease acquisition's own transaction (Begin).
type Starter interface {
	// Start returns the details to record for the Running batch b, with
	// details d, right as a delivery takes its lease, and true; or false
	// when there is nothing to record at the start.
	Start(b batch.Batch, d batch.Details) (batch.Details, bool)
}

// PhaseStarter is a Starter whose start of a batch at phase From, its
// details recording no warehouse commit, is only a change of phase to To:
// for such details d, Start(b, d) is d at phase To, and true. The lease
// acquisition can then record it in its own UPDATE (lease.Start, StartOf),
// with no statement of its own; Begin checks it against Start and the
// pipeline's Admit.
type PhaseStarter interface {
	Starter
	StartPhases() (from, to batch.Phase)
}

// StartOf is the lease.Start an acquisition records for registry: the
// source types whose pipelines are PhaseStarters (of one same pair of
// phases: the first source type's, in order, where they differ). The zero
// Start when there are none.
func StartOf(registry Registry) lease.Start {
	var st lease.Start
	types := make([]batch.SourceType, 0, len(registry))
	for t := range registry {
		types = append(types, t)
	}
	slices.Sort(types)
	for _, t := range types {
		ps, ok := registry[t].(PhaseStarter)
		if !ok {
			continue
		}
		from, to := ps.StartPhases()
		if len(st.SourceTypes) == 0 {
			st.From, st.To, st.Version = from, to, batch.DetailsVersion
		}
		if from == st.From && to == st.To {
			st.SourceTypes = append(st.SourceTypes, t)
		}
	}
	return st
}

// Begin runs inside tx, the transaction that has just acquired the lease of
// a (lease.Renewer.AcquireOnStarting with StartOf(registry)) and has not
// committed. a.Batch is the batch as that acquisition left it (the row its
// UPDATE returned: what a read in tx would return, so Begin does not read
// it again). When Execute would go straight to the pipeline (the batch is
// Running and not parked, its details parse and name a phase with work to
// do, a pipeline serves its source type and admits it) and that pipeline
// is a Starter with something to record, the record is made in tx: by the
// acquisition itself when a.Started (a PhaseStarter's phase, checked here
// against the pipeline's own Start), otherwise by a write fenced on the
// lease. The acquisition and the pipeline's first checkpoint then commit
// together: one transaction, not two. Anything else is left to Execute
// (started is false and tx holds only the acquisition); a start the
// acquisition recorded on a batch that this pipeline would not start (its
// Admit refuses it, its details do not parse) is taken back first
// (lease.Store.Unstart), so the batch's details are as they were. Once tx
// committed, the caller passes the returned batch to ExecuteFrom when
// started.
func Begin(ctx context.Context, tx pgx.Tx, store *batch.Store, a lease.Acquisition, registry Registry) (_ batch.Batch, started bool, err error) {
	l, b := a.Lease, a.Batch
	if b.ID != l.BatchID || b.LeaseGeneration != l.Generation {
		return b, false, fmt.Errorf("beginning batch %d: the batch given is not the one term %d acquired (batch %d, generation %d)",
			l.BatchID, l.Generation, b.ID, b.LeaseGeneration)
	}
	if a.Started {
		start := StartOf(registry)
		if sd, ok := wouldStart(b, registry, start.From); ok && sd.Phase == start.To {
			return b, true, nil
		}
		if b, err = lease.NewStore(tx).Unstart(ctx, l, start); err != nil {
			return b, false, err
		}
		return b, false, nil
	}
	sd, ok := wouldStart(b, registry, "")
	if !ok {
		return b, false, nil
	}
	if b, err = store.WithTx(tx).WriteDetails(ctx, l.Fence(), sd); err != nil {
		return b, false, err
	}
	return b, true, nil
}

// wouldStart returns the details a Starter would record at the start of a
// delivery of b, and true, when Execute would go straight to its pipeline;
// with from not empty, of b's details taken at phase from (the phase an
// acquisition's start replaced).
func wouldStart(b batch.Batch, registry Registry, from batch.Phase) (batch.Details, bool) {
	if b.Terminal() || b.ParkedAt != nil {
		return batch.Details{}, false
	}
	d, p, refusal := judge(b, registry, from)
	if refusal != nil {
		return batch.Details{}, false
	}
	st, ok := p.(Starter)
	if !ok {
		return batch.Details{}, false
	}
	return st.Start(b, d)
}

// Refusal is why this build will not work on a Running batch (Judge).
type Refusal struct {
	// Reason says why, in the words a park records (batch.Store.Park).
	Reason string
	// Newer is true when the batch's details are of a version newer than
	// this build's (batch.ErrDetailsNewerVersion): the batch is a newer
	// build's to work on, and is left to it rather than parked.
	Newer bool
}

func (r *Refusal) Error() string { return r.Reason }

// Judge applies this build's rules to the Running batch b before any work
// on it, as Execute does: its details parse (a version this build knows),
// their phase has work to do, a pipeline of registry serves its source
// type, and that pipeline admits it (Admitter). It returns the details
// and the pipeline when this build would work on b, or why not. It reads
// nothing but b, so a caller can judge a batch it locked (the sweeper's
// take-back of parked batches) by the rules a delivery would apply.
func Judge(b batch.Batch, registry Registry) (batch.Details, Pipeline, *Refusal) {
	return judge(b, registry, "")
}

// judge is Judge of b's details taken at phase from, when not empty.
func judge(b batch.Batch, registry Registry, from batch.Phase) (batch.Details, Pipeline, *Refusal) {
	d, err := batch.ParseDetails(b.Details)
	if err != nil {
		return d, nil, &Refusal{Reason: err.Error(), Newer: errors.Is(err, batch.ErrDetailsNewerVersion)}
	}
	if from != "" {
		d.Phase = from
	}
	if d.Phase.NoWork() {
		return d, nil, &Refusal{Reason: fmt.Sprintf("Running in phase %s, in which no work is done", d.Phase)}
	}
	p, ok := registry[b.SourceType]
	if !ok {
		return d, nil, &Refusal{Reason: fmt.Sprintf("no pipeline for source type %q in this build", b.SourceType)}
	}
	if a, ok := p.(Admitter); ok {
		if err := a.Admit(b, d); err != nil {
			return d, nil, &Refusal{Reason: "refused by this worker's rules: " + err.Error()}
		}
	}
	return d, p, nil
}

// Execute runs the pipeline for the batch held by l and records the outcome
// with fenced writes: Succeeded after the pipeline completes, Failed with the
// failure's phase on a handled failure. verify checks the lease is still
// held (see Run.VerifyLease); it may be nil. Execute writes nothing once ctx
// is cancelled or the lease is lost. The returned error is non-nil only when
// recording the outcome itself failed.
func Execute(ctx context.Context, store *batch.Store, l lease.Lease, verify func(context.Context) error, registry Registry) (Result, error) {
	return ExecuteFrom(ctx, store, l, verify, registry, nil)
}

// ExecuteFrom is Execute for a batch already read under the lease: started,
// when not nil, is the batch as Begin wrote it in the acquisition's
// committed transaction, and is not read again.
func ExecuteFrom(ctx context.Context, store *batch.Store, l lease.Lease, verify func(context.Context) error, registry Registry, started *batch.Batch) (Result, error) {
	return ExecuteChecked(ctx, store, l, verify, nil, registry, started)
}

// ExecuteChecked is ExecuteFrom with check (nil: none) for the writes that
// are the lease check of their own transaction's commit (Run.CheckpointTx,
// Run.SucceedTx): with it they spare verify's round trip.
func ExecuteChecked(ctx context.Context, store *batch.Store, l lease.Lease, verify func(context.Context) error, check CommitCheck, registry Registry, started *batch.Batch) (Result, error) {
	var (
		b   batch.Batch
		err error
	)
	if started != nil {
		b = *started
	} else if b, err = store.Get(ctx, l.BatchID); err != nil {
		return Result{}, fmt.Errorf("loading batch %d: %w", l.BatchID, err)
	}
	if b.Terminal() {
		return Result{Outcome: SkippedTerminal, Batch: b}, nil
	}
	d, p, refusal := Judge(b, registry)
	switch {
	case refusal != nil && refusal.Newer:
		// A newer build's batch: not this build's to park or to write.
		return Result{Outcome: LeftToNewer, Batch: b, Err: refusal}, nil
	case refusal != nil:
		return park(ctx, store, l, b, refusal.Reason)
	}
	if b.ParkedAt != nil {
		// Parked by a build that could not work on it; this one can.
		if b, err = store.Unpark(ctx, l.Fence()); errors.Is(err, batch.ErrStaleLease) {
			return Result{Outcome: LeaseLost, Batch: b, Err: err}, nil
		} else if err != nil {
			return Result{Outcome: Retry, Err: err}, nil
		}
	}

	run := &Run{Batch: b, Details: d, Lease: l, store: store, verify: verify, check: check}
	perr := p.Execute(ctx, run)
	var failure *Failure
	switch {
	case perr == nil && run.succeeded:
		// Recorded Succeeded in the publication's own transaction: the
		// batch is terminal and its lease released, whatever ctx says now.
		return Result{Outcome: Succeeded, Batch: run.Batch}, nil
	case errors.Is(perr, batch.ErrStaleLease):
		return Result{Outcome: LeaseLost, Batch: run.Batch, Err: perr}, nil
	case ctx.Err() != nil:
		// Cancelled (shutdown or lost lease): whatever the pipeline says,
		// write nothing more; the next delivery continues from the details.
		return Result{Outcome: Retry, Batch: run.Batch, Err: errors.Join(ctx.Err(), perr)}, nil
	case perr == nil:
		done, err := store.MarkSucceeded(ctx, l.Fence(), run.Details)
		if errors.Is(err, batch.ErrStaleLease) {
			return Result{Outcome: LeaseLost, Batch: run.Batch, Err: err}, nil
		}
		if err != nil {
			return Result{Outcome: Retry, Batch: run.Batch, Err: err}, err
		}
		return Result{Outcome: Succeeded, Batch: done}, nil
	case errors.As(perr, &failure):
		msg := failure.Err.Error()
		if len(msg) > maxErrorMessage {
			msg = msg[:maxErrorMessage]
		}
		failed, err := store.MarkFailedBecause(ctx, l.Fence(), run.Details, failure.Phase, failure.Reason, msg)
		if errors.Is(err, batch.ErrStaleLease) {
			return Result{Outcome: LeaseLost, Batch: run.Batch, Err: err}, nil
		}
		if err != nil {
			return Result{Outcome: Retry, Batch: run.Batch, Err: err}, err
		}
		return Result{Outcome: Failed, Phase: failure.Phase, Reason: failure.Reason, Batch: failed, Err: failure.Err}, nil
	default:
		return Result{Outcome: Retry, Batch: run.Batch, Err: perr}, nil
	}
}

// park records why this build cannot work on the batch, under the lease,
// without touching its details.
func park(ctx context.Context, store *batch.Store, l lease.Lease, b batch.Batch, reason string) (Result, error) {
	parked, err := store.Park(ctx, l.Fence(), reason)
	switch {
	case errors.Is(err, batch.ErrStaleLease):
		return Result{Outcome: LeaseLost, Batch: b, Err: err}, nil
	case err != nil:
		return Result{Outcome: Retry, Batch: b, Err: err}, nil
	}
	return Result{Outcome: Parked, Batch: parked, Err: errors.New(reason)}, nil
}

// IsTransient reports whether err may go away if the same work is retried.
// See the package documentation for the classification.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var failure *Failure
	if errors.As(err, &failure) || errors.Is(err, folder.ErrMalformed) {
		return false
	}
	if errors.Is(err, warehouse.ErrTransient) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08":
			return true
		}
		switch pgErr.Code {
		case "40001", "40P01", "57P01", "57P02", "57P03", "53300", "55P03":
			return true
		case "25006":
			// A write reached a server that is read-only: a standby, or
			// an old primary after a failover, through a name (DNS, a
			// pooler's host) that still leads to it. The database is
			// failing over, not the batch (a connection string with
			// target_session_attrs=read-write refuses such a server when
			// it connects).
			return true
		case "26000", "42P05":
			// A prepared statement missing, or already there: this code
			// names none, so it is pgx's statement cache meeting a pooler
			// in transaction mode (--database-pooler transaction is
			// missing). The deployment is wrong, not the batch.
			return true
		}
		return false
	}
	var (
		connectErr *pgconn.ConnectError
		opErr      *net.OpError
		dnsErr     *net.DNSError
	)
	switch {
	case errors.As(err, &connectErr), errors.As(err, &opErr), errors.As(err, &dnsErr):
		return true
	case pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE):
		return true
	case errors.Is(err, context.DeadlineExceeded):
		return true
	case isTransientAWS(err):
		return true
	}
	return folder.IsTransient(err)
}

// busyDataAPI are the Redshift Data API's errors for a warehouse that is
// busy or briefly unavailable rather than refusing the request.
var busyDataAPI = map[string]bool{
	"ActiveStatementsExceededException": true,
	"ActiveSessionsExceededException":   true,
	"InternalServerException":           true,
	"DatabaseConnectionException":       true,
}

// isTransientAWS reports whether err is an AWS API error the SDK's standard
// retryer would retry (throttling codes such as SlowDown and
// ThrottlingException, HTTP 500/502/503/504, request timeouts, connection
// errors) or a busy Redshift Data API. The SDK retries these itself a few
// times; what reaches here has outlasted those retries, and the delivery is
// retried later with a longer backoff.
func isTransientAWS(err error) bool {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && busyDataAPI[apiErr.ErrorCode()] {
		return true
	}
	return retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == aws.TrueTernary
}
