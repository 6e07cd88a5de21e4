package jobs

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/metrics"
)

// StatsIntervalDefault is how often database-derived gauges are refreshed.
const StatsIntervalDefault = 15 * time.Second

// statsQuery computes every database-derived gauge in one statement:
// running scoped batches, those whose lease expired, those parked, the
// oldest one's age, and the ingest queue's River jobs by state.
const statsQuery = `
	WITH running AS (
		SELECT count(*) AS n,
		       count(*) FILTER (WHERE execution_lease_expires_at < now()) AS stuck,
		       count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked,
		       COALESCE(EXTRACT(EPOCH FROM now() - min(started_at)), 0)::float8 AS oldest
		FROM ingestion_batches
		WHERE status = 'Running' AND source_scope IS NOT NULL
	), queue AS (
		SELECT state::text AS state, count(*) AS n
		FROM river_job
		WHERE queue = $1 AND state IN ('available', 'scheduled', 'retryable', 'running', 'pending')
		GROUP BY state
	)
	SELECT r.n, r.stuck, r.parked, r.oldest, q.state, q.n
	FROM running r LEFT JOIN queue q ON true`

// statsTimeout bounds one refresh of the gauges.
const statsTimeout = 5 * time.Second

// RefreshStats updates the database-derived gauges once, and tells
// m.DatabaseStats whether it succeeded: the gauges are exported only while
// fresh.
func RefreshStats(ctx context.Context, pool *pgxpool.Pool, m *metrics.Metrics) (err error) {
	defer func() { m.DatabaseStats.Refreshed(err) }()
	rows, err := pool.Query(ctx, statsQuery, Queue)
	if err != nil {
		return err
	}
	defer rows.Close()
	depth := map[string]float64{}
	for rows.Next() {
		var (
			running, stuck, parked int64
			oldest                 float64
			state                  *string
			n                      *int64
		)
		if err := rows.Scan(&running, &stuck, &parked, &oldest, &state, &n); err != nil {
			return err
		}
		m.RunningBatches.Set(float64(running))
		m.StuckBatches.Set(float64(stuck))
		m.ParkedBatches.Set(float64(parked))
		m.OldestRunningAge.Set(oldest)
		if state != nil && n != nil {
			depth[*state] = float64(*n)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, s := range metrics.JobStates {
		m.QueueDepth.WithLabelValues(s).Set(depth[s])
	}
	return refreshQueuePaused(ctx, pool, m)
}

// leaderQuery reports whether River's leader (the client that runs River's
// maintenance, elected in river_leader with a TTL) is the client id $1.
const leaderQuery = `SELECT EXISTS (SELECT 1 FROM river_leader WHERE leader_id = $1 AND expires_at > now())`

// RefreshTenantStats updates ingest_tenant_batches when riverID, this
// process's River client id, is River's elected leader, and empties it
// otherwise (or when it cannot tell): so one worker of a fleet exports the
// tenant-labelled series, however many pods there are, and a worker that
// lost the leadership stops at its next refresh. It sets
// ingest_river_leader and reports whether this process leads; it tells
// m.TenantStats whether it succeeded (both are exported only while fresh).
func RefreshTenantStats(ctx context.Context, pool *pgxpool.Pool, m *metrics.Metrics, riverID string) (bool, error) {
	var (
		leader bool
		err    error
	)
	defer func() { m.TenantStats.Refreshed(err) }()
	err = pool.QueryRow(ctx, leaderQuery, riverID).Scan(&leader)
	if err == nil && leader {
		err = refreshTenantStats(ctx, pool, m)
	}
	if err != nil || !leader {
		m.SetTenantBatches(nil)
		leader = false
	}
	m.RiverLeader.Set(0)
	if leader {
		m.RiverLeader.Set(1)
	}
	return leader, err
}

// refreshQueuePaused sets ingest_queue_paused for the workers' queues
// (metrics.PausedQueues) from river_queue.paused_at: 1 paused, 0 not (nor
// a queue River has no row for yet, which no worker has started).
func refreshQueuePaused(ctx context.Context, pool *pgxpool.Pool, m *metrics.Metrics) error {
	paused, err := PausedQueues(ctx, pool, metrics.PausedQueues)
	if err != nil {
		return err
	}
	for _, q := range metrics.PausedQueues {
		v := 0.0
		if paused[q] {
			v = 1
		}
		m.QueuePaused.WithLabelValues(q).Set(v)
	}
	return nil
}

// tenantStatsQuery counts each tenant's Running scoped batches that hold a
// live lease and those that wait for one (parked batches wait for an
// operator, not a worker, and are left out).
const tenantStatsQuery = `
	SELECT tenant_id,
	       count(*) FILTER (WHERE execution_lease_id IS NOT NULL AND execution_lease_expires_at > now()),
	       count(*) FILTER (WHERE parked_at IS NULL AND (execution_lease_id IS NULL OR execution_lease_expires_at <= now()))
	FROM ingestion_batches
	WHERE status = 'Running' AND source_scope IS NOT NULL
	GROUP BY tenant_id`

func refreshTenantStats(ctx context.Context, pool *pgxpool.Pool, m *metrics.Metrics) error {
	rows, err := pool.Query(ctx, tenantStatsQuery)
	if err != nil {
		return err
	}
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (metrics.TenantBatchCount, error) {
		var c metrics.TenantBatchCount
		err := row.Scan(&c.Tenant, &c.Running, &c.Waiting)
		return c, err
	})
	if err != nil {
		return err
	}
	// Bounded there: the busiest tenants keep series of their own, the
	// others are summed.
	m.SetTenantBatches(counts)
	return nil
}

// RunStats refreshes the gauges every interval until ctx is done; the
// tenant-labelled ones only while riverID, this worker's River client id
// (Client.ID), is River's leader (RefreshTenantStats).
func RunStats(ctx context.Context, pool *pgxpool.Pool, m *metrics.Metrics, interval time.Duration, logger *slog.Logger, riverID string) {
	interval = cmpOr(interval, StatsIntervalDefault)
	m.SetStatsRefresh(interval, statsTimeout)
	leading := false
	refresh := func() {
		qctx, cancel := context.WithTimeout(ctx, statsTimeout)
		defer cancel()
		err := RefreshStats(qctx, pool, m)
		leader, terr := RefreshTenantStats(qctx, pool, m, riverID)
		if leader != leading {
			leading = leader
			if leader {
				logger.Info("this worker is River's leader: it exports the tenant gauge ingest_tenant_batches")
			} else {
				logger.Info("this worker is not River's leader (any more): it exports no ingest_tenant_batches")
			}
		}
		if err = errors.Join(err, terr); err != nil && ctx.Err() == nil {
			m.DatabaseStatsErrors.Inc()
			logger.Warn("refreshing database gauges failed", "error", err)
		}
	}
	refresh()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			refresh()
		}
	}
}
