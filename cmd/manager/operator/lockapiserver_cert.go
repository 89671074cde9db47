package operator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// With the apiserver backend the chart's hand-written RBAC (not config/'s:
// config/ deploys the CRD backend) lets the operator read and write the
// Secret --lock-apiserver-cert-secret-name and the lock API's APIService.

// LockAPIServiceName is the APIService that registers kubelock-apiserver:
// the lock API's group version.
const LockAPIServiceName = locksv1alpha1.APIServiceName

// DefaultLockAPIServerCertDir is where the operator keeps its copy of the
// lock apiserver's rotated certificate (the rotator checks that the files it
// issues reach a folder): an emptyDir in the Deployment.
func DefaultLockAPIServerCertDir() string {
	return filepath.Join(os.TempDir(), "kubelock-apiserver", "serving-certs")
}

// lockAPIServerDNSNames are the names kube-apiserver reaches the lock
// apiserver's Service by.
func (o *Options) lockAPIServerDNSNames() []string {
	svc, ns := o.LockAPIServerServiceName, o.CertSecretNamespace
	return []string{svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local", svc + "." + ns}
}

// lockAPIServerBackend starts the lock apiserver's certificate rotation (with
// CertRotation) and waits until kube-apiserver serves the lock API. The
// returned context ends with ctx, or when the rotation stops.
func lockAPIServerBackend(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, o Options, log logr.Logger) (context.Context, error) {
	if o.CertRotation {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		done, err := startLockAPIServerCert(ctx, cfg, scheme, o)
		if err != nil {
			cancel(nil)
			return nil, fmt.Errorf("setting up the lock apiserver's certificate rotation: %w", err)
		}
		go func() {
			err := <-done
			cancel(fmt.Errorf("the lock apiserver's certificate rotation stopped: %w", err))
		}()
	}
	return ctx, waitForLockAPI(ctx, cfg, log)
}

// startLockAPIServerCert runs the lock apiserver's certificate rotation in a
// manager of its own, started at once: the operator's controllers need the
// lock API, which kube-apiserver serves only once kubelock-apiserver has
// this certificate and the APIService its CA. The returned channel receives
// the manager's end.
func startLockAPIServerCert(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, o Options) (<-chan error, error) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return nil, err
	}
	if err := setupLockAPIServerCert(mgr, o); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return done, nil
}

// waitForLockAPI returns once kube-apiserver serves the lock API, logging
// while it does not (kubelock-apiserver starting, or its APIService not yet
// available).
func waitForLockAPI(ctx context.Context, cfg *rest.Config, log logr.Logger) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	gv := locksv1alpha1.GroupVersion.String()
	var last error
	logged := time.Time{}
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		if _, last = dc.ServerResourcesForGroupVersion(gv); last == nil {
			return true, nil
		}
		if time.Since(logged) > 30*time.Second {
			log.Info("waiting for kube-apiserver to serve the lock API from kubelock-apiserver", "groupVersion", gv, "apiService", LockAPIServiceName, "error", last.Error())
			logged = time.Now()
		}
		return false, nil
	})
	if err != nil {
		// The cause: a stop (context.Canceled) or the certificate rotation's end.
		return fmt.Errorf("waiting for %s: %w", gv, errors.Join(context.Cause(ctx), last))
	}
	return nil
}

// setupLockAPIServerCert issues and rotates kubelock-apiserver's serving
// certificate as the webhook's, in a Secret of its own that the lock
// apiserver's pods mount, and keeps the APIService's caBundle current, so
// that kube-apiserver trusts the server it proxies the lock API to. Every
// replica runs it (concurrent Secret updates are resolved by
// resourceVersion); it needs no webhook server.
func setupLockAPIServerCert(mgr manager.Manager, o Options) error {
	secret := types.NamespacedName{Namespace: o.CertSecretNamespace, Name: o.LockAPIServerCertSecretName}
	dns := o.lockAPIServerDNSNames()
	if err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:             secret,
		CertDir:               o.LockAPIServerCertDir,
		CAName:                "kubelock-apiserver-ca",
		CAOrganization:        "kubelock",
		DNSName:               dns[0],
		ExtraDNSNames:         dns[1:],
		IsReady:               make(chan struct{}),
		Webhooks:              []rotator.WebhookInfo{{Name: LockAPIServiceName, Type: rotator.APIService}},
		FieldOwner:            certFieldOwner,
		ControllerName:        "lock-apiserver-cert-rotator",
		RequireLeaderElection: false,
	}); err != nil {
		return err
	}
	return mgr.Add(&secretToFiles{mgr: mgr, key: secret, dir: o.LockAPIServerCertDir})
}
