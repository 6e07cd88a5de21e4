package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/batch"
)

// scopeKey names a folder's batches: tenant and source scope.
type scopeKey struct{ tenant, scope string }

// scopeState is what the batches of one folder say.
type scopeState struct {
	running, succeeded int64
	// failed is the newest Failed batch, failedPhase its phase.
	failed      int64
	failedPhase string
	// failedIncompleteAt is when the newest Failed batch failed, if it
	// failed because its folder held no completion marker
	// (batch.ReasonFolderIncomplete); nil otherwise.
	failedIncompleteAt *time.Time
	// resumable: the folder's newest batch is a failed publication that
	// can still be resumed (batch.ResumablePublicationSQL); it is failed.
	resumable bool
	// newestSucceeded: the folder's newest batch is the Succeeded one;
	// objects is its details' summary of the objects it loaded (JSON,
	// batch.ObjectsSummary), nil when it has none (a load of a build
	// before the summary) or its details are of a version this build does
	// not know (never guessed at).
	newestSucceeded bool
	objects         []byte
}

// lookup reads, for each folder, its Running and Succeeded batches, its
// newest Failed one, whether its newest batch is a failed publication
// committed less than window ago that can still be resumed, and whether
// its newest batch Succeeded with the summary of the objects it loaded,
// in one statement (index ix_ingestion_batches_scope).
func lookup(ctx context.Context, pool *pgxpool.Pool, keys []scopeKey, window time.Duration) (map[scopeKey]scopeState, error) {
	out := make(map[scopeKey]scopeState, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	tenants := make([]string, len(keys))
	scopes := make([]string, len(keys))
	for i, k := range keys {
		tenants[i], scopes[i] = k.tenant, k.scope
	}
	rows, err := pool.Query(ctx, `
		SELECT r.tenant_id, r.source_scope,
		       coalesce(max(b.id) FILTER (WHERE b.status = 'Running'), 0),
		       coalesce(max(b.id) FILTER (WHERE b.status = 'Succeeded'), 0),
		       coalesce((array_agg(b.id ORDER BY b.id DESC) FILTER (WHERE b.status = 'Failed'))[1], 0),
		       coalesce((array_agg(b.details->>'phase' ORDER BY b.id DESC) FILTER (WHERE b.status = 'Failed'))[1], ''),
		       (array_agg(CASE WHEN b.details->'lastError'->>'reason' = '`+string(batch.ReasonFolderIncomplete)+`' THEN b.completed_at END ORDER BY b.id DESC) FILTER (WHERE b.status = 'Failed'))[1],
		       coalesce((array_agg(`+batch.ResumablePublicationSQL("b", "$3 * interval '1 microsecond'")+` ORDER BY b.id DESC))[1], false),
		       (array_agg(b.status ORDER BY b.id DESC))[1] = 'Succeeded',
		       (array_agg(CASE WHEN b.details->>'version' = $4 THEN b.details->'objects' END ORDER BY b.id DESC))[1]
		FROM unnest($1::text[], $2::text[]) AS r(tenant_id, source_scope)
		JOIN ingestion_batches b ON b.tenant_id = r.tenant_id AND b.source_scope = r.source_scope
		GROUP BY r.tenant_id, r.source_scope`, tenants, scopes, window.Microseconds(), strconv.Itoa(batch.DetailsVersion))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k scopeKey
		var st scopeState
		if err := rows.Scan(&k.tenant, &k.scope, &st.running, &st.succeeded, &st.failed, &st.failedPhase, &st.failedIncompleteAt, &st.resumable, &st.newestSucceeded, &st.objects); err != nil {
			return nil, err
		}
		out[k] = st
	}
	return out, rows.Err()
}

// CheckpointOverlap is how far before a finished pass's start later passes
// still check markers: for markers whose LastModified (S3's clock, the
// upload's start) precedes the database time the pass began.
const CheckpointOverlap = time.Hour

// ApplicationName is the application_name enqueue reconcile's sessions
// carry (cmd/enqueue sets it for the whole pool; RunPeriod sets it for its
// checkpoint transaction whatever the pool says). Migration 00115 records
// it with every checkpoint write (moved_application), so a checkpoint
// moved by any other program is told apart; pg_stat_activity names a
// session holding the checkpoint by it.
const ApplicationName = "fleet-ingest-reconcile"

// Role is reconcile's group role in deploy/postgres/roles.sql
// (grants.Reconcile), the only runtime role that writes the checkpoints: a
// checkpoint last moved by a login of it (with ApplicationName) is
// reconcile's own.
const Role = "fleet_reconcile"

