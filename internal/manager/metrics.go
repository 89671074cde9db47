package manager

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Metrics are served over HTTPS to callers the apiserver authenticates (a
// bearer token, TokenReview) and authorizes (get on the non-resource URL
// /metrics, SubjectAccessReview): config/rbac's kubelock-metrics-reader
// ClusterRole grants that, config/prometheus scrapes with it.
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// metricsOptions configures controller-runtime's metrics server from o.
func metricsOptions(o Options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.MetricsAddr}
	if !o.MetricsSecure {
		return m
	}
	m.SecureServing = true
	m.FilterProvider = filters.WithAuthenticationAndAuthorization
	m.CertDir = o.MetricsCertDir
	m.TLSOpts = []func(*tls.Config){func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS12
		// HTTP/1.1 only: no exposure to HTTP/2 stream-reset floods
		// (CVE-2023-44487) on an endpoint any pod can reach.
		c.NextProtos = []string{"http/1.1"}
	}}
	return m
}
