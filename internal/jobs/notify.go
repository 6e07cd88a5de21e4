package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/notify"
)

// NotifyQueue is the River queue of outcome notifications: a queue of its
// own, so a slow or failing receiver never delays a load and a burst of
// loads never delays an answer to a receiver. Its jobs never touch a
// batch's lease.
const NotifyQueue = "fleet_notify"

// Notification defaults (worker flags --notify-*).
const (
	NotifyMaxAttemptsDefault = 12
	NotifyRetryBaseDefault   = 10 * time.Second
	NotifyRetryMaxDefault    = time.Hour
	NotifyTimeoutDefault     = 30 * time.Second
)

// OutcomeArgs is the job the Outbox inserts with every outcome of a batch,
// in the transaction that writes it. Its worker (OutcomeWorker) fans it out
// into one DeliveryArgs job per destination the tenant names at the time
// it runs.
type OutcomeArgs struct {
	Notification notify.Notification `json:"notification"`
}

// Kind implements river.JobArgs.
func (OutcomeArgs) Kind() string { return "fleet_outcome" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (OutcomeArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: NotifyQueue, MaxAttempts: MaxAttempts}
}

// DeliveryArgs is one notification to one destination of its tenant,
// named by its name in the destinations file (the file, not the job,
// holds the URL and the secret).
type DeliveryArgs struct {
	Destination  string              `json:"destination"`
	Notification notify.Notification `json:"notification"`
}

// Kind implements river.JobArgs.
func (DeliveryArgs) Kind() string { return "fleet_notification" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (DeliveryArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: NotifyQueue, MaxAttempts: NotifyMaxAttemptsDefault}
}

// Outbox is the batch.Outbox of the binaries: it inserts an OutcomeArgs
// job in the transaction of every outcome a batch.Store writes. River is
// the outbox: the job commits with the outcome or not at all.
type Outbox struct {
	river *river.Client[pgx.Tx]
	dests Destinations // nil: every tenant's outcomes
}

// For returns the outbox limited to the outcomes of tenants that have a
// destination in d when the outcome is written (the worker: its
// destinations file), so the batches of a tenant that named none cost no
// job. A destination added to the file reaches the outcomes written after
// the worker reads it again (--notifications-reload).
func (o *Outbox) For(d Destinations) *Outbox { return &Outbox{river: o.river, dests: d} }

// NewOutbox returns an outbox inserting with client (any client of the
// database: it inserts in the caller's transaction only).
func NewOutbox(client *river.Client[pgx.Tx]) *Outbox { return &Outbox{river: client} }

