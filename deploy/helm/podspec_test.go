package helm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/fleet/ingest/internal/testkit/testdeps"
)

// podTemplate is one pod template of a rendered document, whatever holds
// it.
type podTemplate struct {
	where     string // Kind/name of the document
	component string // its app.kubernetes.io/component label
	labels    map[string]string
	spec      corev1.PodSpec
}

// podTemplates finds every pod template in the rendered documents: every
// Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob and bare Pod.
// A document of another kind that still holds containers fails the test,
// so no pod can slip past the checks below.
func podTemplates(t *testing.T, docs map[string]manifest) []podTemplate {
	t.Helper()
	var out []podTemplate
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		m := docs[key]
		var tpl corev1.PodTemplateSpec
		switch m.Kind {
		case "Deployment":
			tpl = decode[appsv1.Deployment](t, m).Spec.Template
		case "StatefulSet":
			tpl = decode[appsv1.StatefulSet](t, m).Spec.Template
		case "DaemonSet":
			tpl = decode[appsv1.DaemonSet](t, m).Spec.Template
		case "ReplicaSet":
			tpl = decode[appsv1.ReplicaSet](t, m).Spec.Template
		case "Job":
			tpl = decode[batchv1.Job](t, m).Spec.Template
		case "CronJob":
			tpl = decode[batchv1.CronJob](t, m).Spec.JobTemplate.Spec.Template
		case "Pod":
			p := decode[corev1.Pod](t, m)
			tpl = corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
		default:
			require.NotRegexp(t, `(?m)^\s*containers:`, m.raw, "%s holds a pod spec of a kind this test does not know: add it to podTemplates", key)
			continue
		}
		require.NotEmpty(t, tpl.Spec.Containers, key)
		out = append(out, podTemplate{where: key, component: tpl.Labels["app.kubernetes.io/component"], labels: tpl.Labels, spec: tpl.Spec})
	}
	return out
}

// everyComponent returns values that turn on every optional part of the
// chart: each top-level value with an "enabled" key (enqueue, sqs,
// reconcile, migration, and whatever is added later), with the values
// those require.
func everyComponent(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	var defaults map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &defaults))
	out := map[string]any{}
	for key, v := range defaults {
		if m, ok := v.(map[string]any); ok {
			if _, ok := m["enabled"]; ok {
				out[key] = map[string]any{"enabled": true}
			}
		}
	}
	out["sqs"].(map[string]any)["queueURL"] = "https://sqs.us-east-1.amazonaws.com/123456789012/fleet"
	out["reconcile"].(map[string]any)["bucket"] = "fleet-uploads"
	out["prune"].(map[string]any)["databaseURLKey"] = "operator-url"
	return out
}

// merge sets the keys of b into a, recursively; it returns a.
func merge(a, b map[string]any) map[string]any {
	for k, v := range b {
		if vm, ok := v.(map[string]any); ok {
			if am, ok := a[k].(map[string]any); ok {
				a[k] = merge(am, vm)
				continue
			}
		}
		a[k] = v
	}
	return a
}

// valuesKey is the values key of a component's own settings.
func valuesKey(component string) string {
	if component == "migrate" {
		return "migration"
	}
	return component
}

// podSettings are the values every pod takes from the shared pod spec,
// in the shape of values.yaml, distinct by tag.
func podSettings(tag string) map[string]any {
	return map[string]any{
		"imagePullSecrets": []any{map[string]any{"name": "regcred-" + tag}},
		"nodeSelector":     map[string]any{"pool": "fleet-" + tag},
		"tolerations":      []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "fleet-" + tag, "effect": "NoSchedule"}},
		"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
			"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "arch-" + tag, "operator": "In", "values": []any{"arm64"}}}}},
		}}},
		"topologySpreadConstraints": []any{map[string]any{"maxSkew": 2, "topologyKey": "zone-" + tag, "whenUnsatisfiable": "DoNotSchedule"}},
		"priorityClassName":         "fleet-" + tag,
		"podSecurityContext":        map[string]any{"runAsNonRoot": true, "runAsUser": 4242, "fsGroup": 4242},
	}
}

