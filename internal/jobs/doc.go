// Package jobs connects ingestion batches to River: the Enqueuer reserves a
// batch and inserts its job in one transaction, the IngestWorker runs jobs
// under the batch's execution lease, and the Sweeper re-delivers batches
// whose worker died.
//
// # Deliveries
//
// River delivers jobs at least once, and several jobs may name one batch
// (duplicate notifications, resumes, re-deliveries). Each delivery:
//
//  1. acquires the execution lease with a holder id unique to the delivery
//     (process/job/attempt/random). Not found → the job is cancelled
//     (river.JobCancel). Terminal batch → the job completes with no work.
//     Live lease held by another delivery → river.JobSnooze until just after
//     the holder's expiry (snoozing does not use up attempts): if the holder
//     dies, this delivery takes over; if it finishes, this one finds a
//     terminal batch and completes.
//  2. hands the term to the process's lease.Renewer, which renews every
//     term the process holds with one statement every RenewEvery, on a pool
//     of its own. A renewal that finds the term gone cancels that delivery's
//     work context at once (self-fencing); a statement that fails is retried
//     sooner, and a term whose local deadline (computed from the database
//     clock, see package lease) passes without a renewal is fenced the same
//     way. The delivery stops before its term expires where possible, and
//     the database fence rejects any write that slips through
//     (batch.ErrStaleLease).
//  3. runs the pipeline for the batch's source type (package pipeline),
//     which records durable phases in the batch details under the lease.
//  4. releases the lease on completion, failure and shutdown, so a
//     successor need not wait for expiry.
//
// # Crash takeover is bounded by the lease, not by River's rescuer
//
// River re-delivers a job left "running" by a killed process only after
// RescueStuckJobsAfter, and only a job with a timeout (notification jobs:
// the worker's --rescue-stuck-jobs-after, 2 min by default), and
// IngestWorker disables job timeouts (Timeout returns -1) so that a healthy batch is never killed by a
// timer however long it runs. Takeover therefore comes from the Sweeper:
// every worker process sweeps every SweepInterval (5 s) for Running batches
// whose lease expired by the database clock and inserts one job per
// (batch, expired generation). It decides under the batch's row lock, in the
// statement that finds the candidates, so a delivery taking the lease over
// at the same moment is either seen (nothing is done) or waits for the sweep;
// a running job fetched after the lease expired is a live takeover and is
// neither cancelled nor joined by a new job. A transaction-scoped advisory
// lock keeps two sweepers from running at once, and each sweep sees the jobs
// the previous one queued, so two sweepers cannot both re-deliver it.
//
// Bound: a worker killed just after renewing leaves a lease that expires at
// most LeaseTTL later. The next sweep after that comes within SweepInterval;
// the inserted job is fetched within River's fetch latency (LISTEN/NOTIFY,
// or FetchPollInterval, 1 s, at worst) and takes the lease over at once. So
// a crashed batch is resumed within LeaseTTL + SweepInterval + fetch latency
// ≈ TTL + 6 s, inside the required TTL + 15 s (a worker killed before it
// took the lease is re-delivered within OrphanAfter + SweepInterval). River
// never rescues a job whose timeout is disabled, so the dead process's job
// would stay "running" forever: the Sweeper marks it for cancellation in the
// same transaction
// (River's rescuer then finalises it as cancelled, and if its process was
// only paused, River cancels its context when it wakes).
//
// A healthy batch that runs longer than any River timeout or rescue interval
// keeps its lease renewed, so the Sweeper never sees it expired; if River
// rescues its job anyway and delivers it again, that duplicate finds the
// live lease and snoozes. It is never executed twice at once.
//
// A paused worker (SIGSTOP, a long GC or network stall) that outlives its
// lease is handled the same way: the Sweeper re-delivers, a successor takes
// over with a higher generation, and when the paused worker resumes its
// next renewal finds the lease lost (or its local deadline has passed) and
// every write it attempts is rejected.
//
// # Batches this build cannot work on
//
// A Running batch whose details do not parse or are of an older version
// this build does not know, that is Running in a no-work phase, or whose
// source type has no pipeline, is parked by the delivery that finds it
// (pipeline.Parked, batch.Store.Park): the reason is recorded in columns,
// the details are not rewritten, the job is cancelled (river.JobCancel) and
// the Sweeper does not re-deliver it, so nothing loops. An operator cancels
// it (Enqueuer.Cancel), or a build that can work on it takes it back: its
// Sweeper judges the batches parked for OrphanAfter by its own rules
// (pipeline.Judge) and unparks and re-delivers those it can work on (an
// older release parked them during a rollout).
//
// A batch whose details are of a version newer than this build's is a
// newer release's (pipeline.LeftToNewer): the delivery writes nothing,
// releases the lease and snoozes the job (WorkerConfig.NewerReleaseSnooze),
// which costs no River attempt, until a newer worker fetches it.
//
// # Operator cancel
//
// Enqueuer.Cancel moves a Running batch to Failed/cancelled with one fenced
// transition that also moves the lease generation on, and cancels its River
// jobs in the same transaction. A delivery working on it is stopped by
// River's remote cancel, by its next heartbeat (the renewal is refused) or by
// the fence on its next write, whichever comes first; its warehouse load
// fails the lease check before its commit. finish reports it as cancelled.
//
// # Failures
//
// Handled failures are recorded on the batch (failed_pre_commit,
// failed_publication, superseded, publication_expired) and complete the job.
// Transient failures return an error so River retries with backoff; the
// batch keeps its recorded progress. After MaxAttempts the batch is
// recorded failed (pre-commit or publication, by whether the warehouse
// commit happened) so its scope is not held by a batch nobody retries.
//
// # Graceful shutdown
//
// On SIGTERM the worker stops fetching and lets running batches finish for
// the shutdown grace period; then it cancels them. A cancelled delivery
// writes nothing more, releases its lease and returns an error, so River
// retries the job later and the batch continues from its recorded phase.
package jobs
