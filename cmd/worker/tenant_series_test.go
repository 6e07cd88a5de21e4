package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// TestTenantSeriesAreBoundedPerPod is the red team's case: imports naming
// 5,005 tenants left every worker pod exporting 9,738 series of
// ingest_tenant_batches (722 KB a scrape). 5,000 tenants' folders are
// imported through the enqueue code path (ImportMany bursts, as serve,
// sqs and reconcile do), and a worker — run as in production, with the
// default --metrics-max-tenants — serves /metrics: its tenant-labelled
// series are at most 2 × (100 + 1), the 100 busiest tenants and _other,
// and they still sum to every waiting batch.
func TestTenantSeriesAreBoundedPerPod(t *testing.T) {
	t.Parallel()
	const tenants = 5000
	names := make([]string, tenants)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%04d", i)
	}
	url, _ := waitingBatches(t, names...)

	port := freePorts(t, 1)
	stderr, stop := runWorker(t, "run", "--database-url", url, "--metrics-addr", "127.0.0.1:"+strconv.Itoa(port),
		"--name", "tenant-series", "--orphan-after", "1h", "--stats-interval", "1s", "--log-level", "warn")
	var body string
	require.Eventually(t, func() bool {
		var err error
		body, err = scrapeMetrics(port)
		return err == nil && strings.Contains(body, "ingest_tenant_batches{")
	}, 60*time.Second, 100*time.Millisecond, "the worker never exported its tenant gauge; logs: %s", stderr.String())

	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	tenantSeries, tenantValues, waiting, otherWaiting := 0, map[string]bool{}, 0.0, 0.0
	for name, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() != "tenant" && l.GetName() != "tenant_id" {
					continue
				}
				tenantSeries++
				tenantValues[l.GetValue()] = true
				if name == "ingest_tenant_batches" && hasLabel(s.GetLabel(), "state", "waiting") {
					waiting += s.GetGauge().GetValue()
					if l.GetValue() == metrics.TenantOther {
						otherWaiting = s.GetGauge().GetValue()
					}
				}
			}
		}
	}
	bound := 2 * (metrics.MaxTenantsDefault + 1)
	t.Logf("%d tenants imported: %d tenant-labelled series, %d tenant values, a scrape of %d bytes", tenants, tenantSeries, len(tenantValues), len(body))
	require.LessOrEqual(t, tenantSeries, bound, "a pod exports at most 2 × (--metrics-max-tenants + 1) tenant series")
	require.Len(t, tenantValues, metrics.MaxTenantsDefault+1, "the 100 busiest tenants and _other")
	require.Equal(t, float64(tenants), waiting, "no batch is lost: the others are summed under _other")
	require.Equal(t, float64(tenants-metrics.MaxTenantsDefault), otherWaiting)

	stop()
}

// waitingBatches imports a folder for each tenant into a fresh database
// through the enqueue code path (ImportMany bursts, as serve, sqs and
// reconcile do) and deletes their jobs: a worker is then there for its
// gauges, not its jobs, and every batch stays Running, waiting (with
// --orphan-after 1h the sweeper re-delivers none). It returns the
// database's URL and a pool on it.
func waitingBatches(t *testing.T, tenants ...string) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, url)
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	enq := &jobs.Enqueuer{Pool: pool, River: client, Logger: slog.New(slog.DiscardHandler)}
	for burst := range slices.Chunk(tenants, jobs.MaxBurst) {
		reqs := make([]jobs.ImportRequest, 0, len(burst))
		for _, tenant := range burst {
			reqs = append(reqs, jobs.ImportRequest{TenantID: tenant, TenantDatabase: "db", CompanyID: "c",
				Folder: "s3://fleet-uploads/tenants/" + tenant + "/db/c/up-1"})
		}
		results, err := enq.ImportMany(ctx, reqs)
		require.NoError(t, err)
		for _, r := range results {
			require.Equal(t, jobs.OutcomeEnqueued, r.Outcome, "%+v", r)
		}
	}
	_, err = pool.Exec(ctx, `DELETE FROM river_job`)
	require.NoError(t, err)
	return url, pool
}

