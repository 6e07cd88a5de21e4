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
//     reason.
//   - Resume requires proof from the warehouse (SliceVerifier) that the
//     slice is still stamped with the batch, besides the operational rules.
package batch
