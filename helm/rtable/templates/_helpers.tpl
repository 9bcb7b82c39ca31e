{{/* The chart's name, cut to 63 characters (a label value's limit). */}}
{{- define "rtable.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name, for every object the chart makes; 63 characters at most (DNS label).
A release whose name already contains the chart's name is not repeated ("rtable", not
"rtable-rtable").
*/}}
{{- define "rtable.fullname" -}}
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

{{- define "rtable.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels every object carries (Kubernetes' recommended app.kubernetes.io set). */}}
{{- define "rtable.labels" -}}
helm.sh/chart: {{ include "rtable.chart" . }}
{{ include "rtable.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rtable
{{- end }}

{{/*
What the Deployment and the Service select the operator pods by. component=operator keeps them
apart from the replica pods, which the operator labels name=rtable, component=replica.
*/}}
{{- define "rtable.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rtable.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rtable.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rtable.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rtable.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "rtable.coreImage" -}}
{{- printf "%s:%s" .Values.coreImage.repository (.Values.coreImage.tag | default .Chart.AppVersion) }}
{{- end }}
