package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestNotificationMetrics: the worker exports the notification counters
// with a series per destination kind from the start and no tenant label;
// enqueue serve does not export them.
func TestNotificationMetrics(t *testing.T) {
	m := New()
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	kinds := map[string][]string{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				require.NotEqual(t, "tenant", l.GetName(), f.GetName())
				kinds[f.GetName()] = append(kinds[f.GetName()], l.GetValue())
			}
		}
	}
	for _, name := range []string{"ingest_notifications_sent_total", "ingest_notifications_failed_total", "ingest_notifications_given_up_total"} {
		require.ElementsMatch(t, NotificationKinds, kinds[name], name)
	}
	require.True(t, exported(t, m)["ingest_notifications_config_reload_failures_total"])
	m.NotificationsGivenUp.WithLabelValues("sns").Inc()
	require.Equal(t, 1.0, testutil.ToFloat64(m.NotificationsGivenUp.WithLabelValues("sns")))

	serve := exported(t, NewServe())
	for _, name := range []string{"ingest_notifications_sent_total", "ingest_notifications_config_reload_failures_total"} {
		require.False(t, serve[name], name)
	}
}
