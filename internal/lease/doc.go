// Package lease implements the execution lease on an ingestion batch: the
// guarantee, kept by PostgreSQL, that at most one delivery works on a Running
// batch at a time.
//
// A lease is three columns of ingestion_batches: execution_lease_id (the
// holder, unique per delivery), execution_lease_expires_at (always computed
// from the database clock — now() + ttl for a renewal, clock_timestamp() +
// ttl for an acquisition, which may have waited inside its transaction —
// never from the caller's clock) and
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
// Audit trail: the statements that acquire and release leases, and the
// terminal fenced writes that end them, record every term in the column
// execution_lease_terms (holder, generation, acquisition time, final expiry,
// release time; the last batch.AuditLimit terms), and the fenced write
// records each accepted write with its generation (details.writes). A term is
// closed when it ends — released, ended by a terminal write, or taken over
// after it expired — with its final expiry copied from
// execution_lease_expires_at; while it is open the row's column is its
// expiry. Renewals touch neither the trail nor the details document: they
// update the two narrow columns execution_lease_expires_at and
// execution_lease_renewed_at, so their cost does not grow with the batch, and
// no lease operation ever rewrites a details document (of whatever version).
// The chaos suite's invariant checker reads the trail to prove that no two
// terms overlapped and that no stale-generation write was accepted.
//
// Renewing many terms: a worker process renews every term it holds with one
// statement per renewal period (Store.RenewMany, driven by a Renewer shared
// by its deliveries). The terms that come back lost are fenced one by one:
// their deliveries' work contexts are cancelled with ErrLost.
//
// Renewals are isolated per row. The statement locks the rows it renews
// with FOR NO KEY UPDATE SKIP LOCKED, so a row another transaction has
// locked (an operator's open transaction, a slow cancel, the holder's own
// fenced write in flight) never makes it wait: that term comes back Busy —
// the statement's snapshot, a read that waits on no lock, still shows it
// held — and is retried alone at once (Store.RenewWaiting, waiting at most
// a quarter of the period, and never more than a second, under SET LOCAL
// lock_timeout). A term whose row is still locked is unknown: not renewed,
// not lost, not counted or logged as lost (ingest_lease_renewals_total
// counts it "busy"). It is retried every quarter period and keeps its local
// deadline, at which it fences itself if no renewal came first. The other
// terms of the process are renewed as usual.
//
// A term as its holder sees it:
//
//	          renewed (deadline moves on)
//	            ┌───────┐
//	            ▼       │       row locked: skipped, retried alone
//	Acquire ─▶ held ────┴────────────────────────▶ unknown (busy)
//	            │  ▲                                  │   │
//	            │  └──── renewed once the lock ends ──┘   │
//	            │ renewal or check finds it gone,         │ local deadline
//	            │ or local deadline passes                │ passes
//	            ▼                                         │
//	         fenced: work context cancelled (ErrLost) ◀───┘
//
// Local deadlines and the safety margin: the only clock is the database's.
// A holder that sent an acquisition or renewal at local time t, answered
// with expiry e at database time n, stops working by t + (e − n) − m on
// its own clock, m being the safety margin (RenewerConfig.SafetyMargin;
// worker run --lease-safety-margin): clock skew between the two cancels
// out, and the deadline errs early by the request's latency plus m, never
// late. A term whose renewals keep failing, or whose row stays locked, is
// fenced at that deadline — m before the database lets a successor take the
// batch over, so that work in flight when its context is cancelled (a
// warehouse COMMIT) has m to end. The check a holder makes right before an
// irreversible step (Holding.Verify, the lease check the warehouses run
// before their commit) asks the database for more than m left:
// execution_lease_expires_at > now() + m (Store.Check); a term with m or
// less left is fenced and its commit refused. The default margin is
// DefaultSafetyMargin: a tenth of the TTL, at least the quarter period after
// which a failed renewal is retried (and 100 ms), at most half of TTL −
// period; a margin must be shorter than TTL − period, or a term renewed on
// time would reach it.
//
// Concurrent acquirers are serialised by the row lock the UPDATE takes;
// under READ COMMITTED the losers re-evaluate the conditions against the
// winner's committed row and see a live lease.
package lease
