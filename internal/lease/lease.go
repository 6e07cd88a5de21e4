package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fleet/ingest/internal/batch"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the store needs of a connection: a pool, a connection or a
// transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Store acquires, renews and releases execution leases.
type Store struct {
	db       DB
	renewals DB // Renew and RenewMany; db unless WithRenewals
}

// NewStore returns a lease store working on db.
func NewStore(db DB) *Store { return &Store{db: db, renewals: db} }

// WithRenewals returns a store that renews terms (Renew, RenewMany) on db
// and does everything else on the receiver's. A worker gives its renewals a
// connection of their own (a pool of one): however many deliveries wait for
// connections or for row locks, the one renewal statement per period never
// queues behind them, and it holds that connection only for a statement
// that waits for no lock (SKIP LOCKED). RenewWaiting, the per-term fallback
// that does wait for a row lock (at most a second), stays on the
// receiver's db so it cannot hold the renewal connection.
func (s *Store) WithRenewals(db DB) *Store { return &Store{db: s.db, renewals: db} }

// Lease is one term of an execution lease, as held by one delivery.
type Lease struct {
	BatchID    int64
	HolderID   string
	Generation int64
	// ExpiresAt is the database-clock expiry of this term.
	ExpiresAt time.Time
	// RenewedAt is the database clock when the term was acquired or last
	// renewed: ExpiresAt − RenewedAt is how long it had left at that moment,
	// whatever the local clock says.
	RenewedAt time.Time
}

// Remaining is how long the term had left when it was acquired or last
// renewed, by the database clock. A holder's local deadline is the local
// time it sent that request plus Remaining: skew between the local and the
// database clocks cancels out.
func (l Lease) Remaining() time.Duration { return l.ExpiresAt.Sub(l.RenewedAt) }

// Fence returns the fence that a holder's state writes carry.
func (l Lease) Fence() batch.Fence {
	return batch.Fence{BatchID: l.BatchID, LeaseID: l.HolderID, Generation: l.Generation}
}

// Outcome is the domain result of Acquire.
type Outcome int

const (
	// Acquired means the caller now holds the lease (fresh or taken over).
	Acquired Outcome = iota + 1
	// Held means another delivery holds a live lease.
	Held
	// Terminal means the batch is not Running and cannot be leased.
	Terminal
	// NotFound means no batch has the id.
	NotFound
)

func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case Held:
		return "held"
	case Terminal:
		return "terminal"
	case NotFound:
		return "not_found"
	}
	return "unknown"
}

// Acquisition is what Acquire decided.
type Acquisition struct {
	Outcome Outcome
	// Lease is the term now held, when Outcome is Acquired.
	Lease Lease
	// TakenOver is true when Acquired replaced an expired holder.
	TakenOver bool
	// PreviousHolder and PreviousExpiresAt describe the expired term that was
	// taken over, or, when Outcome is Held, the live holder and its expiry.
	PreviousHolder    string
	PreviousExpiresAt time.Time
	// Now is the database clock when the decision was made.
	Now time.Time
	// Status is the batch's status when Outcome is Terminal.
	Status batch.Status
	// TenantID is the batch's tenant when Outcome is Acquired (for the
	// delivery's log lines).
	TenantID string
	// Batch is, when Outcome is Acquired, the whole batch row as the
	// acquisition's UPDATE left it (its RETURNING): what a read of the
	// batch later in the acquisition's transaction would return, so the
	// holder need not read it again (pipeline.Begin).
	Batch batch.Batch
	// Started is true when the acquisition's UPDATE also recorded the
	// Start it was given (AcquireStarting): Batch's details are at phase
	// Start.To, and the new term in the lease trail names that phase.
	Started bool
}

// Start is a first checkpoint that an acquisition records in its own
// UPDATE (AcquireStarting), so it costs no statement of its own: the phase
// of a delivery about to begin work (package pipeline, PhaseStarter: the
// Fleet pipeline's loading). It is recorded when the batch the lease is
// taken of is of one of SourceTypes, not parked, and its details are a
// document of version Version at phase From that records no warehouse
// commit (redshiftCommitted not true); the details' phase then becomes To,
// nothing else in them changes, and the new term in the lease trail says
// so ("phase": To), which is the write's audit. The holder still checks
// the batch with its own rules in the acquisition's transaction and takes
// the phase back (Unstart) before it commits if they refuse it. The zero
// Start records nothing.
type Start struct {
	SourceTypes []batch.SourceType
	From, To    batch.Phase
	Version     int
}

