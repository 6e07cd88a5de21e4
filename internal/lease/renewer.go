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
	// RenewalBusy is a term whose row another transaction kept locked
	// through the renewal and its per-term retry: not renewed, not lost,
	// unknown until a later renewal or its deadline.
	RenewalBusy = "busy"
	// RenewalRevoked is a term an operator's cancel revoked: not renewed,
	// and not lost either (no takeover, no expiry: nothing to alert on).
	RenewalRevoked = "revoked"
)

// RenewerConfig configures a Renewer.
type RenewerConfig struct {
	// TTL is the term length, on the database clock. Required.
	TTL time.Duration
	// Every is the renewal period; it must be shorter than TTL. Required.
	Every time.Duration
	// SafetyMargin is how long before the expiry its last renewal reported
	// a holder stops its work (its local deadline), and how much of its
	// term must be left, by the database clock, for Verify to let an
	// irreversible step (a warehouse commit) start: a commit in flight at
	// the deadline has that long to end before a successor may take the
	// batch over. Defaults to DefaultSafetyMargin(TTL, Every). It must be
	// shorter than TTL − Every, so that a term renewed on time never
	// reaches it.
	SafetyMargin time.Duration
	// Clock reads the local clock. Defaults to time.Now. It only measures
	// local time between a request and a deadline: no local reading is ever
	// compared with a database timestamp.
	Clock func() time.Time
	// Observe, if set, is told how many terms each renewal attempt
	// renewed, lost, failed to renew, found locked or found revoked by a
	// cancel (RenewalRenewed, RenewalLost, RenewalError, RenewalBusy,
	// RenewalRevoked).
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
// Renewals are isolated per row: a row that another transaction keeps
// locked is skipped by the statement and retried alone (waiting briefly for
// the lock), then, if still locked, left unknown — not renewed, not lost —
// and retried sooner than the next period. Only its own term can run out.
//
// Local deadlines come from the database clock: a renewal sent at local time
// t that the database answered with expiry e at its time n gives the local
// deadline t + (e − n) − SafetyMargin. Skew between the clocks cancels out,
// and the deadline errs early by the request's latency plus the margin,
// never late.
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

// DefaultSafetyMargin is the safety margin of a Renewer whose config sets
// none: a tenth of the TTL, and at least the delay before a failed or
// blocked renewal is retried (a quarter of the period, at least 100 ms), so
// one late renewal attempt lands before the margin; but at most half of
// TTL − every, so a term renewed on time keeps that much slack before its
// deadline (this bound only applies when the period is over 80 % of the
// TTL). With the worker's defaults (30 s, 10 s) it is 3 s; with a 3 s TTL
// renewed every second, 300 ms.
func DefaultSafetyMargin(ttl, every time.Duration) time.Duration {
	return min(max(ttl/10, retryAfter(every)), (ttl-every)/2)
}

// ValidateSafetyMargin reports whether margin leaves a usable window for
// terms of ttl renewed every period: it must not be negative and must be
// shorter than ttl − every, or a term renewed on time would reach its
// deadline before its next renewal.
func ValidateSafetyMargin(margin, ttl, every time.Duration) error {
	if margin < 0 || margin >= ttl-every {
		return fmt.Errorf("lease safety margin %s must be at least 0 and shorter than the TTL %s minus the renewal period %s", margin, ttl, every)
	}
	return nil
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
	if cfg.SafetyMargin == 0 {
		cfg.SafetyMargin = DefaultSafetyMargin(cfg.TTL, cfg.Every)
	}
	if err := ValidateSafetyMargin(cfg.SafetyMargin, cfg.TTL, cfg.Every); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
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
	return a, r.hold(ctx, a.Lease, sent, false), nil
}

// AcquireOn is Acquire run on db, typically a transaction the caller
// commits after it (see package jobs: the per-tenant cap decides and
// acquires in one transaction). The term's deadline runs from the moment
// the acquisition statement answers, but it is renewed only once the caller
// says its transaction committed (Holding.Committed): until then no other
// session can see it, and a renewal would find the batch still as it was
// before the acquisition and fence the term as lost (under load a renewal
// round fell into that window and cancelled fresh deliveries). A caller
// whose transaction fails to commit must Close the Holding (the
// acquisition never happened).
func (r *Renewer) AcquireOn(ctx context.Context, db DB, batchID int64, holderID string) (Acquisition, *Holding, error) {
	return r.AcquireOnStarting(ctx, db, batchID, holderID, Start{})
}

// AcquireOnStarting is AcquireOn recording start in the acquisition's own
// UPDATE (Store.AcquireStarting).
func (r *Renewer) AcquireOnStarting(ctx context.Context, db DB, batchID int64, holderID string, start Start) (Acquisition, *Holding, error) {
	sent := r.cfg.Clock()
	a, err := NewStore(db).AcquireStarting(ctx, batchID, holderID, r.cfg.TTL, start)
	if err != nil || a.Outcome != Acquired {
		return a, nil, err
	}
	return a, r.hold(ctx, a.Lease, sent, true), nil
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
	busy     bool // its row was locked at the last renewal attempt
	pending  bool // acquired in a transaction not yet committed: not renewed
}

// deadlineOf is the local deadline of a term renewed (or acquired, or
// checked) as l by a request sent at local time sent.
func (r *Renewer) deadlineOf(l Lease, sent time.Time) time.Time {
	return sent.Add(l.Remaining() - r.cfg.SafetyMargin)
}

func (r *Renewer) hold(parent context.Context, l Lease, sent time.Time, pending bool) *Holding {
	ctx, cancel := context.WithCancelCause(parent)
	h := &Holding{r: r, ctx: ctx, cancel: cancel, lease: l, deadline: r.deadlineOf(l, sent), pending: pending}
	h.mu.Lock()
	h.timer = time.AfterFunc(h.deadline.Sub(r.cfg.Clock()), h.expire)
	h.mu.Unlock()
	if !pending {
		r.register(h)
	}
	return h
}

// register adds h to the terms the renewal rounds renew.
func (r *Renewer) register(h *Holding) {
	r.mu.Lock()
	r.held[h] = struct{}{}
	if !r.running {
		r.running = true
		go r.loop()
	}
	r.mu.Unlock()
}

// Committed tells the renewer that the transaction that acquired the term
// (AcquireOn) committed: from now on the term is renewed with the others.
// It does nothing for a term already renewed, closed or lost.
func (h *Holding) Committed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done || !h.pending {
		return
	}
	h.pending = false
	// Under h.mu, so that a Close cannot run between the two and leave a
	// closed term registered (no path takes h.mu while holding r.mu).
	h.r.register(h)
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

// Deadline returns the term's local deadline, on the renewer's clock: the
// expiry its last renewal reported, less the safety margin. Its work is
// cancelled then unless a renewal moved it.
func (h *Holding) Deadline() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadline
}

