{{/*
The operator's namespace: namespace.name, or the release's namespace (helm -n)
when it is empty.
*/}}
{{- define "kubelock.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end }}

{{/*
The labels the chart adds to every object, next to config/'s own
(app.kubernetes.io/name, component and part-of), which selectors use.
*/}}
{{- define "kubelock.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | trunc 63 | trimSuffix "-" | quote }}
{{- end }}
{{- end }}

{{/*
"true" when the lock webhook enforces the rules: the CRD backend with the
webhook engine (kubelock-apiserver runs them in-process).
*/}}
{{- define "kubelock.lockWebhook" -}}
{{- if and (eq .Values.backend "crd") (eq .Values.admission.engine "webhook") -}}
true
{{- end -}}
{{- end }}

{{/*
"true" when the operator serves its webhook: for the lock rules (see
kubelock.lockWebhook), and for fenced objects with either engine or backend.
*/}}
{{- define "kubelock.webhookServer" -}}
{{- if or (include "kubelock.lockWebhook" .) .Values.fencedObjects.enable -}}
true
{{- end -}}
{{- end }}

{{/* "true" with the apiserver backend (templates/apiserver). */}}
{{- define "kubelock.apiserverBackend" -}}
{{- if eq .Values.backend "apiserver" -}}
true
{{- end -}}
{{- end }}

{{/*
The ValidatingWebhookConfiguration whose caBundle the operator keeps current
(--webhook-config-name): the lock rules', or the fenced objects' when the
policy engine or kubelock-apiserver replaces the lock webhook.
*/}}
{{- define "kubelock.webhookConfigName" -}}
{{- if include "kubelock.lockWebhook" . -}}
kubelock-validating-webhook-configuration
{{- else -}}
kubelock-fenced-objects
{{- end -}}
{{- end }}

{{/* Annotations of the CRDs: Helm keeps them on uninstall (crd.keep). */}}
{{- define "kubelock.crdAnnotations" -}}
{{- if .Values.crd.keep }}
helm.sh/resource-policy: keep
{{- end }}
{{- end }}

{{/*
Annotations of the lock ValidatingWebhookConfiguration: with cert-manager,
its CA injector fills the caBundle (config/certmanager).
*/}}
{{- define "kubelock.webhookAnnotations" -}}
{{- if .Values.certManager.enable }}
annotations:
  cert-manager.io/inject-ca-from: {{ include "kubelock.namespace" . }}/kubelock-serving-cert
{{- end }}
{{- end }}

{{/*
kubelock-apiserver's --etcd-servers: every member by its DNS name, or without
cluster DNS the ClusterIP of kubelock-etcd-client, from the environment the
kubelet gives pods.
*/}}
{{- define "kubelock.etcdServers" -}}
{{- if .Values.etcd.clusterDNS -}}
{{- $ns := include "kubelock.namespace" . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $members = append $members (printf "http://kubelock-etcd-%d.kubelock-etcd.%s.svc:2379" $i $ns) -}}
{{- end -}}
{{- join "," $members -}}
{{- else -}}
http://$(KUBELOCK_ETCD_CLIENT_SERVICE_HOST):2379
{{- end -}}
{{- end }}
