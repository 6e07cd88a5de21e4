package deploy_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
)

// requireScoped parses expr (Grafana's $__rate_interval as 5m) and requires
// every selector to carry namespace=~"$namespace" and release=~"$release"
// exactly once each.
func requireScoped(t *testing.T, where, expr string) {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(strings.ReplaceAll(expr, "$__rate_interval", "5m"))
	require.NoError(t, err, "%s: %s", where, expr)
	n := 0
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		n++
		seen := map[string]int{}
		for _, m := range vs.LabelMatchers {
			switch m.Name {
			case "namespace", "release":
				seen[m.Name]++
				require.Equal(t, labels.MatchRegexp, m.Type, "%s: %s", where, vs)
				require.Equal(t, "$"+m.Name, m.Value, "%s: %s", where, vs)
			}
		}
		require.Equal(t, map[string]int{"namespace": 1, "release": 1}, seen, "%s: %s is not scoped by the namespace and release variables", where, vs)
		return nil
	})
	require.NotZero(t, n, "%s: no selector in %s", where, expr)
}

// TestDashboardIsScopedToOneRelease: the dashboard has namespace and
// release variables (read from the targets' up series, the release's within
// the chosen namespace) and every panel's every query selects on both, so
// two installs in one Prometheus are shown apart.
func TestDashboardIsScopedToOneRelease(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("grafana/fleet-ingest.json")
	require.NoError(t, err)
	var dash struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
				Query      any    `json:"query"`
				Datasource struct {
					UID string `json:"uid"`
				} `json:"datasource"`
				IncludeAll bool   `json:"includeAll"`
				AllValue   string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string            `json:"title"`
			Panels  []json.RawMessage `json:"panels"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		require.Equal(t, "${datasource}", v.Datasource.UID, v.Name)
		// All (.*) also matches series without the label (a scrape that
		// does not set release).
		require.True(t, v.IncludeAll, v.Name)
		require.Equal(t, ".*", v.AllValue, v.Name)
		q, ok := v.Query.(map[string]any)
		require.True(t, ok, "%s: query is an object", v.Name)
		require.Equal(t, v.Definition, q["query"], v.Name)
		vars[v.Name] = v.Definition
	}
	require.Equal(t, `label_values(up{job=~"fleet-ingest-.*"}, namespace)`, vars["namespace"])
	require.Equal(t, `label_values(up{job=~"fleet-ingest-.*",namespace=~"$namespace"}, release)`, vars["release"])

	n := 0
	for _, p := range dash.Panels {
		require.Empty(t, p.Panels, "%s: nested panels are not checked here; flatten them or extend the test", p.Title)
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			requireScoped(t, p.Title, tg.Expr)
			n++
		}
	}
	require.GreaterOrEqual(t, n, 55)
}
