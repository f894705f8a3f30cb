{{/* Names and labels. */}}
{{- define "space-api.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "space-api.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "space-api.selectorLabels" -}}
app.kubernetes.io/name: {{ include "space-api.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "space-api.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "space-api.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "space-api.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "space-api.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image: <repository>:<tag or appVersion> (what `make image` tags), or pinned by
digest: <repository>@<digest>, or <repository>:<tag>@<digest> when a tag is given.
*/}}
{{- define "space-api.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.digest }}
{{- if .Values.image.tag }}{{ printf "%s:%s@%s" $repo .Values.image.tag .Values.image.digest }}{{ else }}{{ printf "%s@%s" $repo .Values.image.digest }}{{ end }}
{{- else }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The namespace of sandbox Pods (kubernetes substrate). */}}
{{- define "space-api.sandboxNamespace" -}}
{{- default .Release.Namespace .Values.kubernetes.namespace }}
{{- end }}

{{/* The Secret the chart creates for whatever does not come from an existing one. */}}
{{- define "space-api.secretName" -}}
{{- include "space-api.fullname" . }}
{{- end }}

{{- define "space-api.chartSecretNeeded" -}}
{{- if or (not .Values.database.existingSecret) (not .Values.redis.existingSecret) }}true{{ end }}
{{- end }}

{{/* Is v unset? null and "" are; 0 and false are values. */}}
{{- define "space-api.unset" -}}
{{- if or (kindIs "invalid" .) (and (kindIs "string" .) (eq . "")) }}true{{ end }}
{{- end }}

{{/*
Checks the schema cannot express across keys; each fails the render with a message
naming the values to fix.
*/}}
{{- define "space-api.validate" -}}
{{- $rpsUnset := include "space-api.unset" .Values.admission.clientRefillRps }}
{{- $burstUnset := include "space-api.unset" .Values.admission.clientBurst }}
{{- if ne $rpsUnset $burstUnset }}
{{- fail "admission.clientRefillRps and admission.clientBurst must be set together (a per-client rate for every client key) or both left null (no per-client rate)" }}
{{- end }}
{{- if and (eq .Values.auth.mode "trusted_header") (not .Values.auth.trustedProxyCIDRs) }}
{{- fail "auth.trustedProxyCIDRs is required with auth.mode trusted_header: the addresses of the gateway whose X-Client-ID is trusted" }}
{{- end }}
{{- if and (not .Values.database.existingSecret) (not .Values.database.url) }}
{{- fail "set database.url or database.existingSecret (SPACE_DATABASE_URL)" }}
{{- end }}
{{- if and (not .Values.redis.existingSecret) (not .Values.redis.addrs) }}
{{- fail "set redis.addrs or redis.existingSecret (SPACE_REDIS_ADDRS)" }}
{{- end }}
{{- if eq (int .Values.ports.http) (int .Values.ports.internal) }}
{{- fail "ports.http and ports.internal must differ: the internal listener is never the public one" }}
{{- end }}
{{- $minGrace := add (int .Values.shutdownTimeoutSeconds) (int .Values.preStopSleepSeconds) }}
{{- if and (not (include "space-api.unset" .Values.terminationGracePeriodSeconds)) (le (int .Values.terminationGracePeriodSeconds) $minGrace) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed shutdownTimeoutSeconds + preStopSleepSeconds (%d), or the kubelet kills replicas mid-drain" (int .Values.terminationGracePeriodSeconds) $minGrace) }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (include "space-api.unset" .Values.podDisruptionBudget.maxUnavailable) (include "space-api.unset" .Values.podDisruptionBudget.minAvailable) }}
{{- fail "podDisruptionBudget needs maxUnavailable or minAvailable" }}
{{- end }}
{{- if and (not .Values.redis.tls.enabled) (or .Values.redis.tls.caFile .Values.redis.tls.serverName) }}
{{- fail "redis.tls.caFile and redis.tls.serverName need redis.tls.enabled: true (SPACE_REDIS_TLS)" }}
{{- end }}
{{- if and .Values.redis.auth.existingSecret (not .Values.redis.auth.existingSecretPasswordKey) }}
{{- fail "redis.auth.existingSecretPasswordKey names the password's key in redis.auth.existingSecret" }}
{{- end }}
{{- $chartEnv := list }}
{{- range (include "space-api.chartEnv" . | fromYamlArray) }}
{{- $chartEnv = append $chartEnv .name }}
{{- end }}
{{- range $i, $e := .Values.extraEnv }}
{{- if has $e.name $chartEnv }}
{{- fail (printf "extraEnv[%d] sets %s, which the chart already sets from its values: change the value instead" $i $e.name) }}
{{- end }}
{{- end }}
{{- range $i, $v := .Values.extraVolumes }}
{{- if has $v.name (list "tmp" "templates" "flags" "redis-auth") }}
{{- fail (printf "extraVolumes[%d] is named %s, a volume of the chart's own: choose another name" $i $v.name) }}
{{- end }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.hosts needs at least one host when ingress.enabled" }}
{{- end }}
{{- if and .Values.httpRoute.enabled (not .Values.httpRoute.parentRefs) }}
{{- fail "httpRoute.parentRefs needs the Gateway to attach to when httpRoute.enabled" }}
{{- end }}
{{- end }}

{{/*
The drain: the preStop sleep, then SIGTERM and SPACE_SHUTDOWN_TIMEOUT, plus 5 seconds
for the process to exit. Not a cold start: see values.yaml.
*/}}
{{- define "space-api.terminationGracePeriodSeconds" -}}
{{- if include "space-api.unset" .Values.terminationGracePeriodSeconds }}
{{- add (int .Values.shutdownTimeoutSeconds) (int .Values.preStopSleepSeconds) 5 }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
The SPACE_* environment of every container that runs space-api (the server and the
migration init container): config.Load validates all of it, even for migrate. It is
chartEnv, what the values render, then extraEnv.
*/}}
{{- define "space-api.env" -}}
{{ include "space-api.chartEnv" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "space-api.chartEnv" -}}
- name: SPACE_HTTP_ADDR
  value: {{ printf ":%d" (int .Values.ports.http) | quote }}
- name: SPACE_INTERNAL_HTTP_ADDR
  value: {{ printf ":%d" (int .Values.ports.internal) | quote }}
- name: SPACE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: SPACE_SHUTDOWN_TIMEOUT
  value: {{ printf "%ds" (int .Values.shutdownTimeoutSeconds) | quote }}
- name: SPACE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ default (include "space-api.secretName" .) .Values.database.existingSecret }}
      key: {{ ternary .Values.database.existingSecretKey "database-url" (ne .Values.database.existingSecret "") }}
- name: SPACE_REDIS_ADDRS
  valueFrom:
    secretKeyRef:
      name: {{ default (include "space-api.secretName" .) .Values.redis.existingSecret }}
      key: {{ ternary .Values.redis.existingSecretKey "redis-addrs" (ne .Values.redis.existingSecret "") }}
- name: SPACE_REDIS_TIMEOUT
  value: {{ .Values.redis.timeout | quote }}
- name: SPACE_REDIS_PIPELINE_ABOVE
  value: {{ .Values.redis.pipelineAbove | quote }}
- name: SPACE_REDIS_BATCH_ABOVE
  value: {{ .Values.redis.batchAbove | quote }}
- name: SPACE_REDIS_KEY_PREFIX
  value: {{ .Values.redis.keyPrefix | quote }}
- name: SPACE_REDIS_MODE
  value: {{ .Values.redis.mode | quote }}
{{- with .Values.redis.auth.username }}
- name: SPACE_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if .Values.redis.auth.existingSecret }}
# The password is a file from the mounted Secret, never a value in the pod spec.
- name: SPACE_REDIS_PASSWORD_FILE
  value: /etc/space/redis-auth/password
{{- end }}
- name: SPACE_REDIS_TLS
  value: {{ .Values.redis.tls.enabled | toString | quote }}
{{- with .Values.redis.tls.caFile }}
- name: SPACE_REDIS_TLS_CA_FILE
  value: {{ . | quote }}
{{- end }}
{{- with .Values.redis.tls.serverName }}
- name: SPACE_REDIS_TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
- name: SPACE_AUTH_MODE
  value: {{ .Values.auth.mode | quote }}
{{- with .Values.auth.trustedProxyCIDRs }}
- name: SPACE_TRUSTED_PROXY_CIDRS
  value: {{ join "," . | quote }}
{{- end }}
- name: SPACE_AUTH_FAILURE_REFILL_RPS
  value: {{ include "space-api.number" .Values.auth.failureRefillRps | quote }}
