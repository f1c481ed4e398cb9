{{/* The release name, or RELEASE-rewind when it does not already say
rewind (helm's usual fullname): `helm install rewind` names the
coordinator rewind-coordinator, not rewind-rewind-coordinator. */}}
{{- define "rewind.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rewind.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "rewind.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rewind.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rewind.prometheus" -}}
{{- if .root.Values.prometheus.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- if .root.Values.tls.enabled }}
prometheus.io/scheme: https
{{- end }}
{{- end }}
{{- end -}}

{{/*
The transport flags of a daemon: its certificate directory with TLS on,
--insecure with it off. Takes the root context.
*/}}
{{- define "rewind.tlsArgs" -}}
{{- if .Values.tls.enabled -}}
- --tls-dir=/etc/rewind/tls
- --tls-trust-domain={{ .Values.tls.trustDomain }}
{{- else -}}
- --insecure
{{- end -}}
{{- end -}}

{{/*
The certificate volume of a daemon: dict "root" . "secret" NAME.
*/}}
{{- define "rewind.tlsVolume" -}}
{{- if .root.Values.tls.enabled -}}
- name: tls
  secret: {secretName: {{ .secret }}, defaultMode: 0440}
{{- end -}}
{{- end -}}

{{/*
The mount of the certificate volume (not a subPath: a subPath mount
never sees the Secret's renewals).
*/}}
{{- define "rewind.tlsMount" -}}
{{- if .Values.tls.enabled -}}
- {name: tls, mountPath: /etc/rewind/tls, readOnly: true}
{{- end -}}
{{- end -}}

{{/*
Gossip encryption: the flag, volume and mount of gossip.keysSecret (none
when it is empty: then a daemon reads gossip.keys from its TLS Secret
when that holds one).
*/}}
{{- define "rewind.gossipArgs" -}}
{{- if .Values.gossip.keysSecret -}}
- --gossip-keys=/etc/rewind/gossip/gossip.keys
{{- end -}}
{{- end -}}

{{- define "rewind.gossipVolume" -}}
{{- if .Values.gossip.keysSecret -}}
- name: gossip-keys
  secret: {secretName: {{ .Values.gossip.keysSecret }}, defaultMode: 0440}
{{- end -}}
{{- end -}}

{{- define "rewind.gossipMount" -}}
{{- if .Values.gossip.keysSecret -}}
- {name: gossip-keys, mountPath: /etc/rewind/gossip, readOnly: true}
{{- end -}}
{{- end -}}

{{/*
Node enrollment (tls.enroll): the agent's TLS directory is its own
(memory-backed, written by the agent), and the projected volume holds its
token for the enrollment audience and the CA bundle the coordinator
publishes. enrollAgent is true when agents enroll.
*/}}
{{- define "rewind.enrollAgent" -}}
{{- if and .Values.tls.enabled .Values.tls.enroll.enabled -}}true{{- end -}}
{{- end -}}

{{- define "rewind.enrollAgentArgs" -}}
- --tls-dir=/var/run/rewind/tls
- --tls-trust-domain={{ .Values.tls.trustDomain }}
- --enroll-token=/var/run/rewind/enroll/token
- --enroll-ca=/var/run/rewind/enroll/ca.crt
{{- end -}}

{{- define "rewind.enrollAgentVolumes" -}}
- name: tls
  emptyDir: {medium: Memory, sizeLimit: 1Mi}
- name: enroll
  projected:
    defaultMode: 0440
    sources:
      - serviceAccountToken: {audience: {{ .Values.tls.enroll.audience }}, expirationSeconds: 3600, path: token}
      - configMap: {name: {{ .Values.tls.enroll.caBundleConfigMap }}, items: [{key: ca.crt, path: ca.crt}]}
{{- end -}}

{{- define "rewind.enrollAgentMounts" -}}
- {name: tls, mountPath: /var/run/rewind/tls}
- {name: enroll, mountPath: /var/run/rewind/enroll, readOnly: true}
{{- end -}}

{{- define "rewind.enrollCoordinatorArgs" -}}
{{- if include "rewind.enrollAgent" . -}}
- --enroll-ca=/etc/rewind/enroll-ca
- --enroll-service-account={{ .Release.Namespace }}/{{ include "rewind.fullname" . }}-agent
- --enroll-audience={{ .Values.tls.enroll.audience }}
- --enroll-validity={{ .Values.tls.enroll.validity }}
- --enroll-ca-configmap={{ .Values.tls.enroll.caBundleConfigMap }}
{{- end -}}
{{- end -}}