func (st Start) args() []any {
	types := make([]string, len(st.SourceTypes))
	for i, t := range st.SourceTypes {
		types[i] = string(t)
	}
	return []any{types, string(st.From), string(st.To), st.Version}
}

// TakeoverDelay is how long after the previous term's expiry it was taken
// over, by the database clock. It is zero unless TakenOver.
func (a Acquisition) TakeoverDelay() time.Duration {
	if !a.TakenOver {
		return 0
	}
	return a.Now.Sub(a.PreviousExpiresAt)
}

// ErrInvalidTTL is returned for a non-positive lease duration.
var ErrInvalidTTL = errors.New("lease ttl must be positive")

// acquireSQL decides the acquisition in the UPDATE's own conditions: under
// READ COMMITTED a concurrent acquirer blocks on the row and then re-checks
// them against the winner's committed version, so exactly one wins.
//
// The clock is read when the row is updated (clock_timestamp(), once per
// row through the sub-select), not at the start of the transaction
// (now()): an acquisition may wait inside its transaction first — on the
// tenant's lock of a capped acquisition (package jobs), on the row lock of
// a concurrent acquirer — and a term stamped from before that wait would
// expire before its holder's local deadline, which runs from after it.
// The returned time is that same reading, so the time left the holder
// computes (expiry − now) is exactly the ttl, counted from a moment after
// its request was sent.
//
// The term trail (execution_lease_terms) gets the new term appended, after
// closing the term it takes over with that term's final expiry; it is
// bounded to batch.AuditLimit terms. The details document is touched only
// to record a Start ($4–$7, see Start): its phase, in the same row
// version, named in the new term. The statement returns the whole batch
// row as it left it (batch.Columns: the new term's generation, expiry and
// clock reading among them), then the term before the new one: closed
// here without a release time, it was taken over (and names the previous
// holder and its expiry); released, the lease was free. Last comes the
// phase the new term recorded, NULL when it recorded none.
var acquireSQL = `
	UPDATE ingestion_batches b
	SET (execution_lease_id, execution_lease_expires_at, execution_lease_generation,
	     execution_lease_renewed_at, execution_lease_terms, details, updated_at) = (
	    SELECT $2::text, c.at + $3 * interval '1 microsecond', b.execution_lease_generation + 1,
	           c.at,
	           jsonb_path_query_array(
	               CASE WHEN b.execution_lease_id IS NULL THEN b.execution_lease_terms
	                    ELSE ` + batch.LeaseTermsClosed("b", "") + ` END
	               || jsonb_build_array(jsonb_build_object(
	                   'leaseId', $2::text, 'generation', b.execution_lease_generation + 1,
	                   'at', c.at, 'expiresAt', c.at + $3 * interval '1 microsecond', 'closed', false)
	                   || CASE WHEN s.start THEN jsonb_build_object('phase', $6::text) ELSE '{}'::jsonb END),
	               '$[last - ` + strconv.Itoa(batch.AuditLimit-1) + ` to last]'),
	           CASE WHEN s.start THEN jsonb_set(b.details, '{phase}', to_jsonb($6::text)) ELSE b.details END,
	           c.at
	    FROM (SELECT clock_timestamp() AS at) c,
	         (SELECT COALESCE(b.source_type = ANY($4::text[])
	                 AND b.parked_at IS NULL
	                 AND jsonb_typeof(b.details) = 'object'
	                 AND b.details->'version' = to_jsonb($7::int)
	                 AND b.details->>'phase' = $5::text
	                 AND b.details->'redshiftCommitted' IS DISTINCT FROM 'true'::jsonb, false) AS start) s)
	WHERE b.id = $1
	  AND b.status = 'Running'
	  AND (b.execution_lease_id IS NULL OR b.execution_lease_expires_at <= clock_timestamp())
	RETURNING ` + batch.Columns + `, b.execution_lease_terms->-2, b.execution_lease_terms->-1->>'phase'`

