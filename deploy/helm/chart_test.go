// Package helm_test renders the fleet-ingest chart with Helm's own Go
// packages and checks the manifests' key invariants.
package helm_test

import (
	"fmt"
	"maps"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "fleet-ingest"

// manifest is one rendered document.
type manifest struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	raw string
}

// render renders the chart with overrides and returns its documents by
// kind and name, or the render error.
func render(t *testing.T, overrides map[string]any) (map[string]manifest, error) {
	t.Helper()
	if _, ok := overrides["uploads"]; !ok {
		// Required by the chart; every test but the one about it names one.
		overrides = maps.Clone(overrides)
		if overrides == nil {
			overrides = map[string]any{}
		}
		overrides["uploads"] = map[string]any{"buckets": []any{"fleet-uploads"}}
	}
	ch, err := loader.Load(chartDir)
	require.NoError(t, err)
	vals, err := chartutil.ToRenderValues(ch, overrides, chartutil.ReleaseOptions{Name: "prod", Namespace: "fleet", IsInstall: true}, chartutil.DefaultCapabilities)
	require.NoError(t, err)
	out, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	docs := map[string]manifest{}
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, doc := range strings.Split(out[name], "\n---") {
			if strings.TrimSpace(doc) == "" || strings.HasPrefix(strings.TrimSpace(doc), "#") && !strings.Contains(doc, "kind:") {
				continue
			}
			var m manifest
			require.NoError(t, yaml.Unmarshal([]byte(doc), &m), "%s:\n%s", name, doc)
			if m.Kind == "" {
				continue
			}
			m.raw = doc
			key := m.Kind + "/" + m.Metadata.Name
			require.NotContains(t, docs, key, "duplicate %s", key)
			docs[key] = m
		}
	}
	return docs, nil
}

func decode[T any](t *testing.T, m manifest) T {
	t.Helper()
	var v T
	require.NoError(t, yaml.UnmarshalStrict([]byte(m.raw), &v), m.raw)
	return v
}

func mustRender(t *testing.T, overrides map[string]any) map[string]manifest {
	t.Helper()
	docs, err := render(t, overrides)
	require.NoError(t, err)
	return docs
}

func argValue(args []string, flag string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func envSecret(c corev1.Container, name string) (string, string) {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
		}
	}
	return "", ""
}

// requireHardened checks a pod's security context and that its database
// URL comes from the component's own Secret.
func requireHardened(t *testing.T, what, secret string, pod corev1.PodSpec) {
	t.Helper()
	require.NotNil(t, pod.SecurityContext, what)
	require.True(t, *pod.SecurityContext.RunAsNonRoot, what)
	require.NotZero(t, *pod.SecurityContext.RunAsUser, what)
	for _, c := range pod.Containers {
		sc := c.SecurityContext
		require.NotNil(t, sc, what)
		require.True(t, *sc.ReadOnlyRootFilesystem, "%s: read-only root filesystem", what)
		require.False(t, *sc.AllowPrivilegeEscalation, "%s: no privilege escalation", what)
		require.True(t, *sc.RunAsNonRoot, what)
		require.Contains(t, sc.Capabilities.Drop, corev1.Capability("ALL"), what)
		name, key := envSecret(c, "DATABASE_URL")
		require.Equal(t, secret, name, "%s: the database URL comes from the component's own Secret", what)
		require.Equal(t, "url", key, what)
		for _, e := range c.Env {
			require.NotContains(t, strings.ToLower(e.Value), "postgres://", "%s: no connection string inline", what)
		}
	}
}

