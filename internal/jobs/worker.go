package jobs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/drain"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
)

// Defaults of WorkerConfig.
const (
	LeaseTTLDefault   = 30 * time.Second
	RenewEveryDefault = 10 * time.Second
	// NewerReleaseSnoozeDefault is WorkerConfig.NewerReleaseSnooze's
	// default.
	NewerReleaseSnoozeDefault = 10 * time.Second
	minSnoozeDefault          = time.Second
	releaseTimeout            = 5 * time.Second
)

// ErrLeaseLost is the cause of a work context cancelled because a renewal
// found the lease gone, or its term ran out without one.
var ErrLeaseLost = lease.ErrLost

// WorkerConfig configures IngestWorker.
type WorkerConfig struct {
	// Store reads and writes batches (the operational pool).
	Store *batch.Store
	// Leases acquires, renews and releases leases. Give it a pool of its
	// own so renewals never queue behind pipeline work. The worker renews
	// every lease it holds with one statement per RenewEvery (a
	// lease.Renewer shared by all its deliveries).
	Leases *lease.Store
	// Pipelines by source type.
	Pipelines pipeline.Registry
	// LeaseTTL is the lease duration. Defaults to LeaseTTLDefault (30 s).
	LeaseTTL time.Duration
	// RenewEvery is the heartbeat period; it must be shorter than LeaseTTL.
	// Defaults to RenewEveryDefault (10 s).
	RenewEvery time.Duration
	// LeaseSafetyMargin is how long before its lease's expiry a delivery
	// stops working, and how much of its term must be left for a warehouse
	// commit to start (lease.RenewerConfig.SafetyMargin). Defaults to
	// lease.DefaultSafetyMargin(LeaseTTL, RenewEvery): a tenth of the TTL
	// (3 s with the defaults). It must be shorter than LeaseTTL − RenewEvery.
	LeaseSafetyMargin time.Duration
	// HolderPrefix identifies this process in lease ids (e.g. the pod
	// name). Defaults to "worker".
	HolderPrefix string
	// Clock reads the local clock for lease deadlines. Defaults to
	// time.Now; tests skew it.
	Clock func() time.Time
	// MaxRunningPerTenant caps the batches of one tenant that hold a lease
	// across the fleet while another tenant's work waits (see fairness.go);
	// 0 means no cap. It needs FairnessDB.
	MaxRunningPerTenant int
	// FairnessDB runs the capped acquisitions' transactions (the lease
	// pool).
	FairnessDB lease.DB
	// Drain, if set, knows every delivery, so that a stopping worker can
	// wait for the loads that will finish in time and give up the others
	// (drain.Tracker.Drain).
	Drain *drain.Tracker
	// NewerReleaseSnooze is how long a delivery that leaves its batch to a
	// newer release (its details are of a version newer than this build's,
	// pipeline.LeftToNewer) snoozes the job, plus up to 20% jitter: the
	// job is then fetched again, by whichever worker comes first, until a
	// newer one takes it. A snooze gives River's attempt back, so however
	// long a rollout lasts the job never runs out of attempts. Defaults to
	// NewerReleaseSnoozeDefault (10 s).
	NewerReleaseSnooze time.Duration
	// PauseBeforeCompletion, tests only, pauses a delivery that ended its
	// batch (Succeeded or Failed) between that terminal write and
	// returning to River, the window a crash test kills the worker in.
	PauseBeforeCompletion time.Duration
	Metrics               *metrics.Metrics
	Logger                *slog.Logger
}

