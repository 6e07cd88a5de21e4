package helm_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// databaseURLOf returns the Secret and key of a pod's DATABASE_URL.
func databaseURLOf(t *testing.T, pod corev1.PodSpec) (secret, key string) {
	t.Helper()
	for _, e := range pod.Containers[0].Env {
		if e.Name == "DATABASE_URL" {
			require.NotNil(t, e.ValueFrom)
			require.NotNil(t, e.ValueFrom.SecretKeyRef)
			return e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
		}
	}
	t.Fatalf("no DATABASE_URL in %s", pod.Containers[0].Name)
	return "", ""
}

// TestChartReconcileReadsItsOwnSecret: enqueue reconcile connects as a
// login of its own role (fleet_reconcile, issue 44), from a Secret of its
// own, <fullname>-reconcile by default (secrets.reconcile.existingSecret and
// databaseURLKey override it), never the doors' <fullname>-enqueue: a door
// login could otherwise move reconcile's checkpoints. The doors (enqueue
// serve and sqs) keep reading the enqueue Secret, and overriding one
// component's Secret moves no other.
func TestChartReconcileReadsItsOwnSecret(t *testing.T) {
	t.Parallel()
	reconcilePod := func(docs map[string]manifest) corev1.PodSpec {
		require.Contains(t, docs, "Deployment/prod-fleet-ingest-reconcile")
		return decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-reconcile"]).Spec.Template.Spec
	}
	sqsPod := func(docs map[string]manifest) corev1.PodSpec {
		require.Contains(t, docs, "Deployment/prod-fleet-ingest-sqs")
		return decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-sqs"]).Spec.Template.Spec
	}

	docs := mustRender(t, monitoringValues(map[string]any{"sqs": sqsOn, "reconcile": reconcileOn}))
	secret, key := databaseURLOf(t, reconcilePod(docs))
	require.Equal(t, "prod-fleet-ingest-reconcile", secret, "reconcile reads a Secret of its own by default")
	require.Equal(t, "url", key)
	require.Equal(t, []string{"prod-fleet-ingest-reconcile"}, secretsOf(reconcilePod(docs)), "reconcile sees no door's credentials")
	secret, _ = databaseURLOf(t, sqsPod(docs))
	require.Equal(t, "prod-fleet-ingest-enqueue", secret, "the doors keep the enqueue Secret")
	secret, _ = databaseURLOf(t, pods(t, docs).enqueue)
	require.Equal(t, "prod-fleet-ingest-enqueue", secret)

	// An existing Secret and key of the operator's choosing.
	docs = mustRender(t, monitoringValues(map[string]any{"sqs": sqsOn, "reconcile": reconcileOn,
		"secrets": map[string]any{"reconcile": map[string]any{"existingSecret": "fleet-reconcile-db", "databaseURLKey": "dsn"}}}))
	secret, key = databaseURLOf(t, reconcilePod(docs))
	require.Equal(t, "fleet-reconcile-db", secret)
	require.Equal(t, "dsn", key)
	secret, key = databaseURLOf(t, sqsPod(docs))
	require.Equal(t, "prod-fleet-ingest-enqueue", secret, "secrets.reconcile moves no door")
	require.Equal(t, "url", key)

	// secrets.sqs (the doors' override) is no longer reconcile's.
	docs = mustRender(t, monitoringValues(map[string]any{"sqs": sqsOn, "reconcile": reconcileOn,
		"secrets": map[string]any{"sqs": map[string]any{"existingSecret": "fleet-sqs-db"}}}))
	secret, _ = databaseURLOf(t, reconcilePod(docs))
	require.Equal(t, "prod-fleet-ingest-reconcile", secret, "secrets.sqs moved reconcile")
	secret, _ = databaseURLOf(t, sqsPod(docs))
	require.Equal(t, "fleet-sqs-db", secret)
}
