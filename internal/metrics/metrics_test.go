package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
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
	w := NewWorker()
	// The database-derived gauges are exported once refreshed.
	w.DatabaseStats.Refreshed(nil)
	w.TenantStats.Refreshed(nil)
	worker := exported(t, w)
	for _, name := range workerOnly {
		require.True(t, worker[name], "the worker exports %s", name)
	}
	// Nor does the worker export the doors' families, which it never
	// moves: they would sit at zero beside enqueue serve's, sqs's and
	// reconcile's real ones.
	for family := range worker {
		for _, door := range []string{"ingest_http_", "ingest_sqs_", "ingest_reconcile_", "ingest_sns_", "ingest_reservations_",
			"ingest_late_object_events_", "ingest_events_ignored_", "ingest_tenant_tokens_", "ingest_import_group_", "ingest_secret_file_"} {
			require.False(t, strings.HasPrefix(family, door), "the worker exports %s", family)
		}
	}
	require.True(t, worker["ingest_notifications_sent_total"], "the worker sends the notifications")
	require.True(t, worker["ingest_tenant_cap_deferrals_total"])
	require.True(t, worker["ingest_river_leader"])
	require.True(t, worker["ingest_database_up"])
	for name, m := range map[string]*Metrics{"serve": NewServe(), "sqs": NewSQS(), "reconcile": NewReconcile()} {
		got := exported(t, m)
		for _, w := range workerOnly {
			require.False(t, got[w], "%s exports %s", name, w)
		}
		require.True(t, got["ingest_reservations_total"], "%s exports its reservations", name)
		require.True(t, got["ingest_build_info"], name)
		require.True(t, got["ingest_database_up"], "%s says whether it reaches its database", name)
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
	// ingest_late_object_events_total and ingest_events_ignored_total:
	// each door its own series (every reason of its own).
	for m, door := range map[*Metrics]string{NewServe(): DoorEvents, NewSQS(): DoorSQS} {
		families, err := m.Registry.Gather()
		require.NoError(t, err)
		doors := map[string][]string{}
		for _, f := range families {
			if f.GetName() == "ingest_late_object_events_total" || f.GetName() == "ingest_events_ignored_total" {
				for _, s := range f.GetMetric() {
					doors[f.GetName()] = append(doors[f.GetName()], s.GetLabel()[0].GetValue()) // door sorts first
				}
			}
		}
		require.Equal(t, []string{door}, doors["ingest_late_object_events_total"])
		require.Equal(t, []string{door, door, door, door}, doors["ingest_events_ignored_total"], "one series per reason: %v", EventIgnoredReasons)
	}
	require.True(t, exported(t, NewSQS())["ingest_sqs_messages_deleted_total"])
	require.True(t, exported(t, NewReconcile())["ingest_reconcile_missed_total"])
}

// TestMetricNamesFollowTheConventions lints every binary's registry with
// client_golang's promlint (what promtool check metrics runs): no histogram
// whose name ends in a reserved suffix (ingest_sqs_message_receive_count
// was exported as …_count_count), no counter without _total, base units.
func TestMetricNamesFollowTheConventions(t *testing.T) {
	for name, m := range map[string]*Metrics{"all": New(), "worker": NewWorker(), "serve": NewServe(), "sqs": NewSQS(), "reconcile": NewReconcile()} {
		NewImportGroups(m.Registry)
		families := gatherIngest(t, m)
		problems, err := promlint.NewWithMetricFamilies(families).Lint()
		require.NoError(t, err)
		require.Empty(t, problems, name)
		// promlint does not check a histogram's own name: its series add
		// _bucket, _sum and _count to it.
		for _, f := range families {
			if f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
				for _, reserved := range []string{"_count", "_sum", "_bucket", "_total"} {
					require.False(t, strings.HasSuffix(f.GetName(), reserved), "%s: histogram %s ends in %s", name, f.GetName(), reserved)
				}
			}
		}
	}
	require.True(t, exported(t, NewSQS())["ingest_sqs_message_receives"])
}

// gatherIngest returns the ingest_ families m's registry gathers (not the
// Go and process collectors').
func gatherIngest(t *testing.T, m *Metrics) []*dto.MetricFamily {
	t.Helper()
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	var out []*dto.MetricFamily
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "ingest_") {
			out = append(out, f)
		}
	}
	return out
}

// TestDoorRoutesAreOneVocabulary: ingest_http_request_outcomes_total names
// its routes as ingest_http_requests_total and the access log do, by
// their ServeMux patterns.
func TestDoorRoutesAreOneVocabulary(t *testing.T) {
	families, err := NewServe().Registry.Gather()
	require.NoError(t, err)
	routes := map[string]map[string]bool{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "ingest_http_") {
			continue
		}
		routes[f.GetName()] = map[string]bool{}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "route" {
					routes[f.GetName()][l.GetValue()] = true
				}
			}
		}
	}
	require.Len(t, routes, 3)
	for name, values := range routes {
		require.NotEmpty(t, values, name)
		for route := range values {
			_, known := DoorRoutes[route]
			require.True(t, known, "%s: route %q is not one of the door's patterns", name, route)
		}
	}
	require.Equal(t, routes["ingest_http_requests_total"], routes["ingest_http_request_outcomes_total"])
}
