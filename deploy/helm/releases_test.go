package helm_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleet/ingest/internal/testkit/testdeps"
)

// twoReleases are two installs of the chart in one namespace, every
// component enabled: the case where nothing but the release label tells
// their series, alerts, Secrets and dashboards apart.
var twoReleases = []string{"prod", "canary"}

const twoReleasesNamespace = "fleet"

func everyComponentMonitored() map[string]any {
	return monitoringValues(map[string]any{"sqs": sqsOn, "reconcile": reconcileOn})
}

// TestChartAlertsNameTheirRelease: every rule a release renders carries
// the labels namespace and release (its own) and a summary that names
// both; then every promtool test of deploy/prometheus (*_test.yaml,
// written against the rules' source on series without those labels) is
// run again against the rules of two releases rendered into one namespace,
// each input series once per release and each expected alert once per
// release with that release's labels and summary: every alert that fires
// carries namespace and release, and the two releases' alerts are
// distinct (promtool compares the exact label sets).
func TestChartAlertsNameTheirRelease(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plain := plainRules(t)
	var ruleFiles []string
	for _, rel := range twoReleases {
		rules := renderedRules(t, renderRelease(t, rel, twoReleasesNamespace, everyComponentMonitored()), rel+"-fleet-ingest")
		got := ruleMap(rules)
		require.Len(t, got, len(plain), "every component enabled: every alert")
		for name, r := range got {
			require.Equal(t, twoReleasesNamespace, r.Labels["namespace"], name)
			require.Equal(t, rel, r.Labels["release"], name)
			require.Equal(t, plain[name].Labels["severity"], r.Labels["severity"], name)
			require.Equal(t, twoReleasesNamespace+"/"+rel+": "+plain[name].Annotations["summary"], r.Annotations["summary"], name)
		}
		raw, err := yaml.Marshal(rules)
		require.NoError(t, err)
		file := rel + "-rules.yaml"
		require.NoError(t, os.WriteFile(filepath.Join(dir, file), raw, 0o600))
		ruleFiles = append(ruleFiles, file)
	}

	tests, err := filepath.Glob("../prometheus/*_test.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, tests)
	bin := promtoolBin(t)
	firing := 0
	for _, file := range tests {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		twice, n := perRelease(t, raw, ruleFiles)
		firing += n
		out := filepath.Join(dir, filepath.Base(file))
		require.NoError(t, os.WriteFile(out, twice, 0o600))
		cmd := exec.Command(bin, "test", "rules", filepath.Base(out))
		cmd.Dir = dir
		res, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s, run for releases %v in namespace %s:\n%s", file, twoReleases, twoReleasesNamespace, res)
	}
	require.GreaterOrEqual(t, firing, 2*len(plain), "every alert shown firing, once per release")
	t.Logf("%d test file(s), %d rules per release, %d expected alerts across %v, each with its namespace and release", len(tests), len(plain), firing, twoReleases)
}

// perRelease rewrites a promtool test file for the rendered rules of
// twoReleases: each input series once per release (with its namespace and
// release labels), each expected alert once per release (with them as
// labels and the summary naming them). A series that names its install
// already is kept as it is, and an alert expected of an install is
// expected once, if that install is one of the two, with its summary
// naming it. It returns the file and the number of expected alerts in it.
func perRelease(t *testing.T, raw []byte, ruleFiles []string) ([]byte, int) {
	t.Helper()
	// YAML reads an unquoted 0x110 (110 zeros to promtool) as the
	// hexadecimal number 272: such values must be quoted to survive here.
	if m := unquotedHex.Find(raw); m != nil {
		t.Fatalf("%q: quote the values (YAML reads 0x... as a hexadecimal number)", m)
	}
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	doc["rule_files"] = ruleFiles
	// Group names repeat across the two files; promql_expr_test has no
	// alerts to name an install: the source's own run covers both.
	delete(doc, "group_eval_order")
	n := 0
	p := parser.NewParser(parser.Options{})
	for _, tc := range doc["tests"].([]any) {
		tc := tc.(map[string]any)
		delete(tc, "promql_expr_test")
		var series []any
		for _, s := range asList(tc["input_series"]) {
			s := s.(map[string]any)
			lbls, err := p.ParseMetric(s["series"].(string))
			require.NoError(t, err, "%v", s["series"])
			if lbls.Has("namespace") || lbls.Has("release") {
				// A test of installs of its own: its series as they are.
				series = append(series, s)
				continue
			}
			for _, rel := range twoReleases {
				b := labels.NewBuilder(lbls)
				b.Set("namespace", twoReleasesNamespace)
				b.Set("release", rel)
				c := maps.Clone(s)
				c["series"] = seriesString(b.Labels())
				series = append(series, c)
			}
		}
		tc["input_series"] = series
		for _, at := range asList(tc["alert_rule_test"]) {
			at := at.(map[string]any)
			var exp []any
			for _, e := range asList(at["exp_alerts"]) {
				e := e.(map[string]any)
				own, _ := e["exp_labels"].(map[string]any)
				releases := twoReleases
				if own["namespace"] != nil || own["release"] != nil {
					// An install of the test's own: expected once if it is
					// one of the two rendered, else not at all.
					if own["namespace"] != twoReleasesNamespace || !slices.Contains(twoReleases, fmt.Sprint(own["release"])) {
						continue
					}
					releases = []string{fmt.Sprint(own["release"])}
				}
				for _, rel := range releases {
					lbls := map[string]any{}
					maps.Copy(lbls, own)
					lbls["namespace"], lbls["release"] = twoReleasesNamespace, rel
					ann := map[string]any{}
					if a, ok := e["exp_annotations"].(map[string]any); ok {
						maps.Copy(ann, a)
					}
					if s, ok := ann["summary"].(string); ok {
						ann["summary"] = twoReleasesNamespace + "/" + rel + ": " + s
					}
					exp = append(exp, map[string]any{"exp_labels": lbls, "exp_annotations": ann})
					n++
				}
			}
			at["exp_alerts"] = exp
			if exp == nil {
				at["exp_alerts"] = []any{}
			}
		}
	}
	out, err := yaml.Marshal(doc)
	require.NoError(t, err)
	return out, n
}

var unquotedHex = regexp.MustCompile(`(?m)values:[ \t]*0x[0-9]+[ \t]*$`)

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// seriesString writes labels as promtool's input series: name{k="v",…}.
func seriesString(lbls labels.Labels) string {
	var parts []string
	lbls.Range(func(l labels.Label) {
		if l.Name != model.MetricNameLabel {
			parts = append(parts, l.Name+"="+strconv.Quote(l.Value))
		}
	})
	return lbls.Get(model.MetricNameLabel) + "{" + strings.Join(parts, ",") + "}"
}

// TestTwoReleasesConsumersDownAreTwoAlerts: two releases in one namespace
// lose their enqueue sqs (the targets are gone from 4m):
// FleetIngestSQSConsumerDown fires twice, once per release, each alert
// labelled with its namespace and release and its summary naming them (an
// absent() expression has no labels of its own: before the chart labelled
// every rule, the two were one alert with identical labels to
// Alertmanager). Only prod's consumer down: one alert, prod's.
func TestTwoReleasesConsumersDownAreTwoAlerts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rules := map[string]alertRule{}
	var files []string
	for _, rel := range twoReleases {
		g := renderedRules(t, renderRelease(t, rel, twoReleasesNamespace,
			monitoringValues(map[string]any{"enqueue": map[string]any{"enabled": false}, "sqs": sqsOn})), rel+"-fleet-ingest")
		rules[rel] = ruleMap(g)["FleetIngestSQSConsumerDown"]
		require.True(t, strings.HasPrefix(rules[rel].Expr, "absent("), rules[rel].Expr)
		raw, err := yaml.Marshal(g)
		require.NoError(t, err)
		files = append(files, rel+".yaml")
		require.NoError(t, os.WriteFile(filepath.Join(dir, rel+".yaml"), raw, 0o600))
	}
	require.NotEqual(t, rules["prod"].Labels, rules["canary"].Labels)

	up := func(rel, job, values string) string {
		return fmt.Sprintf("  - series: up{namespace=%q,release=%q,job=%q,instance=\"%s-%s\"}\n    values: %s\n", twoReleasesNamespace, rel, job, rel, job, values)
	}
	alert := func(rel string) string {
		r := rules[rel]
		exp, err := yaml.Marshal([]map[string]any{{"exp_labels": r.Labels, "exp_annotations": r.Annotations}})
		require.NoError(t, err)
		return indent(string(exp), "    ")
	}
	run := func(name, series, expected string) {
		test := "rule_files: [" + strings.Join(files, ", ") + "]\nevaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n" + series +
			"  alert_rule_test:\n" +
			"  - eval_time: 5m\n    alertname: FleetIngestSQSConsumerDown\n    exp_alerts: []\n" +
			"  - eval_time: 20m\n    alertname: FleetIngestSQSConsumerDown\n    exp_alerts:\n" + expected
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(test), 0o600))
		cmd := exec.Command(promtoolBin(t), "test", "rules", name)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s:\n%s\n%s", name, test, out)
	}
	series := ""
	for _, rel := range twoReleases {
		series += up(rel, "fleet-ingest-worker", "1x30") + up(rel, "fleet-ingest-sqs", "1x3 _x27")
	}
	run("test-both.yaml", series, alert("prod")+alert("canary"))
	require.Contains(t, alert("prod"), "summary: 'fleet/prod: No enqueue sqs is up'")
	require.Contains(t, alert("canary"), "release: canary")

	series = up("prod", "fleet-ingest-worker", "1x30") + up("prod", "fleet-ingest-sqs", "1x3 _x27") +
		up("canary", "fleet-ingest-worker", "1x30") + up("canary", "fleet-ingest-sqs", "1x30")
	run("test-prod-only.yaml", series, alert("prod"))
}

