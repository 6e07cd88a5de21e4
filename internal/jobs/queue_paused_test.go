package jobs

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
)

// TestRefreshStatsSaysWhichQueueIsPaused: ingest_queue_paused{queue} is 1
// while River's QueuePause (the River UI's Pause) holds a workers' queue,
// 0 for the others and again once resumed; PausedQueues says the same.
func TestRefreshStatsSaysWhichQueueIsPaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	require.ElementsMatch(t, []string{Queue, NotifyQueue}, metrics.PausedQueues, "the gauge's queues are the workers'")
	paused := func(q string) float64 { return testutil.ToFloat64(f.metrics.QueuePaused.WithLabelValues(q)) }

	require.NoError(t, RefreshStats(ctx, f.pool, f.metrics))
	require.Zero(t, paused(Queue), "no row for the queue yet: not paused")
	// The row a worker's producer keeps for its queue.
	for _, q := range []string{Queue, NotifyQueue} {
		_, err := f.pool.Exec(ctx, `INSERT INTO river_queue (name, created_at, updated_at) VALUES ($1, now(), now()) ON CONFLICT (name) DO NOTHING`, q)
		require.NoError(t, err)
	}
	require.NoError(t, f.enqueuer.River.QueuePause(ctx, Queue, nil))
	require.NoError(t, RefreshStats(ctx, f.pool, f.metrics))
	require.Equal(t, 1.0, paused(Queue))
	require.Zero(t, paused(NotifyQueue))
	got, err := PausedQueues(ctx, f.pool, []string{Queue, NotifyQueue})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{Queue: true}, got)

	require.NoError(t, f.enqueuer.River.QueueResume(ctx, Queue, nil))
	require.NoError(t, RefreshStats(ctx, f.pool, f.metrics))
	require.Zero(t, paused(Queue))
}
