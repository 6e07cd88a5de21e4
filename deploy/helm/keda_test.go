package helm_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// scaledObject is the part of KEDA's ScaledObject the chart sets.
type scaledObject struct {
	Spec struct {
		ScaleTargetRef struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount int `json:"minReplicaCount"`
		MaxReplicaCount int `json:"maxReplicaCount"`
		Triggers        []struct {
			Type              string            `json:"type"`
			Metadata          map[string]string `json:"metadata"`
			AuthenticationRef *struct {
				Name string `json:"name"`
			} `json:"authenticationRef"`
		} `json:"triggers"`
	} `json:"spec"`
}

type triggerAuthentication struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		SecretTargetRef []struct {
			Parameter string `json:"parameter"`
			Name      string `json:"name"`
			Key       string `json:"key"`
		} `json:"secretTargetRef"`
	} `json:"spec"`
}

// decodeCRD decodes a custom resource, whose fields the test does not all
// name.
func decodeCRD[T any](t *testing.T, m manifest) T {
	t.Helper()
	var v T
	require.NoError(t, yaml.Unmarshal([]byte(m.raw), &v), m.raw)
	return v
}

func kedaValues(worker map[string]any) map[string]any {
	w := map[string]any{"autoscaling": map[string]any{"enabled": false}}
	for k, v := range worker {
		w[k] = v
	}
	return map[string]any{"worker": w}
}

// TestChartKEDAScalesWorkersOnTheBacklog: worker.keda renders a KEDA
// ScaledObject on the worker Deployment instead of the CPU HPA (never
// both), counting the ingest queue's available and running jobs with
// KEDA's postgresql scaler (credentials from the worker's Secret) or
// reading the workers' ingest_queue_jobs gauge from Prometheus; off by
// default.
func TestChartKEDAScalesWorkersOnTheBacklog(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, nil)
	require.NotContains(t, docs, "ScaledObject/prod-fleet-ingest-worker", "off by default")
	require.Contains(t, docs, "HorizontalPodAutoscaler/prod-fleet-ingest-worker")

	_, err := render(t, map[string]any{"worker": map[string]any{"keda": map[string]any{"enabled": true}}})
	require.ErrorContains(t, err, "mutually exclusive", "KEDA and the CPU HPA are never both rendered")

	docs = mustRender(t, kedaValues(map[string]any{"concurrency": 6, "keda": map[string]any{"enabled": true, "maxReplicas": 20}}))
	require.NotContains(t, docs, "HorizontalPodAutoscaler/prod-fleet-ingest-worker")
	worker := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"])
	require.Nil(t, worker.Spec.Replicas, "replicas belong to KEDA")
	so := decodeCRD[scaledObject](t, docs["ScaledObject/prod-fleet-ingest-worker"])
	require.Equal(t, "Deployment", so.Spec.ScaleTargetRef.Kind)
	require.Equal(t, "prod-fleet-ingest-worker", so.Spec.ScaleTargetRef.Name)
	require.Equal(t, 2, so.Spec.MinReplicaCount)
	require.Equal(t, 20, so.Spec.MaxReplicaCount)
	require.Len(t, so.Spec.Triggers, 1)
	trig := so.Spec.Triggers[0]
	require.Equal(t, "postgresql", trig.Type)
	require.Equal(t, "6", trig.Metadata["targetQueryValue"], "one replica per concurrency's worth of jobs")
	require.NotNil(t, trig.AuthenticationRef)
	auth := decodeCRD[triggerAuthentication](t, docs["TriggerAuthentication/"+trig.AuthenticationRef.Name])
	require.Len(t, auth.Spec.SecretTargetRef, 1)
	require.Equal(t, "connection", auth.Spec.SecretTargetRef[0].Parameter)
	require.Equal(t, "prod-fleet-ingest-worker", auth.Spec.SecretTargetRef[0].Name)
	require.Equal(t, "url", auth.Spec.SecretTargetRef[0].Key)

	// The query KEDA runs counts the ingest queue's available and running
	// jobs, and nothing else, on a real River schema.
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewDatabaseURL(t))
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	for i := range 5 {
		_, err := client.Insert(ctx, jobs.IngestArgs{BatchID: int64(i + 1)}, nil)
		require.NoError(t, err)
	}
	_, err = client.Insert(ctx, jobs.IngestArgs{BatchID: 99}, &river.InsertOpts{Queue: jobs.Queue, ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempted_at = now() WHERE id = (SELECT min(id) FROM river_job)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = (SELECT max(id) FROM river_job WHERE state = 'available')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state) VALUES ('{}', 'other', 1, 'other_queue', 'available')`)
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, trig.Metadata["query"]).Scan(&n))
	require.Equal(t, 4, n, "3 available + 1 running; not the scheduled, completed or other queue's jobs")

	// The Secret KEDA reads can be another one.
	docs = mustRender(t, kedaValues(map[string]any{"keda": map[string]any{"enabled": true, "jobsPerReplica": 10,
		"postgresql": map[string]any{"existingSecret": "keda-db", "key": "conn"}}}))
	so = decodeCRD[scaledObject](t, docs["ScaledObject/prod-fleet-ingest-worker"])
	require.Equal(t, "10", so.Spec.Triggers[0].Metadata["targetQueryValue"])
	auth = decodeCRD[triggerAuthentication](t, docs["TriggerAuthentication/prod-fleet-ingest-worker-keda"])
	require.Equal(t, "keda-db", auth.Spec.SecretTargetRef[0].Name)
	require.Equal(t, "conn", auth.Spec.SecretTargetRef[0].Key)

	// The Prometheus scaler reads the workers' gauge.
	_, err = render(t, kedaValues(map[string]any{"keda": map[string]any{"enabled": true, "source": "prometheus"}}))
	require.ErrorContains(t, err, "serverAddress is required")
	docs = mustRender(t, kedaValues(map[string]any{"keda": map[string]any{"enabled": true, "source": "prometheus",
		"prometheus": map[string]any{"serverAddress": "http://prometheus.monitoring:9090"}}}))
	require.NotContains(t, docs, "TriggerAuthentication/prod-fleet-ingest-worker-keda")
	so = decodeCRD[scaledObject](t, docs["ScaledObject/prod-fleet-ingest-worker"])
	trig = so.Spec.Triggers[0]
	require.Equal(t, "prometheus", trig.Type)
	require.Equal(t, "http://prometheus.monitoring:9090", trig.Metadata["serverAddress"])
	require.Equal(t, "4", trig.Metadata["threshold"])
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(trig.Metadata["query"])
	require.NoError(t, err)
	var names []string
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			names = append(names, vs.Name)
		}
		return nil
	})
	require.Equal(t, []string{"ingest_queue_jobs"}, names)

	for _, bad := range []map[string]any{
		{"enabled": true, "source": "cpu"},
		{"enabled": true, "minReplicas": 5, "maxReplicas": 2},
	} {
		_, err = render(t, kedaValues(map[string]any{"keda": bad}))
		require.Error(t, err, "%v", bad)
	}

	lintValues := kedaValues(map[string]any{"keda": map[string]any{"enabled": true}})
	lintValues["uploads"] = map[string]any{"buckets": []any{"fleet-uploads"}}
	res := lint.AllWithKubeVersion(chartDir, lintValues, "fleet", nil)
	for _, msg := range res.Messages {
		require.Less(t, msg.Severity, support.WarningSev, "%s", msg.Error())
	}
}
