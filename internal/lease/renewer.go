package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fleet/ingest/internal/batch"
)

// ErrLost is the cause of a Holding's context when its term is no longer
// held: a renewal found it gone, or its local deadline passed without one.
var ErrLost = errors.New("execution lease lost")

// Outcomes of one term's renewal, as reported to RenewerConfig.Observe.
const (
	RenewalRenewed = "renewed"
	RenewalLost    = "lost"
	RenewalError   = "error"
)

// RenewerConfig configures a Renewer.
type RenewerConfig struct {
	// TTL is the term length, on the database clock. Required.
	TTL time.Duration
	// Every is the renewal period; it must be shorter than TTL. Required.
	Every time.Duration
	// Clock reads the local clock. Defaults to time.Now. It only measures
	// local time between a request and a deadline: no local reading is ever
	// compared with a database timestamp.
	Clock func() time.Time
	// Observe, if set, is told how many terms each renewal attempt
	// renewed, lost or failed to renew (RenewalRenewed, RenewalLost,
	// RenewalError).
	Observe func(outcome string, terms int)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Renewer keeps alive every lease term a process holds, with one statement
// per renewal period for all of them (Store.RenewMany), however many
// deliveries the process runs. A term that comes back lost has its
// Holding's context cancelled with ErrLost at once (self-fencing); the others
// carry on. A failed statement is retried sooner; a term whose local
// deadline passes without a renewal is fenced the same way.
//
// Local deadlines come from the database clock: a renewal sent at local time
// t that the database answered with expiry e at its time n gives the local
// deadline t + (e − n). Skew between the clocks cancels out, and the deadline
// errs early by the request's latency, never late.
//
// The renewal loop runs only while terms are held; a Renewer needs no
// starting or stopping.
type Renewer struct {
	store *Store
	cfg   RenewerConfig

	mu      sync.Mutex
	held    map[*Holding]struct{}
	running bool
}

// NewRenewer returns a renewer of the terms acquired through it on store.
func NewRenewer(store *Store, cfg RenewerConfig) (*Renewer, error) {
	switch {
	case store == nil:
		return nil, errors.New("lease: a Store is required")
	case cfg.TTL <= 0:
		return nil, ErrInvalidTTL
	case cfg.Every <= 0 || cfg.Every >= cfg.TTL:
		return nil, fmt.Errorf("lease: renewal period %s must be positive and shorter than the TTL %s", cfg.Every, cfg.TTL)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Renewer{store: store, cfg: cfg, held: map[*Holding]struct{}{}}, nil
}

// Acquire takes the execution lease of a batch for holderID as
// Store.Acquire does, for the renewer's TTL. When the outcome is Acquired the
// term is held by the returned Holding and renewed with every other term of
// the renewer until the Holding is closed; the Holding's context is derived
// from ctx.
func (r *Renewer) Acquire(ctx context.Context, batchID int64, holderID string) (Acquisition, *Holding, error) {
	sent := r.cfg.Clock()
	a, err := r.store.Acquire(ctx, batchID, holderID, r.cfg.TTL)
	if err != nil || a.Outcome != Acquired {
		return a, nil, err
	}
	return a, r.hold(ctx, a.Lease, sent), nil
}

// Holding is one term held through a Renewer by one delivery.
type Holding struct {
	r      *Renewer
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	lease    Lease
	deadline time.Time // local clock
	timer    *time.Timer
	done     bool // closed or lost: no more renewals
}

func (r *Renewer) hold(parent context.Context, l Lease, sent time.Time) *Holding {
	ctx, cancel := context.WithCancelCause(parent)
	h := &Holding{r: r, ctx: ctx, cancel: cancel, lease: l, deadline: sent.Add(l.Remaining())}
	h.mu.Lock()
	h.timer = time.AfterFunc(h.deadline.Sub(r.cfg.Clock()), h.expire)
	h.mu.Unlock()
	r.mu.Lock()
	r.held[h] = struct{}{}
	if !r.running {
		r.running = true
		go r.loop()
	}
	r.mu.Unlock()
	return h
}

// Context is the delivery's work context: cancelled with ErrLost as its
// cause when the term is lost, and when the Holding is closed.
func (h *Holding) Context() context.Context { return h.ctx }

// Lease returns the term with its latest known expiry.
func (h *Holding) Lease() Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// Deadline returns the term's local deadline, on the renewer's clock.
func (h *Holding) Deadline() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadline
}

// Verify proves the term is still held, for use right before an
// irreversible step (pipeline.Run.VerifyLease): a term renewed within the
// last renewal period is checked with a read (Store.Check: no write, no
// commit to flush), an older one is renewed. It returns batch.ErrStaleLease
// when the term is lost (and fences it), or when it could not be checked.
func (h *Holding) Verify(ctx context.Context) error {
	h.mu.Lock()
	l, done, deadline := h.lease, h.done, h.deadline
	h.mu.Unlock()
	if done {
		return batch.ErrStaleLease
	}
	sent := h.r.cfg.Clock()
	left := deadline.Sub(sent)
	// An answer that lands after the local deadline would come too late.
	rctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	var (
		checked Lease
		ok      bool
		err     error
	)
	fresh := left > h.r.cfg.TTL-h.r.cfg.Every
	if fresh {
		checked, ok, err = h.r.store.Check(rctx, l)
	} else {
		checked, ok, err = h.r.store.Renew(rctx, l, h.r.cfg.TTL)
	}
	switch {
	case err != nil:
		if !fresh {
			h.r.observe(RenewalError, 1)
		}
		return fmt.Errorf("%w: lease check failed: %v", batch.ErrStaleLease, err)
	case !ok:
		h.r.observe(RenewalLost, 1)
		h.fence(fmt.Errorf("%w: the database no longer holds term %d of batch %d for %s", ErrLost, l.Generation, l.BatchID, l.HolderID))
		return batch.ErrStaleLease
	}
	if !fresh {
		h.r.observe(RenewalRenewed, 1)
	}
	h.renewed(checked, sent)
	return nil
}

// Close stops renewing the term, cancels the Holding's context and returns
// the term as last renewed, for the caller to release.
func (h *Holding) Close() Lease {
	h.mu.Lock()
	h.done = true
	h.timer.Stop()
	l := h.lease
	h.mu.Unlock()
	h.r.mu.Lock()
	delete(h.r.held, h)
	h.r.mu.Unlock()
	h.cancel(nil)
	return l
}

// renewed applies a renewal that was sent at local time sent.
func (h *Holding) renewed(l Lease, sent time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return
	}
	if l.ExpiresAt.After(h.lease.ExpiresAt) {
		h.lease = l
	}
	if d := sent.Add(l.Remaining()); d.After(h.deadline) {
		h.deadline = d
		h.timer.Reset(d.Sub(h.r.cfg.Clock()))
	}
}

