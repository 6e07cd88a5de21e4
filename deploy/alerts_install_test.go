package deploy_test

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
)

// installLabels are the target labels that name an install: the chart's
// rules add them to every alert, and every expression keeps them.
var installLabels = []string{"namespace", "release"}

// TestAlertExpressionsKeepTheirInstall: no rule of the source aggregates
// namespace or release away (every sum, max… is by them, none is without
// them), no vector matching ignores them or matches on labels without
// them, so even read unscoped every alert is one install's. absent() is
// the exception PromQL imposes (its result has no labels but its
// selector's equality matchers): the chart's labels name the install of
// those (deploy/helm/releases_test.go).
func TestAlertExpressionsKeepTheirInstall(t *testing.T) {
	t.Parallel()
	groups, errs := rulefmt.ParseFile(alertsSource, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	require.Empty(t, errs)
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			n++
			e, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			require.NoError(t, err, r.Alert)
			parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
				switch node := node.(type) {
				case *parser.AggregateExpr:
					for _, l := range installLabels {
						if node.Without {
							require.NotContains(t, node.Grouping, l, "%s: %s aggregates %s away", r.Alert, node, l)
						} else {
							require.Contains(t, node.Grouping, l, "%s: %s aggregates %s away: write by (namespace, release, …)", r.Alert, node, l)
						}
					}
				case *parser.BinaryExpr:
					if m := node.VectorMatching; m != nil && len(m.MatchingLabels) > 0 {
						for _, l := range installLabels {
							require.Equal(t, m.On, slices.Contains(m.MatchingLabels, l), "%s: %s matches across installs (%s)", r.Alert, node, l)
						}
					}
				}
				return nil
			})
		}
	}
	require.GreaterOrEqual(t, n, 21)
}
