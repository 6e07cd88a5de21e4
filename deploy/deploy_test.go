// Package deploy_test checks the operational artefacts under deploy/: every
// Prometheus alert rule and Grafana panel names only metrics (and labels)
// that the binaries export.
package deploy_test

import (
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
)

// exported returns every exported metric family and its label names. For
// histograms the _bucket, _sum and _count series are included.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	m := metrics.NewWorker()
	// Series per tenant exist only once a tenant has batches: give the
	// gauge one so it is gathered with its labels.
	m.SetTenantBatches([]metrics.TenantBatchCount{{Tenant: "tenant-a"}})
	// The database-derived gauges are exported once refreshed, and the
	// last success's timestamp once the database was reached.
	m.DatabaseStats.Refreshed(nil)
	m.TenantStats.Refreshed(nil)
	m.Database.Reached(time.Now())
	// Pool statistics are gathered from the pools a binary adds: add one
	// (pgxpool connects lazily; this one never does).
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m.AddPool("shared", pool)
	worker, err := m.Registry.Gather()
	require.NoError(t, err)
	serve, err := metrics.NewServe().Registry.Gather()
	require.NoError(t, err)
	sqs, err := metrics.NewSQS().Registry.Gather()
	require.NoError(t, err)
	reconcile, err := metrics.NewReconcile().Registry.Gather()
	require.NoError(t, err)
	out := map[string]map[string]bool{}
	for _, f := range slices.Concat(worker, serve, sqs, reconcile) {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		names := []string{f.GetName()}
		if f.GetType().String() == "HISTOGRAM" {
			labels["le"] = true
			names = append(names, f.GetName()+"_bucket", f.GetName()+"_sum", f.GetName()+"_count")
		}
		for _, n := range names {
			out[n] = labels
		}
	}
	return out
}

// targetLabels are set by the scrape on every series (the chart's
// ServiceMonitor, or the scrape job docs/deploy.md gives), not by the
// binaries: the dashboard and the chart's rules select on them.
var targetLabels = map[string]bool{"namespace": true, "release": true}

// checkExpr parses a PromQL expression and checks every selector against
// the exported metrics.
func checkExpr(t *testing.T, where, expr string, known map[string]map[string]bool) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	require.NoError(t, err, "%s: %s", where, expr)
	var names []string
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		labels, ok := known[vs.Name]
		require.True(t, ok, "%s: %q is not exported by the binaries", where, vs.Name)
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" || targetLabels[m.Name] {
				continue
			}
			require.True(t, labels[m.Name], "%s: metric %s has no label %q", where, vs.Name, m.Name)
		}
		names = append(names, vs.Name)
		return nil
	})
	require.NotEmpty(t, names, "%s names no metric", where)
	return names
}

// runbookURL is where every alert's runbook_url points, followed by a
// section anchor of docs/runbook.md.
const runbookURL = "https://github.com/fleet/ingest/blob/main/docs/runbook.md#"

// runbookAnchors returns the anchors of docs/runbook.md's headings, as
// GitHub renders them (lower case, spaces to hyphens, punctuation dropped).
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile("../docs/runbook.md")
	require.NoError(t, err)
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		title, ok := strings.CutPrefix(line, "## ")
		if !ok {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return anchors
}

func checkRunbook(t *testing.T, alert, url string, anchors map[string]bool) {
	t.Helper()
	anchor, ok := strings.CutPrefix(url, runbookURL)
	require.True(t, ok, "%s: runbook_url %q must point into docs/runbook.md", alert, url)
	require.True(t, anchors[anchor], "%s: docs/runbook.md has no section #%s", alert, anchor)
}

func TestRunbookCoversOperatorTasks(t *testing.T) {
	t.Parallel()
	anchors := runbookAnchors(t)
	for _, section := range []string{"stuck-batch", "parked-batch", "cancel", "retry", "resume", "lost-worker", "database-down", "permission-denied"} {
		require.True(t, anchors[section], "docs/runbook.md has no section %q", section)
	}
}

