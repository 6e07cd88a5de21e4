package batch

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// ReserveManyResult is ReserveMany's answer for one reservation.
type ReserveManyResult struct {
	Outcome ReserveOutcome
	// BatchID is the new Running batch (Reserved), the Running batch that
	// holds the scope (Conflict), or the newest batch of the scope, which
	// succeeded (AlreadySucceeded), is a resumable failed publication
	// (Resumable) or is newer than the batch a re-import was of
	// (Superseded).
	BatchID int64
	// BatchUID is that batch's uid (Batch.UID; empty for a legacy batch).
	BatchUID string
	// DuplicateOf is, for a reservation whose scope an earlier one of the
	// same call named, the index of that earlier one, whose outcome this
	// one's follows; -1 otherwise.
	DuplicateOf int

	// The scope's newest batch as this answer found it, for the requests
	// of the same scope that follow it.
	latestID        int64
	latestUID       string
	latestSucceeded bool
}

// ResumablePublicationSQL is the SQL condition, on the batch row named b,
// that the batch is a failed publication an operator can still resume:
// Failed in phase failed_publication (details of this build's version),
// its warehouse commit done and its publication not, not cancelled, and
// committed less than window ago by the database clock (window: an SQL
// expression of type interval). It is the rule of Store.Resume that the
// operational row alone can decide; Resume proves the warehouse slice
// besides. A folder whose newest batch meets it is not loaded again by
// an import (Reservation.SkipIfResumable): the data is committed, and
// resuming publishes it.
func ResumablePublicationSQL(b, window string) string {
	return `(` + b + `.status = 'Failed' AND ` + b + `.cancelled_at IS NULL
	    AND ` + b + `.details->>'version' = '` + strconv.Itoa(DetailsVersion) + `'
	    AND ` + b + `.details->>'phase' = '` + string(PhaseFailedPublication) + `'
	    AND ` + b + `.details->'redshiftCommitted' = 'true'::jsonb
	    AND ` + b + `.details->'publication'->'completed' IS DISTINCT FROM 'true'::jsonb
	    AND jsonb_typeof(` + b + `.details->'committedAt') = 'string'
	    AND (` + b + `.details->>'committedAt')::timestamptz > now() - (` + window + `))`
}