func TestChartDefaults(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, nil)

	worker := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"])
	pod := worker.Spec.Template.Spec
	require.Nil(t, worker.Spec.Replicas, "replicas belong to the HPA when autoscaling")
	requireHardened(t, "worker", "prod-fleet-ingest-worker", pod)
	c := pod.Containers[0]
	require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, "metrics", c.LivenessProbe.HTTPGet.Port.String())
	grace, ok := argValue(c.Args, "--shutdown-grace")
	require.True(t, ok)
	graceDur, err := time.ParseDuration(grace)
	require.NoError(t, err)
	require.Greater(t, time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, graceDur,
		"terminationGracePeriodSeconds must outlast the worker's shutdown grace")
	drainMax, ok := argValue(c.Args, "--drain-max")
	require.True(t, ok, "a rollout waits for loads that will finish")
	drainDur, err := time.ParseDuration(drainMax)
	require.NoError(t, err)
	require.Equal(t, 15*time.Minute, drainDur)
	require.Greater(t, time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, drainDur,
		"terminationGracePeriodSeconds must outlast the drain limit, or a draining pod is SIGKILLed mid-load")
	_, capped := argValue(c.Args, "--max-running-per-tenant")
	require.False(t, capped, "no tenant cap by default")
	marker, _ := argValue(c.Args, "--marker")
	require.Equal(t, "_SUCCESS", marker, "the worker loads no folder without the doors' completion marker")
	tenantSeries, _ := argValue(c.Args, "--metrics-max-tenants")
	require.Equal(t, "100", tenantSeries, "the worker's default bound on tenant series")
	ttl, _ := argValue(c.Args, "--lease-ttl")
	renew, _ := argValue(c.Args, "--lease-renew-every")
	ttlDur, _ := time.ParseDuration(ttl)
	renewDur, _ := time.ParseDuration(renew)
	require.Less(t, renewDur, ttlDur)
	require.Equal(t, "30s", ttl)
	_, ok = argValue(c.Args, "--lease-safety-margin")
	require.False(t, ok, "the worker's default safety margin (a tenth of the TTL)")
	require.Equal(t, []string{"/worker"}, c.Command)
	require.Equal(t, "run", c.Args[0])

	require.Contains(t, docs, "HorizontalPodAutoscaler/prod-fleet-ingest-worker")
	require.Contains(t, docs, "PodDisruptionBudget/prod-fleet-ingest-worker")
	require.Contains(t, docs, "PodDisruptionBudget/prod-fleet-ingest-enqueue")

	job := decode[batchv1.Job](t, docs["Job/prod-fleet-ingest-migrate"])
	require.Equal(t, "pre-install,pre-upgrade", docs["Job/prod-fleet-ingest-migrate"].Metadata.Annotations["helm.sh/hook"])
	require.Equal(t, []string{"migrate"}, job.Spec.Template.Spec.Containers[0].Args)
	require.Equal(t, corev1.RestartPolicyNever, job.Spec.Template.Spec.RestartPolicy)
	requireHardened(t, "migrate job", "prod-fleet-ingest-migrate", job.Spec.Template.Spec)

	enq := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-enqueue"])
	requireHardened(t, "enqueue", "prod-fleet-ingest-enqueue", enq.Spec.Template.Spec)
	ec := enq.Spec.Template.Spec.Containers[0]
	require.Equal(t, []string{"/enqueue"}, ec.Command)
	require.Equal(t, "serve", ec.Args[0])
	require.Equal(t, "/readyz", ec.ReadinessProbe.HTTPGet.Path)
	require.NotContains(t, ec.Args, "--imports-without-marker", "HTTP imports require the marker by default")
	requireAdminProbes(t, ec, decode[corev1.Service](t, docs["Service/prod-fleet-ingest-enqueue"]),
		decode[corev1.Service](t, docs["Service/prod-fleet-ingest-enqueue-admin"]))

	require.NotContains(t, docs, "ServiceMonitor/prod-fleet-ingest", "off by default")
	require.NotContains(t, docs, "PrometheusRule/prod-fleet-ingest", "off by default")
}

