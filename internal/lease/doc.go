// Package lease implements the execution lease on an ingestion batch: the
// guarantee, kept by PostgreSQL, that at most one delivery works on a Running
// batch at a time.
//
// A lease is three columns of ingestion_batches: execution_lease_id (the
// holder, unique per delivery), execution_lease_expires_at (always computed
// from the database clock, now() + ttl, never from the caller's clock) and
// execution_lease_generation (a fencing token that increases on every
// acquisition and never decreases).
//
// State machine of one batch's lease:
//
//	               Acquire (gen+1)
//	┌────────┐ ─────────────────────────▶ ┌────────────────────┐ ──┐
//	│  free  │                            │ held(id, gen, exp) │   │ Renew: exp = now()+ttl
//	└────────┘ ◀───────────────────────── └────────────────────┘ ◀─┘ (only by (id, gen) and
//	    ▲        Release by (id, gen), or      │        ▲            only while exp > now())
//	    │        a terminal fenced write       │        │
//	    │                                      │ now() ≥ exp
//	    │                                      ▼        │ Acquire by another id (gen+1):
//	    │                              ┌────────────────┐ "taken over"
//	    └──────── Release ──────────── │    expired     │─┘
//	                                   └────────────────┘
//
// Rules:
//
//   - Acquire succeeds only while the batch is Running and the lease is free
//     or expired. A live lease held by another delivery is never taken: the
//     caller gets Held with the holder's expiry, so it can wait until then.
//     A batch that is not Running (Succeeded, Failed) is Terminal and cannot
//     acquire a lease.
//   - Renew extends exactly the term held, (id, generation), and only while
//     it has not expired. A holder that was paused past its expiry finds its
//     renewal refused even if nobody took over yet, and must stop working.
//   - Release frees the lease only for the (id, generation) that holds it.
//   - Every state write a holder makes (batch.Store.WriteDetails,
//     MarkSucceeded, MarkFailed) carries the Fence of its term and is
//     rejected by the database unless the batch is still Running and held by
//     that exact unexpired term. A worker paused past its expiry therefore
//     cannot overwrite its successor: the successor's acquisition bumped the
//     generation.
//
// Audit trail: the same statements record every term in the batch details
// (details.leases: holder, generation, acquisition time, last expiry,
// renewals, release time), and the fenced write records each accepted write
// with its generation (details.writes). Writes from Go never replace these
// trails. The chaos suite's invariant checker reads them to prove that no two
// terms overlapped and that no stale-generation write was accepted.
//
// Concurrent acquirers are serialised by the row lock the UPDATE takes;
// under READ COMMITTED the losers re-evaluate the conditions against the
// winner's committed row and see a live lease.
package lease