// maxAcquireAttempts bounds retries when the lease is released between the
// acquisition attempt and the look-up that explains its failure.
const maxAcquireAttempts = 3

// Acquire takes the execution lease of a Running batch for holderID for ttl,
// measured on the database clock. It never takes a live lease held by
// another delivery. Expected outcomes (Held, Terminal, NotFound) are
// results; errors are infrastructure failures or invalid arguments.
func (s *Store) Acquire(ctx context.Context, batchID int64, holderID string, ttl time.Duration) (Acquisition, error) {
	return s.AcquireStarting(ctx, batchID, holderID, ttl, Start{})
}

// AcquireStarting is Acquire recording start (see Start) in the
// acquisition's own UPDATE when the batch is at its From phase:
// Acquisition.Started says whether it did.
func (s *Store) AcquireStarting(ctx context.Context, batchID int64, holderID string, ttl time.Duration, start Start) (Acquisition, error) {
	if err := batch.ValidateLeaseID(holderID); err != nil {
		return Acquisition{}, err
	}
	if ttl <= 0 {
		return Acquisition{}, ErrInvalidTTL
	}
	for range maxAcquireAttempts {
		var (
			a          = Acquisition{Outcome: Acquired, Lease: Lease{BatchID: batchID, HolderID: holderID}}
			prev       *Term
			prevHolder *string
			prevExp    *time.Time
			started    *string
		)
		b, err := batch.Scan(s.db.QueryRow(ctx, acquireSQL, append([]any{batchID, holderID, ttl.Microseconds()}, start.args()...)...), &prev, &started)
		if err == nil {
			if b.LeaseExpiresAt == nil || b.LeaseRenewedAt == nil {
				return Acquisition{}, fmt.Errorf("acquiring lease on batch %d: the acquisition returned no term", batchID)
			}
			a.Batch, a.TenantID, a.Started = b, b.TenantID, started != nil
			a.Lease.Generation, a.Lease.ExpiresAt, a.Now = b.LeaseGeneration, *b.LeaseExpiresAt, *b.LeaseRenewedAt
			a.Lease.RenewedAt = a.Now
			if prev != nil && prev.Closed && prev.ReleasedAt == nil {
				a.TakenOver, a.PreviousHolder, a.PreviousExpiresAt = true, prev.LeaseID, prev.ExpiresAt
			}
			return a, nil
		}
		if !errors.Is(err, batch.ErrNotFound) {
			return Acquisition{}, fmt.Errorf("acquiring lease on batch %d: %w", batchID, err)
		}

		var (
			status batch.Status
			now    time.Time
		)
		err = s.db.QueryRow(ctx, `
			SELECT status, execution_lease_id, execution_lease_expires_at, clock_timestamp()
			FROM ingestion_batches WHERE id = $1`, batchID).Scan(&status, &prevHolder, &prevExp, &now)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return Acquisition{Outcome: NotFound}, nil
		case err != nil:
			return Acquisition{}, fmt.Errorf("reading lease of batch %d: %w", batchID, err)
		case status != batch.StatusRunning:
			return Acquisition{Outcome: Terminal, Status: status, Now: now}, nil
		case prevHolder != nil && prevExp != nil && prevExp.After(now):
			return Acquisition{Outcome: Held, PreviousHolder: *prevHolder, PreviousExpiresAt: *prevExp, Now: now}, nil
		}
		// Released or expired since the attempt: try again.
	}
	return Acquisition{}, fmt.Errorf("acquiring lease on batch %d: gave up after %d attempts", batchID, maxAcquireAttempts)
}

// unstartSQL takes back the Start an acquisition recorded, in the
// acquisition's transaction: the details' phase as it was, and the term's
// note of it removed.
const unstartSQL = `
	UPDATE ingestion_batches
	SET details = jsonb_set(details, '{phase}', to_jsonb($4::text)),
	    execution_lease_terms = jsonb_set(execution_lease_terms, '{-1}', (execution_lease_terms->-1) - 'phase')
	WHERE id = $1 AND execution_lease_id = $2 AND execution_lease_generation = $3 AND status = 'Running'
	  AND details->>'phase' = $5 AND execution_lease_terms->-1->>'phase' = $5
	RETURNING ` + batch.Columns

