package helm_test

import (
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// secretsOf lists every Secret a pod reads, from the environment and from
// volumes.
func secretsOf(pod corev1.PodSpec) []string {
	var out []string
	add := func(name string) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, c := range pod.Containers {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				add(e.ValueFrom.SecretKeyRef.Name)
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				add(e.SecretRef.Name)
			}
		}
	}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			add(v.Secret.SecretName)
		}
	}
	return out
}

type components struct {
	worker, enqueue, migrate corev1.PodSpec
}

func pods(t *testing.T, docs map[string]manifest) components {
	t.Helper()
	return components{
		worker:  decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"]).Spec.Template.Spec,
		enqueue: decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-enqueue"]).Spec.Template.Spec,
		migrate: decode[batchv1.Job](t, docs["Job/prod-fleet-ingest-migrate"]).Spec.Template.Spec,
	}
}

// TestChartGivesEachComponentItsOwnSecretAndServiceAccount: the migrate
// Job alone reads the DDL-capable URL; each component runs as its own
// ServiceAccount, without an API token; the IAM annotation is on the
// worker's only.
func TestChartGivesEachComponentItsOwnSecretAndServiceAccount(t *testing.T) {
	t.Parallel()
	const irsa = "eks.amazonaws.com/role-arn"
	docs := mustRender(t, map[string]any{
		"worker":  map[string]any{"serviceAccount": map[string]any{"annotations": map[string]any{irsa: "arn:aws:iam::1:role/fleet-worker"}}},
		"secrets": map[string]any{"enqueue": map[string]any{"hmacSecretKey": "hmac"}},
	})
	p := pods(t, docs)
	require.Equal(t, []string{"prod-fleet-ingest-worker"}, secretsOf(p.worker))
	require.Equal(t, []string{"prod-fleet-ingest-enqueue"}, secretsOf(p.enqueue))
	require.Equal(t, []string{"prod-fleet-ingest-migrate"}, secretsOf(p.migrate), "only the migrate Job reads the DDL URL")

	for name, pod := range map[string]corev1.PodSpec{"worker": p.worker, "enqueue": p.enqueue, "migrate": p.migrate} {
		sa := "prod-fleet-ingest-" + name
		require.Equal(t, sa, pod.ServiceAccountName, name)
		require.False(t, *pod.AutomountServiceAccountToken, name)
		account := decode[corev1.ServiceAccount](t, docs["ServiceAccount/"+sa])
		require.False(t, *account.AutomountServiceAccountToken, name)
		if name == "worker" {
			require.Equal(t, "arn:aws:iam::1:role/fleet-worker", account.Annotations[irsa])
		} else {
			require.NotContains(t, account.Annotations, irsa, "%s carries no IAM role", name)
		}
	}

	// The token (and the HMAC secret) are files, never environment.
	c := p.enqueue.Containers[0]
	for _, e := range c.Env {
		require.NotContains(t, []string{"ENQUEUE_AUTH_TOKEN", "ENQUEUE_HMAC_SECRET"}, e.Name)
	}
	tokenFile, ok := argValue(c.Args, "--auth-token-file")
	require.True(t, ok)
	hmacFile, ok := argValue(c.Args, "--hmac-secret-file")
	require.True(t, ok)
	require.Len(t, c.VolumeMounts, 1)
	mount := c.VolumeMounts[0]
	require.True(t, mount.ReadOnly)
	require.Equal(t, mount.MountPath+"/token", tokenFile)
	require.Equal(t, mount.MountPath+"/hmac", hmacFile)
	vol := p.enqueue.Volumes[0]
	require.Equal(t, mount.Name, vol.Name)
	require.Equal(t, []corev1.KeyToPath{{Key: "token", Path: "token"}, {Key: "hmac", Path: "hmac"}}, vol.Secret.Items,
		"only the token and the HMAC secret are files; the database URL stays out of the volume")
	for _, a := range c.Args {
		require.NotContains(t, a, "--dev-allow-local-folders", "the chart never accepts local folders over HTTP")
		require.NotContains(t, a, "--insecure-no-auth")
	}
}