// fence marks the term done and cancels its work with cause. It reports
// whether it did: false when the term was already closed or fenced.
func (h *Holding) fence(cause error) bool {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return false
	}
	h.done = true
	h.timer.Stop()
	h.mu.Unlock()
	h.cancel(cause)
	return true
}

// expire runs at the local deadline.
func (h *Holding) expire() {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return
	}
	// A renewal may have moved the deadline as the timer fired.
	if left := h.deadline.Sub(h.r.cfg.Clock()); left > 0 {
		h.timer.Reset(left)
		h.mu.Unlock()
		return
	}
	l := h.lease
	h.mu.Unlock()
	h.r.observe(RenewalLost, 1)
	h.r.cfg.Logger.Error("lease lost: its term ran out without a renewal; stopping work on the batch",
		"batch_id", l.BatchID, "lease_id", l.HolderID, "lease_generation", l.Generation)
	h.fence(fmt.Errorf("%w: term %d of batch %d ran out without a renewal", ErrLost, l.Generation, l.BatchID))
}

func (r *Renewer) observe(outcome string, n int) {
	if r.cfg.Observe != nil && n > 0 {
		r.cfg.Observe(outcome, n)
	}
}

// retryAfter is how soon a failed renewal statement is retried.
func (r *Renewer) retryAfter() time.Duration { return max(r.cfg.Every/4, 100*time.Millisecond) }