// Unstart takes back, in the transaction of the acquisition of l that
// recorded it (Acquisition.Started), the Start start: the batch's details
// are again at start.From, as before the acquisition, and the term no
// longer names start.To. The holder calls it when its own checks refuse
// the batch the acquisition started (pipeline.Begin), before its
// transaction commits. It returns the batch as it left it.
func (s *Store) Unstart(ctx context.Context, l Lease, start Start) (batch.Batch, error) {
	b, err := batch.Scan(s.db.QueryRow(ctx, unstartSQL, l.BatchID, l.HolderID, l.Generation, string(start.From), string(start.To)))
	if err != nil {
		return batch.Batch{}, fmt.Errorf("taking back the start of batch %d: %w", l.BatchID, err)
	}
	return b, nil
}

// renewSQL extends one term. It touches only the lease columns (never the
// details document or the term trail), so its cost does not grow with the
// batch: an update of narrow columns, HOT when the page has room.
const renewSQL = `
	UPDATE ingestion_batches
	SET execution_lease_expires_at = now() + $4 * interval '1 microsecond',
	    execution_lease_renewed_at = now()
	WHERE id = $1
	  AND execution_lease_id = $2
	  AND execution_lease_generation = $3
	  AND status = 'Running'
	  AND execution_lease_expires_at > now()
	RETURNING execution_lease_expires_at, now()`

// Renew extends the exact term l to now() + ttl by the database clock. It
// returns the renewed lease and true, or false when the term is no longer
// held (expired, taken over, released, or the batch left Running); a lost
// lease must stop all work at once.
func (s *Store) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, bool, error) {
	if ttl <= 0 {
		return l, false, ErrInvalidTTL
	}
	err := s.renewals.QueryRow(ctx, renewSQL, l.BatchID, l.HolderID, l.Generation, ttl.Microseconds()).Scan(&l.ExpiresAt, &l.RenewedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	}
	if err != nil {
		return l, false, fmt.Errorf("renewing lease on batch %d: %w", l.BatchID, err)
	}
	return l, true, nil
}

// checkSQL reads one term without extending it. It finds the term while it
// is held at all, and says whether more than the margin ($4) is left of
// it, both by the database clock.
const checkSQL = `
	SELECT execution_lease_expires_at, now(),
	       execution_lease_expires_at > now() + $4 * interval '1 microsecond'
	FROM ingestion_batches
	WHERE id = $1
	  AND execution_lease_id = $2
	  AND execution_lease_generation = $3
	  AND status = 'Running'
	  AND execution_lease_expires_at > now()`

// Check reports whether the term l is still held (held) and whether more
// than margin is left of it (usable), by the database clock, without
// extending it: a read, with no write and no commit to flush. It is the
// lease check a holder makes right before an irreversible step (a warehouse
// commit): a term with margin or less left must not start one, since the
// step may end after the expiry. The returned lease carries the term's
// current expiry and the database time of the check when held.
func (s *Store) Check(ctx context.Context, l Lease, margin time.Duration) (checked Lease, held, usable bool, err error) {
	checked = l
	err = s.db.QueryRow(ctx, checkSQL, l.BatchID, l.HolderID, l.Generation, max(margin, 0).Microseconds()).
		Scan(&checked.ExpiresAt, &checked.RenewedAt, &usable)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, false, nil
	}
	if err != nil {
		return l, false, false, fmt.Errorf("checking lease on batch %d: %w", l.BatchID, err)
	}
	return checked, true, usable, nil
}

