package testenv

import (
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubelock/kubelock/internal/pki"
)

// clientCerts is envtest's authenticator for the cluster: each user a client
// certificate of the cluster's CA (the apiserver's --client-ca-file), as
// envtest's own gives users of the control planes it starts.
type clientCerts struct{ ca *pki.CA }

var _ envtest.Authn = clientCerts{}

// Configure, Start and Stop have nothing to do: the cluster trusts the CA.
func (clientCerts) Configure(string, *envtest.Arguments) error { return nil }
func (clientCerts) Start() error                               { return nil }
func (clientCerts) Stop() error                                { return nil }

// AddUser is base authenticated as user.
func (a clientCerts) AddUser(user envtest.User, base *rest.Config) (*rest.Config, error) {
	crt, key, err := a.ca.Client(user.Name, user.Groups...)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(base)
	cfg.CertData, cfg.KeyData = crt, key
	return cfg, nil
}
