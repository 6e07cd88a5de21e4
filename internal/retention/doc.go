// Package retention prunes the batch history (enqueue prune): it deletes
// batches of ingestion_batches that completed before a cutoff and that
// nothing still needs, in small transactions that give way to locks.
//
// # What is never deleted
//
// A batch is prunable only when every one of these holds:
//
//   - it is a Fleet batch: it has a source scope (its folder). Date-scoped
//     batches of the table's older pipelines are not this program's and are
//     never touched;
//   - it is terminal: Succeeded or Failed, never Running (a parked batch
//     is Running: an operator still has to cancel it), and it completed
//     (completed_at) before the cutoff, by the database clock;
//   - it is not the newest batch of its folder (tenant and source scope,
//     batch.Store.LatestMany's notion): imports (the already_succeeded and
//     resumable skips), enqueue reconcile (it compares a folder with its
//     newest batch's summary of the objects it loaded, and enqueues a folder
//     that has no batch at all), retries and the read API all start from it;
//   - it is not the newest Succeeded batch of its folder: reconcile answers
//     already_succeeded for a folder with any Succeeded batch, and a retry
//     of an older failure is refused while a newer batch succeeded; without
//     it a folder that succeeded once and failed since would look as if it
//     never succeeded;
//   - it is not a failed publication that can still be resumed
//     (batch.ResumablePublicationSQL with the publication window): its load
//     is committed and enqueue resume needs the row;
//   - no batch that is kept names it as the batch it retries (details
//     retryOf, batch.Store.RetriedBy), transitively: the retry chain of
//     every kept batch stays whole, so status and list never link to a
//     batch that is gone. A retry needs nothing else of the batch it
//     retries: a retry of a pruned failure is a retry of its folder's
//     newest batch, which is kept.
//
// # Related rows
//
// No table of the operational database references ingestion_batches by a
// foreign key. River's jobs of a pruned batch are River's: its JobCleaner
// deletes finished jobs on its own schedule. The warehouse (schema curated
// locally, or Redshift) records batch ids with the slice a batch loaded
// (fleet_load_objects, fleet_load_errors, fleet_slices); that is warehouse
// data, replaced when the folder is loaded again, and left alone.
//
// # How
//
// Prune walks the table in id order, at most BatchSize candidates per
// transaction. Each transaction sets lock_timeout (SET LOCAL), applies the
// retry-chain rule over the candidates' folders and deletes the rest with
// one DELETE that checks every rule again on each row as it finds it.
// A retry and a prune of the batch it retries are serialised by that
// batch's row: the retry takes it FOR KEY SHARE in the transaction that
// reserves the new batch (jobs.Enqueuer.Retry), the DELETE takes it FOR
// UPDATE. A retry that comes second waits, finds the batch gone and
// answers not_found. A prune that comes second, once its DELETE holds the
// rows, looks in a statement of its own (a snapshot that shows the retry)
// for a batch naming one of them as the batch it retries; if there is one
// the round is rolled back and tried again, and the retry chain rule keeps
// the batch. No kept batch ever names a deleted one. A transaction that meets a lock held longer than
// lock_timeout (SQLSTATE 55P03: a batch being resumed or updated, or DDL)
// (or a retry, above) is rolled back and tried again up to LockRetries times; then its
// candidates are skipped (counted, left for the next run) and the walk goes
// on, so a prune always ends. A dry run walks the same way, locks
// nothing and deletes nothing.
//
// # Who may prune
//
// The operators' login (fleet_operator): deploy/postgres/roles.sql grants
// it DELETE on ingestion_batches under a row-level security policy that
// lets go only terminal Fleet batches completed more than a day ago that
// are not their folder's newest, whatever the statement; the door's and
// the worker's logins may delete no batch. Every transaction that deletes
// records who (Config.Actor), why (Config.Reason) and the ids it deleted in
// the operators' audit (internal/audit), in the same transaction.
package retention