// reserveManySQL reserves many scopes in one statement, with Reserve's
// rules for each: a Running batch is inserted unless the reservation asks
// to skip a scope whose newest batch succeeded, or to skip one whose newest
// batch is a resumable failed publication (ResumablePublicationSQL, within
// the request's window; 0: not skipped), or one already holds the scope
// (the unique partial index decides, ON CONFLICT DO NOTHING). Rows
// are inserted in (tenant, scope) order, so concurrent bursts over
// overlapping scopes wait on each other in one order. It answers one row
// per input, in input order: the new batch's id when one was inserted; the
// scope's Running batch, found by the unique partial index (never inferred
// from the newest batch: an older batch may be the Running one, after a
// resume, while a newer one failed); and the scope's newest batch and its
// status and whether it is a resumable failed publication, all by the
// statement's snapshot. A re-import of a given batch (reimport_of, 0 for
// none) is inserted only while that batch is the scope's newest.
var reserveManySQL = `
	WITH input AS (
		SELECT *
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::text[], $9::bool[], $10::bigint[], $11::bigint[])
		     WITH ORDINALITY AS i(company_id, tenant_id, tenant_database, ingestion_mode, source_type,
		                          pipeline_stage, details, source_scope, skip_if_succeeded, resumable_window_us, reimport_of, ord)
	), known AS (
		SELECT i.ord, l.id AS latest_id, l.batch_uid AS latest_uid, l.status AS latest_status, l.resumable AS latest_resumable,
		       r.id AS running_id, r.batch_uid AS running_uid
		FROM input i
		LEFT JOIN LATERAL (
			SELECT b.id, b.batch_uid, b.status,
			       i.resumable_window_us > 0
			       AND ` + ResumablePublicationSQL("b", "i.resumable_window_us * interval '1 microsecond'") + ` AS resumable
			FROM ingestion_batches b
			WHERE b.tenant_id = i.tenant_id AND b.source_scope = i.source_scope AND b.source_scope IS NOT NULL
			-- The order of ix_ingestion_batches_scope: no other index can
			-- answer without sorting every batch of the tenant, whatever
			-- the statistics say.
			ORDER BY b.tenant_id, b.source_scope, b.id DESC LIMIT 1
		) l ON true
		LEFT JOIN LATERAL (
			-- At most one row (ux_ingestion_batches_running_scope). Ordered
			-- as ix_ingestion_batches_scope, like the look-up above, so the
			-- planner reads the scope's few index entries even on a table
			-- whose statistics are stale (a generic plan that guessed a
			-- small table scanned every Running batch of the tenant, once
			-- per scope).
			SELECT b.id, b.batch_uid FROM ingestion_batches b
			WHERE b.tenant_id = i.tenant_id AND b.source_scope = i.source_scope
			  AND b.status = 'Running' AND b.source_scope IS NOT NULL
			ORDER BY b.tenant_id, b.source_scope, b.id DESC LIMIT 1
		) r ON true
	), ins AS (
		INSERT INTO ingestion_batches
			(company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			 business_date, pipeline_stage, status, details, source_scope)
		SELECT i.company_id, i.tenant_id, i.tenant_database, i.ingestion_mode, i.source_type,
		       NULL, i.pipeline_stage, 'Running', i.details || jsonb_build_object('updatedAt', now()), i.source_scope
		FROM input i JOIN known k ON k.ord = i.ord
		WHERE NOT (i.skip_if_succeeded AND k.latest_status IS NOT DISTINCT FROM 'Succeeded')
		  AND NOT coalesce(k.latest_resumable, false)
		  AND k.running_id IS NULL
		  AND (i.reimport_of = 0 OR k.latest_id IS NOT DISTINCT FROM i.reimport_of)
		ORDER BY i.tenant_id, i.source_scope
		ON CONFLICT (tenant_id, source_scope) WHERE status = 'Running' AND source_scope IS NOT NULL
		DO NOTHING
		RETURNING id, batch_uid, tenant_id, source_scope
	)
	SELECT i.ord, ins.id, k.running_id, k.latest_id, k.latest_status, coalesce(k.latest_resumable, false),
	       COALESCE(COALESCE(ins.batch_uid, k.running_uid)::text, ''), COALESCE(k.latest_uid::text, '')
	FROM input i
	JOIN known k ON k.ord = i.ord
	LEFT JOIN ins ON ins.tenant_id = i.tenant_id AND ins.source_scope = i.source_scope
	ORDER BY i.ord`

// ReserveMany reserves many scoped batches at once, each with Reserve's rules
// and outcome (Reserved, Conflict with the Running batch, AlreadySucceeded,
// Resumable),
// answered in order: one statement for the whole burst in the common case.
// Run it inside the caller's transaction (WithTx) to commit the burst with
// its jobs. A scope named more than once is sent once: the first request
// decides, and each later one follows it (DuplicateOf) — Conflict with the
// batch the first reserved or met, or AlreadySucceeded with the same batch
// — so one scope named any number of times costs one row of one statement;
// only a re-import after an AlreadySucceeded is decided in a round of its
// own.
// Each scope is decided by its own Running batch and newest batch: no
// scope's history can fail another scope's reservation. Every reservation
// is validated first: a *ValidationError names the first field refused,
// and nothing is written; other errors are infrastructure failures.
func (s *Store) ReserveMany(ctx context.Context, rs []Reservation) ([]ReserveManyResult, error) {
	details := make([]string, len(rs))
	for i := range rs {
		if err := rs[i].Validate(); err != nil {
			return nil, err
		}
		raw, err := rs[i].Details.Marshal()
		if err != nil {
			return nil, err
		}
		details[i] = string(raw)
	}
	out := make([]ReserveManyResult, len(rs))
	pending := make([]int, len(rs))
	for i := range rs {
		out[i].DuplicateOf = -1
		pending[i] = i
	}
	decided := make(map[[2]string]int, len(rs)) // scope → the request that decided it last
	// Each round sends the first undecided request of each scope; a later
	// statement of the transaction sees what earlier ones wrote and what
	// others committed meanwhile. A request stays undecided only when a
	// batch that held its scope committed after the statement's snapshot
	// was taken, or when it asks for a re-import of a scope an earlier
	// request found succeeded (one more round).
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == maxReserveAttempts+2 {
			return nil, fmt.Errorf("reserving %d scopes: gave up after %d rounds racing finishing batches", len(pending), attempt)
		}
		round, rest := firstOfEachScope(rs, pending)
		undecided, err := s.reserveRound(ctx, rs, details, round, out)
		if err != nil {
			return nil, err
		}
		for _, i := range round {
			if !slices.Contains(undecided, i) {
				decided[scopeKey(rs[i])] = i
			}
		}
		// Requests are answered in order, as one by one: a request follows
		// the last decided one of its scope only when no request of the
		// scope before it is still undecided.
		next := append(undecided, rest...)
		slices.Sort(next)
		pending = pending[:0]
		blocked := map[[2]string]bool{}
		for _, i := range next {
			k := scopeKey(rs[i])
			if d, ok := decided[k]; ok && !blocked[k] {
				if r, ok := follow(out[d], rs[i]); ok {
					r.DuplicateOf = d
					out[i] = r
					continue
				}
			}
			blocked[k] = true
			pending = append(pending, i)
		}
	}
	return out, nil
}