// requireAdminProbes: enqueue's probes go to its admin listener, a port of
// its own (--admin-listen) that the public Service does not expose; a
// headless Service carries it for Prometheus.
func requireAdminProbes(t *testing.T, c corev1.Container, public, admin corev1.Service) {
	t.Helper()
	listen, ok := argValue(c.Args, "--admin-listen")
	require.True(t, ok)
	require.Equal(t, ":8081", listen)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	require.Equal(t, map[string]int32{"http": 8080, "admin": 8081}, ports)
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		require.Equal(t, "admin", p.HTTPGet.Port.String(), "the kubelet probes the admin port, never the public one")
	}
	require.Len(t, public.Spec.Ports, 1)
	require.Equal(t, "http", public.Spec.Ports[0].TargetPort.String(), "the public Service exposes the API only")
	require.Equal(t, corev1.ClusterIPNone, admin.Spec.ClusterIP)
	require.Len(t, admin.Spec.Ports, 1)
	require.Equal(t, "admin", admin.Spec.Ports[0].Name)
	require.Equal(t, "admin", admin.Spec.Ports[0].TargetPort.String())
}

func TestChartNonDefaults(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, map[string]any{
		"image": map[string]any{"tag": "1.2.3"},
		"worker": map[string]any{
			"replicas": 5, "autoscaling": map[string]any{"enabled": false}, "shutdownGraceSeconds": 60, "drainMaxSeconds": 0,
			"leaseTTLSeconds": 45, "leaseRenewEverySeconds": 15, "concurrency": 8, "leaseSafetyMarginMilliseconds": 4500,
			"podDisruptionBudget": map[string]any{"enabled": false}, "maxRunningPerTenant": 3, "metricsMaxTenants": 0,
		},
		"warehouse": map[string]any{"existingSecret": "redshift"},
		"enqueue":   map[string]any{"enabled": false},
		"migration": map[string]any{"skipWarehouse": true},
		"metrics": map[string]any{
			"serviceMonitor":   map[string]any{"enabled": true},
			"prometheusRule":   map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus"}},
			"grafanaDashboard": map[string]any{"enabled": true},
		},
	})
	worker := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"])
	require.Equal(t, int32(5), *worker.Spec.Replicas)
	pod := worker.Spec.Template.Spec
	require.Equal(t, int64(75), *pod.TerminationGracePeriodSeconds, "no drain past the grace: shutdown grace + 15 s")
	c := pod.Containers[0]
	require.Equal(t, "ghcr.io/fleet/ingest:1.2.3", c.Image)
	v, _ := argValue(c.Args, "--concurrency")
	require.Equal(t, "8", v)
	v, _ = argValue(c.Args, "--lease-safety-margin")
	require.Equal(t, "4500ms", v)
	v, _ = argValue(c.Args, "--max-running-per-tenant")
	require.Equal(t, "3", v, "worker.maxRunningPerTenant")
	v, _ = argValue(c.Args, "--metrics-max-tenants")
	require.Equal(t, "0", v, "worker.metricsMaxTenants: 0 is a value, not the default")
	name, key := envSecret(c, "WAREHOUSE_URL")
	require.Equal(t, "redshift", name)
	require.Equal(t, "url", key)
	require.NotContains(t, docs, "HorizontalPodAutoscaler/prod-fleet-ingest-worker")
	require.NotContains(t, docs, "PodDisruptionBudget/prod-fleet-ingest-worker")
	require.NotContains(t, docs, "Deployment/prod-fleet-ingest-enqueue")
	require.Contains(t, docs, "ServiceMonitor/prod-fleet-ingest")
	var sm struct {
		Spec struct {
			Endpoints []struct {
				Port string `json:"port"`
			} `json:"endpoints"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(docs["ServiceMonitor/prod-fleet-ingest"].raw), &sm))
	var scraped []string
	for _, e := range sm.Spec.Endpoints {
		scraped = append(scraped, e.Port)
	}
	require.Equal(t, []string{"metrics", "admin"}, scraped, "the worker's metrics port and enqueue's admin port, never the public one")
	job := decode[batchv1.Job](t, docs["Job/prod-fleet-ingest-migrate"])
	require.Equal(t, []string{"migrate", "--skip-warehouse"}, job.Spec.Template.Spec.Containers[0].Args)

	rule := docs["PrometheusRule/prod-fleet-ingest"]
	require.Contains(t, rule.raw, "release: kube-prometheus")
	var pr struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(rule.raw), &pr))
	// The alert file's rules of the enabled components (enqueue is off
	// here), scoped to the release: scope_test.go checks them.
	require.NotEmpty(t, pr.Spec.Groups)
	require.NotContains(t, fmt.Sprint(pr.Spec.Groups), "FleetIngestDoor")
	raw, err := os.ReadFile(chartDir + "/files/alerts.yaml")
	require.NoError(t, err)
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			require.Contains(t, string(raw), "alert: "+r.Alert+"\n")
			require.Contains(t, r.Expr, `namespace="fleet",release="prod"`, r.Alert)
		}
	}
	require.Contains(t, docs["ConfigMap/prod-fleet-ingest-dashboard"].raw, "Fleet ingestion: leases and batches")
}

func TestChartRefusesUnsafeTimings(t *testing.T) {
	t.Parallel()
	_, err := render(t, map[string]any{"worker": map[string]any{"shutdownGraceSeconds": 30, "terminationGracePeriodSeconds": 30}})
	require.ErrorContains(t, err, "must be longer than worker.shutdownGraceSeconds")
	_, err = render(t, map[string]any{"worker": map[string]any{"drainMaxSeconds": 600, "terminationGracePeriodSeconds": 300}})
	require.ErrorContains(t, err, "must be longer than worker.drainMaxSeconds")
	_, err = render(t, map[string]any{"worker": map[string]any{"leaseTTLSeconds": 10, "leaseRenewEverySeconds": 10}})
	require.ErrorContains(t, err, "leaseRenewEverySeconds must be shorter")
	for _, margin := range []int{20000, 25000, -1} { // the defaults leave 30 s − 10 s
		_, err = render(t, map[string]any{"worker": map[string]any{"leaseSafetyMarginMilliseconds": margin}})
		require.ErrorContains(t, err, "worker.leaseSafetyMarginMilliseconds (", "%d", margin)
	}
	_, err = render(t, map[string]any{"worker": map[string]any{"leaseSafetyMarginMilliseconds": 19999}})
	require.NoError(t, err)
	_, err = render(t, map[string]any{"enqueue": map[string]any{"sns": map[string]any{"autoConfirm": true}}})
	require.ErrorContains(t, err, "autoConfirm needs enqueue.sns.topicArns")
}

func TestChartLints(t *testing.T) {
	t.Parallel()
	res := lint.AllWithKubeVersion(chartDir, map[string]any{}, "fleet", nil)
	for _, msg := range res.Messages {
		require.Less(t, msg.Severity, support.WarningSev, "%s", msg.Error())
	}
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom == nil {
			return e.Value, true
		}
	}
	return "", false
}

// TestChartRedshiftWarehouse: warehouse.type redshift configures the
// worker and the migrate Job through REDSHIFT_* variables, and refuses an
// incomplete configuration.
func TestChartRedshiftWarehouse(t *testing.T) {
	t.Parallel()
	redshift := map[string]any{
		"workgroup": "fleet-prod", "database": "analytics", "secretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:fleet",
		"iamRole": "arn:aws:iam::123456789012:role/fleet-copy", "staging": "s3://fleet-staging/loads/",
		"loadTimeout": "30m", "region": "eu-west-1",
	}
	docs := mustRender(t, map[string]any{"warehouse": map[string]any{"type": "redshift", "redshift": redshift}})
	worker := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"]).Spec.Template.Spec.Containers[0]
	job := decode[batchv1.Job](t, docs["Job/prod-fleet-ingest-migrate"]).Spec.Template.Spec.Containers[0]
	for _, c := range []corev1.Container{worker, job} {
		for name, want := range map[string]string{
			"WAREHOUSE": "redshift", "REDSHIFT_WORKGROUP": "fleet-prod", "REDSHIFT_DATABASE": "analytics",
			"REDSHIFT_SECRET_ARN": redshift["secretArn"].(string), "REDSHIFT_IAM_ROLE": redshift["iamRole"].(string),
			"REDSHIFT_STAGING": "s3://fleet-staging/loads/", "REDSHIFT_LOAD_TIMEOUT": "30m", "REDSHIFT_QUERY_TIMEOUT": "2m",
			"AWS_REGION": "eu-west-1",
		} {
			got, ok := envValue(c, name)
			require.True(t, ok, "%s: %s", c.Name, name)
			require.Equal(t, want, got, "%s: %s", c.Name, name)
		}
		for _, absent := range []string{"REDSHIFT_CLUSTER_ID", "REDSHIFT_DB_USER", "WAREHOUSE_URL"} {
			_, ok := envValue(c, absent)
			require.False(t, ok, "%s: %s", c.Name, absent)
		}
	}
	require.Equal(t, []string{"migrate"}, job.Args, "the Job applies the Redshift schema")

	// The migrate Job may run as the schema owner's database user, the
	// workers as their own (role fleet_loader).
	owner := maps.Clone(redshift)
	owner["migrateSecretArn"] = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:fleet-owner"
	docs = mustRender(t, map[string]any{"warehouse": map[string]any{"type": "redshift", "redshift": owner}})
	worker = decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"]).Spec.Template.Spec.Containers[0]
	job = decode[batchv1.Job](t, docs["Job/prod-fleet-ingest-migrate"]).Spec.Template.Spec.Containers[0]
	got, _ := envValue(worker, "REDSHIFT_SECRET_ARN")
	require.Equal(t, redshift["secretArn"], got)
	got, _ = envValue(job, "REDSHIFT_SECRET_ARN")
	require.Equal(t, owner["migrateSecretArn"], got)

	// Applying the Redshift schema goes through the Data API: the migrate
	// Job gets the worker's AWS identity and HTTPS egress, and only then.
	const irsa = "eks.amazonaws.com/role-arn"
	withIdentity := func(skip bool) map[string]manifest {
		return mustRender(t, map[string]any{
			"warehouse": map[string]any{"type": "redshift", "redshift": redshift},
			"worker":    map[string]any{"serviceAccount": map[string]any{"annotations": map[string]any{irsa: "arn:aws:iam::1:role/fleet-worker"}}},
			"migration": map[string]any{"skipWarehouse": skip},
		})
	}
	docs = withIdentity(false)
	sa := decode[corev1.ServiceAccount](t, docs["ServiceAccount/prod-fleet-ingest-migrate"])
	require.Equal(t, "arn:aws:iam::1:role/fleet-worker", sa.Annotations[irsa])
	np := decode[networkingv1.NetworkPolicy](t, docs["NetworkPolicy/prod-fleet-ingest-migrate"]).Spec
	require.Equal(t, []string{"TCP/443", "TCP/53", "TCP/5432", "UDP/53"}, allPorts(rulesOf(np.Egress)))
	docs = withIdentity(true)
	sa = decode[corev1.ServiceAccount](t, docs["ServiceAccount/prod-fleet-ingest-migrate"])
	require.NotContains(t, sa.Annotations, irsa, "--skip-warehouse: migrate needs no AWS identity")
	np = decode[networkingv1.NetworkPolicy](t, docs["NetworkPolicy/prod-fleet-ingest-migrate"]).Spec
	require.Equal(t, []string{"TCP/53", "TCP/5432", "UDP/53"}, allPorts(rulesOf(np.Egress)))

	defaults := decode[appsv1.Deployment](t, mustRender(t, nil)["Deployment/prod-fleet-ingest-worker"]).Spec.Template.Spec.Containers[0]
	got, _ = envValue(defaults, "WAREHOUSE")
	require.Equal(t, "postgres", got)

	for _, c := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"type": "redshift", "redshift": map[string]any{"database": "d", "iamRole": "default", "staging": "s3://b/p/"}}, "workgroup or warehouse.redshift.clusterId is required"},
		{map[string]any{"type": "redshift", "redshift": map[string]any{"workgroup": "w", "clusterId": "c", "database": "d", "iamRole": "default", "staging": "s3://b/p/"}}, "only one of"},
		{map[string]any{"type": "redshift", "redshift": map[string]any{"workgroup": "w", "database": "d", "iamRole": "default"}}, "staging are required"},
		{map[string]any{"type": "redshift", "existingSecret": "wh", "redshift": map[string]any{"workgroup": "w", "database": "d", "iamRole": "default", "staging": "s3://b/p/"}}, "existingSecret is for warehouse.type postgres"},
		{map[string]any{"type": "bigquery"}, "warehouse.type must be postgres or redshift"},
	} {
		_, err := render(t, map[string]any{"warehouse": c.values})
		require.ErrorContains(t, err, c.want)
	}
}

// TestChartSizesConnections: enqueue's database pool (--max-conns) and
// HTTP connection cap (--max-http-conns) come from their values; the
// worker's pool takes the binary's default unless set.
func TestChartSizesConnections(t *testing.T) {
	t.Parallel()
	p := pods(t, mustRender(t, nil))
	enq := p.enqueue.Containers[0].Args
	v, ok := argValue(enq, "--max-conns")
	require.True(t, ok)
	require.Equal(t, "32", v)
	v, ok = argValue(enq, "--max-http-conns")
	require.True(t, ok)
	require.Equal(t, "256", v)
	_, ok = argValue(p.worker.Containers[0].Args, "--max-conns")
	require.False(t, ok, "the worker sizes its pools from --concurrency by default")

	p = pods(t, mustRender(t, map[string]any{
		"worker":  map[string]any{"databaseMaxConns": 40},
		"enqueue": map[string]any{"databaseMaxConns": 64, "maxHTTPConns": 512},
	}))
	v, _ = argValue(p.worker.Containers[0].Args, "--max-conns")
	require.Equal(t, "40", v)
	v, _ = argValue(p.enqueue.Containers[0].Args, "--max-conns")
	require.Equal(t, "64", v)
	v, _ = argValue(p.enqueue.Containers[0].Args, "--max-http-conns")
	require.Equal(t, "512", v)
}

// TestChartOneMarkerForTheDoorsAndTheWorker: enqueue.marker names the
// completion marker the doors wait for and the worker requires, so the
// two cannot disagree; enqueue.importsWithoutMarker makes HTTP imports
// opt out of it when their body does not say.
func TestChartOneMarkerForTheDoorsAndTheWorker(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, map[string]any{
		"enqueue": map[string]any{"marker": "_DONE", "importsWithoutMarker": true},
	})
	worker := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"])
	v, _ := argValue(worker.Spec.Template.Spec.Containers[0].Args, "--marker")
	require.Equal(t, "_DONE", v)
	enq := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-enqueue"])
	args := enq.Spec.Template.Spec.Containers[0].Args
	v, _ = argValue(args, "--marker")
	require.Equal(t, "_DONE", v)
	require.Contains(t, args, "--imports-without-marker")
}

// TestChartOneToleranceOfBadRecordsForTheDoors: enqueue.maxBadRecords is
// every door's --max-bad-records (serve, sqs, reconcile), 0 by default;
// a value enqueue would refuse fails the render.
func TestChartOneToleranceOfBadRecordsForTheDoors(t *testing.T) {
	t.Parallel()
	doors := map[string]any{
		"sqs":       map[string]any{"enabled": true, "queueURL": "https://sqs.us-east-1.amazonaws.com/123456789012/fleet"},
		"reconcile": map[string]any{"enabled": true, "bucket": "fleet-uploads"},
	}
	for _, c := range []struct {
		value any
		want  string
	}{{nil, "0"}, {25, "25"}} {
		values := map[string]any{"sqs": doors["sqs"], "reconcile": doors["reconcile"]}
		if c.value != nil {
			values["enqueue"] = map[string]any{"maxBadRecords": c.value}
		}
		docs := mustRender(t, values)
		for _, name := range []string{"Deployment/prod-fleet-ingest-enqueue", "Deployment/prod-fleet-ingest-sqs", "Deployment/prod-fleet-ingest-reconcile"} {
			require.Contains(t, docs, name)
			d := decode[appsv1.Deployment](t, docs[name])
			v, ok := argValue(d.Spec.Template.Spec.Containers[0].Args, "--max-bad-records")
			require.True(t, ok, "%s gets --max-bad-records", name)
			require.Equal(t, c.want, v, name)
		}
		worker := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"])
		_, ok := argValue(worker.Spec.Template.Spec.Containers[0].Args, "--max-bad-records")
		require.False(t, ok, "the worker takes each batch's tolerance from its details")
	}
	for _, bad := range []int{-1, 10001} {
		_, err := render(t, map[string]any{"enqueue": map[string]any{"maxBadRecords": bad}})
		require.ErrorContains(t, err, "enqueue.maxBadRecords must be between 0 and 10000", "%d", bad)
	}
}

// TestChartTenantTokens: secrets.enqueue.tenantTokensKey mounts the tokens
// file beside the import token and names it --tenant-tokens-file; without
// it there is no such flag.
func TestChartTenantTokens(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, map[string]any{"secrets": map[string]any{"enqueue": map[string]any{"tenantTokensKey": "tenant-tokens"}}})
	enq := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-enqueue"])
	args := enq.Spec.Template.Spec.Containers[0].Args
	v, ok := argValue(args, "--tenant-tokens-file")
	require.True(t, ok)
	require.Equal(t, "/etc/fleet-ingest/enqueue/tenant-tokens", v)
	var paths []string
	for _, vol := range enq.Spec.Template.Spec.Volumes {
		if vol.Secret != nil {
			for _, it := range vol.Secret.Items {
				paths = append(paths, it.Key+"->"+it.Path)
			}
		}
	}
	require.Contains(t, paths, "tenant-tokens->tenant-tokens")

	enq = decode[appsv1.Deployment](t, mustRender(t, nil)["Deployment/prod-fleet-ingest-enqueue"])
	_, ok = argValue(enq.Spec.Template.Spec.Containers[0].Args, "--tenant-tokens-file")
	require.False(t, ok, "no tenant tokens by default")
}

// TestChartNotifications: secrets.worker.notificationsKey mounts the
// tenants' notification destinations as a file of a directory mount (no
// subPath, so the kubelet brings Secret updates to the pod and the worker's
// reload sees them), from the worker's own Secret, and names it
// --notifications-file; worker.notify.* are the --notify-* flags; the
// chart refuses values the worker would refuse.
func TestChartNotifications(t *testing.T) {
	t.Parallel()
	notifyFlags := []string{"--notifications-reload", "--notify-concurrency", "--notify-max-attempts", "--notify-retry-base", "--notify-retry-max", "--notify-timeout"}
	flags := func(c corev1.Container) map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, f := range notifyFlags {
			v, ok := argValue(c.Args, f)
			require.True(t, ok, f)
			got[f] = v
		}
		return got
	}

	// By default: no destinations file, no volume, the worker's defaults.
	pod := pods(t, mustRender(t, nil)).worker
	c := pod.Containers[0]
	_, ok := argValue(c.Args, "--notifications-file")
	require.False(t, ok, "no destinations by default")
	require.Empty(t, pod.Volumes)
	require.Empty(t, c.VolumeMounts)
	require.Equal(t, map[string]string{
		"--notifications-reload": "10s", "--notify-concurrency": "2", "--notify-max-attempts": "12",
		"--notify-retry-base": "10s", "--notify-retry-max": "1h", "--notify-timeout": "30s",
	}, flags(c), "the worker's own defaults")

	docs := mustRender(t, map[string]any{
		"secrets": map[string]any{"worker": map[string]any{"notificationsKey": "notifications"}},
		"worker": map[string]any{"notify": map[string]any{
			"reload": "30s", "concurrency": 0, "maxAttempts": 20, "retryBase": "5s", "retryMax": "30m", "timeout": "10s",
		}},
	})
	pod = pods(t, docs).worker
	c = pod.Containers[0]
	require.Equal(t, map[string]string{
		"--notifications-reload": "30s", "--notify-concurrency": "0", "--notify-max-attempts": "20",
		"--notify-retry-base": "5s", "--notify-retry-max": "30m", "--notify-timeout": "10s",
	}, flags(c), "worker.notify.*; concurrency 0 is a value, not the default")
	file, ok := argValue(c.Args, "--notifications-file")
	require.True(t, ok)
	require.Len(t, c.VolumeMounts, 1)
	mount := c.VolumeMounts[0]
	require.True(t, mount.ReadOnly)
	require.Empty(t, mount.SubPath, "a subPath mount never sees the Secret's updates")
	require.Equal(t, mount.MountPath+"/notifications.json", file)
	require.Len(t, pod.Volumes, 1)
	vol := pod.Volumes[0]
	require.Equal(t, mount.Name, vol.Name)
	require.NotNil(t, vol.Secret)
	require.Equal(t, "prod-fleet-ingest-worker", vol.Secret.SecretName, "the worker's own Secret")
	require.Equal(t, []corev1.KeyToPath{{Key: "notifications", Path: "notifications.json"}}, vol.Secret.Items,
		"only the destinations are a file; the database URL stays out of the volume")
	require.Equal(t, []string{"prod-fleet-ingest-worker"}, secretsOf(pod))
	for _, e := range c.Env {
		require.NotEqual(t, "NOTIFICATIONS_FILE", e.Name, "the flag names the file")
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			require.NotEqual(t, "notifications", e.ValueFrom.SecretKeyRef.Key, "webhook secrets never in the environment")
		}
	}
	requireHardened(t, "worker", "prod-fleet-ingest-worker", pod)

	for _, c := range []struct {
		notify map[string]any
		want   string
	}{
		{map[string]any{"concurrency": -1}, "worker.notify.concurrency (-1) must not be negative"},
		{map[string]any{"maxAttempts": 0}, "worker.notify.maxAttempts (0) must be at least 1"},
	} {
		_, err := render(t, map[string]any{"worker": map[string]any{"notify": c.notify}})
		require.ErrorContains(t, err, c.want)
	}
}

// TestChartNotificationsEgress: the worker reaches its tenants' webhooks
// over HTTPS (its networkPolicy.https.cidrs); receivers outside those, or
// on another port, get a rule of their own from networkPolicy.notifications,
// only when the worker has destinations.
func TestChartNotificationsEgress(t *testing.T) {
	t.Parallel()
	egress := func(values map[string]any) []peerRule {
		t.Helper()
		return rulesOf(decode[networkingv1.NetworkPolicy](t, mustRender(t, values)["NetworkPolicy/prod-fleet-ingest-worker"]).Spec.Egress)
	}
	withKey := map[string]any{"worker": map[string]any{"notificationsKey": "notifications"}}
	narrowed := map[string]any{
		"https":         map[string]any{"cidrs": []any{"52.95.0.0/16"}},
		"notifications": map[string]any{"cidrs": []any{"203.0.113.0/24"}, "ports": []any{443, 8443}},
	}

	out := egress(map[string]any{"secrets": withKey})
	require.Equal(t, []string{"TCP/443", "TCP/53", "TCP/5432", "UDP/53"}, allPorts(out), "HTTPS, to networkPolicy.https.cidrs")
	require.Equal(t, "0.0.0.0/0", out[2].peers[0].IPBlock.CIDR)

	out = egress(map[string]any{"secrets": withKey, "networkPolicy": narrowed})
	require.Len(t, out, 4)
	require.Equal(t, []string{"TCP/443"}, out[2].ports)
	require.Equal(t, "52.95.0.0/16", out[2].peers[0].IPBlock.CIDR)
	require.Equal(t, []string{"TCP/443", "TCP/8443"}, out[3].ports, "the receivers' ports")
	require.Len(t, out[3].peers, 1)
	require.Equal(t, "203.0.113.0/24", out[3].peers[0].IPBlock.CIDR)

	out = egress(map[string]any{"networkPolicy": narrowed})
	require.Len(t, out, 3, "no destinations: no rule for their receivers")
	require.Equal(t, []string{"TCP/443", "TCP/53", "TCP/5432", "UDP/53"}, allPorts(out))
}
