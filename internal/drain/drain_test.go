package drain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEstimateLeft(t *testing.T) {
	for _, c := range []struct {
		done, total int64
		elapsed     time.Duration
		left        time.Duration
		ok          bool
	}{
		{0, 10, time.Minute, 0, false}, // nothing read: no rate
		{5, 0, time.Minute, 0, false},  // no objects to go by
		{5, 10, 0, 0, false},           // no time elapsed
		{5, 10, 15 * time.Second, 15 * time.Second, true},
		{1, 4, 10 * time.Second, 30 * time.Second, true},
		{10, 10, time.Minute, 0, true}, // all read: the commit is left
	} {
		left, ok := EstimateLeft(c.done, c.total, c.elapsed)
		require.Equal(t, c.ok, ok, "%+v", c)
		require.Equal(t, c.left, left, "%+v", c)
	}
}

// syncBuffer is a log sink safe for the drain goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDrainFinishesLoadsThatWillFinishAndGivesUpTheRest runs three loads
// through a drain with a 200 ms grace and a 3 s limit: one that reads fast
// enough to finish by the limit, one that shows no progress and one too
// slow to finish. The first is waited for; the other two are cancelled,
// with ErrWillNotFinish, when the grace ends, not before.
func TestDrainFinishesLoadsThatWillFinishAndGivesUpTheRest(t *testing.T) {
	tr := New()
	var logs syncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))

	// fast reads an object every 50 ms of 30: done in 1.5 s.
	var fastDone atomic.Int64
	fastCtx, untrackFast := tr.Track(context.Background(), 1)
	defer untrackFast()
	Report(fastCtx, func() (int64, int64) { return fastDone.Load(), 30 })
	stopReading := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for fastDone.Load() < 30 {
			select {
			case <-stopReading:
				return
			case <-t.C:
				fastDone.Add(1)
			}
		}
	}()
	defer close(stopReading)

	blockedCtx, untrackBlocked := tr.Track(context.Background(), 2)
	defer untrackBlocked()
	Report(blockedCtx, func() (int64, int64) { return 0, 10 })

	// slow read 1 object of 100 in the 100 ms before the stop: 10 s left.
	slowCtx, untrackSlow := tr.Track(context.Background(), 3)
	defer untrackSlow()
	Report(slowCtx, func() (int64, int64) { return 1, 100 })
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, 3, tr.Running())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	go tr.Drain(ctx, Policy{Grace: 200 * time.Millisecond, Max: 3 * time.Second, Every: 20 * time.Millisecond, Logger: log})

	<-blockedCtx.Done()
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "not before the grace ends")
	require.ErrorIs(t, context.Cause(blockedCtx), ErrWillNotFinish)
	<-slowCtx.Done()
	require.ErrorIs(t, context.Cause(slowCtx), ErrWillNotFinish)

	require.Eventually(t, func() bool { return fastDone.Load() == 30 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, fastCtx.Err(), "the load that could finish was waited for: %s", logs.String())
	out := logs.String()
	require.Contains(t, out, `"msg":"draining: the load will finish before the drain limit; waiting for it","batch_id":1`)
	require.Contains(t, out, `"msg":"draining: giving the load up; the batch stays resumable","batch_id":2`)
	require.Contains(t, out, `"msg":"draining: giving the load up; the batch stays resumable","batch_id":3`)
	require.Contains(t, out, "it has shown no progress to go by")
	require.Contains(t, out, "its progress says it would not finish before the drain limit")
	// Durations are numbers of seconds, under keys that say so.
	var finishing map[string]any
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `"msg":"draining: the load will finish before the drain limit`) {
			require.NoError(t, json.Unmarshal([]byte(l), &finishing))
		}
	}
	require.IsType(t, float64(0), finishing["estimated_left_seconds"], "%v", finishing)
	require.IsType(t, float64(0), finishing["drain_deadline_in_seconds"], "%v", finishing)
	require.NotContains(t, finishing, "drain_deadline_in")
}

// TestDrainGivesUpALoadThatSlowsDown: a load that would have finished in
// time at its first rate is cancelled once its rate says it no longer
// will.
func TestDrainGivesUpALoadThatSlowsDown(t *testing.T) {
	tr := New()
	var done atomic.Int64
	done.Store(5)
	ctx, untrack := tr.Track(context.Background(), 7)
	defer untrack()
	Report(ctx, func() (int64, int64) { return done.Load(), 10 })
	time.Sleep(100 * time.Millisecond) // 5 of 10 in 100 ms: about 125 ms left

	dctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Drain(dctx, Policy{Grace: 50 * time.Millisecond, Max: time.Second, Every: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	time.Sleep(150 * time.Millisecond)
	require.NoError(t, ctx.Err(), "waited for while it kept its rate")
	// It reads nothing more: its estimate grows until it passes the limit.
	select {
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("a stalled load was never given up")
	}
	require.True(t, errors.Is(context.Cause(ctx), ErrWillNotFinish))
}

// TestUntrackedContextIgnoresReport: Report on a context no tracker knows
// does nothing (the one-shot CLI and tests run pipelines without one).
func TestUntrackedContextIgnoresReport(t *testing.T) {
	Report(context.Background(), func() (int64, int64) { return 1, 1 })
	tr := New()
	_, untrack := tr.Track(context.Background(), 1)
	require.Equal(t, 1, tr.Running())
	untrack()
	require.Zero(t, tr.Running())
}