// Verify proves the term is still held with more than the safety margin
// left, for use right before an irreversible step (pipeline.Run.VerifyLease,
// the lease check the warehouses make before their commit): a term renewed
// within the last renewal period is checked with a read (Store.Check: no
// write, no commit to flush; the database compares its expiry with now() +
// the margin), an older one is renewed. It returns batch.ErrStaleLease
// when the term is lost or inside its margin (and fences it), or when it
// could not be checked.
func (h *Holding) Verify(ctx context.Context) error {
	h.mu.Lock()
	l, done, deadline := h.lease, h.done, h.deadline
	h.mu.Unlock()
	if done {
		return batch.ErrStaleLease
	}
	cfg := h.r.cfg
	sent := cfg.Clock()
	left := deadline.Sub(sent)
	if left <= 0 {
		return batch.ErrStaleLease // its deadline timer is about to fence it
	}
	// An answer that lands after the local deadline would come too late.
	rctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	var (
		checked    Lease
		ok, inside bool
		err        error
	)
	fresh := left > cfg.TTL-cfg.SafetyMargin-cfg.Every
	if fresh {
		var held bool
		checked, held, ok, err = h.r.store.Check(rctx, l, cfg.SafetyMargin)
		inside = held && !ok
	} else {
		checked, ok, err = h.r.store.Renew(rctx, l, cfg.TTL)
	}
	switch {
	case err != nil:
		if !fresh {
			h.r.observe(RenewalError, 1)
		}
		return fmt.Errorf("%w: lease check failed: %v", batch.ErrStaleLease, err)
	case inside:
		// Held, but no more than the margin is left by the database clock:
		// as good as lost to this holder.
		h.r.observe(RenewalLost, 1)
		cfg.Logger.Error("lease inside its safety margin at a lease check: stopping work on the batch",
			"batch_id", l.BatchID, "lease_id", l.HolderID, "lease_generation", l.Generation,
			"remaining_seconds", checked.Remaining().Seconds(), "safety_margin_seconds", cfg.SafetyMargin.Seconds())
		h.fence(fmt.Errorf("%w: term %d of batch %d has %s left, within its safety margin of %s", ErrLost, l.Generation, l.BatchID, checked.Remaining(), cfg.SafetyMargin))
		return batch.ErrStaleLease
	case !ok:
		// rctx may be spent by now: the look-up gets a renewal period.
		ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Every)
		ended, err := h.r.store.EndedWithoutLoss(ectx, []Lease{l})
		ecancel()
		if err == nil && ended[l.BatchID] == EndedByCancel {
			h.r.observe(RenewalRevoked, 1)
			h.fence(revokedCause(l))
		} else {
			h.r.observe(RenewalLost, 1)
			h.fence(goneCause(l))
		}
		return batch.ErrStaleLease
	}
	if !fresh {
		h.r.observe(RenewalRenewed, 1)
	}
	h.renewed(checked, sent)
	return nil
}

