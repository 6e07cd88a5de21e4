package helm_test

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/stretchr/testify/require"
)

// TestChartDatabasePooler: database.pooler transaction gives every runtime
// component DATABASE_POOLER=transaction and never the migrate Job (worker
// migrate needs a direct connection); the default sets nothing; any other
// value is refused.
func TestChartDatabasePooler(t *testing.T) {
	t.Parallel()
	poolerOf := func(c corev1.Container) string {
		v, _ := envValue(c, "DATABASE_POOLER")
		return v
	}
	p := pods(t, mustRender(t, nil))
	for name, pod := range map[string]corev1.PodSpec{"worker": p.worker, "enqueue": p.enqueue, "migrate": p.migrate} {
		require.Empty(t, poolerOf(pod.Containers[0]), name)
	}

	docs := mustRender(t, map[string]any{
		"database":  map[string]any{"pooler": "transaction"},
		"sqs":       map[string]any{"enabled": true, "queueURL": "https://sqs.eu-west-1.amazonaws.com/123456789012/fleet-uploads"},
		"reconcile": map[string]any{"enabled": true, "bucket": "fleet-uploads"},
	})
	p = pods(t, docs)
	require.Equal(t, "transaction", poolerOf(p.worker.Containers[0]))
	require.Equal(t, "transaction", poolerOf(p.enqueue.Containers[0]))
	require.Empty(t, poolerOf(p.migrate.Containers[0]), "the migrate Job connects directly")
	for _, name := range []string{"Deployment/prod-fleet-ingest-sqs", "Deployment/prod-fleet-ingest-reconcile"} {
		m, ok := docs[name]
		require.True(t, ok, name)
		require.Equal(t, "transaction", poolerOf(decode[appsv1.Deployment](t, m).Spec.Template.Spec.Containers[0]), name)
	}

	_, err := render(t, map[string]any{"database": map[string]any{"pooler": "session"}})
	require.ErrorContains(t, err, "database.pooler must be none or transaction")
}