func (c *WorkerConfig) validate() error {
	c.LeaseTTL = cmpOr(c.LeaseTTL, LeaseTTLDefault)
	c.RenewEvery = cmpOr(c.RenewEvery, RenewEveryDefault)
	c.NewerReleaseSnooze = cmpOr(c.NewerReleaseSnooze, NewerReleaseSnoozeDefault)
	if c.HolderPrefix == "" {
		c.HolderPrefix = "worker"
	}
	if len(c.HolderPrefix) > 50 {
		c.HolderPrefix = c.HolderPrefix[:50]
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New()
	}
	switch {
	case c.Store == nil || c.Leases == nil:
		return errors.New("jobs: Store and Leases are required")
	case c.MaxRunningPerTenant < 0:
		return errors.New("jobs: MaxRunningPerTenant must not be negative")
	case c.MaxRunningPerTenant > 0 && c.FairnessDB == nil:
		return errors.New("jobs: MaxRunningPerTenant needs FairnessDB")
	case c.RenewEvery >= c.LeaseTTL:
		return fmt.Errorf("jobs: lease renewal period %s must be shorter than the lease TTL %s", c.RenewEvery, c.LeaseTTL)
	}
	if c.LeaseSafetyMargin == 0 {
		c.LeaseSafetyMargin = lease.DefaultSafetyMargin(c.LeaseTTL, c.RenewEvery)
	}
	if err := lease.ValidateSafetyMargin(c.LeaseSafetyMargin, c.LeaseTTL, c.RenewEvery); err != nil {
		return fmt.Errorf("jobs: %w", err)
	}
	return nil
}