// NewInsertOnlyOutbox returns an outbox with a River client of its own
// that has no pool: it can only insert in a caller's transaction, which
// is all an outbox does. The worker uses it, since its store exists
// before its River client.
func NewInsertOnlyOutbox(logger *slog.Logger) (*Outbox, error) {
	c, err := river.NewClient(riverpgxv5.New(nil), &river.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	return &Outbox{river: c}, nil
}

// Outcome implements batch.Outbox.
func (o *Outbox) Outcome(ctx context.Context, tx pgx.Tx, b batch.Batch) error {
	n, ok := NotificationOf(b)
	if !ok || (o.dests != nil && len(o.dests.Destinations(b.TenantID)) == 0) {
		return nil
	}
	if _, err := o.river.InsertTx(ctx, tx, OutcomeArgs{Notification: n}, insertOpts(b.TenantID, b.ID)); err != nil {
		return fmt.Errorf("inserting the notification of batch %d's outcome: %w", b.ID, err)
	}
	return nil
}

// NotificationOf is the notification of b's outcome as b stands: ok is
// false when b is Running and not parked (no outcome). Its idempotency
// key is the batch's uid, the outcome and the lease generation of the term
// that wrote it (notify.Key): a resumed batch may fail twice.
func NotificationOf(b batch.Batch) (n notify.Notification, ok bool) {
	n = notify.Notification{BatchID: b.ID, BatchUID: b.UID, TenantID: b.TenantID, Folder: strings.TrimPrefix(b.Scope(), folder.ScopePrefix), Status: string(b.Status)}
	switch {
	case b.Status == batch.StatusSucceeded:
		n.Outcome = notify.OutcomeSucceeded
	case b.Status == batch.StatusFailed:
		n.Outcome = notify.OutcomeFailed
	case b.Parked():
		n.Outcome = notify.OutcomeParked
		n.Message = deref(b.ParkedReason)
		n.At = *b.ParkedAt
	default:
		return notify.Notification{}, false
	}
	if b.CompletedAt != nil {
		n.At = *b.CompletedAt
	}
	if d, err := batch.ParseDetails(b.Details); err == nil {
		n.Phase = string(d.Phase)
		if d.LastError != nil && n.Outcome == notify.OutcomeFailed {
			n.Reason, n.Message = string(d.LastError.Reason), d.LastError.Message
		}
	}
	n.IdempotencyKey = notify.Key(b.Ref(), n.Outcome, b.LeaseGeneration)
	return n, true
}

// Destinations are the notification destinations of each tenant
// (notify.Registry, reloaded from its file).
type Destinations interface {
	Destinations(tenant string) []notify.Destination
	Destination(tenant, name string) (notify.Destination, bool)
}

// NotifyConfig configures the notification workers.
type NotifyConfig struct {
	Destinations Destinations
	Sender       interface {
		Send(ctx context.Context, d notify.Destination, n notify.Notification) error
	}
	// Concurrency is how many notifications this process sends at once;
	// 0 means it sends none (its River client does not work NotifyQueue).
	Concurrency int
	// MaxAttempts bounds the attempts of one delivery; defaults to
	// NotifyMaxAttemptsDefault.
	MaxAttempts int
	// RetryBase is the pause after the first failed attempt, doubling
	// after each further one up to RetryMax (plus up to 20% jitter). Default to
	// NotifyRetryBaseDefault and NotifyRetryMaxDefault.
	RetryBase, RetryMax time.Duration
	// Timeout bounds one attempt; defaults to NotifyTimeoutDefault.
	Timeout time.Duration
	Metrics *metrics.Metrics
	Logger  *slog.Logger
}

func (c *NotifyConfig) defaults() {
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = NotifyMaxAttemptsDefault
	}
	if c.RetryBase <= 0 {
		c.RetryBase = NotifyRetryBaseDefault
	}
	if c.RetryMax <= 0 {
		c.RetryMax = NotifyRetryMaxDefault
	}
	c.RetryMax = max(c.RetryMax, c.RetryBase)
	if c.Timeout <= 0 {
		c.Timeout = NotifyTimeoutDefault
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// OutcomeWorker fans an outcome out: one DeliveryArgs job per destination
// of the tenant, inserted in the transaction that completes the outcome
// job (river.JobCompleteTx), so each destination gets exactly one delivery
// job however often the outcome job runs. A tenant without destinations
// completes it with nothing sent.
type OutcomeWorker struct {
	river.WorkerDefaults[OutcomeArgs]
	pool *pgxpool.Pool
	cfg  NotifyConfig
}

// Timeout implements river.Worker: one attempt's bound, as a delivery's.
// Without a bound of its own an outcome job took the client's, which the
// ingest jobs disable (-1), and River's rescuer never rescues a job whose
// timeout is disabled: one left running by a process that died during the
// fan-out, or whose completion a failover to a standby that was behind
// forgot, stayed running for ever and its tenant was never notified.
func (w *OutcomeWorker) Timeout(*river.Job[OutcomeArgs]) time.Duration { return w.cfg.Timeout }

// Work implements river.Worker.
func (w *OutcomeWorker) Work(ctx context.Context, job *river.Job[OutcomeArgs]) error {
	n := job.Args.Notification
	dests := w.cfg.Destinations.Destinations(n.TenantID)
	if len(dests) == 0 {
		return nil
	}
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	params := make([]river.InsertManyParams, 0, len(dests))
	for _, d := range dests {
		opts := insertOpts(n.TenantID, n.BatchID)
		opts.MaxAttempts = w.cfg.MaxAttempts
		params = append(params, river.InsertManyParams{Args: DeliveryArgs{Destination: d.Name, Notification: n}, InsertOpts: opts})
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := client.InsertManyTx(ctx, tx, params); err != nil {
			return fmt.Errorf("inserting the deliveries of %s: %w", n.IdempotencyKey, err)
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// DeliveryWorker sends one notification to one destination. A failed
// attempt is retried with backoff (NextRetry) until MaxAttempts, then
// given up: counted in ingest_notifications_given_up_total{kind} and
// logged at ERROR. A destination removed from the file since is dropped
// (logged, not retried).
type DeliveryWorker struct {
	river.WorkerDefaults[DeliveryArgs]
	cfg NotifyConfig
}

// Timeout implements river.Worker: one attempt's bound.
func (w *DeliveryWorker) Timeout(*river.Job[DeliveryArgs]) time.Duration { return w.cfg.Timeout }

// NextRetry implements river.Worker: RetryBase doubled per failed attempt
// up to RetryMax, plus up to 20% jitter (backoff).
func (w *DeliveryWorker) NextRetry(job *river.Job[DeliveryArgs]) time.Time {
	return time.Now().Add(backoff(w.cfg.RetryBase, w.cfg.RetryMax, job.Attempt))
}

// Work implements river.Worker.
func (w *DeliveryWorker) Work(ctx context.Context, job *river.Job[DeliveryArgs]) error {
	n := job.Args.Notification
	log := w.cfg.Logger.With("batch_id", n.BatchID, "tenant_id", n.TenantID, "outcome", n.Outcome,
		"idempotency_key", n.IdempotencyKey, "destination", job.Args.Destination, "attempt", job.Attempt)
	d, ok := w.cfg.Destinations.Destination(n.TenantID, job.Args.Destination)
	if !ok {
		log.Warn("notification dropped: its destination is no longer in the destinations file")
		return river.JobCancel(fmt.Errorf("destination %q of tenant %q removed", job.Args.Destination, n.TenantID))
	}
	log = log.With("kind", d.Kind)
	err := w.cfg.Sender.Send(ctx, d, n)
	if err == nil {
		log.Info("notification sent")
		return nil
	}
	if job.Attempt >= job.MaxAttempts {
		w.cfg.Metrics.NotificationsGivenUp.WithLabelValues(string(d.Kind)).Inc()
		log.Error("notification given up: every attempt failed", "attempts", job.Attempt, "error", err)
		return err
	}
	log.Warn("notification failed: will retry", "error", err, "attempts_left", job.MaxAttempts-job.Attempt)
	return err
}

// addNotifyWorkers registers the notification workers on workers, for a
// client working NotifyQueue.
func addNotifyWorkers(workers *river.Workers, pool *pgxpool.Pool, cfg NotifyConfig) error {
	cfg.defaults()
	if err := river.AddWorkerSafely(workers, &OutcomeWorker{pool: pool, cfg: cfg}); err != nil {
		return err
	}
	return river.AddWorkerSafely(workers, &DeliveryWorker{cfg: cfg})
}
