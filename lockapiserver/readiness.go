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
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
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
//     extension-apiserver-authentication ConfigMap through informers that
//     fill a moment after the server listens; until then the front proxy's
//     certificate (every request kube-apiserver forwards) and a direct
//     client's are not recognised, the request is anonymous, and the lock
//     user gets a 403 it would take as final.
//
// Each gives up after readinessTimeout, as kube-apiserver's
// storage-readiness does, so a store or a ConfigMap that never answers shows
// in the logs rather than as a replica that never serves.
const (
	readinessTimeout         = time.Minute
	storageReadinessHook     = "storage-readiness"
	authenticationCAHook     = "authentication-ca"
	authenticationConfigMap  = "extension-apiserver-authentication"
	clientCAKey              = "client-ca-file"
	requestHeaderClientCAKey = "requestheader-client-ca-file"
)

// addReadinessHooks adds both hooks to s, built from cfg as authn says.
func addReadinessHooks(s *genericapiserver.GenericAPIServer, cfg *genericapiserver.RecommendedConfig, authn *genericoptions.DelegatingAuthenticationOptions) error {
	if err := s.AddPostStartHook(storageReadinessHook, s.StorageReadinessHook.Hook); err != nil {
		return err
	}
	cas, err := newAuthenticationCAs(cfg, authn)
	if err != nil || cas == nil {
		return err
	}
	return s.AddPostStartHook(authenticationCAHook, func(ctx genericapiserver.PostStartHookContext) error {
		cas.wait(ctx)
		return nil
	})
}

// authenticationCAs are the CA bundles this server checks client
// certificates against that it loads from the ConfigMap: serving holds
// every one (the clients' CA, then the front proxy's, joined), requestHeader
// the front proxy's (nil when there is none).
type authenticationCAs struct {
	kube          kubernetes.Interface
	serving       dynamiccertificates.CAContentProvider
	requestHeader dynamiccertificates.CAContentProvider
	// clientCA and frontProxy say which of the ConfigMap's CAs the server
	// loads (not the ones given as files, or none with
	// --authentication-skip-lookup).
	clientCA, frontProxy bool
}

// newAuthenticationCAs is nil when the server loads no CA from the
// ConfigMap. It reads the ConfigMap as the authenticator does, with the
// authentication kubeconfig or in-cluster.
func newAuthenticationCAs(cfg *genericapiserver.RecommendedConfig, authn *genericoptions.DelegatingAuthenticationOptions) (*authenticationCAs, error) {
	if authn == nil || authn.SkipInClusterLookup || cfg.SecureServing == nil || cfg.SecureServing.ClientCA == nil {
		return nil, nil
	}
	a := &authenticationCAs{
		serving:    cfg.SecureServing.ClientCA,
		clientCA:   authn.ClientCert == (genericoptions.ClientCertAuthenticationOptions{}),
		frontProxy: authn.RequestHeader.ClientCAFile == "",
	}
	if rh := cfg.Authentication.RequestHeaderConfig; rh != nil {
		a.requestHeader = rh.CAContentProvider
	}
	if !a.clientCA && !a.frontProxy {
		return nil, nil
	}
	var kc *rest.Config
	var err error
	if authn.RemoteKubeConfigFile != "" {
		kc, err = clientcmd.BuildConfigFromFlags("", authn.RemoteKubeConfigFile)
	} else {
		kc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	if a.kube, err = kubernetes.NewForConfig(kc); err != nil {
		return nil, err
	}
	return a, nil
}

// wait returns once every CA the ConfigMap publishes that the server loads
// from it is loaded, or after readinessTimeout (logged).
func (a *authenticationCAs) wait(ctx context.Context) {
	deadline, cancel := context.WithTimeout(ctx, readinessTimeout)
	defer cancel()
	var data map[string]string
	var last error
	// Read the ConfigMap once (again each second while that fails), then
	// watch the providers take in what it says.
	err := wait.PollUntilContextCancel(deadline, time.Second, true, func(ctx context.Context) (bool, error) {
		data, last = a.published(ctx)
		return last == nil, nil // not read yet: poll on
	})
	if err == nil {
		err = wait.PollUntilContextCancel(deadline, 100*time.Millisecond, true, func(context.Context) (bool, error) {
			last = a.loaded(data)
			return last == nil, nil
		})
	}
	if err != nil && ctx.Err() == nil {
		klog.ErrorS(last, "gave up waiting for the authentication CAs; requests whose certificates they sign are anonymous until they load",
			"configMap", metav1.NamespaceSystem+"/"+authenticationConfigMap, "timeout", readinessTimeout)
	}
}

// published is the ConfigMap's data.
func (a *authenticationCAs) published(ctx context.Context) (map[string]string, error) {
	cm, err := a.kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, authenticationConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return cm.Data, nil
}

// loaded says which CA of the ConfigMap's data, of those the server loads
// from it, is not in its providers yet. The serving bundle is the clients'
// CA then the front proxy's, each trimmed, joined by a newline.
func (a *authenticationCAs) loaded(data map[string]string) error {
	var front []byte
	if a.requestHeader != nil {
		front = bytes.TrimSpace(a.requestHeader.CurrentCABundleContent())
	}
	if want := bytes.TrimSpace([]byte(data[requestHeaderClientCAKey])); a.frontProxy && a.requestHeader != nil && len(want) > 0 && !bytes.Contains(front, want) {
		return errors.New("the front proxy's CA (" + requestHeaderClientCAKey + ") is not loaded yet")
	}
	if want := bytes.TrimSpace([]byte(data[clientCAKey])); a.clientCA && len(want) > 0 {
		clients := bytes.TrimSpace(a.serving.CurrentCABundleContent())
		if a.requestHeader != nil {
			clients = bytes.TrimSuffix(clients, front)
		}
		if !bytes.Contains(clients, want) {
			return errors.New("the clients' CA (" + clientCAKey + ") is not loaded yet")
		}
	}
	return nil
}
