{{- define "fleet-ingest.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleet-ingest.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleet-ingest.labels" -}}
app.kubernetes.io/name: {{ include "fleet-ingest.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fleet-ingest.selector" -}}
app.kubernetes.io/name: {{ include "fleet-ingest.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
The image of every container: repository@digest when image.digest is set
(the tag is then ignored), else repository:tag (default: appVersion).
*/}}
{{- define "fleet-ingest.image" -}}
{{- with .Values.image.digest -}}
{{- if not (regexMatch "^[a-z0-9]+([+._-][a-z0-9]+)*:[a-fA-F0-9]{32,}$" (toString .)) -}}
{{- fail (printf "image.digest must look like sha256:<hex>, not %q" (toString .)) -}}
{{- end -}}
{{ $.Values.image.repository }}@{{ . }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
The pod-level fields every pod of the chart shares (Deployments, the
migrate Job, any CronJob): (dict "root" $ "component" "worker" "values"
.Values.worker), and "serviceAccount" "<component>" to run as another
component's ServiceAccount (default: the component's own). Each of imagePullSecrets, nodeSelector, tolerations,
affinity, topologySpreadConstraints, priorityClassName and
podSecurityContext is the component's own value when that is set
(non-empty), else the top-level one. A spread constraint without a
labelSelector selects the component's own pods; with none at all (and
defaultTopologySpread), the component's pods spread over zones and nodes,
ScheduleAnyway. The chart test fails on a pod template that does not
include this.
*/}}
{{- define "fleet-ingest.podSpec" -}}
{{- $root := .root -}}
{{- $own := .values | default dict -}}
{{- $v := dict -}}
{{- range $key := list "imagePullSecrets" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" "podSecurityContext" -}}
{{- $_ := set $v $key ((get $own $key) | default (get $root.Values $key)) -}}
{{- end -}}
{{- $selector := include "fleet-ingest.selector" (dict "root" $root "component" .component) | fromYaml -}}
{{- $spread := list -}}
{{- range $c := $v.topologySpreadConstraints -}}
{{- $c2 := deepCopy $c -}}
{{- if not $c2.labelSelector -}}
{{- $_ := set $c2 "labelSelector" (dict "matchLabels" $selector) -}}
{{- end -}}
{{- $spread = append $spread $c2 -}}
{{- end -}}
{{- if and (not $spread) $root.Values.defaultTopologySpread -}}
{{- range $key := list "topology.kubernetes.io/zone" "kubernetes.io/hostname" -}}
{{- $spread = append $spread (dict "maxSkew" 1 "topologyKey" $key "whenUnsatisfiable" "ScheduleAnyway" "labelSelector" (dict "matchLabels" $selector)) -}}
{{- end -}}
{{- end -}}
serviceAccountName: {{ include "fleet-ingest.serviceAccountName" (dict "root" $root "component" (.serviceAccount | default .component)) }}
automountServiceAccountToken: false
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $v.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $spread }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The startupProbe of a long-running container: (dict "root" $ "values"
.Values.worker "port" "metrics"). Until it succeeds the liveness and
readiness probes wait, so a slow start (a cold node, a slow database) is
not killed; the component's startupProbe overrides the top-level one.
*/}}
{{- define "fleet-ingest.startupProbe" -}}
{{- $p := (get (.values | default dict) "startupProbe") | default .root.Values.startupProbe | default dict -}}
startupProbe:
  httpGet: {path: /healthz, port: {{ .port }}}
  periodSeconds: {{ $p.periodSeconds | default 5 }}
  failureThreshold: {{ $p.failureThreshold | default 60 }}
  timeoutSeconds: {{ $p.timeoutSeconds | default 2 }}
{{- end -}}

