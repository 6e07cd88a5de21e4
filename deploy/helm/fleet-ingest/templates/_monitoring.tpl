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
deployed) are kept. A group left without rules is dropped.
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