// requirePodSettings checks that a pod carries podSettings(tag): each of
// them, so a pod template that misses one fails with its name.
func requirePodSettings(t *testing.T, p podTemplate, tag string) {
	t.Helper()
	s := p.spec
	require.Equal(t, []corev1.LocalObjectReference{{Name: "regcred-" + tag}}, s.ImagePullSecrets, "%s: imagePullSecrets", p.where)
	require.Equal(t, map[string]string{"pool": "fleet-" + tag}, s.NodeSelector, "%s: nodeSelector", p.where)
	require.Equal(t, []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "fleet-" + tag, Effect: corev1.TaintEffectNoSchedule}}, s.Tolerations, "%s: tolerations", p.where)
	require.NotNil(t, s.Affinity, "%s: affinity", p.where)
	require.NotNil(t, s.Affinity.NodeAffinity, "%s: affinity", p.where)
	require.Equal(t, "arch-"+tag, s.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key, "%s: affinity", p.where)
	require.Len(t, s.TopologySpreadConstraints, 1, "%s: topologySpreadConstraints", p.where)
	tsc := s.TopologySpreadConstraints[0]
	require.Equal(t, "zone-"+tag, tsc.TopologyKey, "%s: topologySpreadConstraints", p.where)
	require.Equal(t, int32(2), tsc.MaxSkew, p.where)
	require.Equal(t, corev1.DoNotSchedule, tsc.WhenUnsatisfiable, p.where)
	requireSelectsOwnPods(t, p, tsc.LabelSelector.MatchLabels)
	require.Equal(t, "fleet-"+tag, s.PriorityClassName, "%s: priorityClassName", p.where)
	require.NotNil(t, s.SecurityContext, "%s: securityContext", p.where)
	require.Equal(t, int64(4242), *s.SecurityContext.RunAsUser, "%s: securityContext", p.where)
	require.Equal(t, int64(4242), *s.SecurityContext.FSGroup, "%s: securityContext", p.where)
	requireOwnServiceAccount(t, p)
}

// requireSelectsOwnPods: a selector (spread constraint, PDB) matches the
// pod's component and release, nothing wider.
func requireSelectsOwnPods(t *testing.T, p podTemplate, sel map[string]string) {
	t.Helper()
	require.NotEmpty(t, p.component, "%s has a component label", p.where)
	require.Equal(t, p.component, sel["app.kubernetes.io/component"], "%s: selects its own component's pods", p.where)
	require.Equal(t, "prod", sel["app.kubernetes.io/instance"], "%s: selects its own release's pods", p.where)
	for k, v := range sel {
		require.Equal(t, v, p.labels[k], "%s: the selector matches the pod's labels (%s)", p.where, k)
	}
}

func requireOwnServiceAccount(t *testing.T, p podTemplate) {
	t.Helper()
	switch p.component {
	case "worker", "enqueue", "sqs", "reconcile", "migrate":
		require.Equal(t, "prod-fleet-ingest-"+p.component, p.spec.ServiceAccountName, "%s: serviceAccountName", p.where)
	default: // a component may run as another's account
		require.True(t, strings.HasPrefix(p.spec.ServiceAccountName, "prod-fleet-ingest-"), "%s: serviceAccountName %q", p.where, p.spec.ServiceAccountName)
	}
	require.NotNil(t, p.spec.AutomountServiceAccountToken, p.where)
	require.False(t, *p.spec.AutomountServiceAccountToken, "%s: no API token", p.where)
}

// TestChartOnePodSpecForEveryPod: every pod the chart renders (found from
// the documents, not listed) takes the top-level imagePullSecrets,
// nodeSelector, tolerations, affinity, topologySpreadConstraints,
// priorityClassName and podSecurityContext, and its own ServiceAccount. A
// private registry reaches the pre-install migrate Job too.
func TestChartOnePodSpecForEveryPod(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, merge(everyComponent(t), podSettings("top")))
	found := podTemplates(t, docs)
	var components []string
	for _, p := range found {
		components = append(components, p.component)
		requirePodSettings(t, p, "top")
		require.Contains(t, docs, "ServiceAccount/"+p.spec.ServiceAccountName, "%s: its ServiceAccount is rendered", p.where)
	}
	for _, want := range []string{"worker", "enqueue", "sqs", "reconcile", "migrate"} {
		require.Contains(t, components, want, "every component is rendered and checked")
	}

	// The same fields, left to their defaults: the pod securityContext
	// everywhere, and nothing the values did not ask for.
	for _, p := range podTemplates(t, mustRender(t, everyComponent(t))) {
		s := p.spec
		require.Empty(t, s.ImagePullSecrets, p.where)
		require.Empty(t, s.NodeSelector, p.where)
		require.Empty(t, s.Tolerations, p.where)
		require.Nil(t, s.Affinity, p.where)
		require.Empty(t, s.PriorityClassName, p.where)
		require.NotNil(t, s.SecurityContext, p.where)
		require.Equal(t, int64(65532), *s.SecurityContext.RunAsUser, p.where)
		require.True(t, *s.SecurityContext.RunAsNonRoot, p.where)
		requireOwnServiceAccount(t, p)
	}
}

