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
"true" when the operator serves its webhook: for the lock rules (admission
engine webhook), and for fenced objects with either engine.
*/}}
{{- define "kubelock.webhookServer" -}}
{{- if or (eq .Values.admission.engine "webhook") .Values.fencedObjects.enable -}}
true
{{- end -}}
{{- end }}

{{/*
The ValidatingWebhookConfiguration whose caBundle the operator keeps current
(--webhook-config-name): the lock rules', or the fenced objects' when the
policy engine replaces the lock webhook.
*/}}
{{- define "kubelock.webhookConfigName" -}}
{{- if eq .Values.admission.engine "webhook" -}}
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
