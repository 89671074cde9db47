package lock

import (
	"encoding/base64"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

func TestLockServerFromTheAPIService(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	kube := &rest.Config{Host: "https://10.0.0.1:6443", BearerToken: "the user's token",
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte("kube-apiserver's CA"), ServerName: "kubernetes", Insecure: true}}
	service := map[string]any{"namespace": "kubelock-system", "name": "kubelock-apiserver", "port": int64(8443)}
	bundle := base64.StdEncoding.EncodeToString(ca)
	ports := func(ps ...int32) []corev1.ServicePort {
		var out []corev1.ServicePort
		for _, p := range ps {
			out = append(out, corev1.ServicePort{Port: p})
		}
		return out
	}
	clusterIP := &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", Ports: ports(9090, 8443)}}

	for _, tc := range []struct {
		name    string
		spec    map[string]any
		svc     *corev1.Service
		host    string
		wantErr string // of the APIService
		svcErr  string // of the Service
	}{
		{name: "the Service's cluster IP", spec: map[string]any{"service": service, "caBundle": bundle},
			svc: clusterIP, host: "https://10.96.0.20:8443"},
		{name: "port 443 when the APIService names none",
			spec: map[string]any{"service": map[string]any{"namespace": "kubelock-system", "name": "kubelock-apiserver"}, "caBundle": bundle},
			svc:  &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", Ports: ports(443)}}, host: "https://10.96.0.20:443"},
		{name: "an IPv6 cluster IP", spec: map[string]any{"service": service, "caBundle": bundle},
			svc: &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "fd00::20", Ports: ports(8443)}}, host: "https://[fd00::20]:8443"},
		{name: "a Service without the APIService's port", spec: map[string]any{"service": service, "caBundle": bundle},
			svc: &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", Ports: ports(443)}}, svcErr: "has no port 8443"},
		{name: "a headless Service, which kube-apiserver cannot reach either", spec: map[string]any{"service": service, "caBundle": bundle},
			svc: &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: ports(8443)}}, svcErr: "is headless"},
		{name: "an ExternalName Service by its external name", spec: map[string]any{"service": service, "caBundle": bundle},
			svc:  &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "locks.example.com"}},
			host: "https://locks.example.com:8443"},
		{name: "no Service: kube-apiserver serves the lock API (the CRD)", spec: map[string]any{},
			wantErr: "names no Service"},
		{name: "TLS verification skipped", spec: map[string]any{"service": service, "insecureSkipTLSVerify": true},
			wantErr: "skips TLS verification"},
		{name: "no caBundle yet", spec: map[string]any{"service": service},
			wantErr: "has no caBundle"},
		{name: "a caBundle that is not base64", spec: map[string]any{"service": service, "caBundle": "%%%"},
			wantErr: "not base64"},
		{name: "a port that is not a number", spec: map[string]any{"service": map[string]any{"namespace": "kubelock-system", "name": "kubelock-apiserver", "port": "443"}, "caBundle": bundle},
			wantErr: "port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			as := &unstructured.Unstructured{Object: map[string]any{"spec": tc.spec}}
			as.SetName(locksv1alpha1.APIServiceName)
			ref, err := serviceOf(as)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), locksv1alpha1.APIServiceName) {
					t.Fatalf("error %v, want one naming %s that says %q", err, locksv1alpha1.APIServiceName, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := lockServerConfig(kube, ref, tc.svc)
			if tc.svcErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.svcErr) || !strings.Contains(err.Error(), "kubelock-system/kubelock-apiserver") {
					t.Fatalf("error %v, want one naming the Service that says %q", err, tc.svcErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Host != tc.host || got.APIPath != "" {
				t.Errorf("host %q, path %q, want %q", got.Host, got.APIPath, tc.host)
			}
			// Only the APIService's CA, for the name kube-apiserver checks.
			if string(got.CAData) != string(ca) || got.CAFile != "" || got.Insecure || got.ServerName != "kubelock-apiserver.kubelock-system.svc" {
				t.Errorf("trust: CA %q, file %q, insecure %v, server name %q; want the APIService's CA for kubelock-apiserver.kubelock-system.svc",
					got.CAData, got.CAFile, got.Insecure, got.ServerName)
			}
			if got.BearerToken != kube.BearerToken {
				t.Errorf("credentials: token %q, want the user's", got.BearerToken)
			}
			if kube.Host != "https://10.0.0.1:6443" || string(kube.CAData) != "kube-apiserver's CA" {
				t.Error("the user's config was changed")
			}
		})
	}
}
