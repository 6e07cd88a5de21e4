package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/batch"
)

// Defaults of Config (enqueue prune's flags).
const (
	BatchSizeDefault   = 1000
	LockTimeoutDefault = 2 * time.Second
	LockRetriesDefault = 3
	// MinOlderThan is the shortest retention Prune accepts: a day of
	// history is what operators read to answer what happened yesterday,
	// and it covers the default publication window.
	MinOlderThan = 24 * time.Hour
)

// lockNotAvailable is SQLSTATE 55P03: lock_timeout expired.
const lockNotAvailable = "55P03"

// Config is what Prune deletes and how.
type Config struct {
	// Pool is the operational database, as a login that may delete batches
	// (fleet_operator, deploy/postgres/roles.sql).
	Pool *pgxpool.Pool
	// OlderThan: batches that completed longer ago than this (by the
	// database clock) are candidates. At least MinOlderThan.
	OlderThan time.Duration
	// Apply deletes; without it Prune only counts what it would delete.
	Apply bool
	// BatchSize is the most candidates one transaction deletes. Defaults
	// to BatchSizeDefault.
	BatchSize int
	// LockTimeout is the lock_timeout of each transaction. Defaults to
	// LockTimeoutDefault.
	LockTimeout time.Duration
	// LockRetries is how many times a transaction that met a lock is tried
	// again before its candidates are skipped. Defaults to
	// LockRetriesDefault; negative: never tried again.
	LockRetries int
	// PublicationWindow: a failed publication committed less than this long
	// ago can still be resumed and is kept. Defaults to
	// batch.DefaultPublicationWindow.
	PublicationWindow time.Duration
	// Logger receives a line per transaction and per lock timeout.
	Logger *slog.Logger
	// Actor and Reason are who prunes and why: every transaction that
	// deletes batches records them, with the ids it deleted, in the
	// operators' audit (audit.ActionPrune), in that transaction.
	Actor  audit.Actor
	Reason string
}

// InputError is a Config value Prune refuses; nothing was read or written.
type InputError struct{ Field, Reason string }

func (e *InputError) Error() string { return e.Field + ": " + e.Reason }

// Validate checks the configuration before anything touches the database.
func (c *Config) Validate() error {
	switch {
	case c.OlderThan < MinOlderThan:
		return &InputError{"older_than", fmt.Sprintf("must be at least %s (got %s)", MinOlderThan, c.OlderThan)}
	case c.BatchSize < 0 || c.BatchSize > 100000:
		return &InputError{"batch_size", "must be between 1 and 100000"}
	case c.LockTimeout < 0:
		return &InputError{"lock_timeout", "must not be negative"}
	case c.PublicationWindow < 0:
		return &InputError{"publication_window", "must not be negative"}
	}
	return nil
}

func (c *Config) withDefaults() Config {
	d := *c
	d.BatchSize = cmp.Or(d.BatchSize, BatchSizeDefault)
	d.LockTimeout = cmp.Or(d.LockTimeout, LockTimeoutDefault)
	if d.LockRetries == 0 {
		d.LockRetries = LockRetriesDefault
	}
	d.PublicationWindow = cmp.Or(d.PublicationWindow, batch.DefaultPublicationWindow)
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return d
}

// Result is what Prune deleted (Apply) or would delete (a dry run).
type Result struct {
	// Applied is true when the batches were deleted.
	Applied bool `json:"applied"`
	// Cutoff is the database time before which batches completed.
	Cutoff time.Time `json:"cutoff"`
	// Batches is how many batches were (or would be) deleted; ByStatus
	// counts them by status, MinID and MaxID bound their ids.
	Batches  int64            `json:"batches"`
	ByStatus map[string]int64 `json:"by_status"`
	MinID    int64            `json:"min_id,omitempty"`
	MaxID    int64            `json:"max_id,omitempty"`
	// KeptForRetries counts old batches kept because a kept batch retries
	// them (directly or through a chain of retries).
	KeptForRetries int64 `json:"kept_for_retries"`
	// SkippedLocked counts candidates left for the next run because their
	// transaction met a lock on every attempt.
	SkippedLocked int64 `json:"skipped_locked"`
	// Transactions is how many transactions deleted (or counted) a part.
	Transactions int `json:"transactions"`
}

func (r *Result) add(id int64, status string) {
	r.Batches++
	r.ByStatus[status]++
	if r.MinID == 0 || id < r.MinID {
		r.MinID = id
	}
	r.MaxID = max(r.MaxID, id)
}