// alertsSource is the one source of the alert rules: the chart renders it
// per install (the PrometheusRule), and deploy/prometheus/alerts.yaml is
// that render for the defaults (deploy/helm/releases_test.go checks it).
const alertsSource = "helm/fleet-ingest/files/alerts.yaml"

func TestAlertRulesReferenceExportedMetrics(t *testing.T) {
	t.Parallel()
	known := exported(t)
	// up is written by Prometheus itself for every scrape target.
	known["up"] = map[string]bool{"job": true, "instance": true}
	anchors := runbookAnchors(t)
	groups, errs := rulefmt.ParseFile(alertsSource, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	require.Empty(t, errs)
	alerts := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "only alerting rules here")
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
			require.NotEmpty(t, r.Labels["severity"], r.Alert)
			checkExpr(t, r.Alert, r.Expr, known)
			checkRunbook(t, r.Alert, r.Annotations["runbook_url"], anchors)
			require.False(t, alerts[r.Alert], "alert %s is defined twice", r.Alert)
			alerts[r.Alert] = true
		}
	}
	for _, want := range []string{"FleetIngestStuckBatch", "FleetIngestLeaseRenewalsFailing", "FleetIngestTakeoverRateHigh", "FleetIngestQueueBacklogGrowing",
		"FleetIngestNoLiveWorker", "FleetIngestFailedBatchRateHigh", "FleetIngestParkedBatch",
		"FleetIngestSQSMessagesFailing", "FleetIngestSQSReceiveFailing", "FleetIngestSQSConsumerBehind", "FleetIngestReconcileFoundMissedUploads", "FleetIngestReconcileFailing", "FleetIngestReconcileCheckpointAhead", "FleetIngestReconcileSilenced",
		"FleetIngestDoorDown", "FleetIngestDoorErrors", "FleetIngestDatabaseUnreachable", "FleetIngestDatabaseStatsFailing",
		"FleetIngestNotificationsGivenUp", "FleetIngestNotificationsFailing", "FleetIngestNotificationDestinationsInvalid"} {
		require.True(t, alerts[want], "missing alert %s", want)
	}
}

func TestDashboardQueriesReferenceExportedMetrics(t *testing.T) {
	t.Parallel()
	known := exported(t)
	known["up"] = map[string]bool{"job": true, "instance": true}
	raw, err := os.ReadFile("grafana/fleet-ingest.json")
	require.NoError(t, err)
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	used := map[string]bool{}
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			expr := strings.ReplaceAll(tg.Expr, "$__rate_interval", "5m")
			for _, n := range checkExpr(t, p.Title, expr, known) {
				used[n] = true
			}
		}
	}
	// The panels operators asked for are there.
	for _, m := range []string{
		"ingest_lease_acquisitions_total", "ingest_lease_renewals_total", "ingest_stale_writes_rejected_total",
		"ingest_reservations_total", "ingest_queue_jobs", "ingest_batch_duration_seconds_bucket",
		"ingest_takeover_delay_seconds_bucket", "ingest_stuck_batches", "ingest_parked_batches", "ingest_records_loaded_total",
		"ingest_http_requests_total", "ingest_http_request_duration_seconds_bucket", "ingest_http_request_outcomes_total",
		"ingest_queue_wait_seconds_bucket",
		"ingest_sqs_messages_received_total", "ingest_sqs_messages_deleted_total", "ingest_sqs_messages_left_total",
		"ingest_sqs_oldest_message_age_seconds", "ingest_sqs_receive_duration_seconds_bucket", "ingest_sqs_receive_errors_total",
		"ingest_reconcile_folders_total", "ingest_reconcile_missed_total", "ingest_reconcile_scans_total",
		"ingest_reconcile_scan_duration_seconds_bucket", "ingest_reconcile_objects_listed_total",
		"ingest_notifications_sent_total", "ingest_notifications_failed_total", "ingest_notifications_given_up_total",
		"ingest_notifications_config_reload_failures_total",
		"ingest_database_up", "ingest_database_last_success_timestamp_seconds",
	} {
		require.True(t, used[m], "no panel shows %s", m)
	}
}
