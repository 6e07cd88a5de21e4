package metrics

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics/metricstest"
)

// tenantSeries returns ingest_tenant_batches by tenant and state, as the
// refresh that set them (jobs.RefreshTenantStats) exports them: fresh.
func tenantSeries(t *testing.T, m *Metrics) map[string]map[string]float64 {
	m.TenantStats.Refreshed(nil)
	return metricstest.TenantBatches(t, m.Registry)
}

// TestTenantBatchesKeepTheBusiestTenants: ingest_tenant_batches has series
// of their own for at most MaxTenants tenants, those with the most Running
// batches (ties by tenant id); the others are summed under _other, which
// is exported only when some tenant is folded into it.
func TestTenantBatchesKeepTheBusiestTenants(t *testing.T) {
	t.Parallel()
	counts := []TenantBatchCount{
		{"tenant-c", 1, 0}, {"tenant-a", 0, 7}, {"tenant-e", 2, 2}, {"tenant-b", 3, 1}, {"tenant-d", 0, 1},
	}
	m := New()
	m.MaxTenants = 3
	m.SetTenantBatches(counts)
	require.Equal(t, map[string]map[string]float64{
		"tenant-a":  {"running": 0, "waiting": 7},
		"tenant-b":  {"running": 3, "waiting": 1},
		"tenant-e":  {"running": 2, "waiting": 2},
		TenantOther: {"running": 1, "waiting": 1},
	}, tenantSeries(t, m), "tenant-b and tenant-e tie at 4 and both rank before tenant-c and tenant-d")
	require.Equal(t, "tenant-c", counts[0].Tenant, "the caller's slice is not reordered")

	// The next refresh replaces the series: no tenant of the last one stays.
	m.SetTenantBatches([]TenantBatchCount{{"tenant-z", 1, 1}})
	require.Equal(t, map[string]map[string]float64{"tenant-z": {"running": 1, "waiting": 1}}, tenantSeries(t, m), "no _other without folded tenants")

	m.MaxTenants = 0
	m.SetTenantBatches(counts)
	require.Equal(t, map[string]map[string]float64{TenantOther: {"running": 6, "waiting": 11}}, tenantSeries(t, m))
	require.Equal(t, MaxTenantsDefault, New().MaxTenants)
}

var variableLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)

// TestEveryTenantLabelIsBounded: of every metric any binary can export,
// only ingest_tenant_batches is labelled by tenant, and with 5,000 tenants
// it exports 2 × (MaxTenants + 1) series. A new family labelled by tenant
// fails here until it is bounded like it.
func TestEveryTenantLabelIsBounded(t *testing.T) {
	t.Parallel()
	_, all := build()
	g := NewImportGroups(nil)
	var labelled []string
	for _, c := range append(all, g.Size, g.Commits, g.Fallbacks, g.Waiting) {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			match := variableLabels.FindStringSubmatch(d.String())
			require.NotNil(t, match, d.String())
			for _, l := range strings.Split(match[1], ",") {
				if strings.Contains(strings.ToLower(l), "tenant") {
					labelled = append(labelled, d.String())
				}
			}
		}
	}
	require.Len(t, labelled, 1, "%v", labelled)
	require.Contains(t, labelled[0], `"ingest_tenant_batches"`)

	counts := make([]TenantBatchCount, 5000)
	for i := range counts {
		counts[i] = TenantBatchCount{Tenant: fmt.Sprintf("t%04d", i), Waiting: 1}
	}
	m := New()
	m.SetTenantBatches(counts)
	series := tenantSeries(t, m)
	require.Len(t, series, MaxTenantsDefault+1)
	require.Equal(t, float64(5000-MaxTenantsDefault), series[TenantOther]["waiting"])
	kept := make([]string, 0, len(series))
	for tenant := range series {
		kept = append(kept, tenant)
	}
	slices.Sort(kept)
	require.Equal(t, []string{TenantOther, "t0000", "t0001"}, kept[:3], "ties by tenant id: the first ids")
}