- name: SPACE_AUTH_FAILURE_BURST
  value: {{ int64 .Values.auth.failureBurst | toString | quote }}
- name: SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED
  value: {{ .Values.admission.enabled | toString | quote }}
- name: SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS
  value: {{ include "space-api.number" .Values.admission.refillRps | quote }}
- name: SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST
  value: {{ int64 .Values.admission.burst | toString | quote }}
{{- if not (include "space-api.unset" .Values.admission.clientRefillRps) }}
- name: SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS
  value: {{ include "space-api.number" .Values.admission.clientRefillRps | quote }}
- name: SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST
  value: {{ int64 .Values.admission.clientBurst | toString | quote }}
{{- end }}
- name: SPACE_CLUSTER_ACTIVATION_ADMISSION_FAILURE_MODE
  value: {{ .Values.admission.failureMode | quote }}
- name: SPACE_CLUSTER_ACTIVATION_ADMISSION_SHADOW
  value: {{ .Values.admission.shadow | toString | quote }}
- name: SPACE_REFUSAL_CACHE_MAX_AGE
  value: {{ .Values.admission.refusalCacheMaxAge | quote }}
- name: SPACE_REFUSAL_PACE
  value: {{ .Values.admission.refusalPace | quote }}
{{- if .Values.flags.enabled }}
- name: SPACE_FLAGS_FILE
  value: /etc/space/flags/flags.json
