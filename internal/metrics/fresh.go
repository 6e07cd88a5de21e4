package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FreshMaxAgeDefault is how long a successful refresh of the
// database-derived gauges counts for until SetStatsRefresh says otherwise:
// three of the worker's default --stats-interval (15 s) and the refresh's
// 5 s timeout.
const FreshMaxAgeDefault = 3*15*time.Second + 5*time.Second

// DatabaseGauges is a group of gauges that one periodic query of the
// database refreshes (jobs.RunStats), exported only while fresh: after a
// refresh that succeeded and for at most its maximum age. Before the first
// refresh, after one that failed, and once the last success is older than
// the maximum age (the refresh loop stalled, or every attempt times out)
// none of its series is exported: an alert or a dashboard sees no value,
// never the value the database last gave, frozen. So a worker whose
// database is down does not say "0 stuck batches, 0 queued".
//
// It is a prometheus.Collector standing for its gauges: register it, not
// them. Its gauges are set as usual; Refreshed says whether a refresh
// succeeded.
type DatabaseGauges struct {
	collectors []prometheus.Collector

	mu     sync.Mutex
	at     time.Time // when the last refresh succeeded; zero: never, or the last failed
	maxAge time.Duration
	now    func() time.Time
}

func newDatabaseGauges(cs ...prometheus.Collector) *DatabaseGauges {
	return &DatabaseGauges{collectors: cs, maxAge: FreshMaxAgeDefault, now: time.Now}
}

// Refreshed records the outcome of a refresh of the group's gauges: nil
// makes them fresh for the maximum age, an error hides them until the next
// refresh that succeeds.
func (g *DatabaseGauges) Refreshed(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.at = time.Time{}
		return
	}
	g.at = g.now()
}

// SetMaxAge sets how long a successful refresh counts for.
func (g *DatabaseGauges) SetMaxAge(d time.Duration) {
	g.mu.Lock()
	g.maxAge = d
	g.mu.Unlock()
}

// Fresh reports whether the gauges are exported now.
func (g *DatabaseGauges) Fresh() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.at.IsZero() && g.now().Sub(g.at) <= g.maxAge
}

// Describe sends the descriptors of every gauge of the group, exported or
// not, so the registry checks them once at registration.
func (g *DatabaseGauges) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range g.collectors {
		c.Describe(ch)
	}
}

// Collect sends the group's series while it is fresh, and nothing
// otherwise.
func (g *DatabaseGauges) Collect(ch chan<- prometheus.Metric) {
	if !g.Fresh() {
		return
	}
	for _, c := range g.collectors {
		c.Collect(ch)
	}
}

// SetStatsRefresh sets the maximum age of both groups of database-derived
// gauges (DatabaseStats, TenantStats) for a refresh every interval, each
// bounded by timeout: three intervals and the timeout.
func (m *Metrics) SetStatsRefresh(interval, timeout time.Duration) {
	for _, g := range []*DatabaseGauges{m.DatabaseStats, m.TenantStats} {
		g.SetMaxAge(3*interval + timeout)
	}
}
