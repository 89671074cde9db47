// Package localcluster starts a local Kubernetes control plane from the
// binaries `make control-plane` builds: etcd (one member or three),
// kube-apiservers on it and kube-controller-manager, each a child process
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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/internal/pki"
)

// Options say what to start and where.
type Options struct {
	// Name names the cluster's certificate authorities (<Name>-ca...) and
	// etcd's cluster token; "localcluster" when empty.
	Name string
	// Dir holds etcd's data (Dir/etcd, or Dir/etcd0...) and pki/: the CAs,
	// certificates, keys and kubeconfigs.
	Dir string
	// LogDir receives each process's log, <component name>.log; Dir/logs
	// when empty.
	LogDir string
	// AssetsDir holds etcd, kube-apiserver and kube-controller-manager.
	AssetsDir string
	// Persist keeps etcd's data and the CAs in Dir from the last run, and
	// etcd syncs its writes; otherwise both start fresh and etcd skips fsync.
	Persist bool
	// Admin is the administrator (group system:masters) whose client
	// certificate AdminConfig holds and the readiness checks use; "admin"
	// when empty.
	Admin string

	// EtcdMembers is the number of etcd members: 1 (when 0) or 3.
	EtcdMembers int
	// EtcdPorts are the members' ports, in order; members without one get
	// free ports.
	EtcdPorts []EtcdPorts
	// EtcdArgs are extra etcd flags (--name=value), each replacing the
	// defaults of its name.
	EtcdArgs []string

	// APIServers is the number of kube-apiservers (1 when 0), each on its own port.
	APIServers int
	// APIServerPorts are their secure ports, in order; the others get free ports.
	APIServerPorts []int
	// APIServerArgs are extra kube-apiserver flags, as EtcdArgs.
	APIServerArgs []string
	// Aggregation turns on the aggregation layer: the apiservers proxy to
	// APIServices with a front-proxy client certificate and the user in
	// X-Remote-* headers, to the APIService's endpoints.
	Aggregation bool

	// ControllerManager starts kube-controller-manager with the rest
	// (otherwise Cluster.ControllerManager is started on demand).
	ControllerManager bool
	// ControllerManagerArgs are extra kube-controller-manager flags, as EtcdArgs.
	ControllerManagerArgs []string

	// NodeIP is the address of a node that will join (package node): the
	// apiservers then also listen there and at ServiceIP, authorize kubelets
	// with the Node authorizer and reach them with a client certificate, and
	// kube-controller-manager runs every controller and hands pods the CA.
	NodeIP string

	// StartTimeout bounds each component's start (DefaultStartTimeout when 0).
	StartTimeout time.Duration
	// Progress, when set, hears a line per component started.
	Progress func(format string, args ...any)
}

// Cluster is a running control plane.
type Cluster struct {
	Etcd              *Etcd
	APIServers        []*APIServer
	ControllerManager *ControllerManager
	// CA signs every serving certificate and every user's client
	// certificate: the apiservers trust it as --client-ca-file.
	CA *pki.CA
	// WebhookClientCA is the CA of the client certificate the apiservers
	// present to admission webhooks (a CA of its own, so users, whose
	// certificates CA signs, cannot call a webhook that requires it);
	// WebhookClientCAFile holds it.
	WebhookClientCA     []byte
	WebhookClientCAFile string

	o      Options
	pkiDir string
	admin  *rest.Config
}

// Start starts etcd, the apiservers and, with o.ControllerManager,
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

// newCluster prepares Dir (fresh unless Persist) and the CA, and lays out
// every component.
func newCluster(o Options) (*Cluster, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	c := &Cluster{o: o, pkiDir: filepath.Join(o.Dir, "pki")}
	if err := c.prepareDirs(); err != nil {
		return nil, err
	}
	var err error
	if c.CA, err = loadOrCreateCA(c.pkiDir, o.Name+"-ca", o.Persist); err != nil {
		return nil, fmt.Errorf("creating certificates: %w", err)
	}
	if c.Etcd, err = newEtcd(&c.o); err != nil {
		return nil, err
	}
	for i := range c.o.APIServers {
		a, err := c.newAPIServer(i)
		if err != nil {
			return nil, err
		}
		c.APIServers = append(c.APIServers, a)
	}
	if c.admin, err = c.UserConfig(o.Admin, "system:masters"); err != nil {
		return nil, err
	}
	common, err := c.apiserverFlags()
	if err != nil {
		return nil, err
	}
	for _, a := range c.APIServers {
		if err := a.configure(c, common); err != nil {
			return nil, err
		}
	}
	saKey, err := serviceAccountKey(c.pkiDir)
	if err != nil {
		return nil, err
	}
	c.ControllerManager, err = c.newControllerManager(saKey)
	return c, err
}