func scopeKey(r Reservation) [2]string { return [2]string{r.TenantID, r.SourceScope} }

// follow answers a later request of a scope from the answer of an earlier
// one, as the later one alone would be answered after it: the batch the
// earlier one reserved holds the scope (Conflict); the batch it met still
// does (Conflict), unless the newest batch succeeded and the later one
// does not ask for a re-import (AlreadySucceeded); a succeeded scope stays
// succeeded, and a resumable one resumable, for a request that does not
// ask for a re-import either. A re-import after AlreadySucceeded or
// Resumable is not answered here (false).
func follow(earlier ReserveManyResult, later Reservation) (ReserveManyResult, bool) {
	r := earlier
	switch {
	case earlier.Outcome == Reserved:
		r.Outcome, r.latestID, r.latestUID, r.latestSucceeded = Conflict, earlier.BatchID, earlier.BatchUID, false
	case earlier.Outcome == Conflict && later.SkipIfSucceeded && earlier.latestSucceeded:
		r.Outcome, r.BatchID, r.BatchUID = AlreadySucceeded, earlier.latestID, earlier.latestUID
	case earlier.Outcome == Conflict:
	case earlier.Outcome == AlreadySucceeded && later.SkipIfSucceeded:
	case earlier.Outcome == Resumable && later.SkipIfResumable > 0:
	default:
		return ReserveManyResult{}, false
	}
	return r, true
}

// firstOfEachScope splits idx into the first request of each (tenant,
// scope) and the rest, in order.
func firstOfEachScope(rs []Reservation, idx []int) (first, rest []int) {
	seen := make(map[[2]string]bool, len(idx))
	for _, i := range idx {
		k := scopeKey(rs[i])
		if seen[k] {
			rest = append(rest, i)
			continue
		}
		seen[k] = true
		first = append(first, i)
	}
	return first, rest
}