// renewManySQL is renewSQL for many terms at once, isolated per row: it
// locks the rows of the terms it renews with SKIP LOCKED, so a row locked
// by another transaction (an operator's open transaction, a slow cancel, a
// holder's own fenced write in flight) delays only its own term, never the
// statement. Every input term comes back once: renewed (with its new
// expiry), busy (skipped: held by the statement's snapshot, but its row was
// locked, so nothing is known of it now), or neither (no longer held). A
// skipped row is told from a lost term by that snapshot read, which never
// waits on a lock.
const renewManySQL = `
	WITH h AS (
	    SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS h(id, lease_id, generation)
	), locked AS (
	    SELECT l.id FROM ingestion_batches l JOIN h ON l.id = h.id
	    WHERE l.id = ANY($1::bigint[])
	      AND l.execution_lease_id = h.lease_id
	      AND l.execution_lease_generation = h.generation
	      AND l.status = 'Running'
	      AND l.execution_lease_expires_at > now()
	    ORDER BY l.id
	    FOR NO KEY UPDATE OF l SKIP LOCKED
	), renewed AS (
	    UPDATE ingestion_batches b
	    SET execution_lease_expires_at = now() + $4 * interval '1 microsecond',
	        execution_lease_renewed_at = now()
	    FROM h
	    WHERE b.id = h.id
	      AND b.id IN (SELECT id FROM locked)
	      AND b.execution_lease_id = h.lease_id
	      AND b.execution_lease_generation = h.generation
	      AND b.status = 'Running'
	      AND b.execution_lease_expires_at > now()
	    RETURNING b.id, b.execution_lease_generation, b.execution_lease_expires_at, now() AS at
	)
	SELECT h.id, h.generation, r.execution_lease_expires_at, r.at,
	       r.id IS NULL AND s.id IS NOT NULL
	       AND s.execution_lease_id = h.lease_id
	       AND s.execution_lease_generation = h.generation
	       AND s.status = 'Running'
	       AND s.execution_lease_expires_at > now()
	FROM h
	LEFT JOIN renewed r ON r.id = h.id AND r.execution_lease_generation = h.generation
	LEFT JOIN ingestion_batches s ON s.id = h.id`

// Renewal is the result of renewing one term with RenewMany.
type Renewal struct {
	// Lease is the term, with its new expiry when Held.
	Lease Lease
	// Held is false when the term is not known to be held now: it is no
	// longer held (see Renew) unless Busy.
	Held bool
	// Busy means the term's row was locked by another transaction, so it
	// was neither renewed nor found lost: its state is unknown until a
	// later renewal, and the term keeps its deadline meanwhile.
	Busy bool
}

// RenewMany extends every term in leases to now() + ttl, by the database
// clock, in one statement: what a worker process does once per renewal
// period for all the leases it holds. It never waits on a row lock: a term
// whose row another transaction has locked comes back Busy (try it again
// with RenewWaiting). The result has one Renewal per term, in order; a term
// that comes back neither Held nor Busy is no longer held and must stop all
// work at once. An error means nothing is known about any of them.
func (s *Store) RenewMany(ctx context.Context, leases []Lease, ttl time.Duration) ([]Renewal, error) {
	if ttl <= 0 {
		return nil, ErrInvalidTTL
	}
	out := make([]Renewal, len(leases))
	if len(leases) == 0 {
		return out, nil
	}
	ids := make([]int64, len(leases))
	holders := make([]string, len(leases))
	gens := make([]int64, len(leases))
	for i, l := range leases {
		ids[i], holders[i], gens[i] = l.BatchID, l.HolderID, l.Generation
		out[i] = Renewal{Lease: l}
	}
	type key struct{ id, gen int64 }
	type result struct {
		exp, now *time.Time
		busy     bool
	}
	results := make(map[key]result, len(leases))
	rows, err := s.renewals.Query(ctx, renewManySQL, ids, holders, gens, ttl.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("renewing %d leases: %w", len(leases), err)
	}
	for rows.Next() {
		var (
			k    key
			r    result
			busy *bool
		)
		if err := rows.Scan(&k.id, &k.gen, &r.exp, &r.now, &busy); err != nil {
			rows.Close()
			return nil, fmt.Errorf("renewing %d leases: %w", len(leases), err)
		}
		r.busy = busy != nil && *busy
		results[k] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("renewing %d leases: %w", len(leases), err)
	}
	for i := range out {
		r := results[key{ids[i], gens[i]}]
		switch {
		case r.exp != nil && r.now != nil:
			out[i].Held = true
			out[i].Lease.ExpiresAt, out[i].Lease.RenewedAt = *r.exp, *r.now
		case r.busy:
			out[i].Busy = true
		}
	}
	return out, nil
}

