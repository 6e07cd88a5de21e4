package helm_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// TestChartScrapesEachComponentUnderItsJob: the ServiceMonitor names the
// admin ports' targets after their component (fleet-ingest-enqueue is
// enqueue serve alone, so FleetIngestDoorDown is not silenced by an sqs or
// reconcile pod), and metrics.scrapeAnnotations annotates every pod with
// its metrics port for a Prometheus without the Operator.
func TestChartScrapesEachComponentUnderItsJob(t *testing.T) {
	t.Parallel()
	all := map[string]any{
		"sqs":       map[string]any{"enabled": true, "queueURL": "https://sqs.eu-west-1.amazonaws.com/123456789012/fleet-uploads"},
		"reconcile": map[string]any{"enabled": true, "bucket": "fleet-uploads"},
	}
	docs := mustRender(t, all)
	for _, d := range []string{"Deployment/prod-fleet-ingest-worker", "Deployment/prod-fleet-ingest-enqueue", "Deployment/prod-fleet-ingest-sqs", "Deployment/prod-fleet-ingest-reconcile"} {
		dep := decode[appsv1.Deployment](t, docs[d])
		require.Empty(t, dep.Spec.Template.Annotations, "%s: no scrape annotations by default", d)
	}

	all["metrics"] = map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "scrapeAnnotations": true}
	docs = mustRender(t, all)
	for d, port := range map[string]string{
		"Deployment/prod-fleet-ingest-worker": "9090", "Deployment/prod-fleet-ingest-enqueue": "8081",
		"Deployment/prod-fleet-ingest-sqs": "8081", "Deployment/prod-fleet-ingest-reconcile": "8081",
	} {
		dep := decode[appsv1.Deployment](t, docs[d])
		require.Equal(t, map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": port, "prometheus.io/path": "/metrics"},
			dep.Spec.Template.Annotations, d)
		found := false
		for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
			want, err := strconv.Atoi(port)
			require.NoError(t, err)
			found = found || p.ContainerPort == int32(want)
		}
		require.True(t, found, "%s: the annotated port is the container's", d)
	}

	var sm struct {
		Spec struct {
			Endpoints []struct {
				Port        string `json:"port"`
				Relabelings []struct {
					SourceLabels []string `json:"sourceLabels"`
					TargetLabel  string   `json:"targetLabel"`
					Replacement  string   `json:"replacement"`
				} `json:"relabelings"`
			} `json:"endpoints"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(docs["ServiceMonitor/prod-fleet-ingest"].raw), &sm))
	require.Len(t, sm.Spec.Endpoints, 2)
	worker, admin := sm.Spec.Endpoints[0], sm.Spec.Endpoints[1]
	require.Equal(t, "metrics", worker.Port)
	require.Equal(t, "fleet-ingest-worker", worker.Relabelings[0].Replacement)
	require.Equal(t, "admin", admin.Port)
	require.Equal(t, "job", admin.Relabelings[0].TargetLabel)
	require.Equal(t, []string{"__meta_kubernetes_service_label_app_kubernetes_io_component"}, admin.Relabelings[0].SourceLabels)
	require.Equal(t, "fleet-ingest-$1", admin.Relabelings[0].Replacement)
	// Each admin Service carries the component label the job is made of.
	for svc, component := range map[string]string{
		"Service/prod-fleet-ingest-enqueue-admin": "enqueue", "Service/prod-fleet-ingest-sqs-admin": "sqs", "Service/prod-fleet-ingest-reconcile-admin": "reconcile",
	} {
		var s struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(docs[svc].raw), &s))
		require.Equal(t, component, s.Metadata.Labels["app.kubernetes.io/component"], svc)
	}
}
