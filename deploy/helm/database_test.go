package helm_test

import (
	"fmt"
	"maps"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestChartDatabaseUnreachablePagesItsOwnRelease runs promtool test rules
// on FleetIngestDatabaseUnreachable as release prod (namespace fleet)
// renders it, beside another release in the same namespace (canary) and
// one in another (staging):
//   - canary's processes all lose the database from the start: prod's rule
//     stays silent (its selector reads prod's series only);
//   - prod's worker and door lose it at 5m: silent at 6m (one minute of 0),
//     paging at 7m with prod's namespace and release;
//   - one of prod's processes reaching it again (at 12m) ends the page.
func TestChartDatabaseUnreachablePagesItsOwnRelease(t *testing.T) {
	t.Parallel()
	rules := renderedRules(t, renderRelease(t, "prod", "fleet", monitoringValues(nil)), "prod-fleet-ingest")
	r, ok := ruleMap(rules)["FleetIngestDatabaseUnreachable"]
	require.True(t, ok, "the page is the worker's: every install has it")
	require.Equal(t, "page", r.Labels["severity"])

	up := func(ns, release, job, values string) string {
		return fmt.Sprintf("  - series: ingest_database_up{namespace=%q,release=%q,job=%q,instance=\"%s-%s\"}\n    values: %s\n", ns, release, job, release, job, values)
	}
	labels := maps.Clone(r.Labels)
	labels["namespace"], labels["release"] = "fleet", "prod"
	exp, err := yaml.Marshal([]map[string]any{{"exp_labels": labels, "exp_annotations": r.Annotations}})
	require.NoError(t, err)
	pages := func(at string) string {
		return fmt.Sprintf("  - eval_time: %s\n    alertname: %s\n    exp_alerts:\n%s", at, r.Alert, indent(string(exp), "    "))
	}
	test := "rule_files:\n- rules.yaml\nevaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n" +
		up("fleet", "prod", "fleet-ingest-worker", "1x4 0x6 1x10") +
		up("fleet", "prod", "fleet-ingest-enqueue", "1x4 0x16") +
		up("fleet", "canary", "fleet-ingest-worker", "0x20") +
		up("fleet", "canary", "fleet-ingest-enqueue", "0x20") +
		up("fleet-staging", "staging", "fleet-ingest-worker", "0x20") +
		"  alert_rule_test:\n" +
		silent("4m", r.Alert) + silent("6m", r.Alert) + pages("7m") + pages("11m") + silent("12m", r.Alert)
	out, ok := promtoolRun(t, rules, test)
	require.True(t, ok, "%s\n%s", out, test)
}
