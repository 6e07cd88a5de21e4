package deploy_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// PromtoolEnv names the promtool binary (make test exports it; Debian's
// prometheus package installs /usr/bin/promtool).
const PromtoolEnv = "PROMTOOL"

// promtool returns the promtool to run. With PROMTOOL or CI set a missing
// promtool fails the test; only a developer's go test without either skips
// it, never make test or .ci/run.
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
	if os.Getenv(PromtoolEnv) == "" && os.Getenv("CI") == "" {
		t.Skipf("promtool not found (%v): install it (apt-get install prometheus) or run make test, which requires it", err)
	}
	t.Fatalf("promtool %q not found (%v): apt-get install -y prometheus, or set %s", name, err, PromtoolEnv)
	return ""
}

// TestAlertRulesPassPromtool runs promtool check rules and promtool test
// rules on prometheus/alerts_test.yaml, and requires that test file to show
// every alert of alerts.yaml both firing (with its labels and rendered
// annotations) and silent.
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
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
	raw, err := os.ReadFile("prometheus/alerts.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	raw, err = os.ReadFile("prometheus/alerts_test.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &tests))
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, at := range tc.AlertRuleTest {
			if len(at.ExpAlerts) > 0 {
				firing[at.Alertname] = true
			} else {
				silent[at.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			require.True(t, firing[r.Alert], "prometheus/alerts_test.yaml never shows %s firing", r.Alert)
			require.True(t, silent[r.Alert], "prometheus/alerts_test.yaml never shows %s silent", r.Alert)
		}
	}
	require.GreaterOrEqual(t, n, 17)
}