// Reasons a period skipped (Period.SkipReason).
const (
	// SkipLocked: another session holds the checkpoint row (a replica
	// working this period, or any login that locked it: Period.Holders).
	SkipLocked = "locked"
	// SkipRanRecently: a replica finished a period less than every/2 ago.
	SkipRanRecently = "ran_recently"
)

// SkipsConsecutiveAlert is how many periods in a row a replica may skip
// before FleetIngestReconcileSilenced (deploy/prometheus/alerts.yaml) pages,
// when no replica of the install scanned meanwhile.
const SkipsConsecutiveAlert = 3

// Period is what RunPeriod did.
type Period struct {
	// Outcome is "scanned", or "skipped" (SkipReason says why).
	Outcome string
	// SkipReason is SkipLocked or SkipRanRecently for a skipped period.
	SkipReason string
	// Holders are the sessions that held the checkpoint when a period
	// skipped because it was locked, as pg_stat_activity names them (none
	// when the holder could not be found: it let go meanwhile).
	Holders []LockHolder
	Summary Summary
	// StartAfter is where this period's listing started.
	StartAfter string
	// Since is the LastModified bound this period applied.
	Since time.Time
	// CheckpointIgnored is true when the checkpoint was dated after the
	// database clock and this period started a new pass instead.
	CheckpointIgnored bool
	// Foreign is set when the checkpoint's last move was not reconcile's
	// (migration 00115): it was ignored, counted and a new pass started.
	Foreign *Move
}

// Move is who last wrote a checkpoint (migration 00115).
type Move struct {
	By          string    `json:"moved_by"`
	Application string    `json:"moved_application"`
	At          time.Time `json:"moved_at"`
}

// LockHolder is a session holding the checkpoint row (or a lock on its
// table that a period's lock waits for).
type LockHolder struct {
	PID         int32      `json:"pid"`
	User        string     `json:"user"`
	Application string     `json:"application_name"`
	ClientAddr  string     `json:"client_addr,omitempty"`
	XactStart   *time.Time `json:"xact_start,omitempty"`
	// Lock is "row" (the checkpoint row) or the mode of a table lock.
	Lock string `json:"lock"`
}

// lockNotAvailable is SQLSTATE 55P03: NOWAIT or lock_timeout.
const lockNotAvailable = "55P03"

// lockTimeout bounds a period's wait for a table lock on the checkpoints
// (NOWAIT covers the row lock only).
const lockTimeout = "2s"

// RunPeriod runs one period of periodic reconciliation of cfg's bucket and
// prefix. The checkpoint row of the pair is the lock: in one transaction it
// takes the row FOR UPDATE NOWAIT (or skips: another session holds it; the
// holders are named from pg_locks and pg_stat_activity in Period.Holders),
// reads the checkpoint (or skips: a replica ran less than every/2 ago),
// scans from the checkpoint's key with cfg.MaxObjects, and writes the
// checkpoint back with the row still held. If the process dies, the
// transaction ends, the row is released and the checkpoint is unchanged:
// the next period repeats the work, which the reservation makes harmless.
// Every skip adds one to ingest_reconcile_periods_skipped_consecutive and
// every scan sets it back to 0, so a lock held for ever by anyone (any
// login with UPDATE on the table can hold the row) is an alert
// (FleetIngestReconcileSilenced), not a silence.
//
// A checkpoint is trusted only when reconcile wrote it last: its mover
// (migration 00115) is ApplicationName under this session's own
// current_user or another login of reconcile's role (Role, not a
// superuser). deploy/postgres/roles.sql lets no other runtime role write
// the checkpoints (the doors' login gets permission denied), so the login
// is what tells reconcile apart; the application name alone, which any
// client sets, does not. One moved by anyone else is ignored, logged and counted
// (ReconcileCheckpointsForeign), and the period starts a new pass, whose
// write replaces it; a row written before migration 00115 (no mover) is
// ignored too, without counting it.
//
// A checkpoint with a time after the database clock was not written by a
// pass (every pass writes database times, and migration 00080 refuses
// later ones): it would make every period skip, or every marker. It is
// ignored, logged and counted (ReconcileCheckpointsIgnored), and the
// period starts a new pass, whose write replaces it.
func RunPeriod(ctx context.Context, cfg Config, every time.Duration) (Period, error) {
	p, err := runPeriod(ctx, cfg, every, cmp.Or(cfg.Logger, slog.Default()))
	if cfg.Metrics != nil {
		switch p.Outcome {
		case "skipped":
			cfg.Metrics.ReconcileSkippedConsecutive.Inc()
		case "scanned": // even when the scan then failed: it was not silenced
			cfg.Metrics.ReconcileSkippedConsecutive.Set(0)
		}
	}
	return p, err
}

