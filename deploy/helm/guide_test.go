package helm_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// guideBlock returns the fenced block that follows marker in
// docs/deploy.md.
func guideBlock(t *testing.T, marker string) string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/deploy.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(raw), "<!-- deploy-guide: "+marker+" -->")
	require.True(t, ok, "docs/deploy.md has no %s block", marker)
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	require.True(t, ok)
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	return block
}

// TestDeployGuideValuesRender: the values docs/deploy.md tells operators to
// start from render with the chart and give what the guide says they give.
func TestDeployGuideValuesRender(t *testing.T) {
	t.Parallel()
	var values map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(guideBlock(t, "values")), &values))
	docs := mustRender(t, values)

	worker := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"])
	require.Equal(t, "ghcr.io/fleet/ingest:1.4.0", worker.Spec.Template.Spec.Containers[0].Image)
	require.Equal(t, "arn:aws:iam::123456789012:role/fleet-ingest-worker",
		decodeCRD[struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}](t, docs["ServiceAccount/prod-fleet-ingest-worker"]).Metadata.Annotations["eks.amazonaws.com/role-arn"])
	require.Contains(t, docs, "ScaledObject/prod-fleet-ingest-worker")
	require.NotContains(t, docs, "HorizontalPodAutoscaler/prod-fleet-ingest-worker")
	require.Contains(t, docs, "ServiceMonitor/prod-fleet-ingest")
	require.Contains(t, docs, "PrometheusRule/prod-fleet-ingest")
	require.Contains(t, docs, "ConfigMap/prod-fleet-ingest-dashboard")
	enq := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-enqueue"])
	args := strings.Join(enq.Spec.Template.Spec.Containers[0].Args, " ")
	require.Contains(t, args, "arn:aws:sns:eu-west-1:123456789012:fleet-uploads")
	require.Contains(t, args, "--operator-token-file")
	migrate := docs["Job/prod-fleet-ingest-migrate"]
	require.Contains(t, migrate.raw, "prod-fleet-ingest-migrate", "the migrate Job reads the owner's Secret")
	env := map[string]string{}
	for _, e := range worker.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	require.Equal(t, "redshift", env["WAREHOUSE"])
	require.Equal(t, "fleet", env["REDSHIFT_WORKGROUP"])
	require.Equal(t, "eu-west-1", env["AWS_REGION"])
}

// TestDeployGuideNotificationValuesRender: the notification values
// docs/deploy.md gives mount the destinations file and set the worker's
// --notify-* flags to the defaults it states.
func TestDeployGuideNotificationValuesRender(t *testing.T) {
	t.Parallel()
	var values map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(guideBlock(t, "notifications-values")), &values))
	worker := decode[appsv1.Deployment](t, mustRender(t, values)["Deployment/prod-fleet-ingest-worker"]).Spec.Template.Spec
	args := worker.Containers[0].Args
	file, ok := argValue(args, "--notifications-file")
	require.True(t, ok)
	require.Equal(t, "/etc/fleet-ingest/worker/notifications.json", file, "the path docs/deploy.md names")
	require.Equal(t, "notifications", worker.Volumes[0].Secret.Items[0].Key)
	defaults := decode[appsv1.Deployment](t, mustRender(t, nil)["Deployment/prod-fleet-ingest-worker"]).Spec.Template.Spec.Containers[0].Args
	for _, f := range []string{"--notify-concurrency", "--notify-max-attempts", "--notify-retry-base", "--notify-retry-max", "--notify-timeout"} {
		got, _ := argValue(args, f)
		want, _ := argValue(defaults, f)
		require.Equal(t, want, got, "%s: the guide's values are the chart's defaults", f)
	}
}
