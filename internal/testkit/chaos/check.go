package chaos

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/lease"
)

// Expectation is what one generated folder should end as.
type Expectation struct {
	TenantID string
	Scope    string
	// Records is how many records the folder holds.
	Records int64
	// Bad folders hold malformed data: their batches must end Failed with
	// failed_pre_commit, and they must leave no slice.
	Bad bool
}

// Report is the invariant checker's verdict.
type Report struct {
	Batches    int
	Succeeded  int
	Failed     int
	Running    int
	Violations []string
}

func (r *Report) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// Check verifies the invariants of a finished scenario, reading only the
// database (operational table, its audit trails, and the warehouse):
//
//   - no batch is left Running (no scope reserved by a batch nobody finishes);
//   - every batch ended Succeeded, or Failed with failed_pre_commit for a
//     folder that was deliberately malformed;
//   - lease terms of a batch (its execution_lease_terms trail) never
//     overlap: each acquisition starts at or after the previous term's
//     release or final expiry, and every term but a live last one was
//     closed with its final expiry recorded;
//   - every accepted state write lies within the term of the generation that
//     made it (no stale-generation write was accepted);
//   - for every good folder, its newest batch succeeded and the warehouse
//     slice holds exactly the folder's records, once, stamped with that
//     batch, which was published exactly once; bad folders leave no slice.
func Check(ctx context.Context, pool *pgxpool.Pool, expect []Expectation) (Report, error) {
	return CheckWith(ctx, pool, pool, expect)
}

