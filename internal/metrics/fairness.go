package metrics

import (
	"cmp"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// TenantBatchStates are the states of ingest_tenant_batches: running holds
// a live lease; waiting is Running, not parked, without one (queued,
// snoozed, in retry backoff, or behind its tenant's cap).
var TenantBatchStates = []string{"running", "waiting"}

// TenantOther is the tenant label value under which a tenant-labelled
// family sums the tenants beyond its bound (Metrics.MaxTenants). A tenant
// id starts with a letter or a digit (batch.ValidateTenantID), so it names
// no tenant.
const TenantOther = "_other"

// MaxTenantsDefault is the default Metrics.MaxTenants (worker run
// --metrics-max-tenants).
const MaxTenantsDefault = 100

// TenantBatchCount is one tenant's Running scoped batches, as
// ingest_tenant_batches exports them.
type TenantBatchCount struct {
	Tenant string
	// Running hold a live lease; Waiting are not parked and hold none.
	Running, Waiting int64
}

func (m *Metrics) newFairness(f func(prometheus.Collector)) {
	m.TenantCapDeferrals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_tenant_cap_deferrals_total",
		Help: "Deliveries snoozed because their tenant had --max-running-per-tenant batches running while another tenant's work waited.",
	})
	m.tenantBatches = &tenantBatches{desc: prometheus.NewDesc("ingest_tenant_batches",
		"Running scoped batches per tenant, from the database: running (holding a live lease) or waiting (no lease, not parked). "+
			"Only the --metrics-max-tenants tenants with the most such batches (100 by default; ties by tenant id) have series of their own; "+
			"the others are summed under tenant=\""+TenantOther+"\". Tenants with neither are not exported.",
		[]string{"tenant", "state"}, nil)}
	m.RiverLeader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_river_leader",
		Help: "1 on the worker that is River's elected leader (river_leader, read every --stats-interval), the one process that exports ingest_tenant_batches; 0 on the others.",
	})
	f(m.TenantCapDeferrals)
	// tenantBatches and RiverLeader are registered through TenantStats.
}

// tenantBatches is the collector of ingest_tenant_batches: the counts of
// the last SetTenantBatches, replaced as a whole, so a scrape never sees
// half of one refresh and half of another.
type tenantBatches struct {
	desc *prometheus.Desc

	mu     sync.Mutex
	counts []TenantBatchCount
}

func (c *tenantBatches) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *tenantBatches) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	counts := c.counts
	c.mu.Unlock()
	for _, tc := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(tc.Running), tc.Tenant, "running")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(tc.Waiting), tc.Tenant, "waiting")
	}
}

// SetTenantBatches replaces the series of ingest_tenant_batches with
// counts (one per tenant). At most MaxTenants tenants get series of their
// own: those with the most Running batches (running and waiting together;
// ties by tenant id), so every worker, counting the same rows, exports the
// same tenants. The other tenants' batches are summed under TenantOther,
// exported only when there are any.
func (m *Metrics) SetTenantBatches(counts []TenantBatchCount) {
	kept, other, folded := topTenants(counts, max(m.MaxTenants, 0))
	if folded {
		kept = append(kept, other)
	}
	m.tenantBatches.mu.Lock()
	m.tenantBatches.counts = kept
	m.tenantBatches.mu.Unlock()
}

// topTenants returns the n tenants of counts with the most batches (their
// order as SetTenantBatches documents it) and the sum of the others;
// folded reports whether there were others. counts is not modified.
func topTenants(counts []TenantBatchCount, n int) (kept []TenantBatchCount, other TenantBatchCount, folded bool) {
	sorted := slices.Clone(counts)
	slices.SortFunc(sorted, func(a, b TenantBatchCount) int {
		return cmp.Or(cmp.Compare(b.Running+b.Waiting, a.Running+a.Waiting), cmp.Compare(a.Tenant, b.Tenant))
	})
	if len(sorted) <= n {
		return sorted, TenantBatchCount{}, false
	}
	other.Tenant = TenantOther
	for _, c := range sorted[n:] {
		other.Running += c.Running
		other.Waiting += c.Waiting
	}
	return sorted[:n], other, true
}
