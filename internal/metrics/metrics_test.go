package metrics

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// exported returns the metric families a registry exports.
func exported(t *testing.T, m *Metrics) map[string]bool {
	t.Helper()
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	return names
}

// TestEachBinaryExportsItsOwnMetrics checks that only the worker exports the
// worker's lease, delivery and database-derived metrics: enqueue serve, sqs
// and reconcile would export them frozen at zero, beside the workers' real
// ones, on the same dashboards.
func TestEachBinaryExportsItsOwnMetrics(t *testing.T) {
	workerOnly := []string{"ingest_leases_held", "ingest_lease_acquisitions_total", "ingest_lease_renewals_total",
		"ingest_deliveries_total", "ingest_running_batches", "ingest_queue_jobs", "ingest_queue_wait_seconds"}
	worker := exported(t, New())
	for _, name := range workerOnly {
		require.True(t, worker[name], "the worker exports %s", name)
	}
	for name, m := range map[string]*Metrics{"serve": NewServe(), "sqs": NewSQS(), "reconcile": NewReconcile()} {
		got := exported(t, m)
		for _, w := range workerOnly {
			require.False(t, got[w], "%s exports %s", name, w)
		}
		require.True(t, got["ingest_reservations_total"], "%s exports its reservations", name)
		require.True(t, got["ingest_build_info"], name)
		require.True(t, got["go_goroutines"], name)
		for family := range got {
			switch {
			case strings.HasPrefix(family, "ingest_sqs_"):
				require.Equal(t, "sqs", name, family)
			case strings.HasPrefix(family, "ingest_reconcile_"):
				require.Equal(t, "reconcile", name, family)
			}
		}
	}
	require.True(t, exported(t, NewSQS())["ingest_sqs_messages_deleted_total"])
	require.True(t, exported(t, NewReconcile())["ingest_reconcile_missed_total"])
}