{{/*
A component's PodDisruptionBudget: (dict "root" $ "component" "sqs"
"values" .Values.sqs "minReplicas" <the fewest replicas it may run>).
Rendered when podDisruptionBudget.enabled and the component runs more than
one replica: a budget over a single pod would block every node drain.
*/}}
{{- define "fleet-ingest.pdb" -}}
{{- $pdb := .values.podDisruptionBudget | default dict -}}
{{- if and $pdb.enabled (gt (int .minReplicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "fleet-ingest.fullname" .root }}-{{ .component }}
  labels:
    {{- include "fleet-ingest.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  {{- if not (kindIs "invalid" $pdb.maxUnavailable) }}
  maxUnavailable: {{ $pdb.maxUnavailable }}
  {{- else if hasKey $pdb "minAvailable" }}
  minAvailable: {{ $pdb.minAvailable }}
  {{- else }}
  minAvailable: 1
  {{- end }}
  selector:
    matchLabels:
      {{- include "fleet-ingest.selector" (dict "root" .root "component" .component) | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The ServiceAccount of a component: (dict "root" . "component" "worker"). */}}
{{- define "fleet-ingest.serviceAccountName" -}}
{{- if .root.Values.serviceAccount.create -}}
{{- printf "%s-%s" (include "fleet-ingest.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- else -}}
default
{{- end -}}
{{- end -}}

{{/*
The name of a component's Secret: its existingSecret, else the release's
own, <fullname>-<default> (dict "root" . "secret" .Values.secrets.worker
"default" "worker"): per release, so two releases in one namespace never
read each other's credentials. secrets.sqs defaults to the enqueue one;
secrets.reconcile to <fullname>-reconcile (a login of fleet_reconcile).
*/}}
{{- define "fleet-ingest.secretName" -}}
{{- .secret.existingSecret | default (printf "%s-%s" (include "fleet-ingest.fullname" .root) .default) -}}
{{- end -}}

{{/*
Environment of a component's container: its own database URL from its own
Secret (dict "root" . "secret" .Values.secrets.worker "default" "worker":
see fleet-ingest.secretName), the warehouse URL and the pod name.
*/}}
{{- define "fleet-ingest.databaseEnv" -}}
{{- $root := .root -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "fleet-ingest.secretName" . }}
      key: {{ .secret.databaseURLKey }}
{{- if $root.Values.warehouse.existingSecret }}
- name: WAREHOUSE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.warehouse.existingSecret }}
      key: {{ $root.Values.warehouse.key }}
{{- end }}
{{- $pooler := $root.Values.database.pooler | default "none" }}
{{- if not (has $pooler (list "none" "transaction")) }}
{{- fail (printf "database.pooler must be none or transaction, not %q" $pooler) }}
{{- end }}
{{- if and (eq $pooler "transaction") (not .direct) }}
- name: DATABASE_POOLER
  value: transaction
{{- end }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- with $root.Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Egress to DNS and PostgreSQL, shared by every component's NetworkPolicy. */}}
{{- define "fleet-ingest.baseEgress" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.networkPolicy.dns.namespace }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.podLabels | nindent 10 }}
  ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
- ports:
    - {protocol: TCP, port: {{ .Values.networkPolicy.postgres.port }}}
  {{- with .Values.networkPolicy.postgres.cidrs }}
  to:
    {{- range . }}
    - ipBlock: {cidr: {{ . | quote }}}
    {{- end }}
  {{- end }}
{{- end -}}

{{/* Egress over HTTPS to networkPolicy.https.cidrs. */}}
{{- define "fleet-ingest.httpsEgress" -}}
- to:
    {{- range .Values.networkPolicy.https.cidrs }}
    - ipBlock: {cidr: {{ . | quote }}}
    {{- end }}
  ports:
    - {protocol: TCP, port: 443}
{{- end -}}

{{/* Validates the worker's timing values. */}}
{{- define "fleet-ingest.workerTermination" -}}
{{- $grace := int .Values.worker.shutdownGraceSeconds -}}
{{- $drain := max $grace (int .Values.worker.drainMaxSeconds) | int -}}
{{- $term := .Values.worker.terminationGracePeriodSeconds | default (add $drain 15) | int -}}
{{- if le $term $grace -}}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must be longer than worker.shutdownGraceSeconds (%d)" $term $grace) -}}
{{- end -}}
{{- if le $term $drain -}}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must be longer than worker.drainMaxSeconds (%d): a draining pod would be SIGKILLed mid-load" $term $drain) -}}
{{- end -}}
{{- if ge (int .Values.worker.leaseRenewEverySeconds) (int .Values.worker.leaseTTLSeconds) -}}
{{- fail "worker.leaseRenewEverySeconds must be shorter than worker.leaseTTLSeconds" -}}
{{- end -}}
{{- with .Values.worker.leaseSafetyMarginMilliseconds -}}
{{- $window := mul (sub (int $.Values.worker.leaseTTLSeconds) (int $.Values.worker.leaseRenewEverySeconds)) 1000 -}}
{{- if or (lt (int .) 0) (ge (int .) $window) -}}
{{- fail (printf "worker.leaseSafetyMarginMilliseconds (%d) must be at least 0 and shorter than (leaseTTLSeconds - leaseRenewEverySeconds) x 1000 = %d" (int .) $window) -}}
{{- end -}}
{{- end -}}
{{- $term -}}
{{- end -}}

{{/*
The warehouse settings of worker run and worker migrate: dict "root" $ and
"migrate" (true for the migrate Job, which runs as the warehouse owner's
database user, warehouse.redshift.migrateSecretArn, when one is set).
*/}}
{{- define "fleet-ingest.warehouseEnv" -}}
{{- $w := .root.Values.warehouse -}}
- name: WAREHOUSE
  value: {{ $w.type | quote }}
{{- if eq $w.type "redshift" }}
{{- $r := $w.redshift }}
{{- if and (not $r.workgroup) (not $r.clusterId) }}
{{- fail "warehouse.redshift.workgroup or warehouse.redshift.clusterId is required with warehouse.type redshift" }}
{{- end }}
{{- if and $r.workgroup $r.clusterId }}
{{- fail "set only one of warehouse.redshift.workgroup and warehouse.redshift.clusterId" }}
{{- end }}
{{- if or (not $r.database) (not $r.iamRole) (not $r.staging) }}
{{- fail "warehouse.redshift.database, iamRole and staging are required with warehouse.type redshift" }}
{{- end }}
{{- if $w.existingSecret }}
{{- fail "warehouse.existingSecret is for warehouse.type postgres" }}
{{- end }}
{{- $secret := $r.secretArn }}
{{- if and .migrate $r.migrateSecretArn }}
{{- $secret = $r.migrateSecretArn }}
{{- end }}
{{- range $name, $value := dict "REDSHIFT_WORKGROUP" $r.workgroup "REDSHIFT_CLUSTER_ID" $r.clusterId "REDSHIFT_DATABASE" $r.database "REDSHIFT_SECRET_ARN" $secret "REDSHIFT_DB_USER" $r.dbUser "REDSHIFT_IAM_ROLE" $r.iamRole "REDSHIFT_STAGING" $r.staging "REDSHIFT_LOAD_TIMEOUT" $r.loadTimeout "REDSHIFT_QUERY_TIMEOUT" $r.queryTimeout "AWS_REGION" $r.region }}
{{- if $value }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- else if ne $w.type "postgres" }}
{{- fail "warehouse.type must be postgres or redshift" }}
{{- end }}
{{- end -}}

{{/*
The accepted upload buckets, as a JSON array: required, and each a valid
S3 bucket name (an empty list is a configuration error, not "any bucket").
*/}}
{{- define "fleet-ingest.buckets" -}}
{{- $buckets := .Values.uploads.buckets | default list -}}
{{- if not $buckets -}}
{{- fail "uploads.buckets: list the S3 buckets uploads arrive in; an empty list is refused, not taken for any bucket" -}}
{{- end -}}
{{- range $buckets -}}
{{- if not (regexMatch "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$" (toString .)) -}}
{{- fail (printf "uploads.buckets: %q is not a valid S3 bucket name" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- toJson $buckets -}}
{{- end -}}

{{/*
Pod annotations for a Prometheus that discovers pods by the conventional
prometheus.io annotations (metrics.scrapeAnnotations), instead of the
ServiceMonitor. Takes (dict "root" . "port" <the metrics port>).
*/}}
{{- define "fleet-ingest.scrapeAnnotations" -}}
{{- if .root.Values.metrics.scrapeAnnotations }}
annotations:
  prometheus.io/scrape: "true"
  prometheus.io/port: {{ .port | quote }}
  prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/*
The doors' tolerance of bad records (enqueue.maxBadRecords), held to what
enqueue accepts (0 to 10000).
*/}}
{{- define "fleet-ingest.maxBadRecords" -}}
{{- $n := .Values.enqueue.maxBadRecords | default 0 -}}
{{- if or (lt (int64 $n) 0) (gt (int64 $n) 10000) -}}
{{- fail (printf "enqueue.maxBadRecords must be between 0 and 10000, not %v" $n) -}}
{{- end -}}
{{- int64 $n -}}
{{- end -}}
