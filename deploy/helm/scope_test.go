package helm_test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/yaml"
)

// renderRelease renders the chart as the release name in namespace ns
// (render renders prod in fleet) and returns the documents by kind/name.
func renderRelease(t *testing.T, name, ns string, overrides map[string]any) map[string]string {
	t.Helper()
	if _, ok := overrides["uploads"]; !ok {
		overrides["uploads"] = map[string]any{"buckets": []any{"fleet-uploads"}}
	}
	ch, err := loader.Load(chartDir)
	require.NoError(t, err)
	vals, err := chartutil.ToRenderValues(ch, overrides, chartutil.ReleaseOptions{Name: name, Namespace: ns, IsInstall: true}, chartutil.DefaultCapabilities)
	require.NoError(t, err)
	out, err := engine.Render(ch, vals)
	require.NoError(t, err)
	docs := map[string]string{}
	for _, text := range out {
		for _, doc := range strings.Split(text, "\n---") {
			var m manifest
			require.NoError(t, yaml.Unmarshal([]byte(doc), &m), doc)
			if m.Kind != "" {
				docs[m.Kind+"/"+m.Metadata.Name] = doc
			}
		}
	}
	return docs
}

// alertRule is one rule of the PrometheusRule (or of the plain rules file).
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string      `json:"name"`
		Rules []alertRule `json:"rules"`
	} `json:"groups"`
}