// reserveRound runs reserveManySQL for the reservations idx (distinct
// scopes), records the decided outcomes in out, and returns those left
// undecided: their scope was held by a batch the statement's snapshot did
// not show, so a later round looks again.
func (s *Store) reserveRound(ctx context.Context, rs []Reservation, details []string, idx []int, out []ReserveManyResult) ([]int, error) {
	n := len(idx)
	var (
		company, tenant, database = make([]string, n), make([]string, n), make([]string, n)
		mode, source, stage       = make([]string, n), make([]string, n), make([]string, n)
		docs, scope               = make([]string, n), make([]string, n)
		skip                      = make([]bool, n)
		window, reimportOf        = make([]int64, n), make([]int64, n)
	)
	for k, i := range idx {
		r := rs[i]
		company[k], tenant[k], database[k] = r.CompanyID, r.TenantID, r.TenantDatabase
		mode[k], source[k], stage[k] = string(r.IngestionMode), string(r.SourceType), r.PipelineStage
		docs[k], scope[k], skip[k] = details[i], r.SourceScope, r.SkipIfSucceeded
		window[k] = max(r.SkipIfResumable, 0).Microseconds()
		reimportOf[k] = r.ReimportOf
	}
	rows, err := s.db.Query(ctx, reserveManySQL, company, tenant, database, mode, source, stage, docs, scope, skip, window, reimportOf)
	if err != nil {
		return nil, fmt.Errorf("reserving %d scopes: %w", n, err)
	}
	defer rows.Close()
	var undecided []int
	for rows.Next() {
		var (
			ord                           int64
			reserved, runningID, latestID *int64
			latestStatus                  *Status
			latestResumable               bool
			uid, latestUID                string // the inserted or running batch's uid; the newest's
		)
		if err := rows.Scan(&ord, &reserved, &runningID, &latestID, &latestStatus, &latestResumable, &uid, &latestUID); err != nil {
			return nil, fmt.Errorf("reserving %d scopes: %w", n, err)
		}
		i := idx[ord-1]
		switch {
		case reserved != nil:
			out[i] = ReserveManyResult{Outcome: Reserved, BatchID: *reserved, BatchUID: uid, DuplicateOf: -1}
		case rs[i].ReimportOf != 0 && (latestID == nil || *latestID != rs[i].ReimportOf):
			// Another re-import of the change (or any newer batch) came
			// first: this one is not made, whatever holds the scope.
			out[i] = ReserveManyResult{Outcome: Superseded, BatchUID: latestUID, DuplicateOf: -1}
			if latestID != nil {
				out[i].BatchID = *latestID
			}
		case latestStatus != nil && *latestStatus == StatusSucceeded && rs[i].SkipIfSucceeded:
			// As Reserve: a folder whose newest batch succeeded is not
			// imported again without asking, whatever else holds it.
			out[i] = ReserveManyResult{Outcome: AlreadySucceeded, BatchID: *latestID, BatchUID: latestUID, DuplicateOf: -1}
		case runningID != nil:
			out[i] = ReserveManyResult{Outcome: Conflict, BatchID: *runningID, BatchUID: uid, DuplicateOf: -1}
		case latestResumable:
			// Its load is committed and only its publication failed: the
			// folder is resumed, not loaded a second time.
			out[i] = ReserveManyResult{Outcome: Resumable, BatchID: *latestID, BatchUID: latestUID, DuplicateOf: -1}
		default:
			undecided = append(undecided, i)
		}
		if latestID != nil {
			out[i].latestID, out[i].latestUID = *latestID, latestUID
			out[i].latestSucceeded = latestStatus != nil && *latestStatus == StatusSucceeded
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reserving %d scopes: %w", n, err)
	}
	return undecided, nil
}

// RecordFailedEnqueueMany is RecordFailedEnqueue for a burst: it records
// each reservation as a batch that is Failed from the start with phase
// failed_enqueue and the message, holding no scope, in one statement, and
// returns the new batch ids in order.
func (s *Store) RecordFailedEnqueueMany(ctx context.Context, rs []Reservation, message string) ([]int64, error) {
	var (
		company, tenant, database, mode, source, stage, docs, scope []string
	)
	at := time.Now().UTC()
	for i := range rs {
		r := rs[i]
		if err := r.Validate(); err != nil {
			return nil, err
		}
		d := r.Details
		d.Phase = PhaseFailedEnqueue
		d.LastError = &ErrorRecord{Phase: PhaseFailedEnqueue, Message: message, At: at}
		raw, err := d.Marshal()
		if err != nil {
			return nil, err
		}
		company, tenant, database = append(company, r.CompanyID), append(tenant, r.TenantID), append(database, r.TenantDatabase)
		mode, source, stage = append(mode, string(r.IngestionMode)), append(source, string(r.SourceType)), append(stage, r.PipelineStage)
		docs, scope = append(docs, string(raw)), append(scope, r.SourceScope)
	}
	rows, err := s.db.Query(ctx, `
		WITH input AS (
			SELECT *
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::text[])
			     WITH ORDINALITY AS i(company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, details, source_scope, ord)
		), ins AS (
			INSERT INTO ingestion_batches
				(company_id, tenant_id, tenant_database, ingestion_mode, source_type,
				 business_date, pipeline_stage, status, details, source_scope, completed_at)
			SELECT company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			       NULL, pipeline_stage, 'Failed', details || jsonb_build_object('updatedAt', now()), source_scope, now()
			FROM input ORDER BY ord
			RETURNING id
		)
		SELECT id FROM ins ORDER BY id`,
		company, tenant, database, mode, source, stage, docs, scope)
	if err != nil {
		return nil, fmt.Errorf("recording %d failed enqueues: %w", len(rs), err)
	}
	defer rows.Close()
	ids := make([]int64, 0, len(rs))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recording %d failed enqueues: %w", len(rs), err)
	}
	if len(ids) != len(rs) {
		return nil, fmt.Errorf("recording %d failed enqueues: %d recorded", len(rs), len(ids))
	}
	return ids, nil
}
