// Package batch is the store of ingestion batches: the one operational table
// ingestion_batches and every operation on it.
//
// Date-scoped batches (Brink POS, KDS CDC) keep their pre-Fleet behaviour:
// Create, UpdateStatus, UpdateDetails and the is_current helpers (SetCurrent,
// GetCurrent), keyed by tenant, business date and pipeline stage. They have no
// source scope and never take part in reservations.
//
// Scoped batches (Fleet) have a NULL business date and a source scope such as
// fleet_s3:{canonicalFolder}. Their lifecycle:
//
//	Reserve ──▶ Running/reserved ──(lease holder, fenced writes)──▶ loading ──▶ committed ──▶ publishing ──▶ Succeeded/published
//	   │              │                    │                              │
//	   │ job insert   │                    │ pre-commit failure            │ publication failure
//	   │ failed       ▼                    ▼                              ▼
//	   └────▶ Failed/failed_enqueue   Failed/failed_pre_commit       Failed/failed_publication ──Resume──▶ Running/committed
//	                                   (terminal: new batch)                   │
//	                                                                           ├─▶ Failed/superseded (slice replaced)
//	                                                                           └─▶ Failed/publication_expired (window passed)
//
// Operator control (any Running scoped batch):
//
//	Running ──Cancel──▶ Failed/cancelled   (lease generation +1: the holder is fenced; scope free)
//	Running ──Park (under the lease)──▶ Running, parked (details untouched; not re-delivered)
//	Running, parked ──Unpark (a delivery, or a newer build's sweep)──▶ Running
//
// Cancel records who asked and why in columns (and, when this build can read
// the details, phase cancelled and the message as the last error); a
// document of an unknown version is never rewritten. A parked batch keeps its
// scope until it is cancelled or a build that can work on it takes it back
// (jobs.Sweeper). The generic updates (UpdateStatus,
// UpdateDetails, UpdateStatusAndDetails) refuse scoped batches
// (ErrScopedBatch): they would bypass the fence and the resume rules.
//
// Invariants:
//
//   - At most one Running batch per (tenant_id, source_scope), enforced by
//     the unique partial index ux_ingestion_batches_running_scope. Reserve
//     and Resume report a clash as a Conflict outcome carrying the running
//     batch's id; the index violation is recognised by constraint name in
//     one place (isRunningScopeViolation), never by message text.
//   - Expected outcomes are results (ReserveResult, ResumeResult); errors
//     are for invalid input (*ValidationError, nothing written) and
//     infrastructure failures.
//   - Every write a worker makes goes through one fenced statement that
//     requires the batch to be Running and held by the writer's exact
//     unexpired lease term (see package lease); otherwise ErrStaleLease and
//     nothing is written. Terminal writes release the lease.
//   - Details are a versioned JSON document; an unparsable document or an
//     unknown version is never guessed at: Resume refuses with an explicit
//     reason. ParseDetails is strict where a document is ambiguous or
//     broken (a known key in another case, a repeated key, a wrong type, an
//     unknown phase) and tolerant of keys a newer build added within the
//     version: it keeps them, and every write of this build writes them
//     back (see DetailsVersion).
//   - Resume requires proof from the warehouse (SliceVerifier) that the
//     slice is still stamped with the batch, besides the operational rules.
package batch