- name: SPACE_FLAGS_POLL_INTERVAL
  value: {{ .Values.flags.pollInterval | quote }}
{{- end }}
{{- with .Values.flags.fallbackTier }}
- name: SPACE_FALLBACK_TIER
  value: {{ . | quote }}
{{- end }}
- name: SPACE_TEMPLATES_FILE
  value: /etc/space/templates/templates.json
- name: SPACE_TEMPLATES_POLL_INTERVAL
  value: {{ .Values.templatesPollInterval | quote }}
- name: SPACE_SUBSTRATE
  value: {{ .Values.substrate | quote }}
{{- with .Values.simulated.coldStart }}
- name: SPACE_SIMULATED_COLD_START
  value: {{ . | quote }}
{{- end }}
{{- with .Values.simulated.timeout }}
- name: SPACE_SIMULATED_TIMEOUT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.simulated.stateDir }}
- name: SPACE_SIMULATED_STATE_DIR
  value: {{ . | quote }}
{{- end }}
- name: SPACE_IDEMPOTENCY_KEY_TTL
  value: {{ .Values.idempotencyKeyTTL | quote }}
- name: SPACE_POOL_REFILL_RESERVE
  value: {{ include "space-api.number" .Values.warmPool.refillReserve | quote }}
- name: SPACE_RECONCILE_INTERVAL
  value: {{ .Values.reconcile.interval | quote }}
- name: SPACE_RECONCILE_GRACE
  value: {{ .Values.reconcile.grace | quote }}
- name: SPACE_LIFECYCLE_INTERVAL
  value: {{ .Values.lifecycle.interval | quote }}
- name: SPACE_METRICS_BUDGET_KEYS
  value: {{ int64 .Values.metrics.budgetKeys | toString | quote }}
- name: SPACE_MAX_IN_FLIGHT
  value: {{ int64 .Values.overload.maxInFlight | toString | quote }}
- name: SPACE_MAX_QUEUED
  value: {{ int64 .Values.overload.maxQueued | toString | quote }}
- name: SPACE_MAX_QUEUED_PER_CLIENT
  value: {{ int64 .Values.overload.maxQueuedPerClient | toString | quote }}
- name: SPACE_MAX_QUEUE_WAIT
  value: {{ .Values.overload.maxQueueWait | quote }}
- name: SPACE_MAX_CONNECTIONS
  value: {{ int64 .Values.overload.maxConnections | toString | quote }}
- name: SPACE_RETENTION_SANDBOXES
  value: {{ .Values.retention.sandboxes | quote }}
- name: SPACE_RETENTION_OPERATIONS
  value: {{ .Values.retention.operations | quote }}
{{- if eq .Values.substrate "kubernetes" }}
- name: SPACE_KUBERNETES_NAMESPACE
  value: {{ include "space-api.sandboxNamespace" . | quote }}
- name: SPACE_KUBERNETES_READY_TIMEOUT
  value: {{ .Values.kubernetes.readyTimeout | quote }}
- name: SPACE_KUBERNETES_CLIENT_QPS
  value: {{ include "space-api.number" .Values.kubernetes.clientQps | quote }}
- name: SPACE_KUBERNETES_CLIENT_BURST
  value: {{ int64 .Values.kubernetes.clientBurst | toString | quote }}
- name: SPACE_KUBERNETES_VOLUME_MOUNT_PATH
  value: {{ .Values.kubernetes.volumeMountPath | quote }}
{{- with .Values.kubernetes.storageClass }}
- name: SPACE_KUBERNETES_STORAGE_CLASS
  value: {{ . | quote }}
{{- end }}
{{- with .Values.kubernetes.volumeSnapshotClass }}
- name: SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS
  value: {{ . | quote }}
{{- end }}
{{- with .Values.kubernetes.softBreachPriorityClass }}
- name: SPACE_KUBERNETES_SOFT_BREACH_PRIORITY_CLASS
  value: {{ . | quote }}
{{- end }}
{{- end }}
- name: SPACE_MAX_CPU_MILLIS
  value: {{ int64 .Values.limits.maxCpuMillis | toString | quote }}