// TestChartEveryPodTemplateUsesThePodSpec: a template that renders
// containers includes the shared pod spec once per pod, including those
// behind values no test enables.
func TestChartEveryPodTemplateUsesThePodSpec(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(chartDir, "templates", "*.yaml"))
	require.NoError(t, err)
	containers := regexp.MustCompile(`(?m)^\s*containers:`)
	podSpec := regexp.MustCompile(`include "fleet-ingest.podSpec"`)
	checked := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		n := len(containers.FindAllIndex(raw, -1))
		require.Equal(t, n, len(podSpec.FindAllIndex(raw, -1)), "%s: every pod template includes fleet-ingest.podSpec", f)
		checked += n
	}
	require.GreaterOrEqual(t, checked, 5)
}

// TestChartComponentPodSpecOverrides: a component's own value (its values
// key: migration for the migrate Job, else the component's name) beats the
// top-level one, for its pods only; the worker's nodeSelector,
// tolerations and affinity of old still apply alone.
func TestChartComponentPodSpecOverrides(t *testing.T) {
	t.Parallel()
	var components []string
	for _, p := range podTemplates(t, mustRender(t, everyComponent(t))) {
		components = append(components, p.component)
	}
	require.Subset(t, components, []string{"worker", "enqueue", "sqs", "reconcile", "migrate"})
	for _, component := range components {
		t.Run(component, func(t *testing.T) {
			t.Parallel()
			values := merge(everyComponent(t), podSettings("top"))
			merge(values, map[string]any{valuesKey(component): podSettings("own")})
			seen := false
			for _, p := range podTemplates(t, mustRender(t, values)) {
				if p.component == component {
					seen = true
					requirePodSettings(t, p, "own")
				} else {
					requirePodSettings(t, p, "top")
				}
			}
			require.True(t, seen)
		})
	}

	// Backwards compatible: worker.nodeSelector/tolerations/affinity alone.
	own := podSettings("own")
	values := merge(everyComponent(t), map[string]any{"worker": map[string]any{
		"nodeSelector": own["nodeSelector"], "tolerations": own["tolerations"], "affinity": own["affinity"],
	}})
	for _, p := range podTemplates(t, mustRender(t, values)) {
		if p.component == "worker" {
			require.Equal(t, map[string]string{"pool": "fleet-own"}, p.spec.NodeSelector)
			require.Len(t, p.spec.Tolerations, 1)
			require.NotNil(t, p.spec.Affinity)
		} else {
			require.Empty(t, p.spec.NodeSelector, p.where)
			require.Empty(t, p.spec.Tolerations, p.where)
			require.Nil(t, p.spec.Affinity, p.where)
		}
	}
}

// TestChartDefaultSpread: with no constraints given, each component's pods
// spread over zones and nodes without ever blocking a schedule, selecting
// only their own pods; a given constraint's labelSelector is kept; and
// defaultTopologySpread false turns the default off.
func TestChartDefaultSpread(t *testing.T) {
	t.Parallel()
	for _, p := range podTemplates(t, mustRender(t, everyComponent(t))) {
		tsc := p.spec.TopologySpreadConstraints
		require.Len(t, tsc, 2, "%s: a default spread", p.where)
		var keys []string
		for _, c := range tsc {
			keys = append(keys, c.TopologyKey)
			require.Equal(t, corev1.ScheduleAnyway, c.WhenUnsatisfiable, "%s: a preference, never a reason not to schedule", p.where)
			require.Equal(t, int32(1), c.MaxSkew, p.where)
			require.NotNil(t, c.LabelSelector, p.where)
			requireSelectsOwnPods(t, p, c.LabelSelector.MatchLabels)
		}
		require.Equal(t, []string{"topology.kubernetes.io/zone", "kubernetes.io/hostname"}, keys, p.where)
	}

	given := []any{map[string]any{
		"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"team": "fleet"}},
	}}
	for _, p := range podTemplates(t, mustRender(t, merge(everyComponent(t), map[string]any{"topologySpreadConstraints": given}))) {
		require.Len(t, p.spec.TopologySpreadConstraints, 1, p.where)
		require.Equal(t, map[string]string{"team": "fleet"}, p.spec.TopologySpreadConstraints[0].LabelSelector.MatchLabels, "%s: a given labelSelector is kept", p.where)
	}

	for _, p := range podTemplates(t, mustRender(t, merge(everyComponent(t), map[string]any{"defaultTopologySpread": false}))) {
		require.Empty(t, p.spec.TopologySpreadConstraints, p.where)
	}
}

