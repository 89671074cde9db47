package lock

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// FindServer returns a config for NewDirect's lockAPI: the lock apiserver
// that kube's cluster proxies the lock API to, found the way kube-apiserver
// finds it. The APIService (locksv1alpha1.APIServiceName) names its Service and the CA that
// signed its serving certificate; the config reaches the Service's cluster IP
// (an ExternalName's name), checks the certificate against that CA
// for the name <service>.<namespace>.svc, as kube-apiserver does, and carries
// kube's credentials. The caller needs get on that APIService and that
// Service (the chart grants both to every authenticated user).
//
// It fails on a cluster whose lock API is the CRD's (no APIService names a
// Service) and on an APIService that trusts its server without a CA.
func FindServer(ctx context.Context, kube *rest.Config) (*rest.Config, error) {
	c, err := newKubeClient(kube)
	if err != nil {
		return nil, err
	}
	as := &unstructured.Unstructured{}
	as.SetAPIVersion("apiregistration.k8s.io/v1")
	as.SetKind("APIService")
	if err := c.Get(ctx, client.ObjectKey{Name: locksv1alpha1.APIServiceName}, as); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubelock: no APIService %s: the cluster does not serve the lock API", locksv1alpha1.APIServiceName)
		}
		return nil, fmt.Errorf("kubelock: reading the APIService %s to find the lock server: %w", locksv1alpha1.APIServiceName, err)
	}
	ref, err := serviceOf(as)
	if err != nil {
		return nil, err
	}
	svc := &corev1.Service{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ref.namespace, Name: ref.name}, svc); err != nil {
		return nil, fmt.Errorf("kubelock: reading the lock server's Service %s/%s: %w", ref.namespace, ref.name, err)
	}
	return lockServerConfig(kube, ref, svc)
}

// apiServiceRef is what an APIService says of its server.
type apiServiceRef struct {
	namespace, name string
	port            int64
	caBundle        []byte
}

// serviceOf reads the server an APIService names, refusing one without a
// Service (served by kube-apiserver itself) or without a CA to trust.
func serviceOf(as *unstructured.Unstructured) (apiServiceRef, error) {
	spec, _, _ := unstructured.NestedMap(as.Object, "spec")
	svc, _, _ := unstructured.NestedMap(spec, "service")
	name, _, _ := unstructured.NestedString(svc, "name")
	if name == "" {
		return apiServiceRef{}, fmt.Errorf("kubelock: the APIService %s names no Service: kube-apiserver serves the lock API itself (the CRD backend), there is no lock server of its own", as.GetName())
	}
	ref := apiServiceRef{name: name, port: 443}
	ref.namespace, _, _ = unstructured.NestedString(svc, "namespace")
	if p, ok, err := unstructured.NestedInt64(svc, "port"); err != nil {
		return apiServiceRef{}, fmt.Errorf("kubelock: the APIService %s: %w", as.GetName(), err)
	} else if ok {
		ref.port = p
	}
	if skip, _, _ := unstructured.NestedBool(spec, "insecureSkipTLSVerify"); skip {
		return apiServiceRef{}, fmt.Errorf("kubelock: the APIService %s skips TLS verification, so it names no CA to trust its server with; give the lock server's URL and CA instead", as.GetName())
	}
	bundle, _, _ := unstructured.NestedString(spec, "caBundle")
	ca, err := base64.StdEncoding.DecodeString(bundle)
	switch {
	case err != nil:
		return apiServiceRef{}, fmt.Errorf("kubelock: the APIService %s has a caBundle that is not base64: %w", as.GetName(), err)
	case len(ca) == 0:
		return apiServiceRef{}, fmt.Errorf("kubelock: the APIService %s has no caBundle yet to trust the lock server with (cert-manager or the operator fills it once the serving certificate exists)", as.GetName())
	}
	ref.caBundle = ca
	return ref, nil
}

// lockServerConfig is kube's user at the Service ref names, reached where
// kube-apiserver reaches it (its ResolveCluster): an ExternalName's name, or
// else the cluster IP on one of the Service's ports (a headless Service it
// refuses, and so does this). The certificate is checked for the Service's
// DNS name against ref's CA and nothing else.
func lockServerConfig(kube *rest.Config, ref apiServiceRef, svc *corev1.Service) (*rest.Config, error) {
	dnsName := ref.name + "." + ref.namespace + ".svc"
	var host string
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		host = svc.Spec.ExternalName
	case svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return nil, fmt.Errorf("kubelock: the lock server's Service %s/%s is headless: kube-apiserver cannot reach it either", ref.namespace, ref.name)
	case !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return int64(p.Port) == ref.port }):
		return nil, fmt.Errorf("kubelock: the lock server's Service %s/%s has no port %d, which the APIService %s names", ref.namespace, ref.name, ref.port, locksv1alpha1.APIServiceName)
	default:
		host = svc.Spec.ClusterIP
	}
	d := rest.CopyConfig(kube)
	d.Host, d.APIPath = "https://"+net.JoinHostPort(host, strconv.FormatInt(ref.port, 10)), ""
	// The kubeconfig's trust (its CA, or insecure-skip-tls-verify) is
	// kube-apiserver's, never the lock server's.
	d.CAFile, d.CAData, d.ServerName, d.Insecure = "", ref.caBundle, dnsName, false
	return d, nil
}
