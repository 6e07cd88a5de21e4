package jobs

import (
	"context"
	"sync"
	"time"

	"github.com/fleet/ingest/internal/metrics"
)

// Defaults of GroupConfig.
const (
	// GroupLingerDefault is enqueue serve's --group-linger.
	GroupLingerDefault = 2 * time.Millisecond
	// GroupMaxDefault bounds the folders of one group.
	GroupMaxDefault = 100
	// GroupTimeoutDefault bounds a group's transaction.
	GroupTimeoutDefault = 30 * time.Second
)

// GroupConfig configures a Grouper.
type GroupConfig struct {
	// Linger is the longest a request waits for others to share its
	// transaction. Zero turns grouping off: every call is its own
	// transaction, as Enqueuer.ImportMany.
	Linger time.Duration
	// Max bounds the folders of one group; a call of Max folders or more
	// is imported alone. Defaults to GroupMaxDefault; at most MaxBurst.
	Max int
	// Timeout bounds a group's transaction, which runs on behalf of every
	// caller in it and so under none of their contexts. Defaults to
	// GroupTimeoutDefault.
	Timeout time.Duration
	// Metrics, if set, records group sizes, commits and fallbacks.
	Metrics *metrics.ImportGroups
}

// Grouper is group commit for imports: concurrent Import and ImportMany
// calls share one Enqueuer.ImportMany burst (one reservation statement,
// one job insert, one commit), and each call is answered with its own
// outcomes, exactly as Enqueuer would answer it alone.
//
// A group goes as soon as no other group's transaction is in flight (an
// idle Grouper adds no wait), when it holds Max folders, or when its
// first request has waited Linger, whichever is first; requests that
// arrive while a transaction commits gather for the next one. So a call
// waits at most Linger and one transaction. Folders named by several
// calls of one group are answered in arrival order, as if the calls had
// run one after another (the second copy: conflict with the first's
// batch).
//
// A group whose transaction fails (an error, not an outcome) fails no
// call by itself: unless the group ran out of time, each call of the group
// is then imported alone under its own context, so a folder that makes the
// shared transaction fail fails only its own request.
//
// A call waits for its group even if its context ends meanwhile (for at
// most Linger and one transaction, bounded by Timeout): the shared
// transaction may already hold its folders, and its answer says what
// became of them. A Grouper needs no closing: pending groups go on their
// own, and every call returns once its group has.
type Grouper struct {
	enq *Enqueuer
	cfg GroupConfig

	mu       sync.Mutex
	open     *group // gathering requests; nil when none is
	inFlight int    // groups sealed and not yet answered
}

// group is one shared transaction: the requests of its calls, in order,
// and, once done is closed, their results.
type group struct {
	reqs    []ImportRequest
	calls   int
	sealed  chan struct{} // closed when the group stops gathering
	done    chan struct{} // closed when results/err/alone are set
	results []Result
	err     error
	// alone: the shared transaction failed; each call imports its own
	// requests.
	alone bool
}

// NewGrouper returns a Grouper over enq.
func NewGrouper(enq *Enqueuer, cfg GroupConfig) *Grouper {
	if cfg.Max <= 0 {
		cfg.Max = GroupMaxDefault
	}
	cfg.Max = min(cfg.Max, MaxBurst)
	if cfg.Timeout <= 0 {
		cfg.Timeout = GroupTimeoutDefault
	}
	return &Grouper{enq: enq, cfg: cfg}
}

// Import is Enqueuer.Import through group commit; its contract is the
// same.
func (g *Grouper) Import(ctx context.Context, req ImportRequest) (Result, error) {
	if err := ValidateImport(req); err != nil {
		return Result{}, err
	}
	res, err := g.ImportMany(ctx, []ImportRequest{req})
	if err != nil {
		return Result{}, err
	}
	return res[0], nil
}

// ImportMany is Enqueuer.ImportMany through group commit; its contract is
// the same. The requests of one call stay together, in order, in one
// group.
func (g *Grouper) ImportMany(ctx context.Context, reqs []ImportRequest) ([]Result, error) {
	if g.cfg.Linger <= 0 || len(reqs) == 0 || len(reqs) >= g.cfg.Max {
		return g.enq.ImportMany(ctx, reqs)
	}
	grp, offset, leader := g.join(reqs)
	if leader {
		g.lead(ctx, grp)
	}
	<-grp.done
	if grp.alone {
		return g.enq.ImportMany(ctx, reqs)
	}
	if grp.err != nil {
		return nil, grp.err
	}
	return grp.results[offset : offset+len(reqs) : offset+len(reqs)], nil
}

// join adds reqs to the open group, or opens one (leader: the caller runs
// it), and returns the group and where reqs start in it.
func (g *Grouper) join(reqs []ImportRequest) (grp *group, offset int, leader bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open != nil && len(g.open.reqs)+len(reqs) > g.cfg.Max {
		g.sealLocked(g.open) // full enough: it goes now, and reqs start the next
	}
	if g.open == nil {
		g.open = &group{sealed: make(chan struct{}), done: make(chan struct{})}
		leader = true
	}
	grp, offset = g.open, len(g.open.reqs)
	grp.reqs = append(grp.reqs, reqs...)
	grp.calls++
	if len(grp.reqs) >= g.cfg.Max || g.inFlight == 0 {
		// Full, or nothing to wait for: no transaction is in flight whose
		// end would bring others along.
		g.sealLocked(grp)
	}
	g.observeWaitingLocked()
	return grp, offset, leader
}

// observeWaitingLocked sets the gauge of gathered calls; g.mu is held.
func (g *Grouper) observeWaitingLocked() {
	if g.cfg.Metrics == nil {
		return
	}
	waiting := 0
	if g.open != nil {
		waiting = g.open.calls
	}
	g.cfg.Metrics.Waiting.Set(float64(waiting))
}

// sealLocked stops grp gathering requests; g.mu is held.
func (g *Grouper) sealLocked(grp *group) {
	if g.open != grp {
		return // sealed already
	}
	g.open = nil
	g.inFlight++
	close(grp.sealed)
	g.observeWaitingLocked()
}

// lead waits until grp is sealed (or seals it when its linger is over),
// runs its transaction and answers its calls.
func (g *Grouper) lead(ctx context.Context, grp *group) {
	select {
	case <-grp.sealed:
	default:
		linger := time.NewTimer(g.cfg.Linger)
		select {
		case <-grp.sealed:
		case <-linger.C:
			g.mu.Lock()
			g.sealLocked(grp)
			g.mu.Unlock()
		}
		linger.Stop()
	}
	// The transaction answers every call of the group: no caller's
	// cancellation ends it, only the group's own timeout.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.Timeout)
	results, err := g.enq.ImportMany(tctx, grp.reqs)
	timedOut := tctx.Err() != nil
	cancel()
	switch {
	case err == nil:
		grp.results = results
		if m := g.cfg.Metrics; m != nil {
			m.Size.Observe(float64(len(grp.reqs)))
			m.Commits.Inc()
		}
	case grp.calls > 1 && !timedOut:
		// One folder may have failed the shared transaction: let each
		// call try its own.
		grp.alone = true
		g.enq.logger().Warn("group import failed: importing its requests one by one", "calls", grp.calls, "imports", len(grp.reqs), "error", err)
		if m := g.cfg.Metrics; m != nil {
			m.Fallbacks.Inc()
		}
	default:
		grp.err = err
	}
	g.mu.Lock()
	g.inFlight--
	if g.open != nil {
		// The requests that gathered while this transaction ran go now.
		g.sealLocked(g.open)
	}
	g.mu.Unlock()
	close(grp.done)
}
