// Package redshift is the production warehouse.Warehouse: schema curated in
// Amazon Redshift (Serverless workgroup or provisioned cluster), reached
// through the Redshift Data API, loaded by server-side COPY from staging
// objects in S3. Redshift has no COPY … FROM STDIN, so a load is staged,
// not streamed.
//
// # A load
//
//	read stamp ── newer batch/generation? ──▶ ErrSliceSuperseded (nothing staged)
//	    │
//	stage: records ─▶ gzip NDJSON parts (≤ PartBytes, multipart uploads) ─▶ manifest.json
//	    │   (a record Redshift could not load ─▶ folder.ErrMalformed, naming object and line)
//	    │   ledger: one row per object (key, ETag, size, its records counted
//	    │   while staging, last-modified, the marker's time) ─▶ ledger.ndjson.gz ─▶ ledger-manifest.json
//	    │   errors: one row per bad record skipped within the tolerance ─▶ errors.ndjson.gz ─▶ errors-manifest.json
//	beforeCommit (lease check)
//	    │
//	transaction 1, the COPY — no shared lock, nothing shared written:
//	    DROP TABLE IF EXISTS curated_staging.fleet_load_<batch>_<generation>
//	    CREATE TABLE … (LIKE curated.fleet_records INCLUDING DEFAULTS)
//	    COPY … FROM '<manifest>' IAM_ROLE … MANIFEST FORMAT AS JSON 'auto' GZIP
//	    (the same for the ledger: curated_staging.fleet_load_<batch>_<generation>_objects
//	     LIKE curated.fleet_load_objects, COPY … FROM '<ledger manifest>'; and for
//	     the errors: …_errors LIKE curated.fleet_load_errors)
//	    │
//	beforeCommit (lease check)
//	    │
//	transaction 2, the swap — short, under the writer lock:
//	    LOCK curated.fleet_writer_lock
//	    guard: no newer batch, no later generation      (fails the transaction)
//	    DELETE the slice's records
//	    INSERT INTO curated.fleet_records SELECT … FROM the staging table
//	    guard: the slice holds exactly the staged count
//	    DELETE + INSERT the stamp (committed_at = GETDATE(), the swap's moment)
//	    DELETE the slice's ledger rows, INSERT … SELECT the staged ones
//	    guard: the ledger holds exactly the staged rows, their records the staged count
//	    DELETE the slice's load errors, INSERT … SELECT the staged ones; guard: exactly those
//	    DROP the staging tables
//	    │
//	DescribeStatement until FINISHED, FAILED or ABORTED, or LoadTimeout
//	    │
//	read the stamp back ─▶ the outcome
//
// No tenant waits on another tenant's COPY: a COPY of any length runs in a
// transaction that locks and writes only the load's own staging table;
// the writer lock is held by swaps and publications only, each a handful of
// statements on one slice. Two swaps (or a swap and a publication) are
// serialised by the lock; should Redshift still report a serializable
// isolation violation (1023) or a snapshot-isolation conflict ("could not
// complete because of conflict with concurrent transaction") for either
// transaction, or end it ABORTED, the same transaction is submitted again
// after a backoff (Config.ConflictRetries, RetryBackoff), from the same
// staging: nothing is staged or copied from S3 twice because of a conflict
// on the swap. Conflicts that outlast the retries are transient
// (warehouse.ErrTransient) for the delivery's own retry.
//
// # Why one writer lock, not one per tenant
//
// The issue that moved the COPY out of the lock asked for the lock to be
// partitioned by tenant or scope if one is kept. It is kept, whole, because
// in Redshift a partitioned lock would not let two swaps run at once: write
// locks in Redshift are table-level. Amazon's "Concurrent write examples"
// (docs.aws.amazon.com/redshift/latest/dg/r_Serializable_isolation_example.html)
// shows a second DELETE (or UPDATE, COPY, INSERT) on a table waiting until
// the first transaction holding that table's write lock ends, whatever rows
// either touches. Every swap deletes from and inserts into
// curated.fleet_records and writes curated.fleet_slices, and every
// publication writes fleet_slices and fleet_publications, so two of them
// for unrelated tenants queue on those tables' own write locks with or
// without fleet_writer_lock. A lock per partition would only change where
// they queue and the order the tables are locked in; "Write and read/write
// operations" (…/dg/c_write_readwrite.html) warns that transactions writing
// several tables in different orders deadlock, and says to lock the tables
// in the same order before any DML. Taking fleet_writer_lock first in every
// swap and publication is that order. What the issue was after — no
// tenant waits for another tenant's COPY — holds because no COPY runs under
// a lock on a shared table: the lock's wait is at most the swaps and
// publications ahead of it, each moving one slice's rows inside the
// cluster (TestNoTenantWaitsOnAnotherTenantsCopy). Sharding the curated
// tables themselves (a table per tenant group) would let swaps run in
// parallel; that is a schema change for the readers too, left until a
// cluster shows swap waits that matter (ingest_phase_duration_seconds{phase="load"}).
// The double, backed by PostgreSQL, locks rows, not tables, so it cannot
// show this; the live test's two concurrent loads run against Redshift.
//
// Staging objects live under <prefix>batch-<id>/gen-<lease generation>/: a
// retried delivery stages under its own generation and never overwrites
// what an older, possibly still running, COPY reads. Each line is the
// curated row FORMAT JSON 'auto' maps onto curated.fleet_records: tenant_id,
// source_scope, batch_id, lease_generation, object_key, line_number, and
// record, the record itself as a JSON object loaded into a SUPER column.
// The manifest names exactly the parts of the load, each "mandatory" with
// its meta.content_length, so a missing part fails the COPY and with it the
// transaction. A load with no records stages no records and COPYs none; its
// swap empties the slice. The load ledger (warehouse.LedgerObject: one row
// per object of the load, curated.fleet_load_objects) is always staged,
// as ledger.ndjson.gz with its ledger-manifest.json beside the parts, and
// always COPYed into its own staging table by the first transaction, so
// the swap always replaces it with the slice: the ledger changes exactly
// when the slice does, and a swap rebuilt by a later delivery
// (follow.rebuild) depends on the record count alone. The load errors
// (warehouse.LoadError: the bad records the reader skipped while staging,
// within the import's tolerance, curated.fleet_load_errors) go the same
// way, as errors.ndjson.gz and errors-manifest.json into
// curated_staging.fleet_load_<batch>_<generation>_errors, even when there
// are none; the swap's guard compares them with that staging table, not
// with a count, and the stamp read counts them (Stamp.BadRecords), so a
// later delivery that follows or repeats the swap learns the count the
// staging delivery found.
//
// Values are written into the statements as literals (see sql.go): the
// Data API documents parameters for SELECT, INSERT, UPDATE and DELETE
// only, and these transactions hold LOCK, COPY and DDL. Strings go
// through one quoting function, which doubles single quotes and
// backslashes and refuses NUL and invalid UTF-8; integers are formatted.
// The manifest URL and IAM role come from configuration held to patterns
// without quotes or backslashes.
//
// Limits checked before staging: a staged line over MaxRecordBytes (COPY
// reads at most 4 MB of one JSON object), a string over MaxStringBytes
// (65,535 bytes in a SUPER value unless the cluster opted into 16,000,000),
// nesting deeper than MaxDepth (1,000), and a number beyond DOUBLE
// PRECISION's range (1e400, or 1e-400, which would be stored as 0: no
// number type of a SUPER value holds it; refuseDouble, which the reader
// asks as its folder.RefuseNumber). Invalid UTF-8, NUL (\u0000, or a raw
// NUL in a CSV field), unpaired UTF-16 surrogate escapes and numbers beyond
// PostgreSQL's numeric are refused while the folder is read (package
// folder, for every warehouse). Each refusal is a folder.BadRecord naming
// the object, the line and (for a value of an NDJSON record) the column
// and JSON path, skipped within the import's tolerance.
//
// The warehouse clock decides time: committed_at is GETDATE() when the
// swap runs (not when the load began), published_at when the publication
// runs, and the publication window is the seconds between committed_at and
// GETDATE() in the guard, never the worker's clock.
//
// # Commit detection
//
// A Data API statement runs on the server whatever its client does next,
// and may commit after the client gave up or died. So the outcome of a load
// is always the stamp read back, never the client's view: after FINISHED, and
// after FAILED, ABORTED, a DescribeStatement error or LoadTimeout. Stamped
// with this batch (by this load or an earlier generation of it) means
// committed; stamped with a newer batch or later generation means
// ErrSliceSuperseded; otherwise the statement's failure is returned
// (*StatementError), or, when the outcome is unknown, an error wrapping
// warehouse.ErrTransient: the next delivery reads the stamp before it loads
// again (see package fleet). Redshift's serializable isolation violation
// (1023), an aborted statement and throttling are transient
// (pipeline.IsTransient).
//
// # Following a statement across deliveries
//
// A submitted statement is followed, never resubmitted while it can still
// commit. Each of a load's transactions, and a publication's, is recorded
// with the batch (warehouse.Journal: the batch details'
// warehouseStatement, a fenced write) twice: its submission (kind, lease
// generation, attempt, record count) before it is sent, and its id before
// it is awaited; the record is cleared once the statement is seen to end.
// Every submission carries a ClientToken derived from kind, batch,
// generation and attempt, so repeating it — after a lost answer, a
// throttled request, or by a later delivery that found only the
// submission recorded — returns the statement already running instead of
// starting another.
//
// A later delivery that finds a record follows it before anything else:
// it polls the recorded id (or repeats the recorded submission with its
// token to learn the id) until the statement ends or LoadTimeout
// (QueryTimeout for a publication) passes; still running, the delivery
// ends transient and nothing new is submitted. Once it ended, the stamp
// says whether it committed; a followed COPY's staging table is dropped and
// this delivery stages its own. Settling a batch that exhausted its
// attempts (pipeline.Settler, package fleet) asks StatementEnded first: a
// batch whose statement may still commit stays Running, never
// failed_pre_commit or failed_publication.
//
// Polling backs off from LoadPollInterval (1 s) to LoadPollMax (10 s) for
// a load's transactions, from PollInterval to PollMax for the short ones;
// a DescribeStatement or submission request that fails for a reason that
// may pass (throttling, too many active statements, an internal error, a
// lost connection) is asked again on the same schedule until the
// deadline.
//
// # Fencing and the residual window
//
// The operational lease cannot fence a Redshift transaction. The guard
// refuses to replace a newer stamp; beforeCommit (the lease check) runs
// just before each transaction is submitted, and a delivery whose context
// ends while it waits (its heartbeat found the lease lost, or the worker is
// stopping) cancels its statement. What remains is a delivery that loses its
// lease while its COPY runs and cannot cancel it — a paused or partitioned
// worker. Its transaction may still commit, stamped with its older
// generation of the same batch and the same folder: if the newer delivery
// committed first, the guard refuses it; if not, the newer delivery's load
// replaces it. A publication has the same window; it can only publish the
// batch the slice is stamped with, once.
//
// # Publication
//
// One transaction: lock, guard (stamped with this batch; published already
// or committed within the window, on the warehouse clock), set published_at,
// append the outbox row unless the batch has one. The lock is never held
// through a COPY, so a publication waits at most for other swaps and
// publications. Conflicts are retried as for loads. The stamp read back is
// the outcome, as for loads.
//
// # Staging cleanup
//
// Once a commit is confirmed (by a load, a later load settling on the stamp,
// or a publication) the batch's staging objects of that and older
// generations are deleted; newer generations are left to their own delivery.
// Deletion failures are logged, not returned. A lifecycle rule on the
// staging prefix is the backstop for batches that never commit.
//
// # Schema
//
// Migrator applies migrations/warehouse/redshift through the Data API, each
// file in one transaction with its row in curated.fleet_warehouse_migrations,
// re-checking the version under a lock so concurrent migrators apply it once.
//
// Tests run the warehouse against redshifttest, a Data API double backed by
// PostgreSQL; its package comment says what it does not emulate.
package redshift
