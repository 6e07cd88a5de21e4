// Package drain decides, when a worker stops (a rollout, a scale-down, a
// node drain: SIGTERM), which of its running loads it finishes before it
// exits and which it gives up at once.
//
// A load given up is not lost: its batch stays Running with its lease
// released, and the next delivery starts it again. On the local (PostgreSQL)
// warehouse that means reading the folder again from its first object, so a
// worker that gave up every load longer than a fixed grace would, with
// hour-long folders, let a rollout restart the same load forever. A load on
// Redshift is a COPY statement the warehouse runs on its own: the worker that
// stops leaves it running and the next delivery follows it (see the redshift
// package), so there is nothing to wait for.
//
// The rule: every load gets the shutdown grace (Policy.Grace). After it, a
// load keeps the worker only while its own progress says it will finish
// before the drain limit (Policy.Max, counted from the stop): the time it
// still needs is estimated from the objects it has read, at the rate it has
// read them, with a margin. A load that will not finish in time, or that has
// shown no progress (blocked, or a Redshift COPY), is cancelled when the
// grace ends, so a draining pod is not held for a load it would cut anyway.
// The estimate is taken again every second: a load that slows down is
// cancelled as soon as it can no longer make it.
//
// The trade-off: a rollout waits for long loads (up to Policy.Max per pod,
// which the pod's terminationGracePeriodSeconds must exceed) instead of
// repeating them; a load longer than Policy.Max is still restarted, and a
// SIGKILL (or a node lost) restarts any load on the local warehouse.
package drain

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// ErrWillNotFinish is the cause of a delivery's context cancelled by Drain:
// its load would not have finished within the drain limit.
var ErrWillNotFinish = errors.New("worker stopping: the load would not finish within the drain limit")

// Tracker knows the deliveries a worker runs and their loads' progress.
// The zero value is not usable: use New.
type Tracker struct {
	mu    sync.Mutex
	loads map[*load]struct{}
	now   func() time.Time
}

// New returns an empty Tracker.
func New() *Tracker { return &Tracker{loads: map[*load]struct{}{}, now: time.Now} }

type load struct {
	batchID int64
	cancel  context.CancelCauseFunc

	mu       sync.Mutex
	progress func() (done, total int64) // nil until the load reports
	since    time.Time                  // when the load reported: it started reading
	verdict  string                     // the decision last logged
}

type ctxKey struct{}

// Track registers a delivery of batchID. The returned context is cancelled,
// with cause ErrWillNotFinish, when a drain gives the delivery up; untrack
// forgets the delivery (call it when the delivery returns).
func (t *Tracker) Track(ctx context.Context, batchID int64) (_ context.Context, untrack func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	l := &load{batchID: batchID, cancel: cancel}
	t.mu.Lock()
	t.loads[l] = struct{}{}
	t.mu.Unlock()
	return context.WithValue(ctx, ctxKey{}, l), func() {
		t.mu.Lock()
		delete(t.loads, l)
		t.mu.Unlock()
		cancel(nil)
	}
}

// Report tells the tracker of ctx's delivery, if any, how to read its load's
// progress: objects read so far, and the folder's objects. Call it when the
// load starts reading; the rate is counted from then.
func Report(ctx context.Context, progress func() (done, total int64)) {
	l, ok := ctx.Value(ctxKey{}).(*load)
	if !ok {
		return
	}
	l.mu.Lock()
	l.progress, l.since = progress, time.Now()
	l.mu.Unlock()
}

// Running is how many deliveries the tracker knows.
func (t *Tracker) Running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.loads)
}

// Policy is how long a stopping worker waits for its loads.
type Policy struct {
	// Grace is how long every running load may run after the stop began,
	// whatever its progress.
	Grace time.Duration
	// Max is how long after the stop began a load whose progress says it
	// will finish by then may run. Below Grace it counts as Grace.
	Max time.Duration
	// Every is how often the loads are looked at. Defaults to 1 s.
	Every time.Duration
	// Margin multiplies a load's estimated time left. Defaults to 1.25.
	Margin float64
	// Logger receives one line per load per decision.
	Logger *slog.Logger
}

// EstimateLeft returns how long a load that read done of total objects in
// elapsed still needs at that rate; ok is false when it has read nothing
// (no rate to go by).
func EstimateLeft(done, total int64, elapsed time.Duration) (left time.Duration, ok bool) {
	switch {
	case done <= 0 || total <= 0 || elapsed <= 0:
		return 0, false
	case done >= total:
		return 0, true // everything read: the commit is left
	}
	return time.Duration(float64(elapsed) * float64(total-done) / float64(done)), true
}

// Drain runs from the moment the worker stops taking work until ctx is done
// (the caller cancels it once every delivery returned, or when it gives up
// waiting at Policy.Max): it cancels, under the rule of the package
// documentation, the deliveries whose loads will not finish in time.
func (t *Tracker) Drain(ctx context.Context, p Policy) {
	if p.Every <= 0 {
		p.Every = time.Second
	}
	if p.Margin < 1 {
		p.Margin = 1.25
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	start := t.now()
	graceEnd, deadline := start.Add(p.Grace), start.Add(max(p.Max, p.Grace))
	tick := time.NewTicker(p.Every)
	defer tick.Stop()
	for {
		t.decide(p, graceEnd, deadline)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// decide looks at every load once.
func (t *Tracker) decide(p Policy, graceEnd, deadline time.Time) {
	t.mu.Lock()
	loads := make([]*load, 0, len(t.loads))
	for l := range t.loads {
		loads = append(loads, l)
	}
	t.mu.Unlock()
	now := t.now()
	for _, l := range loads {
		l.mu.Lock()
		var done, total int64
		if l.progress != nil {
			done, total = l.progress()
		}
		left, known := EstimateLeft(done, total, now.Sub(l.since))
		left = time.Duration(float64(left) * p.Margin)
		verdict := ""
		switch {
		case l.verdict == "cancelled":
		case known && !now.Add(left).After(deadline):
			verdict = "finishing"
		case now.Before(graceEnd):
			verdict = "grace"
		default:
			verdict = "cancelled"
		}
		if verdict == "" || verdict == l.verdict {
			l.mu.Unlock()
			continue
		}
		l.verdict = verdict
		l.mu.Unlock()
		attrs := []any{"batch_id", l.batchID, "objects_done", done, "objects_total", total}
		if known {
			attrs = append(attrs, "estimated_left_seconds", left.Round(time.Second).Seconds())
		}
		attrs = append(attrs, "drain_deadline_in_seconds", deadline.Sub(now).Round(time.Second).Seconds())
		switch verdict {
		case "finishing":
			p.Logger.Info("draining: the load will finish before the drain limit; waiting for it", attrs...)
		case "grace":
			p.Logger.Info("draining: the load may not finish before the drain limit; it has the shutdown grace", attrs...)
		case "cancelled":
			why := "its progress says it would not finish before the drain limit"
			if !known {
				why = "it has shown no progress to go by (blocked, or a warehouse statement that its successor follows)"
			}
			p.Logger.Warn("draining: giving the load up; the batch stays resumable", append(attrs, "why", why)...)
			l.cancel(ErrWillNotFinish)
		}
	}
}