func cmpOr(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

// IngestWorker runs IngestArgs jobs: it takes the batch's execution lease,
// keeps it alive with a heartbeat while the batch's pipeline runs, and
// releases it when done. See the package documentation.
type IngestWorker struct {
	river.WorkerDefaults[IngestArgs]
	cfg     WorkerConfig
	renewer *lease.Renewer
	start   lease.Start // what an acquisition records (pipeline.StartOf)
}

// NewIngestWorker validates cfg and returns the worker.
func NewIngestWorker(cfg WorkerConfig) (*IngestWorker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	renewer, err := lease.NewRenewer(cfg.Leases, lease.RenewerConfig{
		TTL: cfg.LeaseTTL, Every: cfg.RenewEvery, SafetyMargin: cfg.LeaseSafetyMargin, Clock: cfg.Clock, Logger: cfg.Logger,
		Observe: func(outcome string, n int) { cfg.Metrics.LeaseRenewals.WithLabelValues(outcome).Add(float64(n)) },
	})
	if err != nil {
		return nil, err
	}
	return &IngestWorker{cfg: cfg, renewer: renewer, start: pipeline.StartOf(cfg.Pipelines)}, nil
}

// Pipelines are the pipelines the worker runs batches with (its
// WorkerConfig's): the rules a batch is judged by (pipeline.Judge), for
// the sweeper's take-back of parked batches.
func (w *IngestWorker) Pipelines() pipeline.Registry { return w.cfg.Pipelines }

// Timeout disables River's job timeout: a healthy batch may run for as long
// as it needs. Liveness is the lease's business, not a timer's.
func (w *IngestWorker) Timeout(*river.Job[IngestArgs]) time.Duration { return -1 }

// Retry backoff bounds of NextRetry.
const (
	retryBackoffBase = time.Second
	retryBackoffMax  = 10 * time.Minute
)

// NextRetry backs off exponentially from one second, capped at ten minutes,
// with up to 20% jitter: transient failures (a restarting database, a
// network blip) are retried within seconds, and MaxAttempts spans about
// three hours before the batch is recorded failed. River's default
// (attempt⁴ seconds) would leave a batch idle for minutes after its third
// failure.
func (w *IngestWorker) NextRetry(job *river.Job[IngestArgs]) time.Time {
	return time.Now().Add(backoff(retryBackoffBase, retryBackoffMax, job.Attempt))
}

// backoff is the pause after failed attempt number attempt (from 1): base
// doubled per earlier failure, capped at limit, plus up to 20% jitter.
func backoff(base, limit time.Duration, attempt int) time.Duration {
	d := limit
	if n := attempt - 1; n < 40 && base<<max(n, 0) > 0 {
		d = min(base<<max(n, 0), limit)
	}
	return d + time.Duration(mrand.Int64N(int64(d)/5+1))
}

// Work implements river.Worker.
func (w *IngestWorker) Work(ctx context.Context, job *river.Job[IngestArgs]) error {
	m, log := w.cfg.Metrics, w.cfg.Logger.With("job_id", job.ID, "batch_id", job.Args.BatchID, "attempt", job.Attempt)
	observeQueueWait(m, job.JobRow)
	if w.cfg.Drain != nil {
		var untrack func()
		ctx, untrack = w.cfg.Drain.Track(ctx, job.Args.BatchID)
		defer untrack()
	}
	holder := w.holderID(job)
	var (
		a       lease.Acquisition
		held    *lease.Holding
		over    *deferral
		started *batch.Batch
		err     error
	)
	if w.cfg.MaxRunningPerTenant > 0 {
		a, held, over, err = w.acquireFair(ctx, job.Args.BatchID, holder)
	} else {
		a, held, started, err = w.acquireAndBegin(ctx, job.Args.BatchID, holder)
	}
	if err != nil {
		m.Deliveries.WithLabelValues("retry").Inc()
		return err
	}
	if over != nil {
		m.Deliveries.WithLabelValues("snoozed_tenant_cap").Inc()
		m.TenantCapDeferrals.Inc()
		log.Info("tenant at its cap of running batches while another tenant waits: snoozing",
			"tenant_id", over.tenant, "running", over.running, "cap", w.cfg.MaxRunningPerTenant,
			"waiting_tenant_id", over.waiting, "jobs_moved_behind", over.moved, "snooze_seconds", minSnoozeDefault.Seconds())
		return river.JobSnooze(minSnoozeDefault)
	}
	switch a.Outcome {
	case lease.NotFound:
		m.LeaseAcquisitions.WithLabelValues("not_found").Inc()
		m.Deliveries.WithLabelValues("cancelled").Inc()
		log.Warn("batch not found: cancelling job")
		return river.JobCancel(fmt.Errorf("batch %d not found", job.Args.BatchID))
	case lease.Terminal:
		m.LeaseAcquisitions.WithLabelValues("terminal").Inc()
		m.Deliveries.WithLabelValues("skipped_terminal").Inc()
		log.Info("batch is terminal: nothing to do", "status", a.Status)
		return nil
	case lease.Held:
		m.LeaseAcquisitions.WithLabelValues("contended").Inc()
		m.Deliveries.WithLabelValues("snoozed_contended").Inc()
		wait := max(a.PreviousExpiresAt.Sub(a.Now)+time.Second, minSnoozeDefault)
		log.Info("lease held by another delivery: snoozing until its expiry",
			"holder", a.PreviousHolder, "holder_expires_at", a.PreviousExpiresAt, "snooze_seconds", wait.Seconds())
		return river.JobSnooze(wait)
	}
	if a.TakenOver {
		m.LeaseAcquisitions.WithLabelValues("taken_over").Inc()
		m.TakeoverDelay.Observe(a.TakeoverDelay().Seconds())
		log.Warn("took over an expired lease", "previous_holder", a.PreviousHolder, "takeover_delay_seconds", a.TakeoverDelay().Seconds())
	} else {
		m.LeaseAcquisitions.WithLabelValues("acquired").Inc()
	}
	log = log.With("tenant_id", a.TenantID, "lease_id", holder, "lease_generation", a.Lease.Generation)
	m.LeasesHeld.Inc()
	defer m.LeasesHeld.Dec()

	log.Info("lease acquired: working on batch")
	workCtx := held.Context()
	res, err := pipeline.ExecuteChecked(workCtx, w.cfg.Store, a.Lease, held.Verify, held, w.cfg.Pipelines, started)
	leaseLost := errors.Is(context.Cause(workCtx), ErrLeaseLost)
	last := held.Close()

	// Release so a successor need not wait for expiry, unless the terminal
	// write that ended the batch released it already.
	if err != nil || (res.Outcome != pipeline.Succeeded && res.Outcome != pipeline.Failed) {
		relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		if _, rerr := w.cfg.Leases.Release(relCtx, last); rerr != nil {
			log.Warn("releasing lease failed; it will expire", "error", rerr)
		}
		relCancel()
	}
	if err != nil {
		m.Deliveries.WithLabelValues("retry").Inc()
		return err
	}
	if leaseLost && res.Outcome == pipeline.Retry {
		res.Outcome = pipeline.LeaseLost
	}
	if p := w.cfg.PauseBeforeCompletion; p > 0 && (res.Outcome == pipeline.Succeeded || res.Outcome == pipeline.Failed) {
		log.Warn("tests only: pausing between the batch's terminal write and the job's completion", "pause_seconds", p.Seconds())
		time.Sleep(p)
	}
	return w.finish(ctx, job, res, log)
}

// acquireAndBegin acquires the batch's lease and makes the pipeline's first
// checkpoint (pipeline.Begin: the loading phase of a batch not yet loading)
// in one transaction on the operational pool: one commit where there were
// two, and no read of the batch (Begin works on the row the acquisition's
// UPDATE returned). started is the batch as that transaction left it when
// Begin wrote, nil otherwise. A transaction that fails to commit acquired nothing: its
// Holding is closed and the error returned (the delivery is retried).
func (w *IngestWorker) acquireAndBegin(ctx context.Context, batchID int64, holder string) (lease.Acquisition, *lease.Holding, *batch.Batch, error) {
	tx, err := w.cfg.Store.Begin(ctx)
	if err != nil {
		return lease.Acquisition{}, nil, nil, fmt.Errorf("acquiring lease on batch %d: %w", batchID, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	a, held, err := w.renewer.AcquireOnStarting(ctx, tx, batchID, holder, w.start)
	if err != nil {
		return a, nil, nil, err
	}
	var (
		b       batch.Batch
		started bool
	)
	if a.Outcome == lease.Acquired {
		if b, started, err = pipeline.Begin(ctx, tx, w.cfg.Store, a, w.cfg.Pipelines); err != nil {
			held.Close()
			return lease.Acquisition{}, nil, nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if held != nil {
			held.Close()
		}
		return lease.Acquisition{}, nil, nil, fmt.Errorf("acquiring lease on batch %d: committing: %w", batchID, err)
	}
	if held != nil {
		held.Committed()
	}
	if !started {
		return a, held, nil, nil
	}
	return a, held, &b, nil
}

// observeQueueWait records how long job waited in the queue before its
// first fetch: from its insertion to its first attempt, both by the
// database clock. A later fetch (a retry, or the fetch after a snooze,
// which River does not count as an attempt but records in AttemptedBy) is
// not a queue wait.
func observeQueueWait(m *metrics.Metrics, job *rivertype.JobRow) {
	if job.Attempt != 1 || len(job.AttemptedBy) > 1 || job.AttemptedAt == nil {
		return
	}
	m.QueueWait.Observe(max(job.AttemptedAt.Sub(job.CreatedAt), 0).Seconds())
}

// countResume counts, in ingest_resumes_total, a batch an operator resumed
// (enqueue resume put it back to Running) that this delivery finished: the
// resumed publication ran here. The resume request itself is a one-shot
// command that exits before any scrape; its outcome is its JSON line.
func countResume(m *metrics.Metrics, b batch.Batch, outcome string) {
	if d, err := batch.ParseDetails(b.Details); err == nil && d.Resumes > 0 {
		m.Resumes.WithLabelValues(outcome).Inc()
	}
}

// finish maps a pipeline result onto River: completed, snoozed, cancelled
// or retried.
func (w *IngestWorker) finish(ctx context.Context, job *river.Job[IngestArgs], res pipeline.Result, log *slog.Logger) error {
	m := w.cfg.Metrics // log names the tenant already (the acquisition's)
	age := time.Since(res.Batch.StartedAt).Seconds()
	switch res.Outcome {
	case pipeline.Succeeded:
		m.Deliveries.WithLabelValues("worked").Inc()
		m.BatchDuration.WithLabelValues("succeeded").Observe(age)
		countResume(m, res.Batch, "succeeded")
		log.Info("batch succeeded")
		return nil
	case pipeline.Failed:
		m.Deliveries.WithLabelValues("worked").Inc()
		m.BatchDuration.WithLabelValues("failed").Observe(age)
		countResume(m, res.Batch, "failed")
		m.BatchFailures.WithLabelValues(string(res.Phase), string(cmp.Or(res.Reason, "none"))).Inc()
		log.Warn("batch failed", "phase", res.Phase, "reason", res.Reason, "error", res.Err)
		return nil
	case pipeline.SkippedTerminal:
		m.Deliveries.WithLabelValues("skipped_terminal").Inc()
		return nil
	case pipeline.Parked:
		// Not retried and not re-delivered by the sweeper: a loop of
		// deliveries would change nothing. An operator cancels it (enqueue
		// cancel) or deploys a build that can work on it.
		m.Deliveries.WithLabelValues("parked").Inc()
		log.Error("batch parked: this worker cannot or will not work on it (see reason); cancel it, or deploy a build or settings that can", "reason", res.Err)
		return river.JobCancel(fmt.Errorf("batch %d parked: %w", job.Args.BatchID, res.Err))
	case pipeline.LeftToNewer:
		// Not this build's batch: a newer release wrote its details with a
		// change this build cannot honour. The lease is released (Work did),
		// nothing was written, and it is no failure: the job is snoozed
		// (which gives the attempt back) until a newer worker fetches it.
		// Never parked, so a newer worker needs no operator to take it.
		wait := w.cfg.NewerReleaseSnooze
		wait += time.Duration(mrand.Int64N(int64(wait)/5 + 1))
		m.Deliveries.WithLabelValues("left_to_newer_release").Inc()
		log.Warn("batch left to a newer release: its details are of a version this build does not know; lease released, nothing written, job snoozed (no attempt used)",
			"reason", res.Err, "snooze_seconds", wait.Seconds())
		return river.JobSnooze(wait)
	case pipeline.LeaseLost:
		if errors.Is(res.Err, batch.ErrStaleLease) {
			m.StaleWritesRejected.Inc()
		}
		if b, ok := w.cancelledByOperator(ctx, job.Args.BatchID); ok {
			return w.stoppedByOperator(job, b, log)
		}
		m.Deliveries.WithLabelValues("lease_lost").Inc()
		log.Warn("lease lost mid-way: stopped without further writes", "error", res.Err)
		// Try again shortly: the job then finds a successor's live lease
		// (snooze), a terminal batch (done), or a free lease (continue).
		return river.JobSnooze(minSnoozeDefault)
	}
	// Transient failure or cancellation: the batch keeps its progress.
	if errors.Is(context.Cause(ctx), river.ErrJobCancelledRemotely) {
		if b, ok := w.cancelledByOperator(ctx, job.Args.BatchID); ok {
			return w.stoppedByOperator(job, b, log)
		}
		m.Deliveries.WithLabelValues("cancelled").Inc()
		log.Warn("job cancelled remotely, lease lost (an operator cancelled the batch, or the sweeper re-delivered it after the lease expired): stopped without further writes", "error", res.Err)
		return river.JobCancel(fmt.Errorf("cancelled remotely: %w", res.Err))
	}
	// A stopping worker's delivery failed nothing: it was stopped. It is
	// snoozed, which gives River's attempt back, so a batch interrupted on
	// its last attempt is delivered again at once instead of being
	// discarded to wait for the sweeper, and restarts never use up the
	// attempts meant for failures.
	if errors.Is(context.Cause(ctx), drain.ErrWillNotFinish) {
		m.Deliveries.WithLabelValues("interrupted").Inc()
		log.Info("delivery given up by the draining worker: batch left resumable, job snoozed (the attempt is given back)", "error", res.Err, "snooze_seconds", minSnoozeDefault.Seconds())
		return river.JobSnooze(minSnoozeDefault)
	}
	if ctx.Err() != nil {
		m.Deliveries.WithLabelValues("interrupted").Inc()
		log.Info("delivery interrupted by shutdown: batch left resumable, job snoozed (the attempt is given back)", "error", res.Err, "snooze_seconds", minSnoozeDefault.Seconds())
		return river.JobSnooze(minSnoozeDefault)
	}
	if job.Attempt >= job.MaxAttempts {
		return w.giveUp(ctx, job, res, log)
	}
	m.Deliveries.WithLabelValues("retry").Inc()
	log.Warn("transient failure: will retry", "error", res.Err)
	return res.Err
}

// cancelledByOperator returns the batch if an operator cancelled it.
func (w *IngestWorker) cancelledByOperator(ctx context.Context, batchID int64) (batch.Batch, bool) {
	b, err := w.cfg.Store.Get(context.WithoutCancel(ctx), batchID)
	return b, err == nil && b.CancelledAt != nil
}

// stoppedByOperator ends a delivery whose batch an operator cancelled: one
// line naming who (cancelled_by) and why (reason), and when, and the job
// cancelled.
func (w *IngestWorker) stoppedByOperator(job *river.Job[IngestArgs], b batch.Batch, log *slog.Logger) error {
	w.cfg.Metrics.Deliveries.WithLabelValues("cancelled").Inc()
	log.Warn("batch cancelled by an operator: stopped without further writes",
		"cancelled_by", deref(b.CancelledBy), "reason", deref(b.CancelReason), "cancelled_at", b.CancelledAt)
	return river.JobCancel(fmt.Errorf("batch %d cancelled by %s: %s", job.Args.BatchID, deref(b.CancelledBy), deref(b.CancelReason)))
}

// giveUp records a batch whose transient failures outlasted every attempt as
// failed, so its scope does not stay reserved by a batch nobody retries.
// It holds the batch's lease through the renewer like any delivery: the
// term is renewed while the warehouse stamp is read back (however slow the
// read), the read stops when the term is lost, and the final write is
// fenced on the term, so it lands only while the term is held.
func (w *IngestWorker) giveUp(ctx context.Context, job *river.Job[IngestArgs], res pipeline.Result, log *slog.Logger) error {
	m := w.cfg.Metrics
	m.Deliveries.WithLabelValues("failed").Inc()
	a, held, err := w.renewer.Acquire(ctx, job.Args.BatchID, w.holderID(job))
	if err != nil || a.Outcome != lease.Acquired {
		return res.Err
	}
	marked := false
	defer func() {
		last := held.Close()
		if marked {
			return // the terminal write released the lease
		}
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if _, err := w.cfg.Leases.Release(relCtx, last); err != nil {
			log.Warn("releasing lease failed; it will expire", "error", err)
		}
	}()
	hctx := held.Context()
	b, err := w.cfg.Store.Get(hctx, job.Args.BatchID)
	if err != nil {
		return res.Err
	}
	d, err := batch.ParseDetails(b.Details)
	if err != nil {
		return res.Err
	}
	// Never assume the work did not commit: the pipeline reads it back.
	if s, ok := w.cfg.Pipelines[b.SourceType].(pipeline.Settler); ok {
		if d, err = s.Settle(hctx, b, d); err != nil {
			log.Warn("giving up: could not tell whether the batch committed; it stays Running for a later delivery", "error", err)
			return res.Err
		}
	}
	phase := batch.PhaseFailedPreCommit
	if d.RedshiftCommitted {
		phase = batch.PhaseFailedPublication
	}
	msg := fmt.Sprintf("gave up after %d attempts: %v", job.Attempt, res.Err)
	if _, err := w.cfg.Store.MarkFailed(hctx, held.Lease().Fence(), d, phase, msg); err != nil {
		log.Warn("giving up: recording the batch failed was refused or failed; it stays Running for a later delivery", "error", err)
		return res.Err
	}
	marked = true
	log.Error("batch failed after exhausting retries", "phase", phase, "error", res.Err)
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// holderID makes a lease holder id unique to this delivery.
func (w *IngestWorker) holderID(job *river.Job[IngestArgs]) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/job-%d/attempt-%d/%s", w.cfg.HolderPrefix, job.ID, job.Attempt, hex.EncodeToString(b[:]))
}