func (o *Options) defaults() error {
	if o.Dir == "" || o.AssetsDir == "" {
		return errors.New("localcluster: Dir and AssetsDir must be set")
	}
	if o.Name == "" {
		o.Name = "localcluster"
	}
	if o.LogDir == "" {
		o.LogDir = filepath.Join(o.Dir, "logs")
	}
	if o.Admin == "" {
		o.Admin = "admin"
	}
	o.APIServers = max(o.APIServers, 1)
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	return nil
}

// prepareDirs removes etcd's data and pki/ unless Persist (never anything
// else in Dir) and creates the folders.
func (c *Cluster) prepareDirs() error {
	if !c.o.Persist {
		stale, _ := filepath.Glob(filepath.Join(c.o.Dir, "etcd*"))
		for _, p := range append(stale, c.pkiDir) {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("cleaning the data folder: %w", err)
			}
		}
	}
	for _, d := range []string{c.o.Dir, c.pkiDir, c.o.LogDir} {
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
	if !c.o.ControllerManager {
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
	var cs []*Component
	for _, m := range c.Etcd.Members {
		cs = append(cs, m.Component)
	}
	for _, a := range c.APIServers {
		cs = append(cs, a.Component)
	}
	return append(cs, c.ControllerManager.Component)
}

// APIServer is the first apiserver, the one URL and the configs point at.
func (c *Cluster) APIServer() *APIServer { return c.APIServers[0] }

// URL is the first apiserver's.
func (c *Cluster) URL() string { return c.APIServer().URL }

// LogDir is where the components' logs are.
func (c *Cluster) LogDir() string { return c.o.LogDir }

// CAFile holds CA's certificate.
func (c *Cluster) CAFile() string { return filepath.Join(c.pkiDir, "ca.crt") }

// AdminConfig is a connection to the first apiserver as Options.Admin.
func (c *Cluster) AdminConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// UserConfig is a connection to the first apiserver as user in groups: a
// client certificate of CA.
func (c *Cluster) UserConfig(user string, groups ...string) (*rest.Config, error) {
	crt, key, err := c.CA.Client(user, groups...)
	if err != nil {
		return nil, err
	}
	return &rest.Config{Host: c.URL(), TLSClientConfig: rest.TLSClientConfig{CAData: c.CA.PEM, CertData: crt, KeyData: key}}, nil
}

// Kubeconfig writes a kubeconfig of user in groups as file in the pki
// folder and returns its path.
func (c *Cluster) Kubeconfig(file, user string, groups ...string) (string, error) {
	cfg, err := c.UserConfig(user, groups...)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.pkiDir, file)
	return path, writeKubeconfig(path, cfg)
}

// WriteServingCert writes a serving certificate of CA for 127.0.0.1,
// localhost and hosts as dir/tls.crt and dir/tls.key (controller-runtime's
// names) and returns their paths.
func (c *Cluster) WriteServingCert(dir, name string, hosts ...string) (crtPath, keyPath string, err error) {
	crt, key, err := c.CA.Serving(name, hosts...)
	if err != nil {
		return "", "", err
	}
	return writePair(dir, "tls.crt", "tls.key", crt, key)
}

// AssetsDir is $KUBEBUILDER_ASSETS when set, else the newest control-plane
// build under root/bin/k8s (where `make control-plane` builds).
func AssetsDir(root string) string {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "bin", "k8s", "*"))
	if len(dirs) == 0 {
		return filepath.Join(root, "bin", "k8s")
	}
	return dirs[len(dirs)-1] // Glob sorts
}