// VerifyLocal is the part of Verify that needs no database: the term is
// neither closed nor fenced and its local deadline has not passed. A commit
// whose own transaction checks the term with the safety margin by the
// database clock (batch.Fence.Margin, pipeline.Run.CheckpointTx) needs no
// more. It returns batch.ErrStaleLease otherwise.
func (h *Holding) VerifyLocal() error {
	h.mu.Lock()
	done, deadline := h.done, h.deadline
	h.mu.Unlock()
	if done || !h.r.cfg.Clock().Before(deadline) {
		return batch.ErrStaleLease
	}
	return nil
}

// SafetyMargin is the time the term must have left, by the database clock,
// at a commit (RenewerConfig.SafetyMargin).
func (h *Holding) SafetyMargin() time.Duration { return h.r.cfg.SafetyMargin }

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
	if h.busy {
		h.busy = false
		h.r.cfg.Logger.Info("lease renewed again: the batch row is no longer locked",
			"batch_id", l.BatchID, "lease_id", l.HolderID, "lease_generation", l.Generation)
	}
	if d := h.r.deadlineOf(l, sent); d.After(h.deadline) {
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
	h.r.cfg.Logger.Error("lease lost: its term reached its safety margin without a renewal; stopping work on the batch",
		"batch_id", l.BatchID, "lease_id", l.HolderID, "lease_generation", l.Generation,
		"expires_at", l.ExpiresAt, "safety_margin_seconds", h.r.cfg.SafetyMargin.Seconds())
	h.fence(fmt.Errorf("%w: term %d of batch %d reached its safety margin without a renewal", ErrLost, l.Generation, l.BatchID))
}

func (r *Renewer) observe(outcome string, n int) {
	if r.cfg.Observe != nil && n > 0 {
		r.cfg.Observe(outcome, n)
	}
}

