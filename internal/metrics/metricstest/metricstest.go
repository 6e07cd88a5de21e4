// Package metricstest reads the series a metrics registry gathers, for
// tests.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TenantBatches returns, per tenant label value, the states and values of
// ingest_tenant_batches that g gathers.
func TenantBatches(t testing.TB, g prometheus.Gatherer) map[string]map[string]float64 {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	out := map[string]map[string]float64{}
	for _, f := range families {
		if f.GetName() != "ingest_tenant_batches" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if out[labels["tenant"]] == nil {
				out[labels["tenant"]] = map[string]float64{}
			}
			out[labels["tenant"]][labels["state"]] = s.GetGauge().GetValue()
		}
	}
	return out
}
