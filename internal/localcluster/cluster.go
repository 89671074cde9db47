// Package localcluster starts a local Kubernetes control plane from the
// binaries `make control-plane` builds: etcd (one member or three),
// kube-apiservers on it (several behind HAProxy, as a highly available
// control plane has them) and kube-controller-manager, each a child process
// that dies with its parent, on ports given or chosen, with its data under
// one folder and certificates from one CA of its own. kubelock-dev, the test
// environment (test/testenv), the fault-injection suite and the benchmark
// start their clusters with it; package node adds a real node.
//
// Each part is a Component that can be stopped and started again on its own
// (the fault suite stops etcd members and kills an apiserver).
package localcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/internal/pki"
)

// Cluster is a running control plane.
type Cluster struct {
	Etcd              *Etcd
	APIServers        []*APIServer
	ControllerManager *ControllerManager
	// Balancer is HAProxy in front of the apiservers (Options.Balancer), else nil.
	Balancer *Balancer
	// CA signs every serving certificate and every user's client
	// certificate: the apiservers trust it as --client-ca-file.
	CA *pki.CA
	// WebhookClientCA is the CA of the client certificate the apiservers
	// present to admission webhooks (a CA of its own, so users, whose
	// certificates CA signs, cannot call a webhook that requires it);
	// WebhookClientCAFile holds it.
	WebhookClientCA     []byte
	WebhookClientCAFile string

	o         Options
	webhookCA *pki.CA
	auth      *authority
	admin     *rest.Config
}

// Start starts etcd, the apiservers and, with o.StartControllerManager,
// kube-controller-manager, and returns once each is ready. On an error it
// stops what it started.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	c, err := newCluster(o)
	if err != nil {
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

// newCluster prepares Dir (fresh unless Persist) and the CAs, and lays out
// every component.
func newCluster(o Options) (*Cluster, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	c := &Cluster{o: o, auth: &authority{dir: filepath.Join(o.Dir, "pki")}}
	if err := prepareDirs(&c.o, c.auth.dir); err != nil {
		return nil, err
	}
	var err error
	if c.auth.ca, err = loadOrCreateCA(c.auth.dir, o.Name+"-ca", o.Persist); err != nil {
		return nil, fmt.Errorf("creating certificates: %w", err)
	}
	c.CA = c.auth.ca
	if c.Etcd, err = newEtcd(&c.o); err != nil {
		return nil, err
	}
	for i := range c.o.APIServers {
		a, err := newAPIServer(&c.o, i)
		if err != nil {
			return nil, err
		}
		c.APIServers = append(c.APIServers, a)
	}
	if o.Balancer {
		if c.Balancer, err = newBalancer(&c.o, c.auth.dir, c.auth.caFile(), c.APIServers); err != nil {
			return nil, err
		}
	}
	if c.admin, err = c.UserConfig(o.Admin, "system:masters"); err != nil {
		return nil, err
	}
	saKey, err := serviceAccountKey(c.auth.dir)
	if err != nil {
		return nil, err
	}
	if err := c.configureAPIServers(saKey); err != nil {
		return nil, err
	}
	c.ControllerManager, err = newControllerManager(&c.o, c.auth, c.URL(), saKey)
	return c, err
}

// configureAPIServers gives the apiservers their flags, one issuer (the
// first's URL) and one webhook client certificate for all.
func (c *Cluster) configureAPIServers(saKey string) error {
	dir := filepath.Join(c.auth.dir, "webhook-client")
	wca, admission, err := webhookClientAuth(dir, c.o.Name+"-webhook-client-ca", c.o.Persist)
	if err != nil {
		return err
	}
	c.webhookCA, c.WebhookClientCA, c.WebhookClientCAFile = wca, wca.PEM, filepath.Join(dir, "ca.crt")
	common, err := apiserverFlags(&c.o, c.auth, c.Etcd, saKey, c.URL(), admission)
	if err != nil {
		return err
	}
	for _, a := range c.APIServers {
		if err := a.configure(&c.o, c.auth, common, c.admin); err != nil {
			return err
		}
	}
	if c.Balancer != nil {
		c.Balancer.Ready = readyz(c.Balancer.URL, c.admin)
	}
	return nil
}

// WebhookClientCert is a client certificate of the kind the apiservers
// present to admission webhooks, for a probe of a webhook that requires
// one: a webhook refuses (and logs) a handshake without it.
func (c *Cluster) WebhookClientCert() (tls.Certificate, error) {
	crt, key, err := c.webhookCA.Client(pki.WebhookClientCN)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(crt, key)
}

// FrontProxyClientCert is the certificate kube-apiserver presents to
// aggregated API servers when it forwards a request, with the user in
// X-Remote-User and X-Remote-Group (only with Options.Aggregation).
func (c *Cluster) FrontProxyClientCert() (tls.Certificate, error) {
	dir := filepath.Join(c.auth.dir, "front-proxy")
	return tls.LoadX509KeyPair(filepath.Join(dir, "proxy-client.crt"), filepath.Join(dir, "proxy-client.key"))
}

// prepareDirs removes etcd's data and the folders also given unless
// Persist (never anything else in Dir), and creates Dir, LogDir and them.
func prepareDirs(o *Options, also ...string) error {
	if !o.Persist {
		stale, _ := filepath.Glob(filepath.Join(o.Dir, "etcd*"))
		for _, p := range append(stale, also...) {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("cleaning the data folder: %w", err)
			}
		}
	}
	for _, d := range append([]string{o.Dir, o.LogDir}, also...) {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating the data folder: %w", err)
		}
	}
	return nil
}