- name: SPACE_MAX_MEMORY_MIB
  value: {{ int64 .Values.limits.maxMemoryMib | toString | quote }}
- name: SPACE_MAX_DISK_GIB
  value: {{ int64 .Values.limits.maxDiskGib | toString | quote }}
- name: SPACE_MAX_BODY_BYTES
  value: {{ int64 .Values.limits.maxBodyBytes | toString | quote }}
- name: SPACE_DISPATCHER_WORKERS
  value: {{ int64 .Values.dispatcher.workers | toString | quote }}
- name: SPACE_DISPATCHER_ADMISSION_DEADLINE
  value: {{ .Values.dispatcher.admissionDeadline | quote }}
- name: SPACE_DISPATCHER_MAX_SNOOZE
  value: {{ .Values.dispatcher.maxSnooze | quote }}
- name: SPACE_DISPATCHER_OWNER_LANES
  value: {{ int64 .Values.dispatcher.ownerLanes | toString | quote }}
- name: SPACE_DISPATCHER_MAX_ATTEMPTS
  value: {{ int64 .Values.dispatcher.maxAttempts | toString | quote }}
{{- with .Values.dispatcher.jobTimeout }}
- name: SPACE_DISPATCHER_JOB_TIMEOUT
  value: {{ . | quote }}
{{- end }}
- name: SPACE_RIVER_UI
  value: {{ .Values.dispatcher.riverUI | quote }}
{{- end }}

{{/*
A number as Go's strconv.ParseFloat reads it. Whole numbers print without an exponent
(1000000, not 1e+06); fractions as they are (0.5).
*/}}
{{- define "space-api.number" -}}
{{- if eq (float64 .) (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ float64 . }}{{ end }}
{{- end }}

{{/*
What the pods read once at start, hashed into the checksum/config annotation so that a
change rolls them: the environment and the chart's Secret. The flags and templates
ConfigMaps are left out on purpose: both are re-read live, and restarting every replica
on a quota or template change would defeat that.
*/}}
{{- define "space-api.configChecksum" -}}
{{- $in := list (include "space-api.env" .) (include "space-api.secretData" .) }}
{{- join "\n---\n" $in | sha256sum }}
{{- end }}

{{- define "space-api.secretData" -}}
{{- if not .Values.database.existingSecret }}
database-url: {{ .Values.database.url | b64enc | quote }}
{{- end }}
{{- if not .Values.redis.existingSecret }}
redis-addrs: {{ join "," .Values.redis.addrs | b64enc | quote }}
{{- end }}
{{- end }}

{{- define "space-api.templatesJSON" -}}
{{- dict "templates" .Values.sandboxTemplates | toPrettyJson }}
{{- end }}

{{/* flagd flag-definition file: static defaultVariant only. */}}
{{- define "space-api.flagsJSON" -}}
{{- $quotas := dict "state" "ENABLED" "defaultVariant" "default" "variants" (dict "default" .Values.flags.quotas) }}
{{- $pool := dict "state" "ENABLED" "defaultVariant" "default" "variants" (dict "default" .Values.flags.warmPool) }}
{{- dict "flags" (dict "space-api-client-concurrency-quotas" $quotas "space-api-warm-pool" $pool) | toPrettyJson }}
{{- end }}

{{/*
Mounts. Both ConfigMaps are mounted as directories, never with subPath: the kubelet
updates a directory mount by swapping its ..data symlink, which the flags provider's
polling sees; a subPath mount would keep the first version forever.
*/}}
{{- define "space-api.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: templates
  mountPath: /etc/space/templates
  readOnly: true
{{- if .Values.flags.enabled }}
- name: flags
  mountPath: /etc/space/flags
  readOnly: true
{{- end }}
{{- if .Values.redis.auth.existingSecret }}
- name: redis-auth
  mountPath: /etc/space/redis-auth
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Probe settings from values, without the chart's own switch. */}}
{{- define "space-api.probe" -}}
{{- toYaml (omit . "enabled") }}
{{- end }}

{{/*
The label matchers that select this release's series, as the ServiceMonitor labels
them (namespace, and the job named after the internal Service), unless
prometheusRule.selector or grafanaDashboard says otherwise.
*/}}
{{- define "space-api.metricSelector" -}}
{{- if .Values.prometheusRule.selector -}}
{{ .Values.prometheusRule.selector }}
{{- else -}}
namespace="{{ .Release.Namespace }}", job="{{ include "space-api.fullname" . }}-internal"
{{- end -}}
{{- end }}