// loop renews every period while terms are held.
func (r *Renewer) loop() {
	t := time.NewTimer(r.cfg.Every)
	defer t.Stop()
	for range t.C {
		r.mu.Lock()
		if len(r.held) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		next := r.cfg.Every
		if err := r.RenewAll(context.Background()); err != nil {
			r.cfg.Logger.Warn("renewing leases failed: retrying; terms are fenced at their deadlines", "error", err, "retry_in", r.retryAfter())
			next = r.retryAfter()
		}
		t.Reset(next)
	}
}

// RenewAll renews every held term now, in one statement bounded by the
// renewal period, and fences the terms that came back lost. It returns the
// statement's error, if any; the terms then keep their deadlines.
func (r *Renewer) RenewAll(ctx context.Context) error {
	r.mu.Lock()
	holdings := make([]*Holding, 0, len(r.held))
	for h := range r.held {
		holdings = append(holdings, h)
	}
	r.mu.Unlock()
	leases := make([]Lease, 0, len(holdings))
	live := holdings[:0]
	for _, h := range holdings {
		h.mu.Lock()
		if !h.done {
			live = append(live, h)
			leases = append(leases, h.lease)
		}
		h.mu.Unlock()
	}
	if len(live) == 0 {
		return nil
	}
	// One order for every process's statement, so two renewals never wait
	// on each other's rows in opposite orders.
	order := make([]int, len(live))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(leases[a].BatchID, leases[b].BatchID) })
	sortedLeases := make([]Lease, len(order))
	sortedHoldings := make([]*Holding, len(order))
	for i, j := range order {
		sortedLeases[i], sortedHoldings[i] = leases[j], live[j]
	}

	sent := r.cfg.Clock()
	rctx, cancel := context.WithTimeout(ctx, r.cfg.Every)
	defer cancel()
	res, err := r.store.RenewMany(rctx, sortedLeases, r.cfg.TTL)
	if err != nil {
		r.observe(RenewalError, len(sortedLeases))
		return err
	}
	renewed := 0
	var gone []int // indexes of terms no longer held
	for i, rr := range res {
		if rr.Held {
			renewed++
			sortedHoldings[i].renewed(rr.Lease, sent)
			continue
		}
		gone = append(gone, i)
	}
	r.observe(RenewalRenewed, renewed)
	if len(gone) == 0 {
		return nil
	}
	// A delivery that wrote its batch's terminal state while the statement
	// ran is done, not fenced: it stops renewing as soon as it returns.
	goneLeases := make([]Lease, len(gone))
	for k, i := range gone {
		goneLeases[k] = res[i].Lease
	}
	ended, err := r.store.EndedByTerminalWrite(rctx, goneLeases)
	if err != nil {
		ended = nil // unknown: treat every one as lost
	}
	lost := 0
	for _, i := range gone {
		h, l := sortedHoldings[i], res[i].Lease
		if ended[l.BatchID] {
			h.fence(fmt.Errorf("term %d of batch %d ended with the batch's terminal write", l.Generation, l.BatchID))
			continue
		}
		if !h.fence(fmt.Errorf("%w: the database no longer holds term %d of batch %d for %s", ErrLost, l.Generation, l.BatchID, l.HolderID)) {
			continue // closed by its delivery meanwhile
		}
		lost++
		r.cfg.Logger.Error("lease lost: stopping work on the batch", "batch_id", l.BatchID, "lease_id", l.HolderID, "lease_generation", l.Generation)
	}
	r.observe(RenewalLost, lost)
	return nil
}
