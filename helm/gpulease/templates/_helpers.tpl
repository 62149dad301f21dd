{{/* Names of the chart's objects: <release>-<part>. */}}
{{- define "gpulease.name" -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" .root.Release.Name) -}}
{{- fail (printf "release name %q: it names Services and a Namespace, so it must be lower-case letters, digits and '-', starting with a letter (no dots)" .root.Release.Name) -}}
{{- end -}}
{{- printf "%s-%s" .root.Release.Name .part | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The namespace of the users' servers. */}}
{{- define "gpulease.usersNamespace" -}}
{{- .Values.singleuser.namespace | default (printf "%s-users" .Release.Name) -}}
{{- end -}}

{{/* Labels of every object; `component` says which part it is. */}}
{{- define "gpulease.labels" -}}
app.kubernetes.io/name: gpulease
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* What a part's pods are selected by (never changes across upgrades). */}}
{{- define "gpulease.selector" -}}
app.kubernetes.io/name: gpulease
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* A container's security context under PodSecurity `restricted`. */}}
{{- define "gpulease.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The MIG resources the profiles use, under the mixed strategy, sorted
     (spawners/kube/scheduler_config.py gpu_resources; tests compare the two). */}}
{{- define "gpulease.migResources" -}}
{{- $names := list -}}
{{- if eq .Values.gpu.migStrategy "mixed" -}}
{{- range .Values.profiles -}}
{{- with .gpu -}}{{- with .mig -}}{{- $names = append $names (printf "nvidia.com/mig-%s" .) -}}{{- end -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* A Secret's value kept across upgrades: the one stored, else a new one. */}}
{{- define "gpulease.kept" -}}
{{- $stored := lookup "v1" "Secret" .root.Release.Namespace (include "gpulease.name" (dict "root" .root "part" "hub")) -}}
{{- if and $stored $stored.data (hasKey $stored.data .key) -}}
{{- index $stored.data .key -}}
{{- else -}}
{{- .new | b64enc -}}
{{- end -}}
{{- end -}}

{{/* A cluster-wide object's name from parts that may be long: as it is up to `max`
     characters, else cut and ended with a hash of the whole, so that two long
     release/namespace pairs never share a ClusterRole or its binding. */}}
{{- define "gpulease.clusterName" -}}
{{- if le (len .name) (int .max) -}}{{ .name }}{{- else -}}
{{- printf "%s-%s" (trunc (sub (int .max) 9 | int) .name | trimSuffix "-") (sha256sum .name | trunc 8) -}}
{{- end -}}
{{- end -}}

{{/* A tier's PriorityClass name (tier: on-demand | spot): cluster-wide, per release and
     namespace. priorityclasses.yaml makes them, the hub's configuration names them. */}}
{{- define "gpulease.priorityClass" -}}
{{- $hub := include "gpulease.name" (dict "root" .root "part" "hub") -}}
{{- include "gpulease.clusterName" (dict "name" (printf "%s-%s-%s" $hub .root.Release.Namespace .tier) "max" 63) -}}
{{- end -}}

{{/* Where researchers reach the hub: the first Ingress host (https with
     ingress.tlsSecret) and the base URL; "" without an Ingress. */}}
{{- define "gpulease.publicUrl" -}}
{{- if .Values.ingress.tls -}}
{{- fail "ingress.tls is replaced by ingress.tlsSecret: the name of the Secret of a certificate for the hosts and their wildcard (gpu.lab.example.org and *.gpu.lab.example.org), which the chart puts in the Ingress's TLS block for both" -}}
{{- end -}}
{{- if and .Values.ingress.enabled .Values.ingress.hosts -}}
{{- printf "%s://%s%s" (ternary "https" "http" (ne .Values.ingress.tlsSecret "")) (first .Values.ingress.hosts) .Values.hub.baseUrl -}}
{{- end -}}
{{- end -}}

{{/* JupyterHub.subdomain_host: each user's servers at USER.<domain>, the gpulease
     service at gpulease--service.<domain> (gpulease.hub.web.origins). hub.subdomainHost, else
     the first Ingress host's origin; "" only with hub.allowSharedOrigin; else refused. */}}
{{- define "gpulease.subdomainHost" -}}
{{- $hub := .Values.hub -}}
{{- if and $hub.subdomainHost $hub.allowSharedOrigin -}}
{{- fail (printf "hub.subdomainHost (%s) and hub.allowSharedOrigin: set one. The first serves each user's servers on an origin of their own, the second on the hub's origin shared by all" $hub.subdomainHost) -}}
{{- else if $hub.subdomainHost -}}
{{- trimSuffix "/" $hub.subdomainHost -}}
{{- else if not $hub.allowSharedOrigin -}}
{{- $public := include "gpulease.publicUrl" . -}}
{{- if not $public -}}
{{- fail "no domain for the users' servers: gpulease serves each user's servers on an origin of their own, USER.<domain>, and nothing says the domain. Set ingress.enabled with ingress.hosts (e.g. [gpu.lab.example.org], and ingress.tlsSecret: a certificate for it and *.gpu.lab.example.org), or hub.subdomainHost (e.g. https://gpu.lab.example.org, with a wildcard DNS record *.gpu.lab.example.org; http://localhost:8000 to try the hub through kubectl port-forward); or, only for users who all trust each other, hub.allowSharedOrigin: true (docs/cluster.md, \"Origins\")" -}}
{{- end -}}
{{- $parts := urlParse $public -}}
{{- printf "%s://%s" $parts.scheme $parts.host -}}
{{- end -}}
{{- end -}}

{{/* The Ingress's hosts as a JSON list: ingress.hosts and the wildcard of the subdomain
     host, where the users' servers and the gpulease service are. */}}
{{- define "gpulease.ingressHosts" -}}
{{- $hosts := .Values.ingress.hosts -}}
{{- $subdomainHost := include "gpulease.subdomainHost" . -}}
{{- if $subdomainHost -}}
{{- $hosts = append $hosts (printf "*.%s" (regexReplaceAll ":[0-9]+$" (urlParse $subdomainHost).host "")) -}}
{{- end -}}
{{- $hosts | uniq | toJson -}}
{{- end -}}
