{{/* Names, labels and the pieces several templates share. */}}

{{- define "gpu-admission.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* Object name prefix; short enough that "<fullname>-certs-renew-<timestamp>" Jobs stay under 63. */}}
{{- define "gpu-admission.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-admission.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpu-admission.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-admission
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component (webhook, agent, certs). */}}
{{- define "gpu-admission.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-admission.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpu-admission.componentLabels" -}}
{{ include "gpu-admission.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpu-admission.image" -}}
{{- $repository := required (printf "image.repository is required: no public registry carries this image. Build it from the project's Dockerfile and push it where your nodes can pull from: `docker build -t REGISTRY/gpu-admission:%s . && docker push REGISTRY/gpu-admission:%s`, then install with `--set image.repository=REGISTRY/gpu-admission`" .Chart.AppVersion .Chart.AppVersion) .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "gpu-admission.serviceName" -}}
{{ include "gpu-admission.fullname" . }}
{{- end }}

{{/* Both webhook configurations carry this name (one Mutating..., one Validating...). */}}
{{- define "gpu-admission.webhookConfigName" -}}
{{ include "gpu-admission.fullname" . }}
{{- end }}

{{- define "gpu-admission.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "existingSecret" }}
{{- .Values.certificates.existingSecret.name }}
{{- else }}
{{- printf "%s-tls" (include "gpu-admission.fullname" .) }}
{{- end }}
{{- end }}

{{/* DNS names of the webhook Service: what the serving certificate must cover. */}}
{{- define "gpu-admission.dnsNames" -}}
{{- $svc := include "gpu-admission.serviceName" . }}
{{- $ns := .Release.Namespace }}
- {{ $svc }}
- {{ $svc }}.{{ $ns }}
- {{ $svc }}.{{ $ns }}.svc
- {{ $svc }}.{{ $ns }}.svc.{{ .Values.certificates.clusterDomain }}
{{- end }}

{{/* "memory" or "api": the effective reservation store of the server. */}}
{{- define "gpu-admission.reservations" -}}
{{- if eq .Values.webhook.reservations "auto" }}
{{- if gt (int .Values.webhook.replicas) 1 }}leader{{ else }}memory{{ end }}
{{- else }}
{{- .Values.webhook.reservations }}
{{- end }}
{{- end }}

{{/* True when the cluster evaluates webhook matchConditions (GA in 1.30). */}}
{{- define "gpu-admission.useMatchConditions" -}}
{{- if and .Values.webhook.skipPodsWithoutGpu (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{/* Namespaces no webhook ever matches. */}}
{{- define "gpu-admission.excludedNamespaces" -}}
{{- $names := list "kube-system" "kube-node-lease" .Release.Namespace }}
{{- range .Values.namespaceSelection.excludedNamespaces }}
{{- $names = append $names . }}
{{- end }}
{{- toJson ($names | uniq) }}
{{- end }}

{{- define "gpu-admission.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ include "gpu-admission.excludedNamespaces" . }}
    {{- if eq .Values.namespaceSelection.mode "optIn" }}
    - key: {{ .Values.namespaceSelection.label }}
      operator: In
      values: ["true"]
    {{- else }}
    - key: {{ .Values.namespaceSelection.label }}
      operator: NotIn
      values: ["false"]
    {{- end }}
{{- end }}

{{/* A CEL list literal of strings: ['a','b']. */}}
{{- define "gpu-admission.celList" -}}
[{{- range $i, $s := . }}{{ if $i }}, {{ end }}'{{ $s | replace "\\" "\\\\" | replace "'" "\\'" }}'{{- end }}]
{{- end }}

{{/*
CEL: true when a pod may be a GPU pod and must be decided by the webhook. Every field access is guarded
with has(), because an evaluation error would hand the request to the failure policy. Conservative on
purpose: a pod sent here needlessly costs one fast-path answer.
*/}}
{{- define "gpu-admission.gpuPodExpression" -}}
{{- $d := .Values.webhook.gpuPodDetection }}
{{- $terms := list }}
{{- $resource := printf "%s.exists(p, r.startsWith(p)) || %s.exists(s, r.contains(s))" (include "gpu-admission.celList" $d.resourcePrefixes) (include "gpu-admission.celList" $d.resourceSubstrings) }}
{{- $env := printf "%s.exists(p, e.name.startsWith(p))" (include "gpu-admission.celList" $d.envPrefixes) }}
{{- $terms = append $terms (printf "((has(object.spec.containers) ? object.spec.containers : []) + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c,\n    (has(c.resources) && ['limits', 'requests'].exists(f, f in c.resources && c.resources[f].exists(r, %s)))\n    || (has(c.env) && c.env.exists(e, %s)))" $resource $env) }}
{{- $terms = append $terms (printf "(has(object.metadata.annotations) && object.metadata.annotations.exists(k, k in %s || %s.exists(p, k.startsWith(p))))" (include "gpu-admission.celList" $d.annotations) (include "gpu-admission.celList" $d.annotationPrefixes)) }}
{{- if $d.hostPathVolumes }}
{{- $terms = append $terms "(has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath)))" }}
{{- end }}
{{- if $d.runtimeClassSubstrings }}
{{- $terms = append $terms (printf "(has(object.spec.runtimeClassName) && %s.exists(s, object.spec.runtimeClassName.contains(s)))" (include "gpu-admission.celList" $d.runtimeClassSubstrings)) }}
{{- end }}
{{- if $d.resourceClaims }}
{{- $terms = append $terms "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)" }}
{{- end }}
{{- if $d.envFrom }}
{{- $terms = append $terms "((has(object.spec.containers) ? object.spec.containers : []) + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c, has(c.envFrom))" }}
{{- end }}
{{- if $d.tolerations }}
{{- $terms = append $terms "(has(object.spec.tolerations) && object.spec.tolerations.exists(t, !has(t.key) || t.key == '' || !['node.kubernetes.io/', 'node-role.kubernetes.io/', 'node.cloudprovider.kubernetes.io/', 'CriticalAddonsOnly'].exists(p, t.key.startsWith(p))))" }}
{{- end }}
{{- if $d.nodeName }}
{{- $terms = append $terms "(has(object.spec.nodeName) && object.spec.nodeName != '')" }}
{{- end }}
{{- join "\n|| " $terms }}
{{- end }}

{{/* The ServiceAccounts the webhook and the agent run as (made by the chart unless serviceAccount.create=false). */}}
{{- define "gpu-admission.serviceAccountName" -}}
{{- default (include "gpu-admission.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "gpu-admission.agentServiceAccountName" -}}
{{- printf "%s-agent" (include "gpu-admission.serviceAccountName" .) }}
{{- end }}

{{/* Restricted by default (values.yaml); every pod and container of the chart gets these. */}}
{{- define "gpu-admission.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "gpu-admission.containerSecurityContext" -}}
{{- toYaml .Values.securityContext }}
{{- end }}

{{/* The caBundle for the webhook configurations' clientConfig, where the chart knows it at render time. */}}
{{- define "gpu-admission.caBundle" -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
caBundle: {{ .Values.certificates.existingSecret.caBundle | nospace | quote }}
{{- end }}
{{- end }}

{{- define "gpu-admission.webhookAnnotations" -}}
{{- if eq .Values.certificates.mode "certManager" -}}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/%s-serving" .Release.Namespace (include "gpu-admission.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The CIDRs the API server calls webhooks from, as a JSON list: webhook.networkPolicy.apiServerCIDRs, else
the addresses the cluster's own `kubernetes` Service points at (its EndpointSlice, else its Endpoints; the
API server keeps them to its advertised addresses), read at install or upgrade. Empty where the render
cannot read the cluster (helm template, GitOps).
*/}}
{{- define "gpu-admission.apiServerCIDRs" -}}
{{- $cidrs := list }}
{{- if .Values.webhook.networkPolicy.apiServerCIDRs }}
{{- $cidrs = .Values.webhook.networkPolicy.apiServerCIDRs }}
{{- else }}
{{- $addresses := list }}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" }}
{{- range ($slice.endpoints | default list) }}
{{- $addresses = concat $addresses (.addresses | default list) }}
{{- end }}
{{- if not $addresses }}
{{- $endpoints := lookup "v1" "Endpoints" "default" "kubernetes" }}
{{- range ($endpoints.subsets | default list) }}
{{- range (.addresses | default list) }}
{{- $addresses = append $addresses .ip }}
{{- end }}
{{- end }}
{{- end }}
{{- range (uniq $addresses) }}
{{- $cidrs = append $cidrs (printf "%s/%s" . (ternary "128" "32" (contains ":" .))) }}
{{- end }}
{{- end }}
{{- toJson $cidrs }}
{{- end }}

{{/*
Non-empty when this render can read the cluster (helm install, upgrade, --dry-run=server); empty for
helm template and GitOps renders, where every lookup finds nothing.
*/}}
{{- define "gpu-admission.clusterReadable" -}}
{{- if lookup "v1" "Namespace" "" "kube-system" }}true{{ end }}
{{- end }}

{{/* The record key's Secret that the chart (or its certificate Job) makes. */}}
{{- define "gpu-admission.recordKeySecretName" -}}
{{- printf "%s-record-key" (include "gpu-admission.fullname" .) }}
{{- end }}

{{/* Non-empty when the certificate Job, not the render, makes the record key (see record-key-secret.yaml). */}}
{{- define "gpu-admission.recordKeyByJob" -}}
{{- if and (not .Values.webhook.recordKey.existingSecret) (eq .Values.certificates.mode "builtin") (not (include "gpu-admission.clusterReadable" .)) }}true{{ end }}
{{- end }}