// TestChartStartupProbes: every long-running container with probes has a
// startupProbe on its liveness probe's port, so a slow start is not
// killed; the migrate Job has none, but resources of its own.
func TestChartStartupProbes(t *testing.T) {
	t.Parallel()
	values := merge(everyComponent(t), map[string]any{
		"reconcile": map[string]any{"startupProbe": map[string]any{"periodSeconds": 10, "failureThreshold": 90}},
	})
	long := 0
	for _, p := range podTemplates(t, mustRender(t, values)) {
		for _, c := range p.spec.Containers {
			if strings.HasPrefix(p.where, "Job/") || strings.HasPrefix(p.where, "CronJob/") {
				require.Nil(t, c.StartupProbe, p.where)
				continue
			}
			require.NotNil(t, c.LivenessProbe, p.where)
			long++
			sp := c.StartupProbe
			require.NotNil(t, sp, "%s: startupProbe", p.where)
			require.Equal(t, "/healthz", sp.HTTPGet.Path, p.where)
			require.Equal(t, c.LivenessProbe.HTTPGet.Port, sp.HTTPGet.Port, p.where)
			want := [2]int32{5, 60}
			if p.component == "reconcile" {
				want = [2]int32{10, 90}
			}
			require.Equal(t, want, [2]int32{sp.PeriodSeconds, sp.FailureThreshold}, "%s: startupProbe timing", p.where)
		}
	}
	require.GreaterOrEqual(t, long, 4)

	job := func(values map[string]any) corev1.Container {
		return decode[batchv1.Job](t, mustRender(t, values)["Job/prod-fleet-ingest-migrate"]).Spec.Template.Spec.Containers[0]
	}
	c := job(nil)
	require.Equal(t, "128Mi", c.Resources.Requests.Memory().String())
	require.Equal(t, "100m", c.Resources.Requests.Cpu().String())
	require.Equal(t, "512Mi", c.Resources.Limits.Memory().String())
	c = job(map[string]any{"migration": map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "1Gi"}}}})
	require.Equal(t, "1Gi", c.Resources.Limits.Memory().String())
}

// TestChartImageDigest: image.digest pins every container to
// repository@digest, the tag ignored; a malformed digest fails the render.
func TestChartImageDigest(t *testing.T) {
	t.Parallel()
	const digest = "sha256:4b1c7f3e0a9d2c5b8e6f1a3d7c9b2e4f6a8c0d1e3f5a7b9c2d4e6f8a0b1c3d5e"
	values := merge(everyComponent(t), map[string]any{"image": map[string]any{"tag": "1.2.3", "digest": digest}})
	found := podTemplates(t, mustRender(t, values))
	for _, p := range found {
		for _, c := range p.spec.Containers {
			require.Equal(t, "ghcr.io/fleet/ingest@"+digest, c.Image, p.where)
		}
	}
	for _, p := range podTemplates(t, mustRender(t, map[string]any{"image": map[string]any{"tag": "1.2.3"}})) {
		require.Equal(t, "ghcr.io/fleet/ingest:1.2.3", p.spec.Containers[0].Image, p.where)
	}
	_, err := render(t, map[string]any{"image": map[string]any{"digest": "1.2.3"}})
	require.ErrorContains(t, err, "image.digest must look like sha256:<hex>")
}

