{{/*
Names, labels and small shared pieces of the gkm chart.
*/}}

{{- define "gkm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name: every object name starts with it. */}}
{{- define "gkm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's name: (dict "ctx" $ "component" "operator") -> gkm-operator */}}
{{- define "gkm.componentName" -}}
{{- printf "%s-%s" (include "gkm.fullname" .ctx | trunc 50 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "gkm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object: (dict "ctx" $ "component" "operator") */}}
{{- define "gkm.labels" -}}
helm.sh/chart: {{ include "gkm.chart" .ctx }}
{{ include "gkm.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: gkm
{{- end -}}

{{/* Labels a selector matches on: never change them for an existing release. */}}
{{- define "gkm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gkm.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{/* The gkm image reference (a digest wins over the tag). */}}
{{- define "gkm.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- if not (hasPrefix "sha256:" $img.digest) -}}
{{- fail (printf "image.digest must look like sha256:<hex>, got %q" $img.digest) -}}
{{- end -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion ($img.tag | toString)) -}}
{{- end -}}
{{- end -}}

{{/* A log level, checked: (dict "level" .Values.x.logLevel "ctx" $) */}}
{{- define "gkm.logLevel" -}}
{{- $l := default .ctx.Values.logLevel .level -}}
{{- if not (has $l (list "debug" "info" "warn" "error")) -}}
{{- fail (printf "log level must be debug, info, warn or error, got %q" $l) -}}
{{- end -}}
{{- $l -}}
{{- end -}}

{{/* Flags every daemon takes: (dict "level" ... "port" ... "ctx" $) */}}
{{- define "gkm.commonArgs" -}}
{{- if not (has .ctx.Values.logFormat (list "json" "text")) -}}
{{- fail (printf "logFormat must be json or text, got %q" .ctx.Values.logFormat) -}}
{{- end -}}
- --health-listen=:{{ .port }}
- --log-level={{ include "gkm.logLevel" . }}
- --log-format={{ .ctx.Values.logFormat }}
{{- end -}}

{{/* The policies (gkm-policies) as files: every daemon that runs policies
gets --policy-dir on this mount and reloads when the files change, so none
of them needs RBAC on ConfigMaps. */}}
{{- define "gkm.policyMount" -}}
- {name: policies, mountPath: /etc/gkm/policies, readOnly: true}
{{- end -}}
{{- define "gkm.policyVolume" -}}
- name: policies
  configMap: {name: gkm-policies}
{{- end -}}

{{/* Liveness and readiness probes on the health port named by .port. */}}
{{- define "gkm.probes" -}}
livenessProbe:
  httpGet: {path: /healthz, port: {{ .name }}}
  initialDelaySeconds: 5
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: {{ .name }}}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}

{{/* The securityContext of every container outside the node pod. */}}
{{- define "gkm.restrictedContainer" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities: {drop: [ALL]}
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "gkm.restrictedPod" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* Environment every daemon gets from the downward API. */}}
{{- define "gkm.podEnv" -}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
{{- end -}}

{{/* The ConfigMap of trusted keys: the user's, or the chart's. */}}
{{- define "gkm.trustKeysName" -}}
{{- if .Values.verification.existingConfigMap -}}
{{- .Values.verification.existingConfigMap -}}
{{- else -}}
{{- include "gkm.componentName" (dict "ctx" . "component" "trust-keys") -}}
{{- end -}}
{{- end -}}

{{/* Entries of imagePullSecrets (names or {name: x} maps). */}}
{{- define "gkm.pullSecrets" -}}
{{- range . }}
- name: {{ if kindIs "map" . }}{{ required "imagePullSecrets: an entry has no name" .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end -}}

{{/* Spread replicas over nodes unless the user set an affinity. */}}
{{- define "gkm.spreadAffinity" -}}
{{- if .affinity -}}
{{- toYaml .affinity -}}
{{- else -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gkm.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 12 }}
{{- end -}}
{{- end -}}

{{/* Registry mirrors (the node's own files, registry.mirrors, read-only
hostPath; in the operator and webhook only with mirrors.controlPlane) and the
registry CA bundle (registry.caConfigMap): args, mounts and volumes of a
component that reads images. Called with (dict "ctx" $ "node" true|false). */}}
{{- define "gkm.registryArgs" -}}
{{- $r := .ctx.Values.registry -}}
{{- if or .node $r.mirrors.controlPlane }}
{{- with $r.mirrors.hostsDir }}
- --registry-hosts-dir=/etc/gkm/node-hosts
{{- end }}
{{- with $r.mirrors.registriesConf }}
- --registries-conf=/etc/gkm/node-containers/{{ base . }}
{{- end }}
{{- end }}
{{- with $r.caConfigMap }}
- --ca-file=/etc/gkm/registry-ca/ca.crt
{{- end }}
{{- end -}}
{{- define "gkm.registryMounts" -}}
{{- $r := .ctx.Values.registry -}}
{{- if or .node $r.mirrors.controlPlane }}
{{- if $r.mirrors.hostsDir }}
- {name: node-hosts, mountPath: /etc/gkm/node-hosts, readOnly: true}
{{- end }}
{{- if $r.mirrors.registriesConf }}
- {name: node-containers, mountPath: /etc/gkm/node-containers, readOnly: true}
{{- end }}
{{- end }}
{{- if $r.caConfigMap }}
- {name: registry-ca, mountPath: /etc/gkm/registry-ca, readOnly: true}
{{- end }}
{{- end -}}
{{- define "gkm.registryVolumes" -}}
{{- $r := .ctx.Values.registry -}}
{{- if or .node $r.mirrors.controlPlane }}
{{- with $r.mirrors.hostsDir }}
# a node without the directory has no mirrors (an empty one is made)
- name: node-hosts
  hostPath: {path: {{ . }}, type: DirectoryOrCreate}
{{- end }}
{{- with $r.mirrors.registriesConf }}
# the file's directory: a node without the file has no mirrors
- name: node-containers
  hostPath: {path: {{ dir . }}, type: DirectoryOrCreate}
{{- end }}
{{- end }}
{{- with $r.caConfigMap }}
- name: registry-ca
  configMap: {name: {{ . }}, items: [{key: ca.crt, path: ca.crt}]}
{{- end }}
{{- end -}}
