package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

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

// Period is what RunPeriod did.
type Period struct {
	// Outcome is "scanned", or "skipped" when another replica holds the
	// lock or ran within the last half period.
	Outcome string
	Summary Summary
	// StartAfter is where this period's listing started.
	StartAfter string
	// Since is the LastModified bound this period applied.
	Since time.Time
	// CheckpointIgnored is true when the checkpoint was dated after the
	// database clock and this period started a new pass instead.
	CheckpointIgnored bool
}

// RunPeriod runs one period of periodic reconciliation of cfg's bucket and
// prefix: in one transaction it takes the advisory lock of the pair (or
// skips: another replica works), reads the checkpoint (or skips: a replica
// ran less than every/2 ago), scans from the checkpoint's key with
// cfg.MaxObjects, and writes the checkpoint back with the lock still held.
// If the process dies, the transaction ends, the lock is released and the
// checkpoint is unchanged: the next period repeats the work, which the
// reservation makes harmless.
//
// A checkpoint with a time after the database clock was not written by a
// pass (every pass writes database times, and migration 00080 refuses
// later ones): it would make every period skip, or every marker. It is
// ignored, logged and counted (ReconcileCheckpointsIgnored), and the
// period starts a new pass, whose write replaces it.
func RunPeriod(ctx context.Context, cfg Config, every time.Duration) (Period, error) {
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
	tx, err := cfg.Pool.Begin(bounded())
	if err != nil {
		return Period{}, err
	}
	defer func() { _ = tx.Rollback(bounded()) }()
	lockKey := "fleet-ingest-reconcile:" + cfg.Bucket + "/" + cfg.Prefix
	var locked bool
	if err := tx.QueryRow(bounded(), `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, lockKey).Scan(&locked); err != nil {
		return Period{}, err
	}
	if !locked {
		return Period{Outcome: "skipped"}, nil
	}
	if _, err := tx.Exec(bounded(), `
		INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ($1, $2)
		ON CONFLICT (bucket, prefix) DO NOTHING`, cfg.Bucket, cfg.Prefix); err != nil {
		return Period{}, err
	}
	var (
		startAfter                    string
		passStarted, covered, lastRun *time.Time
		now                           time.Time
	)
	if err := tx.QueryRow(bounded(), `
		SELECT start_after, pass_started_at, covered_since, last_run_at, now()
		FROM ingest_reconcile_checkpoints WHERE bucket = $1 AND prefix = $2 FOR UPDATE`, cfg.Bucket, cfg.Prefix).
		Scan(&startAfter, &passStarted, &covered, &lastRun, &now); err != nil {
		return Period{}, err
	}
	ignored := false
	if future(now, passStarted, covered, lastRun) {
		ignored = true
		logger := cmp.Or(cfg.Logger, slog.Default())
		logger.Warn("reconcile checkpoint ignored: it is dated after the database clock, so no pass wrote it; starting a new pass",
			"bucket", cfg.Bucket, "prefix", cfg.Prefix, "pass_started_at", passStarted, "covered_since", covered,
			"last_run_at", lastRun, "database_now", now)
		if cfg.Metrics != nil {
			cfg.Metrics.ReconcileCheckpointsIgnored.Inc()
		}
		startAfter, passStarted, covered, lastRun = "", nil, nil, nil
	}
	if lastRun != nil && now.Sub(*lastRun) < every/2 {
		return Period{Outcome: "skipped"}, nil
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
	p := Period{Outcome: "scanned", Summary: sum, StartAfter: startAfter, Since: since, CheckpointIgnored: ignored}
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