func (c *Cluster) start(ctx context.Context) error {
	if err := c.Etcd.start(ctx); err != nil {
		return err
	}
	c.o.Progress("etcd up on %s", strings.Join(c.Etcd.Endpoints(), ", "))
	for _, a := range c.APIServers {
		if err := a.Start(ctx); err != nil {
			return err
		}
		c.o.Progress("kube-apiserver up on %s", a.URL)
	}
	if b := c.Balancer; b != nil {
		if err := b.Start(ctx); err != nil {
			return err
		}
		c.o.Progress("load balancer (HAProxy) up on %s in front of %d kube-apiservers", b.URL, len(c.APIServers))
	}
	if !c.o.StartControllerManager {
		return nil
	}
	if err := c.ControllerManager.Start(ctx); err != nil {
		return err
	}
	c.o.Progress("kube-controller-manager up: %s", strings.Join(Controllers, ", "))
	return nil
}

// Stop stops kube-controller-manager, the apiservers, then etcd.
func (c *Cluster) Stop() error {
	return StopAll(c.Components())
}

// Components are every component, in start order.
func (c *Cluster) Components() []*Component {
	cs := c.Etcd.Components()
	for _, a := range c.APIServers {
		cs = append(cs, a.Component)
	}
	if c.Balancer != nil {
		cs = append(cs, c.Balancer.Component)
	}
	return append(cs, c.ControllerManager.Component)
}

// APIServer is the first apiserver.
func (c *Cluster) APIServer() *APIServer { return c.APIServers[0] }

// URL is what clients connect to, which the configs point at: the
// balancer's, else the first apiserver's.
func (c *Cluster) URL() string {
	if c.Balancer != nil {
		return c.Balancer.URL
	}
	return c.APIServer().URL
}

// LogDir is where the components' logs are.
func (c *Cluster) LogDir() string { return c.o.LogDir }

// CAFile holds CA's certificate.
func (c *Cluster) CAFile() string { return c.auth.caFile() }

// AdminConfig is a connection to URL as Options.Admin.
func (c *Cluster) AdminConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// UserConfig is a connection to URL as user in groups: a
// client certificate of CA.
func (c *Cluster) UserConfig(user string, groups ...string) (*rest.Config, error) {
	return c.auth.userConfig(c.URL(), user, groups...)
}

// Kubeconfig writes a kubeconfig of user in groups as file in the pki
// folder and returns its path.
func (c *Cluster) Kubeconfig(file, user string, groups ...string) (string, error) {
	return c.auth.kubeconfig(c.URL(), file, user, groups...)
}

// WriteServingCert writes a serving certificate of CA for 127.0.0.1,
// localhost and hosts as dir/tls.crt and dir/tls.key (controller-runtime's
// names) and returns their paths.
func (c *Cluster) WriteServingCert(dir, name string, hosts ...string) (crtPath, keyPath string, err error) {
	return c.auth.servingCert(dir, name, hosts...)
}