// TestChartSecretsAndDashboardPerRelease: two releases in one namespace,
// with the default values, read Secrets of their own
// (<fullname>-migrate, -worker, -enqueue) and ship dashboards of their own
// (uid, title, file name, variables set to the release); a release named
// after the chart keeps the names of the guide (fleet-ingest-worker…); a
// long release name gets a uid within Grafana's 40 characters, still its
// own.
func TestChartSecretsAndDashboardPerRelease(t *testing.T) {
	t.Parallel()
	type seen struct{ secrets, uids, titles, keys []string }
	var all seen
	render := func(rel string) map[string]string {
		values := everyComponentMonitored()
		values["metrics"].(map[string]any)["grafanaDashboard"] = map[string]any{"enabled": true}
		values["secrets"] = map[string]any{"enqueue": map[string]any{"operatorTokenKey": "operator-token", "operatorDatabaseURLKey": "operator-url"}}
		values["prune"] = map[string]any{"enabled": true}
		return renderRelease(t, rel, twoReleasesNamespace, values)
	}
	for _, rel := range append(slices.Clone(twoReleases), "fleet-ingest", "staging-eu-west-1-blue-fleet-ingest-green") {
		docs := render(rel)
		fullname := rel + "-fleet-ingest"
		if strings.Contains(rel, "fleet-ingest") {
			fullname = rel
		}
		secrets := map[string][]string{}
		for key, raw := range docs {
			var pod struct {
				Spec struct {
					Template struct {
						Spec corev1.PodSpec `json:"spec"`
					} `json:"template"`
					JobTemplate struct {
						Spec struct {
							Template struct {
								Spec corev1.PodSpec `json:"spec"`
							} `json:"template"`
						} `json:"spec"`
					} `json:"jobTemplate"`
				} `json:"spec"`
			}
			kind, _, _ := strings.Cut(key, "/")
			if !slices.Contains([]string{"Deployment", "Job", "CronJob"}, kind) {
				continue
			}
			require.NoError(t, yaml.Unmarshal([]byte(raw), &pod))
			spec := pod.Spec.Template.Spec
			if kind == "CronJob" {
				spec = pod.Spec.JobTemplate.Spec.Template.Spec
			}
			for _, c := range spec.Containers {
				for _, e := range c.Env {
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
						secrets[key] = append(secrets[key], e.ValueFrom.SecretKeyRef.Name)
					}
				}
			}
			for _, v := range spec.Volumes {
				if v.Secret != nil {
					secrets[key] = append(secrets[key], v.Secret.SecretName)
				}
			}
		}
		want := map[string]string{
			"Job/" + fullname + "-migrate":          fullname + "-migrate",
			"Deployment/" + fullname + "-worker":    fullname + "-worker",
			"Deployment/" + fullname + "-enqueue":   fullname + "-enqueue",
			"Deployment/" + fullname + "-sqs":       fullname + "-enqueue",
			"Deployment/" + fullname + "-reconcile": fullname + "-reconcile",
			"CronJob/" + fullname + "-prune":        fullname + "-enqueue",
		}
		for key, name := range want {
			require.NotEmpty(t, secrets[key], "%s reads no Secret", key)
			for _, got := range secrets[key] {
				require.Equal(t, name, got, "%s", key)
			}
			all.secrets = append(all.secrets, name)
		}
		require.Len(t, secrets, len(want), "%v", secrets)
		if rel == "fleet-ingest" {
			require.Equal(t, "fleet-ingest-worker", secrets["Deployment/fleet-ingest-worker"][0], "the guide's names")
		}
		var kedaAuth struct {
			Spec struct {
				SecretTargetRef []struct {
					Name string `json:"name"`
				} `json:"secretTargetRef"`
			} `json:"spec"`
		}
		kedaValues := everyComponentMonitored()
		kedaValues["worker"] = map[string]any{"autoscaling": map[string]any{"enabled": false}, "keda": map[string]any{"enabled": true}}
		require.NoError(t, yaml.Unmarshal([]byte(renderRelease(t, rel, twoReleasesNamespace, kedaValues)["TriggerAuthentication/"+fullname+"-worker-keda"]), &kedaAuth))
		require.Equal(t, fullname+"-worker", kedaAuth.Spec.SecretTargetRef[0].Name)

		var cm corev1.ConfigMap
		require.NoError(t, yaml.Unmarshal([]byte(docs["ConfigMap/"+fullname+"-dashboard"]), &cm))
		require.Len(t, cm.Data, 1)
		for key, text := range cm.Data {
			require.Equal(t, fullname+".json", key, "the sidecar writes files by key: one per release")
			all.keys = append(all.keys, key)
			var dash struct {
				UID        string `json:"uid"`
				Title      string `json:"title"`
				Templating struct {
					List []struct {
						Name    string            `json:"name"`
						Current map[string]string `json:"current"`
					} `json:"list"`
				} `json:"templating"`
				Panels []json.RawMessage `json:"panels"`
			}
			require.NoError(t, json.Unmarshal([]byte(text), &dash))
			require.LessOrEqual(t, len(dash.UID), 40, "Grafana's limit")
			if len(fullname) <= 40 {
				require.Equal(t, fullname, dash.UID)
			}
			require.Equal(t, "Fleet ingestion: leases and batches ("+twoReleasesNamespace+"/"+rel+")", dash.Title)
			current := map[string]string{}
			for _, v := range dash.Templating.List {
				if v.Current != nil {
					current[v.Name] = v.Current["value"]
				}
			}
			require.Equal(t, map[string]string{"namespace": twoReleasesNamespace, "release": rel}, current)
			require.Len(t, dash.Panels, dashboardPanels(t), "the file's panels, all of them")
			all.uids = append(all.uids, dash.UID)
			all.titles = append(all.titles, dash.Title)
		}
	}
	for what, list := range map[string][]string{"uid": all.uids, "title": all.titles, "file": all.keys} {
		require.Len(t, list, 4, what)
		require.Len(t, slices.Compact(slices.Sorted(slices.Values(list))), 4, "%s: one per release: %v", what, list)
	}
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(all.secrets))), 4*4, "four Secrets per release (migrate, worker, enqueue, reconcile), none shared: %v", all.secrets)

	// An existingSecret still wins.
	values := everyComponentMonitored()
	values["secrets"] = map[string]any{"worker": map[string]any{"existingSecret": "shared-worker"}}
	dep := renderRelease(t, "prod", "fleet", values)["Deployment/prod-fleet-ingest-worker"]
	var d appsv1.Deployment
	require.NoError(t, yaml.Unmarshal([]byte(dep), &d))
	name, _ := envSecret(d.Spec.Template.Spec.Containers[0], "DATABASE_URL")
	require.Equal(t, "shared-worker", name)
}

