package jobs

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// ClientConfig configures a River client that works ingest jobs.
type ClientConfig struct {
	// Concurrency is how many batches this process works at once.
	Concurrency int
	// RescueStuckJobsAfter is River's rescue interval for jobs left
	// running: notification jobs (OutcomeWorker, DeliveryWorker) are
	// retried after it and their timeout; ingest jobs, whose timeout is
	// disabled, never are (takeover of crashed batches goes by the lease:
	// see the Sweeper). Defaults to River's (1 h); the worker's default is
	// 2 min.
	RescueStuckJobsAfter time.Duration
	// FetchPollInterval defaults to River's (1 s); LISTEN/NOTIFY usually
	// wakes workers sooner.
	FetchPollInterval time.Duration
	// PollOnly makes River poll for jobs every FetchPollInterval and never
	// LISTEN: what a pooler in transaction mode requires (LISTEN through it
	// would silently receive nothing). Leadership changes are then noticed
	// within River's poll period (5 s) instead of at once.
	PollOnly bool
	// ID identifies the client in River (e.g. the pod name).
	ID     string
	Logger *slog.Logger
	// Notify, if set, registers the notification workers (OutcomeWorker,
	// DeliveryWorker) and, when its Concurrency is positive, works
	// NotifyQueue with that many workers.
	Notify *NotifyConfig
}

// NewWorkerClient returns a River client that works ingest jobs with w.
func NewWorkerClient(pool *pgxpool.Pool, w *IngestWorker, cfg ClientConfig) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, w); err != nil {
		return nil, err
	}
	queues := map[string]river.QueueConfig{Queue: {MaxWorkers: max(cfg.Concurrency, 1)}}
	if cfg.Notify != nil {
		if err := addNotifyWorkers(workers, pool, *cfg.Notify); err != nil {
			return nil, err
		}
		if cfg.Notify.Concurrency > 0 {
			queues[NotifyQueue] = river.QueueConfig{MaxWorkers: cfg.Notify.Concurrency}
		}
	}
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:                   cfg.ID,
		Queues:               queues,
		Workers:              workers,
		JobTimeout:           -1,
		RescueStuckJobsAfter: cfg.RescueStuckJobsAfter,
		FetchPollInterval:    cfg.FetchPollInterval,
		PollOnly:             cfg.PollOnly,
		Logger:               cfg.Logger,
	})
}

// NewInsertClient returns a River client that only inserts jobs.
func NewInsertClient(pool *pgxpool.Pool, logger *slog.Logger) (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: logger})
}