// retryAfter is how soon a failed renewal statement, or a term whose row
// was locked, is retried, for a renewal period of every.
func retryAfter(every time.Duration) time.Duration { return max(every/4, 100*time.Millisecond) }

// lockWait is how long the per-term retry of a term whose row was locked
// waits for the lock: long enough for a holder's own fenced write, well
// under the period, and never more than a second.
func (r *Renewer) lockWait() time.Duration { return min(r.cfg.Every/4, time.Second) }

// holdings returns the terms the renewer holds.
func (r *Renewer) holdings() []*Holding {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Holding, 0, len(r.held))
	for h := range r.held {
		out = append(out, h)
	}
	return out
}

// loop renews every term each period while terms are held, and the terms
// whose rows were locked again sooner.
func (r *Renewer) loop() {
	t := time.NewTimer(r.cfg.Every)
	defer t.Stop()
	var (
		retry    []*Holding // terms whose rows were locked at the last attempt
		nextFull = time.Now().Add(r.cfg.Every)
	)
	for range t.C {
		r.mu.Lock()
		if len(r.held) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		terms := retry
		if len(retry) == 0 || !time.Now().Before(nextFull) {
			terms, nextFull = r.holdings(), time.Now().Add(r.cfg.Every)
		}
		busy, err := r.renew(context.Background(), terms)
		retry = busy
		next := time.Until(nextFull)
		switch {
		case err != nil:
			r.cfg.Logger.Warn("renewing leases failed: retrying; terms are fenced at their deadlines", "error", err, "retry_in_seconds", retryAfter(r.cfg.Every).Seconds())
			next, nextFull, retry = retryAfter(r.cfg.Every), time.Now(), nil
		case len(busy) > 0:
			next = min(next, retryAfter(r.cfg.Every))
		}
		t.Reset(max(next, 0))
	}
}

// RenewAll renews every held term now, in one statement bounded by the
// renewal period, retries alone the terms whose rows were locked, and
// fences the terms that came back lost. It returns the statement's error,
// if any; the terms then keep their deadlines, as do the terms whose rows
// stayed locked.
func (r *Renewer) RenewAll(ctx context.Context) error {
	_, err := r.renew(ctx, r.holdings())
	return err
}

// renew renews the live terms among holdings (see RenewAll) and returns
// those whose rows stayed locked.
func (r *Renewer) renew(ctx context.Context, holdings []*Holding) ([]*Holding, error) {
	leases := make([]Lease, 0, len(holdings))
	live := make([]*Holding, 0, len(holdings))
	for _, h := range holdings {
		h.mu.Lock()
		if !h.done {
			live = append(live, h)
			leases = append(leases, h.lease)
		}
		h.mu.Unlock()
	}
	if len(live) == 0 {
		return nil, nil
	}
	// One order for every process's statement (the statement locks its
	// rows in id order too).
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
		return nil, err
	}
	renewed := 0
	var gone, locked []int // indexes of terms no longer held, of terms whose rows were locked
	for i, rr := range res {
		switch {
		case rr.Held:
			renewed++
			sortedHoldings[i].renewed(rr.Lease, sent)
		case rr.Busy:
			locked = append(locked, i)
		default:
			gone = append(gone, i)
		}
	}
	r.observe(RenewalRenewed, renewed)
	busy, stillGone := r.renewLocked(ctx, sortedHoldings, res, locked)
	gone = append(gone, stillGone...)
	if len(gone) == 0 {
		return busy, nil
	}
	// A delivery that wrote its batch's terminal state while the statement
	// ran is done, not fenced: it stops renewing as soon as it returns.
	goneLeases := make([]Lease, len(gone))
	for k, i := range gone {
		goneLeases[k] = res[i].Lease
	}
	ended, err := r.store.EndedWithoutLoss(rctx, goneLeases)
	if err != nil {
		ended = nil // unknown: treat every one as lost
	}
	lost, revoked := 0, 0
	for _, i := range gone {
		h, l := sortedHoldings[i], res[i].Lease
		switch ended[l.BatchID] {
		case EndedByHolder:
			h.fence(fmt.Errorf("term %d of batch %d ended with the batch's terminal write", l.Generation, l.BatchID))
			continue
		case EndedByCancel:
			if !h.fence(revokedCause(l)) {
				continue // closed by its delivery meanwhile
			}
			revoked++
			r.cfg.Logger.Warn("lease revoked: the batch was cancelled by an operator; stopping work on the batch", "batch_id", l.BatchID, "lease_id", l.HolderID, "lease_generation", l.Generation)
			continue
		}
		if !h.fence(goneCause(l)) {
			continue // closed by its delivery meanwhile
		}
		lost++
		r.cfg.Logger.Error("lease lost: stopping work on the batch", "batch_id", l.BatchID, "lease_id", l.HolderID, "lease_generation", l.Generation)
	}
	r.observe(RenewalRevoked, revoked)
	r.observe(RenewalLost, lost)
	return busy, nil
}

