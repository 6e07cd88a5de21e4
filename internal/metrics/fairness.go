package metrics

import "github.com/prometheus/client_golang/prometheus"

// TenantBatchStates are the states of ingest_tenant_batches: running holds
// a live lease; waiting is Running, not parked, without one (queued,
// snoozed, in retry backoff, or behind its tenant's cap).
var TenantBatchStates = []string{"running", "waiting"}

func (m *Metrics) newFairness(f func(prometheus.Collector)) {
	m.TenantCapDeferrals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_tenant_cap_deferrals_total",
		Help: "Deliveries snoozed because their tenant had --max-running-per-tenant batches running while another tenant's work waited.",
	})
	m.TenantBatches = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ingest_tenant_batches",
		Help: "Running scoped batches per tenant, from the database: running (holding a live lease) or waiting (no lease, not parked). Tenants with neither are not exported.",
	}, []string{"tenant", "state"})
	f(m.TenantCapDeferrals)
	f(m.TenantBatches)
}