// renderedRules returns the PrometheusRule's groups as the release renders them.
func renderedRules(t *testing.T, docs map[string]string, fullname string) ruleGroups {
	t.Helper()
	raw, ok := docs["PrometheusRule/"+fullname]
	require.True(t, ok, "no PrometheusRule/%s", fullname)
	var pr struct {
		Spec ruleGroups `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(raw), &pr))
	require.NotEmpty(t, pr.Spec.Groups)
	return pr.Spec
}

func ruleMap(g ruleGroups) map[string]alertRule {
	m := map[string]alertRule{}
	for _, gr := range g.Groups {
		for _, r := range gr.Rules {
			m[r.Alert] = r
		}
	}
	return m
}

func plainRules(t *testing.T) map[string]alertRule {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yaml"))
	require.NoError(t, err)
	var g ruleGroups
	require.NoError(t, yaml.Unmarshal(raw, &g))
	return ruleMap(g)
}

// monitoringValues returns values enabling the PrometheusRule plus extra,
// deep-copied: Helm's linter and renderer coalesce defaults into the maps
// they are given, so parallel tests sharing sqsOn or reconcileOn raced.
func monitoringValues(extra map[string]any) map[string]any {
	v := map[string]any{"metrics": map[string]any{"prometheusRule": map[string]any{"enabled": true}}}
	for k, x := range extra {
		v[k] = deepCopy(x)
	}
	return v
}

// deepCopy copies the maps and slices of a values tree.
func deepCopy(x any) any {
	switch x := x.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, v := range x {
			m[k] = deepCopy(v)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, v := range x {
			s[i] = deepCopy(v)
		}
		return s
	default:
		return x
	}
}

var (
	sqsOn       = map[string]any{"enabled": true, "queueURL": "https://sqs.eu-west-1.amazonaws.com/123456789012/fleet-uploads"}
	reconcileOn = map[string]any{"enabled": true, "bucket": "fleet-uploads"}
)

// TestChartRulesPerEnabledComponent: the PrometheusRule holds the alerts of
// the components the release runs and no others: FleetIngestDoor* with
// enqueue serve, FleetIngestSQS* with enqueue sqs, FleetIngestReconcile*
// with enqueue reconcile, the worker's always; each component has its
// absent-targets alert.
func TestChartRulesPerEnabledComponent(t *testing.T) {
	t.Parallel()
	plain := plainRules(t)
	for _, want := range []string{"FleetIngestNoLiveWorker", "FleetIngestDoorDown", "FleetIngestSQSConsumerDown", "FleetIngestReconcileDown"} {
		require.Contains(t, plain, want)
		require.True(t, strings.HasPrefix(plain[want].Expr, "absent(up{job="), "%s: %s", want, plain[want].Expr)
	}
	for _, c := range []struct {
		name                    string
		values                  map[string]any
		enqueue, sqs, reconcile bool
	}{
		{"defaults", monitoringValues(nil), true, false, false},
		{"sqs-only", monitoringValues(map[string]any{"enqueue": map[string]any{"enabled": false}, "sqs": sqsOn}), false, true, false},
		{"reconcile-only", monitoringValues(map[string]any{"enqueue": map[string]any{"enabled": false}, "reconcile": reconcileOn}), false, false, true},
		{"all", monitoringValues(map[string]any{"sqs": sqsOn, "reconcile": reconcileOn}), true, true, true},
	} {
		got := ruleMap(renderedRules(t, renderRelease(t, "prod", "fleet", c.values), "prod-fleet-ingest"))
		for name := range plain {
			want := true
			switch {
			case strings.HasPrefix(name, "FleetIngestDoor"):
				want = c.enqueue
			case strings.HasPrefix(name, "FleetIngestSQS"):
				want = c.sqs
			case strings.HasPrefix(name, "FleetIngestReconcile"):
				want = c.reconcile
			}
			_, ok := got[name]
			require.Equal(t, want, ok, "%s: %s rendered", c.name, name)
		}
		require.Contains(t, got, "FleetIngestNoLiveWorker", c.name)
		require.Subset(t, keys(plain), keys(got), c.name)
	}

	// Helm's linter passes the SQS-only install with its rules.
	lintValues := monitoringValues(map[string]any{"enqueue": map[string]any{"enabled": false}, "sqs": sqsOn,
		"uploads": map[string]any{"buckets": []any{"fleet-uploads"}}})
	res := lint.AllWithKubeVersion(chartDir, lintValues, "fleet", nil)
	for _, msg := range res.Messages {
		require.Less(t, msg.Severity, support.WarningSev, "%s", msg.Error())
	}

	// A rule's component is its name's: every rule reading a component's
	// metrics or targets carries its prefix, so it goes with it.
	for name, r := range plain {
		for prefix, reads := range map[string][]string{
			"FleetIngestDoor":      {"ingest_http_", `"fleet-ingest-enqueue"`},
			"FleetIngestSQS":       {"ingest_sqs_", `"fleet-ingest-sqs"`},
			"FleetIngestReconcile": {"ingest_reconcile_", `"fleet-ingest-reconcile"`},
		} {
			for _, s := range reads {
				if strings.Contains(r.Expr, s) {
					require.True(t, strings.HasPrefix(name, prefix), "%s reads %s but is not named %s*", name, s, prefix)
				}
			}
		}
	}
}

func keys(m map[string]alertRule) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// promtoolBin is the promtool to run (see deploy.promtool: with PROMTOOL
// or CI set a missing one fails the test).
func promtoolBin(t *testing.T) string {
	t.Helper()
	name := os.Getenv("PROMTOOL")
	if name == "" {
		name = "promtool"
	}
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("PROMTOOL") == "" && os.Getenv("CI") == "" {
		t.Skipf("promtool not found (%v): install it (apt-get install prometheus) or run make test, which requires it", err)
	}
	t.Fatalf("promtool %q not found (%v)", name, err)
	return ""
}

// promtoolRun writes the rendered rules and a test of them and runs
// promtool test rules; it returns promtool's output and whether it passed.
func promtoolRun(t *testing.T, rules ruleGroups, test string) (string, bool) {
	t.Helper()
	dir := t.TempDir()
	raw, err := yaml.Marshal(rules)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), raw, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(test), 0o600))
	bin := promtoolBin(t)
	out, err := exec.Command(bin, "check", "rules", filepath.Join(dir, "rules.yaml")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(bin, "test", "rules", "test.yaml")
	cmd.Dir = dir
	out, err = cmd.CombinedOutput()
	return string(out), err == nil
}

// firing is an alert_rule_test expecting r to fire (no labels but its own:
// the absent alerts' expressions are not plain selectors).
func firing(t *testing.T, at string, r alertRule) string {
	t.Helper()
	exp, err := yaml.Marshal([]map[string]any{{"exp_labels": r.Labels, "exp_annotations": r.Annotations}})
	require.NoError(t, err)
	return fmt.Sprintf("  - eval_time: %s\n    alertname: %s\n    exp_alerts:\n%s", at, r.Alert, indent(string(exp), "    "))
}

func silent(at, alert string) string {
	return fmt.Sprintf("  - eval_time: %s\n    alertname: %s\n    exp_alerts: []\n", at, alert)
}

func indent(s, pre string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = pre + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}

// TestChartAbsentAlertsWithPromtool runs promtool test rules on the rules
// releases render, on series of this release (namespace fleet, release
// prod) beside another release's (namespace other, release canary):
//   - an SQS-only install with no enqueue serve anywhere: FleetIngestDoorDown
//     does not exist and nothing fires while the worker and the consumer
//     are up; the same series page FleetIngestDoorDown in an install that
//     runs enqueue serve (so the first answer is the render's, not the
//     series');
//   - the consumer dies (its target gone): FleetIngestSQSConsumerDown fires,
//     although the other release's consumer is up;
//   - reconcile dies: FleetIngestReconcileDown fires, likewise.
func TestChartAbsentAlertsWithPromtool(t *testing.T) {
	t.Parallel()
	sqsOnly := renderedRules(t, renderRelease(t, "prod", "fleet",
		monitoringValues(map[string]any{"enqueue": map[string]any{"enabled": false}, "sqs": sqsOn})), "prod-fleet-ingest")
	withDoor := renderedRules(t, renderRelease(t, "prod", "fleet", monitoringValues(map[string]any{"sqs": sqsOn})), "prod-fleet-ingest")
	withReconcile := renderedRules(t, renderRelease(t, "prod", "fleet",
		monitoringValues(map[string]any{"enqueue": map[string]any{"enabled": false}, "reconcile": reconcileOn})), "prod-fleet-ingest")

	up := func(ns, release, job, values string) string {
		return fmt.Sprintf("  - series: up{namespace=%q,release=%q,job=%q,instance=\"%s-%s\"}\n    values: %s\n", ns, release, job, release, job, values)
	}
	header := "rule_files:\n- rules.yaml\nevaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n"

	// Healthy SQS-only install: worker and consumer up, no enqueue serve.
	healthy := header +
		up("fleet", "prod", "fleet-ingest-worker", "1x40") +
		up("fleet", "prod", "fleet-ingest-sqs", "1x40") +
		up("other", "canary", "fleet-ingest-enqueue", "1x40") +
		"  alert_rule_test:\n"
	quiet := healthy
	for _, at := range []string{"5m", "30m"} {
		for name := range ruleMap(sqsOnly) {
			quiet += silent(at, name)
		}
		quiet += silent(at, "FleetIngestDoorDown")
	}
	out, ok := promtoolRun(t, sqsOnly, quiet)
	require.True(t, ok, "SQS-only install, healthy: nothing fires, no door alert\n%s", out)
	require.NotContains(t, ruleMap(sqsOnly), "FleetIngestDoorDown")

	out, ok = promtoolRun(t, withDoor, healthy+firing(t, "30m", ruleMap(withDoor)["FleetIngestDoorDown"]))
	require.True(t, ok, "the same series page FleetIngestDoorDown where enqueue serve is deployed\n%s", out)

	// The consumer dies: its target is gone at 10m (last sample at 3m).
	sqs := ruleMap(sqsOnly)["FleetIngestSQSConsumerDown"]
	require.Contains(t, sqs.Expr, `namespace="fleet"`)
	dead := header +
		up("fleet", "prod", "fleet-ingest-worker", "1x40") +
		up("fleet", "prod", "fleet-ingest-sqs", "1x3 _x37") +
		up("other", "canary", "fleet-ingest-sqs", "1x40") +
		up("fleet", "canary", "fleet-ingest-sqs", "1x40") +
		"  alert_rule_test:\n" + silent("5m", sqs.Alert) + firing(t, "20m", sqs)
	out, ok = promtoolRun(t, sqsOnly, dead)
	require.True(t, ok, "a dead consumer pages FleetIngestSQSConsumerDown\n%s", out)

	// Reconcile dies: down (up 0) from 3m.
	rec := ruleMap(withReconcile)["FleetIngestReconcileDown"]
	dead = header +
		up("fleet", "prod", "fleet-ingest-worker", "1x40") +
		up("fleet", "prod", "fleet-ingest-reconcile", "1 1 1 0x37") +
		up("other", "prod", "fleet-ingest-reconcile", "1x40") +
		"  alert_rule_test:\n" + silent("10m", rec.Alert) + firing(t, "25m", rec)
	out, ok = promtoolRun(t, withReconcile, dead)
	require.True(t, ok, "a dead reconcile raises FleetIngestReconcileDown\n%s", out)
}

// scopeOf parses expr and returns, for every selector, its namespace and
// release matchers (failing unless there is exactly one of each), and the
// expression with them removed.
func scopeOf(t *testing.T, where, expr string) ([][2]*labels.Matcher, string) {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	require.NoError(t, err, "%s: %s", where, expr)
	var scopes [][2]*labels.Matcher
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		var ns, rel *labels.Matcher
		var rest []*labels.Matcher
		for _, m := range vs.LabelMatchers {
			switch m.Name {
			case "namespace":
				require.Nil(t, ns, "%s: %s: two namespace matchers", where, vs)
				ns = m
			case "release":
				require.Nil(t, rel, "%s: %s: two release matchers", where, vs)
				rel = m
			default:
				rest = append(rest, m)
			}
		}
		require.NotNil(t, ns, "%s: %s has no namespace matcher", where, vs)
		require.NotNil(t, rel, "%s: %s has no release matcher", where, vs)
		vs.LabelMatchers = rest
		scopes = append(scopes, [2]*labels.Matcher{ns, rel})
		return nil
	})
	require.NotEmpty(t, scopes, "%s: no selector", where)
	return scopes, e.String()
}

func canonical(t *testing.T, expr string) string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	require.NoError(t, err, expr)
	return e.String()
}

// TestChartScopesRulesAndKEDAToTheRelease renders three releases (two in
// one namespace) and checks that every selector of every rule and of the
// KEDA Prometheus query names its own release's namespace and release
// label, that apart from them the expressions are the rules file's (and
// the values' query), and that no release's selectors match another's
// series; the ServiceMonitor sets the release label they select on.
func TestChartScopesRulesAndKEDAToTheRelease(t *testing.T) {
	t.Parallel()
	plain := plainRules(t)
	type release struct{ name, ns string }
	releases := []release{{"prod", "fleet"}, {"staging", "fleet-staging"}, {"canary", "fleet"}}
	scopes := map[release][][2]*labels.Matcher{}
	for _, rel := range releases {
		values := monitoringValues(map[string]any{"sqs": sqsOn, "reconcile": reconcileOn})
		values["metrics"].(map[string]any)["serviceMonitor"] = map[string]any{"enabled": true}
		values["worker"] = map[string]any{"autoscaling": map[string]any{"enabled": false},
			"keda": map[string]any{"enabled": true, "source": "prometheus", "prometheus": map[string]any{"serverAddress": "http://prometheus.monitoring:9090"}}}
		docs := renderRelease(t, rel.name, rel.ns, values)
		fullname := rel.name + "-fleet-ingest"
		rules := ruleMap(renderedRules(t, docs, fullname))
		require.Len(t, rules, len(plain), "every component enabled: every alert")
		for name, r := range rules {
			s, stripped := scopeOf(t, rel.name+"/"+name, r.Expr)
			require.Equal(t, canonical(t, plain[name].Expr), stripped, "%s: only the scope is added", name)
			// The alert names its install: labels, and the summary's prefix.
			wantAnnotations := maps.Clone(plain[name].Annotations)
			wantAnnotations["summary"] = rel.ns + "/" + rel.name + ": " + plain[name].Annotations["summary"]
			require.Equal(t, wantAnnotations, r.Annotations, name)
			wantLabels := maps.Clone(plain[name].Labels)
			wantLabels["namespace"], wantLabels["release"] = rel.ns, rel.name
			require.Equal(t, wantLabels, r.Labels, name)
			scopes[rel] = append(scopes[rel], s...)
		}
		so := decodeCRD[scaledObject](t, manifest{raw: docs["ScaledObject/"+fullname+"-worker"]})
		s, stripped := scopeOf(t, rel.name+"/keda", so.Spec.Triggers[0].Metadata["query"])
		require.Equal(t, canonical(t, `sum(max by (state) (ingest_queue_jobs{state=~"available|running"}))`), stripped)
		scopes[rel] = append(scopes[rel], s...)
		for _, m := range scopes[rel] {
			require.Equal(t, labels.MatchEqual, m[0].Type)
			require.Equal(t, rel.ns, m[0].Value)
			require.Equal(t, labels.MatchEqual, m[1].Type)
			require.Equal(t, rel.name, m[1].Value)
		}

		var sm struct {
			Spec struct {
				Endpoints []struct {
					Relabelings []struct {
						SourceLabels []string `json:"sourceLabels"`
						TargetLabel  string   `json:"targetLabel"`
					} `json:"relabelings"`
				} `json:"endpoints"`
			} `json:"spec"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(docs["ServiceMonitor/"+fullname]), &sm))
		for _, ep := range sm.Spec.Endpoints {
			found := false
			for _, r := range ep.Relabelings {
				found = found || r.TargetLabel == "release" && len(r.SourceLabels) == 1 &&
					r.SourceLabels[0] == "__meta_kubernetes_service_label_app_kubernetes_io_instance"
			}
			require.True(t, found, "%s: every endpoint sets release from app.kubernetes.io/instance", rel.name)
		}
	}
	// Disjoint: no selector of one release matches a series of another.
	for _, a := range releases {
		for _, b := range releases {
			if a == b {
				continue
			}
			for _, m := range scopes[a] {
				require.False(t, m[0].Matches(b.ns) && m[1].Matches(b.name), "%s's selector %v %v matches %s's series", a.name, m[0], m[1], b.name)
			}
		}
	}
}