// prunableSQL is the condition, on the batch row named b, that b is a
// candidate: every rule of the package doc but the retry chain. cutoff
// and window are SQL expressions (parameters) of the completion cutoff
// (timestamptz) and the publication window (microseconds).
func prunableSQL(b, cutoff, window string) string {
	return strings.NewReplacer("b.", b+".").Replace(`(b.source_scope IS NOT NULL
	    AND b.status IN ('Succeeded', 'Failed')
	    AND b.parked_at IS NULL
	    AND b.completed_at < `+cutoff+`
	    AND b.id < (SELECT max(n.id) FROM ingestion_batches n
	                WHERE n.tenant_id = b.tenant_id AND n.source_scope = b.source_scope)
	    AND (b.status <> 'Succeeded' OR EXISTS (
	            SELECT FROM ingestion_batches s
	            WHERE s.tenant_id = b.tenant_id AND s.source_scope = b.source_scope
	              AND s.status = 'Succeeded' AND s.id > b.id))
	    AND NOT coalesce(`) + batch.ResumablePublicationSQL(b, window+" * interval '1 microsecond'") + `, false))`
}

var (
	// candidatesSQL: the next candidates after $1, up to $2, at most $3.
	candidatesSQL = `
		SELECT b.id FROM ingestion_batches b
		WHERE b.id > $1 AND b.id <= $2 AND ` + prunableSQL("b", "$4", "$5") + `
		ORDER BY b.id LIMIT $3`
	// deleteSQL deletes the batches $1 that are still candidates and that
	// no batch that is not a candidate names as retryOf (a retry started
	// since they were read): the rules again, as the DELETE finds each row,
	// after waiting for its lock.
	deleteSQL = `
		DELETE FROM ingestion_batches b
		WHERE b.id = ANY($1) AND ` + prunableSQL("b", "$2", "$3") + `
		  AND NOT EXISTS (
			SELECT FROM ingestion_batches r
			WHERE r.tenant_id = b.tenant_id AND r.source_scope = b.source_scope
			  AND r.details->>'retryOf' = b.id::text AND r.id <> ALL($1)
			  AND NOT ` + prunableSQL("r", "$2", "$3") + `)
		RETURNING b.id, b.status, b.tenant_id, b.source_scope`
	// retriedSQL finds the batches that name one of the deleted ones as
	// the batch they retry: run after the DELETE, which holds their row
	// locks, in a statement of its own (a snapshot taken after every retry
	// that locked one of them first committed).
	retriedSQL = `
		SELECT d.id, r.id
		FROM unnest($1::bigint[], $2::text[], $3::text[]) AS d(id, tenant_id, source_scope)
		JOIN ingestion_batches r ON r.tenant_id = d.tenant_id AND r.source_scope = d.source_scope
		                        AND r.details->>'retryOf' = d.id::text
		LIMIT 1`
	// scopesSQL reads every batch of the candidates' folders: its retryOf
	// (a number, or NULL) and whether it is a candidate.
	scopesSQL = `
		SELECT b.id, b.tenant_id, b.source_scope, b.status,
		       CASE WHEN b.details->>'retryOf' ~ '^[0-9]{1,18}$' THEN (b.details->>'retryOf')::bigint END,
		       ` + prunableSQL("b", "$2", "$3") + `
		FROM ingestion_batches b
		WHERE (b.tenant_id, b.source_scope) IN (
			SELECT c.tenant_id, c.source_scope FROM ingestion_batches c WHERE c.id = ANY($1))`
)