// RenewWaiting renews one term as Renew does, but waits at most lockWait
// for its row lock (SET LOCAL lock_timeout): the per-term fallback for a
// term RenewMany found Busy. The held term comes back renewed and true; a
// term no longer held comes back false; a row still locked after lockWait
// comes back with ErrRowLocked, and nothing is known of the term.
func (s *Store) RenewWaiting(ctx context.Context, l Lease, ttl, lockWait time.Duration) (Lease, bool, error) {
	if ttl <= 0 {
		return l, false, ErrInvalidTTL
	}
	renewed, held := l, false
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(max(lockWait.Milliseconds(), 1), 10)); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, renewSQL, l.BatchID, l.HolderID, l.Generation, ttl.Microseconds()).Scan(&renewed.ExpiresAt, &renewed.RenewedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		held = err == nil
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable:
		return l, false, fmt.Errorf("renewing lease on batch %d: %w", l.BatchID, ErrRowLocked)
	case err != nil:
		return l, false, fmt.Errorf("renewing lease on batch %d: %w", l.BatchID, err)
	case !held:
		return l, false, nil
	}
	return renewed, true, nil
}

// lockNotAvailable is SQLSTATE 55P03, raised when lock_timeout expires.
const lockNotAvailable = "55P03"

// ErrRowLocked is returned by RenewWaiting when another transaction held
// the term's row lock for longer than the wait allowed.
var ErrRowLocked = errors.New("batch row locked by another transaction")

// Ending says why a term that is no longer held ended without being lost.
type Ending int

const (
	// EndedByHolder: the holder's own terminal write ended it (the batch is
	// Succeeded or Failed under the same generation): a delivery that just
	// finished and has not yet stopped renewing.
	EndedByHolder Ending = iota + 1
	// EndedByCancel: an operator's cancel revoked it (the batch is Failed
	// and cancelled, its generation moved on by exactly the cancel).
	EndedByCancel
)

// EndedWithoutLoss reports which of leases, no longer held, ended by their
// own holder's terminal write or were revoked by an operator's cancel,
// rather than lost to a takeover or an expiry. The others are not in the
// result.
func (s *Store) EndedWithoutLoss(ctx context.Context, leases []Lease) (map[int64]Ending, error) {
	ids, gens := make([]int64, len(leases)), make([]int64, len(leases))
	for i, l := range leases {
		ids[i], gens[i] = l.BatchID, l.Generation
	}
	rows, err := s.db.Query(ctx, `
		SELECT b.id, b.execution_lease_generation = t.generation FROM ingestion_batches b
		JOIN unnest($1::bigint[], $2::bigint[]) AS t(id, generation) ON b.id = t.id
		WHERE b.status <> 'Running'
		  AND (b.execution_lease_generation = t.generation
		       OR (b.cancelled_at IS NOT NULL AND b.execution_lease_generation = t.generation + 1))`, ids, gens)
	if err != nil {
		return nil, fmt.Errorf("reading ended leases: %w", err)
	}
	out := make(map[int64]Ending)
	var id int64
	var own bool
	_, err = pgx.ForEachRow(rows, []any{&id, &own}, func() error {
		out[id] = EndedByCancel
		if own {
			out[id] = EndedByHolder
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading ended leases: %w", err)
	}
	return out, nil
}

// releaseSQL frees the lease of one term and closes the term in the trail.
var releaseSQL = `
	UPDATE ingestion_batches
	SET execution_lease_terms = ` + batch.LeaseTermsClosed("ingestion_batches", "clock_timestamp()") + `,
	    execution_lease_id = NULL, execution_lease_expires_at = NULL, updated_at = now()
	WHERE id = $1 AND execution_lease_id = $2 AND execution_lease_generation = $3`

// Release frees the lease if the term l still holds it, so a successor need
// not wait for expiry. It reports whether anything was released; releasing a
// term that was lost or already released is not an error.
func (s *Store) Release(ctx context.Context, l Lease) (bool, error) {
	tag, err := s.db.Exec(ctx, releaseSQL, l.BatchID, l.HolderID, l.Generation)
	if err != nil {
		return false, fmt.Errorf("releasing lease on batch %d: %w", l.BatchID, err)
	}
	return tag.RowsAffected() == 1, nil
}