// dashboardPanels counts the panels of the chart's dashboard file.
func dashboardPanels(t *testing.T) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "files", "dashboard.json"))
	require.NoError(t, err)
	var dash struct {
		Panels []json.RawMessage `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.NotEmpty(t, dash.Panels)
	return len(dash.Panels)
}

// TestStaticAlertsAreTheChartsRender: deploy/prometheus/alerts.yaml is
// what scripts/alerts-static.sh (make -s alerts-static) prints with the
// defaults (release fleet-ingest in namespace fleet, the chart's values);
// run for an SQS-only install's values it prints exactly the rules the
// chart's PrometheusRule holds for that release, FleetIngestDoorDown not
// among them. HELM_BIN names the helm binary (make test builds it).
func TestStaticAlertsAreTheChartsRender(t *testing.T) {
	t.Parallel()
	helm := os.Getenv("HELM_BIN")
	if _, err := exec.LookPath(helm); helm == "" || err != nil {
		testdeps.Missing(t, "helm (HELM_BIN)", "GOBIN=$HOME/.cache/fleet-ingest/helm go install helm.sh/helm/v3/cmd/helm@v3.16.4 and HELM_BIN=$HOME/.cache/fleet-ingest/helm/helm", err)
	}
	static := func(env ...string) []byte {
		cmd := exec.Command("bash", "../../scripts/alerts-static.sh")
		cmd.Env = append(os.Environ(), env...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "%s", stderr.String())
		return out
	}
	checkedIn, err := os.ReadFile("../prometheus/alerts.yaml")
	require.NoError(t, err)
	generated := static("RELEASE=", "NAMESPACE=", "VALUES=")
	require.Equal(t, string(generated), string(checkedIn),
		"deploy/prometheus/alerts.yaml is not the chart's render: run make -s alerts-static > deploy/prometheus/alerts.yaml")
	var g ruleGroups
	require.NoError(t, yaml.Unmarshal(checkedIn, &g))
	require.Equal(t, ruleMap(renderedRules(t, renderRelease(t, "fleet-ingest", "fleet", monitoringValues(nil)), "fleet-ingest")), ruleMap(g))
	require.Contains(t, ruleMap(g), "FleetIngestDoorDown", "the defaults run enqueue serve")
	require.NotContains(t, ruleMap(g), "FleetIngestSQSConsumerDown", "the defaults do not run enqueue sqs")

	// An SQS-only install.
	values := map[string]any{"enqueue": map[string]any{"enabled": false}, "sqs": sqsOn, "uploads": map[string]any{"buckets": []any{"fleet-uploads"}}}
	raw, err := yaml.Marshal(values)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "values.yaml")
	require.NoError(t, os.WriteFile(file, raw, 0o600))
	var sqsOnly ruleGroups
	require.NoError(t, yaml.Unmarshal(static("RELEASE=ingest", "NAMESPACE=data", "VALUES="+file), &sqsOnly))
	want := ruleMap(renderedRules(t, renderRelease(t, "ingest", "data", monitoringValues(values)), "ingest-fleet-ingest"))
	require.Equal(t, want, ruleMap(sqsOnly))
	require.NotContains(t, ruleMap(sqsOnly), "FleetIngestDoorDown")
	require.Equal(t, "data/ingest: No enqueue sqs is up", ruleMap(sqsOnly)["FleetIngestSQSConsumerDown"].Annotations["summary"])
}