// goneCause is the fence cause of a term the database no longer holds.
func goneCause(l Lease) error {
	return fmt.Errorf("%w: the database no longer holds term %d of batch %d for %s", ErrLost, l.Generation, l.BatchID, l.HolderID)
}

// revokedCause is the fence cause of a term an operator's cancel revoked.
func revokedCause(l Lease) error {
	return fmt.Errorf("%w: term %d of batch %d was revoked by an operator's cancel", ErrLost, l.Generation, l.BatchID)
}

// renewLocked retries, each alone and at once, the terms (indexes of
// holdings and res) whose rows RenewMany found locked, waiting at most
// lockWait for each lock. It applies the renewals, and returns the terms
// whose rows stayed locked (unknown: they keep their deadlines) and the
// indexes of those found no longer held.
func (r *Renewer) renewLocked(ctx context.Context, holdings []*Holding, res []Renewal, locked []int) (busy []*Holding, gone []int) {
	if len(locked) == 0 {
		return nil, nil
	}
	type outcome struct {
		l    Lease
		held bool
		err  error
		sent time.Time
	}
	outcomes := make([]outcome, len(locked))
	var wg sync.WaitGroup
	for k, i := range locked {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, r.cfg.Every)
			defer cancel()
			o := &outcomes[k]
			o.sent = r.cfg.Clock()
			o.l, o.held, o.err = r.store.RenewWaiting(rctx, res[i].Lease, r.cfg.TTL, r.lockWait())
		})
	}
	wg.Wait()
	renewed, errs := 0, 0
	for k, i := range locked {
		h, o := holdings[i], outcomes[k]
		switch {
		case o.err == nil && o.held:
			renewed++
			h.renewed(o.l, o.sent)
		case o.err == nil:
			gone = append(gone, i)
		default:
			// Unknown: its row is still locked (or the retry failed). Not
			// lost; it is fenced only if its deadline passes first.
			busy = append(busy, h)
			if !errors.Is(o.err, ErrRowLocked) {
				errs++
				r.cfg.Logger.Warn("renewing a lease whose row was locked failed: retrying; it is fenced at its deadline",
					"batch_id", o.l.BatchID, "lease_generation", o.l.Generation, "error", o.err)
				continue
			}
			h.mu.Lock()
			first, deadline := !h.busy && !h.done, h.deadline
			h.busy = true
			h.mu.Unlock()
			if first {
				r.cfg.Logger.Warn("lease not renewed: another transaction holds the batch row's lock; retrying, the term is fenced at its deadline if the lock outlasts it",
					"batch_id", o.l.BatchID, "lease_id", o.l.HolderID, "lease_generation", o.l.Generation, "deadline_in_seconds", deadline.Sub(r.cfg.Clock()).Seconds())
			}
		}
	}
	r.observe(RenewalRenewed, renewed)
	r.observe(RenewalError, errs)
	r.observe(RenewalBusy, len(busy)-errs)
	return busy, gone
}