// TestChartPodDisruptionBudgets: every component that runs more than one
// replica has a PDB selecting exactly its pods; one replica (or an
// autoscaler that may go down to one or zero) has none, which would block
// node drains; maxUnavailable replaces minAvailable.
func TestChartPodDisruptionBudgets(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, everyComponent(t))
	found := podTemplates(t, docs)
	budgets := map[string]policyv1.PodDisruptionBudget{}
	for key, m := range docs {
		if m.Kind == "PodDisruptionBudget" {
			budgets[key] = decode[policyv1.PodDisruptionBudget](t, m)
		}
	}
	for _, p := range found {
		key := "PodDisruptionBudget/prod-fleet-ingest-" + p.component
		if strings.HasPrefix(p.where, "Job/") || strings.HasPrefix(p.where, "CronJob/") {
			require.NotContains(t, budgets, key, "a Job's pod needs no budget")
			continue
		}
		require.Contains(t, budgets, key, "%s runs 2 replicas", p.where)
		pdb := budgets[key]
		require.Equal(t, intstr.FromInt32(1), *pdb.Spec.MinAvailable, key)
		require.Nil(t, pdb.Spec.MaxUnavailable, key)
		requireSelectsOwnPods(t, p, pdb.Spec.Selector.MatchLabels)
		for _, other := range found {
			if other.component != p.component {
				require.NotEqual(t, other.component, pdb.Spec.Selector.MatchLabels["app.kubernetes.io/component"], key)
			}
		}
	}
	require.Len(t, budgets, 4, "worker, enqueue, sqs, reconcile")

	single := merge(everyComponent(t), map[string]any{
		"worker":    map[string]any{"autoscaling": map[string]any{"minReplicas": 1}},
		"enqueue":   map[string]any{"replicas": 1},
		"sqs":       map[string]any{"replicas": 1},
		"reconcile": map[string]any{"replicas": 1},
	})
	for key, m := range mustRender(t, single) {
		require.NotEqual(t, "PodDisruptionBudget", m.Kind, "%s over a single pod", key)
	}
	docs = mustRender(t, map[string]any{"worker": map[string]any{"autoscaling": map[string]any{"enabled": false}, "replicas": 1}})
	require.NotContains(t, docs, "PodDisruptionBudget/prod-fleet-ingest-worker")
	docs = mustRender(t, kedaValues(map[string]any{"keda": map[string]any{"enabled": true, "minReplicas": 0}}))
	require.NotContains(t, docs, "PodDisruptionBudget/prod-fleet-ingest-worker", "KEDA may scale to zero")
	docs = mustRender(t, kedaValues(map[string]any{"keda": map[string]any{"enabled": true, "minReplicas": 3}}))
	require.Contains(t, docs, "PodDisruptionBudget/prod-fleet-ingest-worker")

	docs = mustRender(t, merge(everyComponent(t), map[string]any{
		"sqs":       map[string]any{"podDisruptionBudget": map[string]any{"maxUnavailable": "50%"}},
		"reconcile": map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}},
	}))
	pdb := decode[policyv1.PodDisruptionBudget](t, docs["PodDisruptionBudget/prod-fleet-ingest-sqs"])
	require.Nil(t, pdb.Spec.MinAvailable)
	require.Equal(t, intstr.FromString("50%"), *pdb.Spec.MaxUnavailable)
	require.NotContains(t, docs, "PodDisruptionBudget/prod-fleet-ingest-reconcile")
}

// TestChartHelmLint runs the Helm CLI's own lint (--strict) and template
// on the chart with its defaults and with every component and pod-spec
// value set, as a platform team would. HELM_BIN names the helm binary:
// make test builds Helm v3.16.4 there (scripts/test-deps.sh); without it
// the test fails (skipped only under -short). TestChartLints lints with
// Helm's Go packages as well.
func TestChartHelmLint(t *testing.T) {
	t.Parallel()
	helm := os.Getenv("HELM_BIN")
	if _, err := exec.LookPath(helm); helm == "" || err != nil {
		testdeps.Missing(t, "helm (HELM_BIN)", "GOBIN=$HOME/.cache/fleet-ingest/helm go install helm.sh/helm/v3/cmd/helm@v3.16.4 and HELM_BIN=$HOME/.cache/fleet-ingest/helm/helm", err)
	}
	dir := t.TempDir()
	for name, values := range map[string]map[string]any{
		"defaults": {},
		"every":    merge(merge(everyComponent(t), podSettings("top")), map[string]any{"image": map[string]any{"digest": "sha256:4b1c7f3e0a9d2c5b8e6f1a3d7c9b2e4f6a8c0d1e3f5a7b9c2d4e6f8a0b1c3d5e"}}),
	} {
		values["uploads"] = map[string]any{"buckets": []any{"fleet-uploads"}}
		raw, err := yaml.Marshal(values)
		require.NoError(t, err)
		file := filepath.Join(dir, name+".yaml")
		require.NoError(t, os.WriteFile(file, raw, 0o600))
		out, err := exec.Command(helm, "lint", "--strict", chartDir, "-f", file).CombinedOutput()
		require.NoError(t, err, "helm lint (%s):\n%s", name, out)
		require.Contains(t, string(out), "0 chart(s) failed", name)
		for _, bad := range []string{"[ERROR]", "[WARNING]"} {
			require.NotContains(t, string(out), bad, name)
		}
		out, err = exec.Command(helm, "template", "prod", chartDir, "-n", "fleet", "-f", file).CombinedOutput()
		require.NoError(t, err, "helm template (%s):\n%s", name, out)
	}
}
