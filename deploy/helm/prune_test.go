package helm_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// TestChartPruneCronJob: prune.enabled renders a CronJob running enqueue
// prune --apply with the values' retention and schedule, one run at a
// time, as the operators' login (by default the enqueue Secret's
// operatorDatabaseURLKey), with its own ServiceAccount and NetworkPolicy;
// without an operator URL the chart refuses to render, and by default
// there is no CronJob.
func TestChartPruneCronJob(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, nil)
	require.NotContains(t, docs, "CronJob/prod-fleet-ingest-prune", "off by default")

	_, err := render(t, map[string]any{"prune": map[string]any{"enabled": true}})
	require.ErrorContains(t, err, "prune.enabled needs the operators' database URL")

	docs = mustRender(t, map[string]any{
		"prune": map[string]any{"enabled": true, "schedule": "0 4 * * *", "olderThan": "30d"},
		"secrets": map[string]any{"enqueue": map[string]any{
			"operatorDatabaseURLKey": "operator-url", "operatorTokenKey": "operator-token",
		}},
	})
	cj := decode[batchv1.CronJob](t, docs["CronJob/prod-fleet-ingest-prune"])
	require.Equal(t, "0 4 * * *", cj.Spec.Schedule)
	require.Equal(t, batchv1.ForbidConcurrent, cj.Spec.ConcurrencyPolicy)
	pod := cj.Spec.JobTemplate.Spec.Template.Spec
	require.Equal(t, corev1.RestartPolicyNever, pod.RestartPolicy)
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	require.Equal(t, []string{"/enqueue"}, c.Command)
	require.Equal(t, []string{"prune", "--older-than=30d", "--batch-size=1000", "--lock-timeout=2s", "--apply"}, c.Args)
	name, key := envSecret(c, "DATABASE_URL")
	require.Equal(t, "prod-fleet-ingest-enqueue", name)
	require.Equal(t, "operator-url", key, "the operators' login, never the doors'")
	require.Equal(t, "prod-fleet-ingest-prune", pod.ServiceAccountName)
	require.False(t, *pod.AutomountServiceAccountToken)
	require.NotNil(t, c.Resources.Limits.Memory())
	sa := decode[corev1.ServiceAccount](t, docs["ServiceAccount/prod-fleet-ingest-prune"])
	require.False(t, *sa.AutomountServiceAccountToken)
	np := decode[networkingv1.NetworkPolicy](t, docs["NetworkPolicy/prod-fleet-ingest-prune"]).Spec
	require.Equal(t, "prune", np.PodSelector.MatchLabels["app.kubernetes.io/component"])
	require.Empty(t, np.Ingress, "nothing reaches it")
	require.Len(t, np.Egress, 2, "DNS and PostgreSQL only")

	// Another key of the enqueue Secret, without the operator surface.
	docs = mustRender(t, map[string]any{"prune": map[string]any{"enabled": true, "databaseURLKey": "prune-url"}})
	name, key = envSecret(decode[batchv1.CronJob](t, docs["CronJob/prod-fleet-ingest-prune"]).Spec.JobTemplate.Spec.Template.Spec.Containers[0], "DATABASE_URL")
	require.Equal(t, []string{"prod-fleet-ingest-enqueue", "prune-url"}, []string{name, key})

	// A Secret of its own.
	docs = mustRender(t, map[string]any{
		"prune": map[string]any{"enabled": true, "existingSecret": "fleet-ingest-operator", "databaseURLKey": "url"},
	})
	cj = decode[batchv1.CronJob](t, docs["CronJob/prod-fleet-ingest-prune"])
	requireHardened(t, "prune cronjob", "fleet-ingest-operator", cj.Spec.JobTemplate.Spec.Template.Spec)
	require.Contains(t, cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args, "--older-than=90d")

	res := lint.AllWithKubeVersion(chartDir, map[string]any{
		"uploads": map[string]any{"buckets": []any{"fleet-uploads"}},
		"prune":   map[string]any{"enabled": true, "databaseURLKey": "prune-url"},
	}, "fleet", nil)
	for _, msg := range res.Messages {
		require.Less(t, msg.Severity, support.WarningSev, "%s", msg.Error())
	}
}
