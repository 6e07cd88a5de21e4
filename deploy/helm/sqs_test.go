package helm_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// TestChartSQSConsumer renders enqueue sqs: its own Deployment with the
// bucket list, pattern and marker of enqueue serve, its own ServiceAccount
// carrying the queue's IAM role (and no other component's), a
// NetworkPolicy admitting only Prometheus on its admin port and letting it
// reach DNS, PostgreSQL and HTTPS (SQS, STS); no queue URL, no chart.
func TestChartSQSConsumer(t *testing.T) {
	t.Parallel()
	const irsa = "eks.amazonaws.com/role-arn"
	const queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/fleet-uploads"
	docs := mustRender(t, map[string]any{
		"sqs": map[string]any{
			"enabled": true, "queueURL": queue, "region": "eu-west-1",
			"serviceAccount": map[string]any{"annotations": map[string]any{irsa: "arn:aws:iam::1:role/fleet-sqs"}},
		},
		"uploads": map[string]any{"buckets": []any{"fleet-uploads", "fleet-uploads-eu"}},
	})
	dep := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-sqs"])
	pod := dep.Spec.Template.Spec
	requireHardened(t, "sqs", "prod-fleet-ingest-enqueue", pod)
	c := pod.Containers[0]
	require.Equal(t, "sqs", c.Args[0])
	for flag, want := range map[string]string{
		"--queue-url": queue, "--marker": "_SUCCESS", "--path-pattern": "tenants/{tenant_id}/{tenant_database}/{company_id}/",
		"--wait-time": "20s", "--max-messages": "10", "--timeout": "30s", "--admin-listen": ":8081",
		"--receivers": "8", "--max-burst": "100", "--linger": "10ms",
	} {
		got, ok := argValue(c.Args, flag)
		require.True(t, ok, flag)
		require.Equal(t, want, got, flag)
	}
	require.Contains(t, c.Args, "--bucket=fleet-uploads")
	require.Contains(t, c.Args, "--bucket=fleet-uploads-eu")
	require.Contains(t, c.Env, corev1.EnvVar{Name: "AWS_REGION", Value: "eu-west-1"})
	require.Empty(t, c.VolumeMounts, "no token: the queue policy is the authority")
	require.Equal(t, "prod-fleet-ingest-sqs", pod.ServiceAccountName)
	require.False(t, *pod.AutomountServiceAccountToken)
	require.GreaterOrEqual(t, *pod.TerminationGracePeriodSeconds, int64(20+30), "a round in hand finishes")

	account := decode[corev1.ServiceAccount](t, docs["ServiceAccount/prod-fleet-ingest-sqs"])
	require.Equal(t, "arn:aws:iam::1:role/fleet-sqs", account.Annotations[irsa])
	require.False(t, *account.AutomountServiceAccountToken)
	for _, other := range []string{"worker", "enqueue"} {
		require.NotContains(t, docs["ServiceAccount/prod-fleet-ingest-"+other].Metadata.Annotations, irsa, other)
	}

	np := decode[networkingv1.NetworkPolicy](t, docs["NetworkPolicy/prod-fleet-ingest-sqs"])
	require.Equal(t, "sqs", np.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"])
	in := rulesOf(np.Spec.Ingress)
	require.Len(t, in, 1)
	require.Equal(t, []string{"TCP/8081"}, in[0].ports)
	require.Equal(t, "monitoring", in[0].peers[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
	require.Equal(t, []string{"TCP/443", "TCP/53", "TCP/5432", "UDP/53"}, allPorts(rulesOf(np.Spec.Egress)))
	require.Contains(t, docs, "Service/prod-fleet-ingest-sqs-admin")

	// Off by default; refused without a queue, or with a visibility
	// timeout a round could outlast.
	require.NotContains(t, mustRender(t, nil), "Deployment/prod-fleet-ingest-sqs")
	_, err := render(t, map[string]any{"sqs": map[string]any{"enabled": true}})
	require.ErrorContains(t, err, "sqs.queueURL is required")
	_, err = render(t, map[string]any{"sqs": map[string]any{"enabled": true, "queueURL": queue, "visibilityTimeoutSeconds": 30}})
	require.ErrorContains(t, err, "must exceed sqs.timeoutSeconds")
}

// TestChartReconciler renders enqueue reconcile --every: its own
// Deployment, ServiceAccount (the bucket's list role) and NetworkPolicy;
// refused for a bucket that is not an upload bucket.
func TestChartReconciler(t *testing.T) {
	t.Parallel()
	const irsa = "eks.amazonaws.com/role-arn"
	docs := mustRender(t, map[string]any{
		"reconcile": map[string]any{
			"enabled": true, "bucket": "fleet-uploads",
			"serviceAccount": map[string]any{"annotations": map[string]any{irsa: "arn:aws:iam::1:role/fleet-reconcile"}},
		},
	})
	dep := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-reconcile"])
	pod := dep.Spec.Template.Spec
	requireHardened(t, "reconcile", "prod-fleet-ingest-reconcile", pod)
	c := pod.Containers[0]
	require.Equal(t, "reconcile", c.Args[0])
	for flag, want := range map[string]string{"--bucket": "fleet-uploads", "--prefix": "tenants/", "--every": "15m", "--max-objects": "100000"} {
		got, ok := argValue(c.Args, flag)
		require.True(t, ok, flag)
		require.Equal(t, want, got, flag)
	}
	account := decode[corev1.ServiceAccount](t, docs["ServiceAccount/prod-fleet-ingest-reconcile"])
	require.Equal(t, "arn:aws:iam::1:role/fleet-reconcile", account.Annotations[irsa])
	np := decode[networkingv1.NetworkPolicy](t, docs["NetworkPolicy/prod-fleet-ingest-reconcile"])
	require.Equal(t, []string{"TCP/443", "TCP/53", "TCP/5432", "UDP/53"}, allPorts(rulesOf(np.Spec.Egress)))

	_, err := render(t, map[string]any{"reconcile": map[string]any{"enabled": true, "bucket": "someone-elses"}})
	require.ErrorContains(t, err, "reconcile.bucket must be one of uploads.buckets")
}
