{{/*
Scoping of PromQL to this release: every selector of a metric of ours
(ingest_*, pgxpool_*, river_*, go_*, process_*) or of up gets the matchers
namespace="<release namespace>",release="<release name>", the target labels
the chart's ServiceMonitor sets (the Operator adds namespace; the
ServiceMonitor copies app.kubernetes.io/instance into release; a plain
Prometheus sets both as in docs/deploy.md, "Scraping"). Two releases, in
one namespace or two, so never read each other's series. Called with
(dict "ctx" $ "query" "<PromQL>").
*/}}
{{- define "fleet-ingest.scopeQuery" -}}
{{- $scope := printf "namespace=%q,release=%q" .ctx.Release.Namespace .ctx.Release.Name -}}
{{- $names := "((?:ingest|pgxpool|river|go|process)_[a-zA-Z0-9_:]*|up)" -}}
{{- $q := regexReplaceAll (printf "\\b%s\\b\\s*\\{" $names) .query "${1}{__FLEET_INGEST_SCOPE__," -}}
{{- $q = regexReplaceAll (printf "\\b%s\\b([^a-zA-Z0-9_:{]|$)" $names) $q "${1}{__FLEET_INGEST_SCOPE__}${2}" -}}
{{- $q = replace "__FLEET_INGEST_SCOPE__,}" (printf "%s}" $scope) $q -}}
{{- replace "__FLEET_INGEST_SCOPE__" $scope $q -}}
{{- end -}}

{{/*
The alert rules of the enabled components, scoped to this release: alerts
named FleetIngestDoor* belong to enqueue serve (enqueue.enabled),
FleetIngestSQS* to enqueue sqs (sqs.enabled), FleetIngestReconcile* to
enqueue reconcile (reconcile.enabled); the others (the worker's, always
deployed) are kept. A group left without rules is dropped; every group of
files/alerts.yaml is carried, new ones included. Every rule kept gets the
labels namespace and release (this release's: its expression selects only
its series, so they are true of every alert it raises, absent() ones
included, whose expressions carry no labels) and its summary prefixed
"<namespace>/<release>: ": two releases' alerts are two alerts to
Alertmanager, and each page names its install.
*/}}
{{- define "fleet-ingest.alertGroups" -}}
{{- $ctx := . -}}
{{- $doc := .Files.Get "files/alerts.yaml" | fromYaml -}}
{{- $components := dict "FleetIngestDoor" .Values.enqueue.enabled "FleetIngestSQS" .Values.sqs.enabled "FleetIngestReconcile" .Values.reconcile.enabled -}}
{{- $groups := list -}}
{{- range $g := $doc.groups -}}
{{- $rules := list -}}
{{- range $r := $g.rules -}}
{{- $keep := true -}}
{{- range $prefix, $enabled := $components -}}
{{- if and (hasPrefix $prefix ($r.alert | default "")) (not $enabled) -}}
{{- $keep = false -}}
{{- end -}}
{{- end -}}
{{- if $keep -}}
{{- $_ := set $r "expr" (include "fleet-ingest.scopeQuery" (dict "ctx" $ctx "query" $r.expr)) -}}
{{- $_ = set $r "labels" (merge (dict "namespace" $ctx.Release.Namespace "release" $ctx.Release.Name) ($r.labels | default dict)) -}}
{{- $annotations := $r.annotations | default dict -}}
{{- $_ = set $annotations "summary" (printf "%s/%s: %s" $ctx.Release.Namespace $ctx.Release.Name ($annotations.summary | default $r.alert)) -}}
{{- $_ = set $r "annotations" $annotations -}}
{{- $rules = append $rules $r -}}
{{- end -}}
{{- end -}}
{{- if $rules -}}
{{- $_ := set $g "rules" $rules -}}
{{- $groups = append $groups $g -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end -}}

{{/*
The Grafana dashboard of this release: files/dashboard.json with a uid of
its own (the fullname; Grafana allows 40 characters, so a longer one is cut
to 31 and followed by 8 hex digits of its SHA-256), the release in its title,
and its namespace and release variables set to this release's: two
releases, in one namespace or two, ship two dashboards.
*/}}
{{- define "fleet-ingest.dashboard" -}}
{{- $fullname := include "fleet-ingest.fullname" . -}}
{{- $uid := $fullname -}}
{{- if gt (len $uid) 40 -}}
{{- $uid = printf "%s-%s" ($fullname | trunc 31 | trimSuffix "-") (sha256sum $fullname | trunc 8) -}}
{{- end -}}
{{- $dash := .Files.Get "files/dashboard.json" | fromJson -}}
{{- $_ := set $dash "uid" $uid -}}
{{- $_ = set $dash "title" (printf "%s (%s/%s)" $dash.title .Release.Namespace .Release.Name) -}}
{{- $current := dict "namespace" .Release.Namespace "release" .Release.Name -}}
{{- range $v := $dash.templating.list -}}
{{- if hasKey $current $v.name -}}
{{- $_ = set $v "current" (dict "text" (get $current $v.name) "value" (get $current $v.name)) -}}
{{- end -}}
{{- end -}}
{{- toPrettyJson $dash -}}
{{- end -}}