func runPeriod(ctx context.Context, cfg Config, every time.Duration, logger *slog.Logger) (Period, error) {
	// Each statement has a deadline of its own (cfg.Timeout), not the
	// period: the scan between them may rightly take long.
	base := context.WithoutCancel(ctx)
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	bounded := func() context.Context {
		c, cancel := context.WithTimeout(base, cfg.timeout())
		cancels = append(cancels, cancel)
		return c
	}
	locked := func() (Period, error) {
		p := Period{Outcome: "skipped", SkipReason: SkipLocked}
		holders, herr := lockHolders(bounded(), cfg)
		if herr != nil {
			logger.Warn("reconcile: could not name the holder of the checkpoint", "bucket", cfg.Bucket, "prefix", cfg.Prefix, "error", herr.Error())
		}
		p.Holders = holders
		return p, nil
	}
	// The row exists before a period locks it: created in a transaction of
	// its own, so a replica creating it does not hold the others for its
	// whole scan.
	err := pgx.BeginFunc(bounded(), cfg.Pool, func(tx pgx.Tx) error {
		if err := asReconcile(bounded(), tx); err != nil {
			return err
		}
		_, err := tx.Exec(bounded(), `
			INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ($1, $2)
			ON CONFLICT (bucket, prefix) DO NOTHING`, cfg.Bucket, cfg.Prefix)
		return err
	})
	if isLockNotAvailable(err) {
		return locked()
	}
	if err != nil {
		return Period{}, err
	}
	tx, err := cfg.Pool.Begin(bounded())
	if err != nil {
		return Period{}, err
	}
	defer func() { _ = tx.Rollback(bounded()) }()
	if err := asReconcile(bounded(), tx); err != nil {
		return Period{}, err
	}
	var (
		startAfter                    string
		passStarted, covered, lastRun *time.Time
		movedBy, movedApp             *string
		movedAt                       *time.Time
		self                          string
		reconcileLogin                bool
		now                           time.Time
	)
	// reconcileLogin: the mover is this session's login, or another login
	// of reconcile's role (fleet_reconcile: replicas on rotated
	// credentials), not a superuser (who is a member of every role).
	err = tx.QueryRow(bounded(), `
		SELECT start_after, pass_started_at, covered_since, last_run_at, moved_by, moved_application, moved_at, current_user, now(),
		       coalesce(moved_by = current_user OR (
		           SELECT NOT m.rolsuper AND pg_has_role(m.oid, g.oid, 'MEMBER')
		             FROM pg_roles m, pg_roles g WHERE m.rolname = moved_by AND g.rolname = $3), false)
		FROM ingest_reconcile_checkpoints WHERE bucket = $1 AND prefix = $2 FOR UPDATE NOWAIT`, cfg.Bucket, cfg.Prefix, Role).
		Scan(&startAfter, &passStarted, &covered, &lastRun, &movedBy, &movedApp, &movedAt, &self, &now, &reconcileLogin)
	if isLockNotAvailable(err) {
		_ = tx.Rollback(bounded())
		return locked()
	}
	if err != nil {
		return Period{}, err
	}
	ignored := false
	if future(now, passStarted, covered, lastRun) {
		ignored = true
		logger.Warn("reconcile checkpoint ignored: it is dated after the database clock, so no pass wrote it; starting a new pass",
			"bucket", cfg.Bucket, "prefix", cfg.Prefix, "pass_started_at", passStarted, "covered_since", covered,
			"last_run_at", lastRun, "database_now", now)
		if cfg.Metrics != nil {
			cfg.Metrics.ReconcileCheckpointsIgnored.Inc()
		}
		startAfter, passStarted, covered, lastRun = "", nil, nil, nil
	}
	var foreign *Move
	switch {
	case movedBy == nil:
		// Written before migration 00115: nobody knows by whom.
		logger.Info("reconcile checkpoint ignored: it records no mover (written before migration 00115); starting a new pass",
			"bucket", cfg.Bucket, "prefix", cfg.Prefix)
		startAfter, passStarted, covered, lastRun = "", nil, nil, nil
	case !reconcileLogin || movedApp == nil || *movedApp != ApplicationName:
		foreign = &Move{By: *movedBy, Application: deref(movedApp)}
		if movedAt != nil {
			foreign.At = *movedAt
		}
		logger.Warn("reconcile checkpoint ignored: it was moved by someone other than reconcile; starting a new pass",
			"bucket", cfg.Bucket, "prefix", cfg.Prefix, "moved_by", foreign.By, "moved_application", foreign.Application,
			"moved_at", movedAt, "reconcile_user", self, "start_after", startAfter, "covered_since", covered, "last_run_at", lastRun)
		if cfg.Metrics != nil {
			cfg.Metrics.ReconcileCheckpointsForeign.Inc()
		}
		startAfter, passStarted, covered, lastRun = "", nil, nil, nil
	}
	if lastRun != nil && now.Sub(*lastRun) < every/2 {
		return Period{Outcome: "skipped", SkipReason: SkipRanRecently}, nil
	}
	if passStarted == nil || startAfter == "" {
		passStarted = &now
	}
	since := cfg.Since
	if covered != nil && covered.Add(-CheckpointOverlap).After(since) {
		since = covered.Add(-CheckpointOverlap)
	}
	cfg.Since = since
	sum, scanErr := Scan(ctx, cfg, startAfter)
	p := Period{Outcome: "scanned", Summary: sum, StartAfter: startAfter, Since: since, CheckpointIgnored: ignored, Foreign: foreign}
	if scanErr != nil && sum.LastKey == "" {
		return p, scanErr
	}
	// What was reconciled stays reconciled, even when the scan then failed.
	if sum.Complete {
		_, err = tx.Exec(bounded(), `
			UPDATE ingest_reconcile_checkpoints
			SET start_after = '', pass_started_at = NULL, covered_since = $3, last_run_at = now()
			WHERE bucket = $1 AND prefix = $2`, cfg.Bucket, cfg.Prefix, *passStarted)
	} else {
		_, err = tx.Exec(bounded(), `
			UPDATE ingest_reconcile_checkpoints
			SET start_after = $3, pass_started_at = $4, last_run_at = now()
			WHERE bucket = $1 AND prefix = $2`, cfg.Bucket, cfg.Prefix, sum.LastKey, *passStarted)
	}
	if err != nil {
		return p, fmt.Errorf("writing the checkpoint: %w", err)
	}
	if err := tx.Commit(bounded()); err != nil {
		return p, fmt.Errorf("writing the checkpoint: %w", err)
	}
	return p, scanErr
}

