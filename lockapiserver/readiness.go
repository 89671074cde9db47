package lockapiserver

import (
	"bytes"
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// A replica joins the Service (and kube-apiserver's aggregator routes to it)
// once its /readyz passes. These post-start hooks hold /readyz until the
// replica can serve what it is sent as the client who sent it:
//
//   - storage-readiness: the watch caches hold every lock and session. Until
//     then the lists and watches of the controller and of waiters go to etcd
//     or are refused.
//   - authentication-ca: the CAs clients are checked against are loaded.
//     k8s.io/apiserver reads them from kube-system's
//     extension-apiserver-authentication ConfigMap through an informer that
//     fills a moment after the server listens; until then the front proxy's
//     certificate (every request kube-apiserver forwards) and a direct
//     client's are not recognised, the request is anonymous, and the lock
//     user gets a 403 it would take as final.
//
// Each gives up after timeout, as kube-apiserver's storage-readiness does, so
// a store or a ConfigMap that never answers shows in the logs rather than as
// a replica that never serves.
const (
	storageReadinessHook     = "storage-readiness"
	authenticationCAHook     = "authentication-ca"
	authenticationConfigMap  = "extension-apiserver-authentication"
	clientCAKey              = "client-ca-file"
	requestHeaderClientCAKey = "requestheader-client-ca-file"
)

// addReadinessHooks adds both hooks to s, built from cfg.
func addReadinessHooks(s *genericapiserver.GenericAPIServer, cfg *genericapiserver.RecommendedConfig) error {
	if err := s.AddPostStartHook(storageReadinessHook, s.StorageReadinessHook.Hook); err != nil {
		return err
	}
	if cfg.ClientConfig == nil || cfg.SecureServing == nil || cfg.SecureServing.ClientCA == nil {
		return nil // no client certificates are checked
	}
	kube, err := kubernetes.NewForConfig(cfg.ClientConfig)
	if err != nil {
		return err
	}
	var requestHeaderCA dynamiccertificates.CAContentProvider
	if rh := cfg.Authentication.RequestHeaderConfig; rh != nil {
		requestHeaderCA = rh.CAContentProvider
	}
	cas := authenticationCAs{kube: kube, serving: cfg.SecureServing.ClientCA, requestHeader: requestHeaderCA}
	return s.AddPostStartHook(authenticationCAHook, func(ctx genericapiserver.PostStartHookContext) error {
		return cas.wait(ctx, time.Minute)
	})
}

// authenticationCAs are the CA bundles this server checks client
// certificates against: serving is every one (the direct clients' CA then
// the front proxy's, joined), requestHeader the front proxy's (nil when
// there is none).
type authenticationCAs struct {
	kube          kubernetes.Interface
	serving       dynamiccertificates.CAContentProvider
	requestHeader dynamiccertificates.CAContentProvider
}

// wait returns once every CA the cluster publishes is loaded, or after
// timeout (logged).
func (a authenticationCAs) wait(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		last = a.check(ctx)
		return last == nil, nil // not loaded yet, or the ConfigMap not read: poll on
	})
	if err != nil {
		klog.ErrorS(last, "giving up waiting for the authentication CAs; requests whose certificates they sign are anonymous until they load", "configMap", metav1.NamespaceSystem+"/"+authenticationConfigMap)
	}
	return nil
}

// check reads the ConfigMap and says which CA it publishes is not loaded yet.
func (a authenticationCAs) check(ctx context.Context) error {
	cm, err := a.kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, authenticationConfigMap, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return a.loaded(cm.Data)
}

// loaded says which CA the ConfigMap's data publishes that is not loaded
// yet. The serving bundle joins the direct clients' CA and the front
// proxy's, trimmed: it holds the former once it is longer than the latter.
func (a authenticationCAs) loaded(data map[string]string) error {
	front := 0
	if a.requestHeader != nil {
		front = len(bytes.TrimSpace(a.requestHeader.CurrentCABundleContent()))
		if front == 0 && len(bytes.TrimSpace([]byte(data[requestHeaderClientCAKey]))) > 0 {
			return errors.New("the front proxy's CA (" + requestHeaderClientCAKey + ") is not loaded yet")
		}
	}
	if len(bytes.TrimSpace([]byte(data[clientCAKey]))) > 0 && len(a.serving.CurrentCABundleContent()) <= front {
		return errors.New("the clients' CA (" + clientCAKey + ") is not loaded yet")
	}
	return nil
}