// TestChartMigrateHookOrderingOnFirstInstall: on a first install, Helm
// creates pre-install hooks by ascending weight before any ordinary
// resource; the Job's ServiceAccount and NetworkPolicy must be hooks of a
// lower weight than the Job, and not deleted before it runs.
func TestChartMigrateHookOrderingOnFirstInstall(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, nil)
	weight := func(key string) int {
		t.Helper()
		m := docs[key]
		require.Equal(t, "pre-install,pre-upgrade", m.Metadata.Annotations["helm.sh/hook"], key)
		w, err := strconv.Atoi(m.Metadata.Annotations["helm.sh/hook-weight"])
		require.NoError(t, err, key)
		return w
	}
	job := weight("Job/prod-fleet-ingest-migrate")
	for _, dep := range []string{"ServiceAccount/prod-fleet-ingest-migrate", "NetworkPolicy/prod-fleet-ingest-migrate"} {
		require.Less(t, weight(dep), job, "%s is created before the Job", dep)
		require.Equal(t, "before-hook-creation", docs[dep].Metadata.Annotations["helm.sh/hook-delete-policy"],
			"%s is not deleted when it is created (hook-succeeded would remove it before the Job runs)", dep)
	}
	// The worker and enqueue accounts are ordinary resources.
	for _, sa := range []string{"ServiceAccount/prod-fleet-ingest-worker", "ServiceAccount/prod-fleet-ingest-enqueue"} {
		require.Empty(t, docs[sa].Metadata.Annotations["helm.sh/hook"], sa)
	}
}

type peerRule struct {
	ports []string // "TCP/5432"
	peers []networkingv1.NetworkPolicyPeer
}

func rulesOf[R networkingv1.NetworkPolicyIngressRule | networkingv1.NetworkPolicyEgressRule](rules []R) []peerRule {
	var out []peerRule
	for _, r := range rules {
		var ports []networkingv1.NetworkPolicyPort
		var peers []networkingv1.NetworkPolicyPeer
		switch r := any(r).(type) {
		case networkingv1.NetworkPolicyIngressRule:
			ports, peers = r.Ports, r.From
		case networkingv1.NetworkPolicyEgressRule:
			ports, peers = r.Ports, r.To
		}
		pr := peerRule{peers: peers}
		for _, p := range ports {
			pr.ports = append(pr.ports, string(*p.Protocol)+"/"+p.Port.String())
		}
		out = append(out, pr)
	}
	return out
}

func allPorts(rules []peerRule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.ports...)
	}
	slices.Sort(out)
	return out
}