// asReconcile names the transaction's writes as reconcile's (migration
// 00115 records the application name with each checkpoint write) and
// bounds its wait for a table lock.
func asReconcile(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT set_config('application_name', $1, true), set_config('lock_timeout', $2, true)`, ApplicationName, lockTimeout)
	return err
}

func isLockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable
}

// lockHolders names the sessions holding cfg's checkpoint row (the
// transaction whose id is the row's xmax) or a lock on the checkpoints
// table that conflicts with a period's, from pg_locks and pg_stat_activity
// (both readable by every login; another login's client address may be
// hidden).
func lockHolders(ctx context.Context, cfg Config) ([]LockHolder, error) {
	var out []LockHolder
	err := pgx.BeginFunc(ctx, cfg.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, lockTimeout); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			SELECT l.pid, coalesce(a.usename::text, ''), coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
			       a.xact_start, CASE WHEN l.locktype = 'transactionid' THEN 'row' ELSE l.mode END
			FROM pg_locks l
			LEFT JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.granted AND l.pid <> pg_backend_pid()
			  AND ((l.locktype = 'transactionid'
			        AND l.transactionid = (SELECT c.xmax FROM ingest_reconcile_checkpoints c WHERE c.bucket = $1 AND c.prefix = $2))
			    OR (l.locktype = 'relation' AND l.relation = 'ingest_reconcile_checkpoints'::regclass
			        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			        AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')))
			ORDER BY l.pid`, cfg.Bucket, cfg.Prefix)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (LockHolder, error) {
			var h LockHolder
			return h, r.Scan(&h.PID, &h.User, &h.Application, &h.ClientAddr, &h.XactStart, &h.Lock)
		})
		return err
	})
	return out, err
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// future reports whether any of a checkpoint's times is after now, the
// database clock.
func future(now time.Time, times ...*time.Time) bool {
	for _, t := range times {
		if t != nil && t.After(now) {
			return true
		}
	}
	return false
}