// Prune deletes (cfg.Apply) or counts the batches the package doc's rules
// let go. Invalid configuration returns an *InputError. A lock that
// outlasts every attempt skips a transaction's candidates (Result.
// SkippedLocked), not the run. On a database error or a cancelled ctx it
// returns what it had done so far with the error.
func Prune(ctx context.Context, c Config) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	cfg := c.withDefaults()
	res := Result{Applied: cfg.Apply, ByStatus: map[string]int64{}}
	var upTo int64
	err := pgx.BeginTxFunc(ctx, cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := setLockTimeout(ctx, tx, cfg.LockTimeout); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			WITH c AS (SELECT now() - $1 * interval '1 microsecond' AS cutoff)
			SELECT c.cutoff, coalesce((SELECT max(id) FROM ingestion_batches WHERE completed_at < c.cutoff), 0) FROM c`,
			cfg.OlderThan.Microseconds()).Scan(&res.Cutoff, &upTo)
	})
	if err != nil {
		return res, fmt.Errorf("reading the cutoff: %w", err)
	}
	log := cfg.Logger.With("apply", cfg.Apply, "cutoff", res.Cutoff)
	log.Info("prune started", "older_than", cfg.OlderThan, "batch_size", cfg.BatchSize, "lock_timeout", cfg.LockTimeout)
	window := cfg.PublicationWindow.Microseconds()
	var after int64
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		cands, err := listCandidates(ctx, cfg, log, after, upTo, res.Cutoff, window)
		if err != nil {
			return res, fmt.Errorf("listing candidates after id %d: %w", after, err)
		}
		if len(cands) == 0 {
			break
		}
		last := cands[len(cands)-1]
		var part round
		for attempt := 0; ; attempt++ {
			part, err = pruneRound(ctx, cfg, cands, res.Cutoff, window)
			if err == nil || !tryAgain(err) {
				break
			}
			if attempt >= cfg.LockRetries {
				log.Warn("prune skipped locked batches", "first_id", cands[0], "last_id", last,
					"candidates", len(cands), "attempts", attempt+1)
				res.SkippedLocked += int64(len(cands))
				part, err = round{}, nil
				break
			}
			msg := "prune met a lock; trying again"
			if retried := (*retriedMeanwhileError)(nil); errors.As(err, &retried) {
				msg = "prune met a retry of a batch it deleted; trying again"
			}
			log.Warn(msg, "first_id", cands[0], "last_id", last, "attempt", attempt+1, "error", err.Error())
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
			}
		}
		if err != nil {
			return res, fmt.Errorf("pruning batches %d to %d: %w", cands[0], last, err)
		}
		res.Transactions++
		for _, d := range part.deleted {
			res.add(d.id, d.status)
		}
		res.KeptForRetries += part.keptForRetries
		log.Info("prune progress", "transaction", res.Transactions, "first_id", cands[0], "last_id", last,
			"batches", len(part.deleted), "kept_for_retries", part.keptForRetries, "total", res.Batches)
		after = last
	}
	log.Info("prune finished", "batches", res.Batches, "by_status", res.ByStatus, "min_id", res.MinID, "max_id", res.MaxID,
		"kept_for_retries", res.KeptForRetries, "skipped_locked", res.SkippedLocked, "transactions", res.Transactions)
	return res, nil
}

// listCandidates lists the next candidates after the id after, in a
// read-only transaction under lock_timeout too (a migration's lock on the
// table is waited for no longer than a delete's), tried again as a
// round is; a table locked on every attempt is an error.
func listCandidates(ctx context.Context, cfg Config, log *slog.Logger, after, upTo int64, cutoff time.Time, window int64) ([]int64, error) {
	for attempt := 0; ; attempt++ {
		var cands []int64
		err := pgx.BeginTxFunc(ctx, cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			if err := setLockTimeout(ctx, tx, cfg.LockTimeout); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, candidatesSQL, after, upTo, cfg.BatchSize, cutoff, window)
			if err == nil {
				cands, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			}
			return err
		})
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable || attempt >= cfg.LockRetries {
			return cands, err
		}
		log.Warn("prune met a lock; trying again", "after_id", after, "attempt", attempt+1, "error", pgErr.Message)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
}

// setLockTimeout is SET LOCAL lock_timeout, with a parameter.
func setLockTimeout(ctx context.Context, tx pgx.Tx, d time.Duration) error {
	_, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", max(d.Milliseconds(), 1)))
	return err
}

// retriedMeanwhileError is a round that would have deleted a batch a
// retry committed meanwhile names (its details' retryOf): rolled back,
// and tried again like a round that met a lock.
type retriedMeanwhileError struct{ batchID, retryID int64 }

func (e *retriedMeanwhileError) Error() string {
	return fmt.Sprintf("batch %d was retried meanwhile (batch %d names it)", e.batchID, e.retryID)
}

// tryAgain reports whether a round's error is one a new round may not
// meet: a lock held longer than lock_timeout, or a retry committed
// meanwhile.
func tryAgain(err error) bool {
	var pgErr *pgconn.PgError
	var retried *retriedMeanwhileError
	return errors.As(err, &retried) || (errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable)
}

type deleted struct {
	id     int64
	status string
}

type round struct {
	deleted        []deleted
	keptForRetries int64
}

// pruneRound deletes (or, in a dry run, counts) the candidates cands in
// one transaction under lock_timeout: it keeps those a kept batch's retry
// chain names and deletes the rest, checking every rule again as it
// deletes (a row's lock is waited for then, for at most lock_timeout).
func pruneRound(ctx context.Context, cfg Config, cands []int64, cutoff time.Time, window int64) (round, error) {
	var out round
	tx, err := cfg.Pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return out, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := setLockTimeout(ctx, tx, cfg.LockTimeout); err != nil {
		return out, err
	}
	doomed, kept, err := withoutRetryChains(ctx, tx, cands, cutoff, window)
	if err != nil {
		return out, err
	}
	out.keptForRetries = int64(kept)
	if len(doomed) == 0 {
		return out, tx.Commit(ctx)
	}
	ids := make([]int64, len(doomed))
	for i, d := range doomed {
		ids[i] = d.id
	}
	if !cfg.Apply {
		out.deleted = doomed
		return out, nil // rolled back: a dry run writes nothing
	}
	rows, err := tx.Query(ctx, deleteSQL, ids, cutoff, window)
	if err != nil {
		return out, err
	}
	var tenants, scopes []string
	out.deleted, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (deleted, error) {
		var d deleted
		var tenant, scope string
		err := r.Scan(&d.id, &d.status, &tenant, &scope)
		tenants, scopes = append(tenants, tenant), append(scopes, scope)
		return d, err
	})
	if err != nil {
		return round{}, err
	}
	// A retry that locked one of these batches (FOR KEY SHARE,
	// jobs.Enqueuer.Retry) before the DELETE did committed a batch naming
	// it, which the DELETE's snapshot did not show: the round is rolled
	// back and tried again, and the retry chain rule keeps the batch.
	deletedIDs := make([]int64, len(out.deleted))
	for i, d := range out.deleted {
		deletedIDs[i] = d.id
	}
	var retried, retry int64
	switch err := tx.QueryRow(ctx, retriedSQL, deletedIDs, tenants, scopes).Scan(&retried, &retry); {
	case err == nil:
		return round{}, &retriedMeanwhileError{batchID: retried, retryID: retry}
	case !errors.Is(err, pgx.ErrNoRows):
		return round{}, err
	}
	slices.SortFunc(out.deleted, func(a, b deleted) int { return cmp.Compare(a.id, b.id) })
	if len(out.deleted) > 0 {
		gone := make([]int64, len(out.deleted))
		byStatus := map[string]int{}
		for i, d := range out.deleted {
			gone[i] = d.id
			byStatus[d.status]++
		}
		if err := audit.Record(ctx, tx, audit.Action{
			Actor: cfg.Actor, Action: audit.ActionPrune, Outcome: "pruned", Reason: cfg.Reason,
			Details: map[string]any{"batch_ids": gone, "batches": len(gone), "by_status": byStatus, "cutoff": cutoff, "older_than": cfg.OlderThan.String()},
		}); err != nil {
			return round{}, err
		}
	}
	return out, tx.Commit(ctx)
}

// withoutRetryChains returns the candidates ids that no kept batch of
// their folders retries, directly or through a chain of retries, and how
// many it kept for that reason. A batch is kept when it is not a
// candidate (young, Running, the newest, …) or a kept batch retries it;
// a retry is newer than the batch it retries, so one pass from the newest
// batch of a folder down follows every chain.
func withoutRetryChains(ctx context.Context, tx pgx.Tx, ids []int64, cutoff time.Time, window int64) ([]deleted, int, error) {
	type row struct {
		id        int64
		scope     [2]string
		status    string
		retryOf   *int64
		candidate bool
	}
	rows, err := tx.Query(ctx, scopesSQL, ids, cutoff, window)
	if err != nil {
		return nil, 0, err
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.scope[0], &x.scope[1], &x.status, &x.retryOf, &x.candidate)
	})
	if err != nil {
		return nil, 0, err
	}
	slices.SortFunc(all, func(a, b row) int { return cmp.Compare(b.id, a.id) }) // newest first
	kept := map[int64]bool{}
	scopeOf := map[int64][2]string{}
	for _, x := range all {
		scopeOf[x.id] = x.scope
	}
	for _, x := range all {
		if !x.candidate {
			kept[x.id] = true
		}
		// A retry is a batch of the same folder (RetriedBy's rule).
		if kept[x.id] && x.retryOf != nil && scopeOf[*x.retryOf] == x.scope {
			kept[*x.retryOf] = true
		}
	}
	want := make(map[int64]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var out []deleted
	n := 0
	for i := len(all) - 1; i >= 0; i-- { // oldest first
		x := all[i]
		switch {
		case !want[x.id]:
		case kept[x.id]:
			n++
		default:
			out = append(out, deleted{x.id, x.status})
		}
	}
	return out, n, nil
}