// TestChartNetworkPolicies: each component may be reached only where it
// must be, and may reach only DNS, PostgreSQL and (worker; enqueue with
// SNS) HTTPS.
func TestChartNetworkPolicies(t *testing.T) {
	t.Parallel()
	docs := mustRender(t, map[string]any{
		"networkPolicy": map[string]any{
			"monitoringNamespace": "observability",
			"postgres":            map[string]any{"cidrs": []any{"10.20.0.0/16"}},
		},
	})
	np := func(name string) networkingv1.NetworkPolicySpec {
		t.Helper()
		p := decode[networkingv1.NetworkPolicy](t, docs["NetworkPolicy/prod-fleet-ingest-"+name])
		require.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, p.Spec.PolicyTypes, name)
		require.Equal(t, name, p.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"], name)
		return p.Spec
	}
	requireBaseEgress := func(name string, egress []peerRule) {
		t.Helper()
		dns := egress[0]
		require.Equal(t, []string{"UDP/53", "TCP/53"}, dns.ports, name)
		require.Equal(t, "kube-system", dns.peers[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"], name)
		require.Equal(t, "kube-dns", dns.peers[0].PodSelector.MatchLabels["k8s-app"], name)
		pg := egress[1]
		require.Equal(t, []string{"TCP/5432"}, pg.ports, name)
		require.Equal(t, "10.20.0.0/16", pg.peers[0].IPBlock.CIDR, name)
	}

	worker := np("worker")
	in := rulesOf(worker.Ingress)
	require.Len(t, in, 1)
	require.Equal(t, []string{"TCP/9090"}, in[0].ports, "only the metrics port")
	require.Equal(t, "observability", in[0].peers[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"], "only from the monitoring namespace")
	out := rulesOf(worker.Egress)
	requireBaseEgress("worker", out)
	require.Equal(t, []string{"TCP/443", "TCP/53", "TCP/5432", "UDP/53"}, allPorts(out), "S3, STS and the Redshift Data API over HTTPS")

	enqueue := np("enqueue")
	in = rulesOf(enqueue.Ingress)
	require.Len(t, in, 2)
	require.Equal(t, []string{"TCP/8080"}, in[0].ports, "its public port")
	require.Empty(t, in[0].peers, "from any source by default")
	require.Equal(t, []string{"TCP/8081"}, in[1].ports, "its admin port (probes, /metrics)")
	require.Len(t, in[1].peers, 1)
	require.Equal(t, "observability", in[1].peers[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"], "only from the monitoring namespace")
	out = rulesOf(enqueue.Egress)
	requireBaseEgress("enqueue", out)
	require.Equal(t, []string{"TCP/53", "TCP/5432", "UDP/53"}, allPorts(out), "no HTTPS without SNS")

	migrate := np("migrate")
	require.Empty(t, migrate.Ingress, "nothing reaches the migrate Job")
	out = rulesOf(migrate.Egress)
	requireBaseEgress("migrate", out)
	require.Equal(t, []string{"TCP/53", "TCP/5432", "UDP/53"}, allPorts(out))

	// With SNS, enqueue may fetch signing certificates; restricted callers
	// apply to the public port only, Prometheus keeps the admin port;
	// direct Redshift for the worker.
	docs = mustRender(t, map[string]any{
		"enqueue": map[string]any{"sns": map[string]any{"topicArns": []any{"arn:aws:sns:us-east-1:123456789012:uploads"}}},
		"networkPolicy": map[string]any{
			"enqueueIngressFrom": []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.30.0.0/16"}}},
			"enqueueAdminFrom":   []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "ops"}}}},
			"redshift":           map[string]any{"enabled": true, "cidrs": []any{"10.40.0.0/16"}},
		},
	})
	enqueue = decode[networkingv1.NetworkPolicy](t, docs["NetworkPolicy/prod-fleet-ingest-enqueue"]).Spec
	require.Equal(t, []string{"TCP/443", "TCP/53", "TCP/5432", "UDP/53"}, allPorts(rulesOf(enqueue.Egress)))
	in = rulesOf(enqueue.Ingress)
	require.Len(t, in, 2)
	require.Equal(t, []string{"TCP/8080"}, in[0].ports)
	require.Len(t, in[0].peers, 1)
	require.Equal(t, "10.30.0.0/16", in[0].peers[0].IPBlock.CIDR)
	require.Equal(t, []string{"TCP/8081"}, in[1].ports)
	require.Equal(t, "monitoring", in[1].peers[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
	require.Len(t, in[1].peers, 2, "the admin port (cancel route, River UI, pprof): Prometheus and enqueueAdminFrom, never the public callers")
	require.Equal(t, "ops", in[1].peers[1].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
	worker = decode[networkingv1.NetworkPolicy](t, docs["NetworkPolicy/prod-fleet-ingest-worker"]).Spec
	require.Equal(t, []string{"TCP/443", "TCP/53", "TCP/5432", "TCP/5439", "UDP/53"}, allPorts(rulesOf(worker.Egress)))
	ec := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-enqueue"]).Spec.Template.Spec.Containers[0]
	arn, _ := argValue(ec.Args, "--sns-topic-arn")
	require.Equal(t, "arn:aws:sns:us-east-1:123456789012:uploads", arn)

	docs = mustRender(t, map[string]any{"networkPolicy": map[string]any{"enabled": false}})
	for key := range docs {
		require.NotContains(t, key, "NetworkPolicy/")
	}
}

// TestChartOperatorToken: the operator token (cancel route, River UI) is
// optional; when its key is given it is a file in the same volume as the
// import token, wired to --operator-token-file, never an environment
// variable, and the operator login's URL (OPERATOR_DATABASE_URL, from the
// same Secret) goes with it: the chart refuses one without the other;
// without them enqueue gets no --operator-token-file and serves neither
// route.
func TestChartOperatorToken(t *testing.T) {
	t.Parallel()
	c := pods(t, mustRender(t, nil)).enqueue
	_, ok := argValue(c.Containers[0].Args, "--operator-token-file")
	require.False(t, ok, "no operator token by default")
	require.Equal(t, []corev1.KeyToPath{{Key: "token", Path: "token"}}, c.Volumes[0].Secret.Items)

	for _, enqueue := range []map[string]any{{"operatorTokenKey": "operator"}, {"operatorDatabaseURLKey": "operator-url"}} {
		_, err := render(t, map[string]any{"secrets": map[string]any{"enqueue": enqueue}})
		require.ErrorContains(t, err, "needs secrets.enqueue.", "%v: the operator token and the operator login go together", enqueue)
	}

	all := pods(t, mustRender(t, map[string]any{"secrets": map[string]any{"enqueue": map[string]any{"operatorTokenKey": "operator", "operatorDatabaseURLKey": "operator-url"}}}))
	p := all.enqueue
	container := p.Containers[0]
	operatorFile, ok := argValue(container.Args, "--operator-token-file")
	require.True(t, ok)
	tokenFile, ok := argValue(container.Args, "--auth-token-file")
	require.True(t, ok)
	require.Len(t, container.VolumeMounts, 1, "one volume for both tokens")
	mount := container.VolumeMounts[0]
	require.True(t, mount.ReadOnly)
	require.Equal(t, mount.MountPath+"/operator-token", operatorFile)
	require.Equal(t, mount.MountPath+"/token", tokenFile)
	require.Len(t, p.Volumes, 1)
	require.Equal(t, mount.Name, p.Volumes[0].Name)
	require.Equal(t, "prod-fleet-ingest-enqueue", p.Volumes[0].Secret.SecretName)
	require.Equal(t, []corev1.KeyToPath{{Key: "token", Path: "token"}, {Key: "operator", Path: "operator-token"}}, p.Volumes[0].Secret.Items)
	urls := map[string]string{}
	for _, e := range container.Env {
		require.NotContains(t, e.Name, "OPERATOR_TOKEN", "the operator token is a file, never environment")
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			urls[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	require.Equal(t, "prod-fleet-ingest-enqueue/url", urls["DATABASE_URL"], "the doors act as the enqueue login")
	require.Equal(t, "prod-fleet-ingest-enqueue/operator-url", urls["OPERATOR_DATABASE_URL"], "the operator surfaces as the operator login")
	require.Equal(t, []string{"prod-fleet-ingest-enqueue"}, secretsOf(p))
	for name, pod := range map[string]corev1.PodSpec{"worker": all.worker, "migrate": all.migrate} {
		for _, e := range pod.Containers[0].Env {
			require.NotEqual(t, "OPERATOR_DATABASE_URL", e.Name, "%s never gets the operator login", name)
		}
	}
}

// TestChartRequiresUploadBuckets: the chart refuses to render without
// upload buckets (an empty allow-list used to mean any bucket, which let a
// notification name a bucket such as "bkt/tenants/acme/…"), or with a name
// S3 would not accept; with them, enqueue serve and the worker get the
// same bucket list and path pattern (the worker as flags, the enqueue
// pods as PATH_PATTERN and ACCEPTED_BUCKETS, so enqueue import and retry
// run in them with kubectl exec apply serve's rule).
func TestChartRequiresUploadBuckets(t *testing.T) {
	t.Parallel()
	for _, buckets := range [][]any{nil, {}, {"Bad/Bucket"}, {"ok-bucket", "no"}} {
		_, err := render(t, map[string]any{"uploads": map[string]any{"buckets": buckets}})
		require.ErrorContains(t, err, "uploads.buckets", "%v", buckets)
	}
	docs := mustRender(t, map[string]any{"uploads": map[string]any{"buckets": []any{"fleet-a", "fleet-b"}, "pathPattern": "t/{tenant_id}/{tenant_database}/{company_id}/"}})
	worker := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-worker"])
	args := worker.Spec.Template.Spec.Containers[0].Args
	require.Contains(t, args, "--bucket=fleet-a")
	require.Contains(t, args, "--bucket=fleet-b")
	require.Contains(t, args, "--path-pattern=t/{tenant_id}/{tenant_database}/{company_id}/")
	enqueue := decode[appsv1.Deployment](t, docs["Deployment/prod-fleet-ingest-enqueue"])
	env := map[string]string{}
	for _, e := range enqueue.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	require.Equal(t, "fleet-a,fleet-b", env["ACCEPTED_BUCKETS"])
	require.Equal(t, "t/{tenant_id}/{tenant_database}/{company_id}/", env["PATH_PATTERN"])
}
