package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"github.com/stretchr/testify/require"
	goyaml "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"

	"github.com/fleet/ingest/internal/testkit/testdeps"
)

// PromtoolEnv names the promtool binary (make test exports it; Debian's
// prometheus package installs /usr/bin/promtool).
const PromtoolEnv = "PROMTOOL"

// promtool returns the promtool to run (PROMTOOL, make test sets it,
// installing Debian's prometheus as root; else promtool on PATH). A missing
// promtool fails the test; only go test -short skips it.
func promtool(t *testing.T) string {
	t.Helper()
	name := os.Getenv(PromtoolEnv)
	if name == "" {
		name = "promtool"
	}
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	testdeps.Missing(t, "promtool", "apt-get install prometheus, which installs /usr/bin/promtool; or set "+PromtoolEnv, err)
	return ""
}

// TestAlertRulesPassPromtool runs promtool check rules on the rules'
// source and on the static file rendered from it, and promtool test rules
// on every prometheus/*_test.yaml (alerts_test.yaml, and a file per
// group added later; each names the source as its rule file), and requires those tests to show every alert of the source both
// firing (with its labels and rendered annotations) and silent.
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	testFiles, err := filepath.Glob("prometheus/*_test.yaml")
	require.NoError(t, err)
	require.Contains(t, testFiles, "prometheus/alerts_test.yaml")
	runs := [][]string{{"check", "rules", "alerts.yaml"}, {"check", "rules", "../" + alertsSource}}
	for _, f := range testFiles {
		var tf struct {
			RuleFiles []string `json:"rule_files"`
		}
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, yaml.Unmarshal(raw, &tf))
		require.Equal(t, []string{"../" + alertsSource}, tf.RuleFiles,
			"%s: test the rules' source (rule_files: [../%s]); alerts.yaml beside it is one install's render", f, alertsSource)
		runs = append(runs, []string{"test", "rules", filepath.Base(f)})
	}
	for _, args := range runs {
		cmd := exec.Command(bin, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %v:\n%s", args, out)
	}

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	raw, err := os.ReadFile(alertsSource)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, f := range testFiles {
		var tests struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string           `json:"alertname"`
					ExpAlerts []map[string]any `json:"exp_alerts"`
				} `json:"alert_rule_test"`
			} `json:"tests"`
		}
		raw, err = os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, yaml.Unmarshal(raw, &tests))
		for _, tc := range tests.Tests {
			for _, at := range tc.AlertRuleTest {
				if len(at.ExpAlerts) > 0 {
					firing[at.Alertname] = true
				} else {
					silent[at.Alertname] = true
				}
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			require.True(t, firing[r.Alert], "no prometheus/*_test.yaml shows %s firing", r.Alert)
			require.True(t, silent[r.Alert], "no prometheus/*_test.yaml shows %s silent", r.Alert)
		}
	}
	require.GreaterOrEqual(t, n, 21)
}

// TestDeployGuideScrapeConfigIsValid: the plain Prometheus scrape job
// docs/deploy.md gives discovers the release namespace's pods, its rule file
// is the alerts promtool checks, and its relabelling (parsed and validated
// by Prometheus' own relabel package: Debian's promtool is built without
// Kubernetes discovery, so promtool check config cannot read this file),
// run on the labels Kubernetes discovery gives the chart's pods, keeps the
// annotated pods at their metrics port under the job names the alerts use
// and drops the rest.
func TestDeployGuideScrapeConfigIsValid(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/deploy.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(raw), "<!-- deploy-guide: prometheus-config -->")
	require.True(t, ok, "docs/deploy.md has no prometheus-config block")
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	require.True(t, ok)
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)

	var cfg struct {
		ScrapeConfigs []struct {
			JobName             string `yaml:"job_name"`
			KubernetesSDConfigs []struct {
				Role       string `yaml:"role"`
				Namespaces struct {
					Names []string `yaml:"names"`
				} `yaml:"namespaces"`
			} `yaml:"kubernetes_sd_configs"`
			RelabelConfigs []*relabel.Config `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
		RuleFiles []string `yaml:"rule_files"`
	}
	require.NoError(t, goyaml.UnmarshalStrict([]byte(block), &cfg), block)
	require.Len(t, cfg.ScrapeConfigs, 1)
	sc := cfg.ScrapeConfigs[0]
	require.Len(t, sc.KubernetesSDConfigs, 1)
	require.Equal(t, "pod", sc.KubernetesSDConfigs[0].Role)
	require.Equal(t, []string{"fleet"}, sc.KubernetesSDConfigs[0].Namespaces.Names)
	rc := sc.RelabelConfigs
	for _, r := range rc {
		require.NoError(t, r.Validate(model.UTF8Validation))
	}
	require.Len(t, cfg.RuleFiles, 1)
	dir := t.TempDir()
	rules, err := os.ReadFile("prometheus/alerts.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, cfg.RuleFiles[0]), rules, 0o600))
	out, err := exec.Command(promtool(t), "check", "rules", filepath.Join(dir, cfg.RuleFiles[0])).CombinedOutput()
	require.NoError(t, err, "%s", out)

	pod := func(component, port string, annotated bool, name string) map[string]string {
		m := map[string]string{
			"__address__":                "10.1.2.3:8080",
			"__metrics_path__":           "/metrics",
			"job":                        "fleet-ingest",
			"__meta_kubernetes_pod_name": "p-" + component,
			"__meta_kubernetes_pod_label_app_kubernetes_io_name":      name,
			"__meta_kubernetes_pod_label_app_kubernetes_io_component": component,
			"__meta_kubernetes_pod_label_app_kubernetes_io_instance":  "prod",
			"__meta_kubernetes_namespace":                             "fleet",
		}
		if annotated {
			m["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] = "true"
			m["__meta_kubernetes_pod_annotation_prometheus_io_port"] = port
			m["__meta_kubernetes_pod_annotation_prometheus_io_path"] = "/metrics"
		}
		return m
	}
	for _, c := range []struct {
		labels map[string]string
		keep   bool
		job    string
		addr   string
	}{
		{pod("worker", "9090", true, "fleet-ingest"), true, "fleet-ingest-worker", "10.1.2.3:9090"},
		{pod("enqueue", "8081", true, "fleet-ingest"), true, "fleet-ingest-enqueue", "10.1.2.3:8081"},
		{pod("sqs", "8081", true, "fleet-ingest"), true, "fleet-ingest-sqs", "10.1.2.3:8081"},
		{pod("enqueue", "8081", false, "fleet-ingest"), false, "", ""},
		{pod("web", "8080", true, "other-app"), false, "", ""},
	} {
		lb := labels.NewBuilder(labels.FromMap(c.labels))
		keep := relabel.ProcessBuilder(lb, rc...)
		require.Equal(t, c.keep, keep, "%v", c.labels)
		if keep {
			got := lb.Labels()
			require.Equal(t, c.job, got.Get("job"))
			require.Equal(t, c.addr, got.Get("__address__"))
			require.Equal(t, "/metrics", got.Get("__metrics_path__"))
			// The chart's rules and the dashboard select on these.
			require.Equal(t, "fleet", got.Get("namespace"))
			require.Equal(t, "prod", got.Get("release"))
		}
	}
}