func hasLabel(labels []*dto.LabelPair, name, value string) bool {
	for _, l := range labels {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// TestRunRefusesANonsenseTenantSeriesBound: --metrics-max-tenants (and
// METRICS_MAX_TENANTS) is 0 to 10,000; anything else is invalid input,
// exit 2, before anything connects.
func TestRunRefusesANonsenseTenantSeriesBound(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"-1", "10001", "many"} {
		var stdout, stderr testproc.SyncBuffer
		code := run(context.Background(), []string{"run", "--database-url", "postgres://u@127.0.0.1:1/x?connect_timeout=1",
			"--metrics-max-tenants", v}, &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, "%s: %s", v, stderr.String())
		require.Contains(t, stderr.String(), "metrics", v)
	}
}

// TestWorkerMetricsOneTenantExporterNoDoorFamiliesPoolsPerPool scrapes
// the /metrics of two workers on one database (--simulate-pods 2: each its
// own pools, River client, stats loop and listener): only one of them,
// River's leader, exports tenant-labelled series; neither exports the
// doors' families (enqueue serve's, sqs's, reconcile's); each exports its
// connection pools' metrics, one series per pool.
func TestWorkerMetricsOneTenantExporterNoDoorFamiliesPoolsPerPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := waitingBatches(t, "tenant-a", "tenant-b", "tenant-c")

	base := freePorts(t, 2)
	stderr, stop := runWorker(t, "run", "--database-url", url, "--metrics-addr", "127.0.0.1:"+strconv.Itoa(base),
		"--name", "two", "--simulate-pods", "2", "--orphan-after", "1h", "--stats-interval", "200ms", "--log-level", "warn")
	scrape := func(i int) map[string]*dto.MetricFamily {
		body, err := scrapeMetrics(base + i)
		if err != nil {
			return nil
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(body))
		if err != nil {
			return nil
		}
		return families
	}
	tenantSeries := func(families map[string]*dto.MetricFamily) int {
		n := 0
		for _, f := range families {
			for _, s := range f.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "tenant" || l.GetName() == "tenant_id" {
						n++
					}
				}
			}
		}
		return n
	}
	var pods [2]map[string]*dto.MetricFamily
	require.Eventually(t, func() bool {
		pods[0], pods[1] = scrape(0), scrape(1)
		return pods[0] != nil && pods[1] != nil && tenantSeries(pods[0])+tenantSeries(pods[1]) > 0
	}, 60*time.Second, 100*time.Millisecond, "no worker exported tenant series; logs: %s", stderr.String())
	// Several refreshes later, still one exporter.
	time.Sleep(time.Second)
	require.Eventually(t, func() bool {
		pods[0], pods[1] = scrape(0), scrape(1)
		return pods[0] != nil && pods[1] != nil
	}, 30*time.Second, 100*time.Millisecond)
	leader := 0
	if tenantSeries(pods[1]) > 0 {
		leader = 1
	}
	require.Equal(t, 6, tenantSeries(pods[leader]), "three tenants, running and waiting")
	require.Zero(t, tenantSeries(pods[1-leader]), "the worker that does not lead River exports no tenant series")
	require.Equal(t, 1.0, pods[leader]["ingest_river_leader"].GetMetric()[0].GetGauge().GetValue())
	require.Equal(t, 0.0, pods[1-leader]["ingest_river_leader"].GetMetric()[0].GetGauge().GetValue())
	var leaderID string
	require.NoError(t, pool.QueryRow(ctx, `SELECT leader_id FROM river_leader`).Scan(&leaderID))
	require.Equal(t, fmt.Sprintf("two-%03d", leader), leaderID, "the exporter is River's elected leader")

	for i, families := range pods {
		for name := range families {
			for _, door := range []string{"ingest_http_", "ingest_sqs_", "ingest_reconcile_", "ingest_sns_", "ingest_reservations_",
				"ingest_late_object_events_", "ingest_events_ignored_", "ingest_tenant_tokens_", "ingest_import_group_"} {
				require.False(t, strings.HasPrefix(name, door), "worker %d exports %s", i, name)
			}
		}
		require.Contains(t, families, "ingest_lease_acquisitions_total")
		for _, family := range []string{"ingest_pgxpool_acquired_connections", "ingest_pgxpool_max_connections", "ingest_pgxpool_acquires_total",
			"ingest_pgxpool_acquire_duration_seconds_total", "ingest_pgxpool_empty_acquires_total", "ingest_pgxpool_canceled_acquires_total",
			"ingest_pgxpool_idle_connections", "ingest_pgxpool_total_connections"} {
			f := families[family]
			require.NotNil(t, f, "worker %d exports %s", i, family)
			pools := map[string]float64{}
			for _, s := range f.GetMetric() {
				pools[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue() + s.GetCounter().GetValue()
			}
			require.Len(t, pools, 3, "%s: worker %d's pools", family, i)
			require.Contains(t, pools, metrics.PoolShared)
			require.Contains(t, pools, metrics.PoolRenewals)
			require.Contains(t, pools, metrics.PoolLoads)
		}
		// The default budget (concurrency 4: --max-conns 6) as the pools
		// report it: one renewal connection, two loads, two shared, beside
		// River's LISTEN connection.
		maxConns := map[string]float64{}
		for _, s := range families["ingest_pgxpool_max_connections"].GetMetric() {
			maxConns[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
		}
		require.Equal(t, map[string]float64{metrics.PoolRenewals: 1, metrics.PoolLoads: 2, metrics.PoolShared: 2}, maxConns, "worker %d", i)
	}

	stop()
}