// CheckWith is Check for a warehouse in another database: its curated
// tables are read through warehouse (the Redshift Data API double's).
func CheckWith(ctx context.Context, pool, warehouse *pgxpool.Pool, expect []Expectation) (Report, error) {
	var r Report
	rows, err := pool.Query(ctx, `
		SELECT id, tenant_id, source_scope, status, details,
		       execution_lease_terms, execution_lease_generation, execution_lease_expires_at,
		       COALESCE(to_jsonb(b)->>'batch_uid', '')
		FROM ingestion_batches b WHERE source_scope IS NOT NULL ORDER BY id`)
	if err != nil {
		return r, err
	}
	type row struct {
		id            int64
		uid           string // empty before batch identity (a schema without the column)
		tenant, scope string
		status        batch.Status
		details       batch.Details
	}
	latest := map[[2]string]row{}
	for rows.Next() {
		var (
			b        row
			raw, trl []byte
			trail    lease.Trail
		)
		if err := rows.Scan(&b.id, &b.tenant, &b.scope, &b.status, &raw, &trl, &trail.Generation, &trail.ExpiresAt, &b.uid); err != nil {
			return r, err
		}
		r.Batches++
		d, err := batch.ParseDetails(raw)
		if err != nil {
			r.violate("batch %d: details unreadable: %v", b.id, err)
			continue
		}
		b.details = d
		latest[[2]string{b.tenant, b.scope}] = b // ids ascend: the last one wins
		switch b.status {
		case batch.StatusRunning:
			r.Running++
			r.violate("batch %d is still Running in phase %s: its scope stays reserved", b.id, d.Phase)
		case batch.StatusSucceeded:
			r.Succeeded++
		case batch.StatusFailed:
			r.Failed++
		}
		if trail.Terms, err = lease.ParseTerms(trl); err != nil {
			r.violate("batch %d: lease trail unreadable: %v", b.id, err)
			continue
		}
		checkTerms(&r, b.id, trail, d.Writes)
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	rows.Close()

	bad := map[[2]string]bool{}
	for _, e := range expect {
		bad[[2]string{e.TenantID, e.Scope}] = e.Bad
	}
	// Failed batches must be explained by an injected fault.
	frows, err := pool.Query(ctx, `SELECT id, tenant_id, source_scope, details->>'phase', COALESCE(details->'lastError'->>'message', '') FROM ingestion_batches WHERE status = 'Failed' AND source_scope IS NOT NULL`)
	if err != nil {
		return r, err
	}
	for frows.Next() {
		var (
			id                int64
			tenant, scope, ph string
			message           string
		)
		if err := frows.Scan(&id, &tenant, &scope, &ph, &message); err != nil {
			return r, err
		}
		if !(bad[[2]string{tenant, scope}] && batch.Phase(ph) == batch.PhaseFailedPreCommit) {
			r.violate("batch %d failed (%s: %s) without an injected data fault", id, ph, message)
		}
	}
	if err := frows.Err(); err != nil {
		return r, err
	}
	frows.Close()

	for _, e := range expect {
		key := [2]string{e.TenantID, e.Scope}
		var (
			stampID, stampCount         *int64
			total, distinct, minB, maxB int64
			pubs                        int64
		)
		err := warehouse.QueryRow(ctx, `
			SELECT (SELECT batch_id FROM curated.fleet_slices WHERE tenant_id = $1 AND source_scope = $2),
			       (SELECT record_count FROM curated.fleet_slices WHERE tenant_id = $1 AND source_scope = $2),
			       count(*), count(DISTINCT (object_key, line_number)), COALESCE(min(batch_id), 0), COALESCE(max(batch_id), 0)
			FROM curated.fleet_records WHERE tenant_id = $1 AND source_scope = $2`, e.TenantID, e.Scope).
			Scan(&stampID, &stampCount, &total, &distinct, &minB, &maxB)
		if err != nil {
			return r, err
		}
		if e.Bad {
			if stampID != nil || total != 0 {
				r.violate("bad folder %s of %s left a slice (%d records)", e.Scope, e.TenantID, total)
			}
			continue
		}
		b, ok := latest[key]
		switch {
		case !ok:
			r.violate("folder %s of %s never got a batch", e.Scope, e.TenantID)
			continue
		case b.status != batch.StatusSucceeded:
			r.violate("folder %s of %s: newest batch %d is %s, not Succeeded", e.Scope, e.TenantID, b.id, b.status)
			continue
		case stampID == nil || *stampID != b.id:
			r.violate("folder %s of %s: slice stamped with %v, not with its newest succeeded batch %d", e.Scope, e.TenantID, deref(stampID), b.id)
		case *stampCount != e.Records || total != e.Records || distinct != e.Records:
			r.violate("folder %s of %s: want %d records once, slice says %d, holds %d (%d distinct)", e.Scope, e.TenantID, e.Records, *stampCount, total, distinct)
		case minB != b.id || maxB != b.id:
			r.violate("folder %s of %s: records stamped with batches %d..%d, want only %d", e.Scope, e.TenantID, minB, maxB, b.id)
		}
		// The batch's publications: of its folder, by its id and, where the
		// schema has batch identity, its uid (a batch the database forgot
		// may have been handed the same id, and published as itself).
		if err := warehouse.QueryRow(ctx, `
			SELECT count(*) FROM curated.fleet_publications p
			WHERE tenant_id = $2 AND source_scope = $3 AND batch_id = $1
			  AND ($4 = '' OR to_jsonb(p)->>'batch_uid' IS NULL OR to_jsonb(p)->>'batch_uid' = $4)`,
			b.id, e.TenantID, e.Scope, b.uid).Scan(&pubs); err != nil {
			return r, err
		}
		if pubs != 1 {
			r.violate("batch %d published %d times, want once", b.id, pubs)
		}
	}
	return r, nil
}

func deref(p *int64) any {
	if p == nil {
		return "nothing"
	}
	return *p
}

// checkTerms verifies the lease trail of one batch: consecutive terms do not
// overlap, every term but a live last one was closed, and every accepted
// write lies within its own term.
func checkTerms(r *Report, id int64, trail lease.Trail, writes []batch.FencedWrite) {
	terms := append([]lease.Term(nil), trail.Terms...)
	sort.Slice(terms, func(i, j int) bool { return terms[i].Generation < terms[j].Generation })
	// end is when a term stopped holding the lease. An open term is the
	// row's current one (its end is the row's live expiry) or was never
	// closed, which loses its end.
	end := func(t lease.Term) (time.Time, bool) {
		switch {
		case t.Closed:
			return t.End(), true
		case t.Generation == trail.Generation && trail.ExpiresAt != nil:
			return *trail.ExpiresAt, true
		}
		r.violate("batch %d: term %d (%s) was never closed: its end is unknown", id, t.Generation, t.LeaseID)
		return t.ExpiresAt, false
	}
	byGen := map[int64]lease.Term{}
	ends := map[int64]time.Time{}
	for i, t := range terms {
		byGen[t.Generation] = t
		ends[t.Generation], _ = end(t)
		if i == 0 {
			continue
		}
		prev := terms[i-1]
		if t.Generation != prev.Generation+1 {
			r.violate("batch %d: lease generations jump from %d to %d", id, prev.Generation, t.Generation)
		}
		if t.At.Before(ends[prev.Generation]) {
			r.violate("batch %d: term %d (%s) started at %s before term %d (%s) ended at %s: two holders at once",
				id, t.Generation, t.LeaseID, t.At, prev.Generation, prev.LeaseID, ends[prev.Generation])
		}
	}
	oldest := int64(0)
	if len(terms) > 0 {
		oldest = terms[0].Generation
	}
	for _, w := range writes {
		t, ok := byGen[w.Generation]
		if !ok {
			if w.Generation >= oldest {
				r.violate("batch %d: write of phase %s by generation %d, which never held the lease", id, w.Phase, w.Generation)
			}
			continue // older than the bounded trail
		}
		if w.LeaseID != t.LeaseID {
			r.violate("batch %d: write by %s under generation %d held by %s", id, w.LeaseID, w.Generation, t.LeaseID)
		}
		if w.At.Before(t.At) || w.At.After(ends[w.Generation]) {
			r.violate("batch %d: write of phase %s at %s outside its term %d [%s, %s]: a stale write was accepted",
				id, w.Phase, w.At, w.Generation, t.At, ends[w.Generation])
		}
		if next, ok := byGen[w.Generation+1]; ok && !w.At.Before(next.At) {
			r.violate("batch %d: write by generation %d at %s after generation %d took over at %s",
				id, w.Generation, w.At, next.Generation, next.At)
		}
	}
}

// Summary is the one-line summary a scenario prints.
func Summary(scenarios, faults, batches, violations int) string {
	return fmt.Sprintf("scenarios %d, faults injected %d, batches %d, invariant violations %d", scenarios, faults, batches, violations)
}
