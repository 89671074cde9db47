package operator

import (
	"os"
	"path/filepath"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// With the apiserver backend the chart's hand-written RBAC (not config/'s:
// config/ deploys the CRD backend) lets the operator read and write the
// Secret --lock-apiserver-cert-secret-name and the lock API's APIService.

// LockAPIServiceName is the APIService that registers kubelock-apiserver:
// the lock API's group version.
const LockAPIServiceName = "v1alpha1.locks.kubelock.io"

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
