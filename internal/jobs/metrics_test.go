package jobs

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
)

// metricValue returns the value of a series of name whose single label (if
// any) has the given value.
func metricValue(t *testing.T, m *metrics.Metrics, name, label string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, metric := range f.GetMetric() {
			if label != "" && (len(metric.GetLabel()) == 0 || metric.GetLabel()[len(metric.GetLabel())-1].GetValue() != label) {
				continue
			}
			return value(metric)
		}
	}
	t.Fatalf("no series %s{%s}", name, label)
	return 0
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

func counterValue(t *testing.T, m *metrics.Metrics, name, label string) float64 {
	return metricValue(t, m, name, label)
}

func gaugeValue(t *testing.T, m *metrics.Metrics, name, label string) float64 {
	return metricValue(t, m, name, label)
}
