// Package locallockapi runs kubelock-apiserver beside a local control plane
// (internal/localcluster): the binary of cmd/kubelock-apiserver, an etcd of
// its own, and its registration with kube-apiserver (an APIService, a
// Service and an EndpointSlice pointing at it, and the RBAC a delegating API
// server needs). kubelock-dev --backend apiserver, the suites and the
// benchmark start their lock apiservers with it.
//
// kube-apiserver must run with the aggregation layer (localcluster's
// Options.Aggregation). It refuses loopback endpoints, so the server listens
// on HostIP, the machine's first non-loopback IPv4 address.
package locallockapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/internal/pki"
	"github.com/kubelock/kubelock/internal/proc"
)

const (
	// Namespace holds the lock apiserver's Services.
	Namespace = "kubelock-system"
	// APIServiceName is the group version's APIService.
	APIServiceName = locksv1alpha1.APIServiceName
	// User is the lock apiserver's own user in kube-apiserver.
	User = "kubelock-apiserver"
	// DefaultName names a server whose Options leave Name empty.
	DefaultName = "kubelock-apiserver"
	// defaultStartTimeout bounds the wait for readiness when Options leave it 0.
	defaultStartTimeout = 2 * time.Minute
)

// Options say how to run one lock apiserver.
type Options struct {
	// Name names its Service, process and files; DefaultName when empty.
	Name string
	// Binary is kubelock-apiserver's path.
	Binary string
	// Dir holds its etcd's data and its serving certificate; LogDir its
	// log and its etcd's (Dir when empty).
	Dir    string
	LogDir string
	// AssetsDir holds the etcd binary (the control plane's).
	AssetsDir string
	// Persist keeps its etcd's data from the last run.
	Persist bool
	// ControllerUsers are --controller-users: kubelock's controller.
	ControllerUsers []string
	// StorageEncoding is --storage-encoding: json (default) or cbor.
	StorageEncoding string
	// Args are extra flags.
	Args []string
	// Store is another server's etcd to serve from, as a replica does (Stop
	// leaves it running); nil: an etcd of its own.
	Store *localcluster.Etcd
	// EtcdArgs are extra flags of its own etcd.
	EtcdArgs []string
	// StartTimeout bounds each start's wait for readiness (2 minutes when 0).
	StartTimeout time.Duration
}

func (o *Options) defaults() {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.LogDir == "" {
		o.LogDir = o.Dir
	}
	if o.StorageEncoding == "" {
		o.StorageEncoding = "json"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = defaultStartTimeout
	}
}

// Server is a running lock apiserver and its etcd.
type Server struct {
	Name string
	// Etcd is its own etcd (nil when it serves from Options.Store).
	Etcd      *localcluster.Etcd
	APIServer *proc.Child
	// Host and Port are where it listens.
	Host string
	Port int
	// CA signed its serving certificate.
	CA []byte

	cluster *localcluster.Cluster
	timeout time.Duration
	// bin, args and logPath start it again (Restart).
	bin     string
	args    []string
	logPath string
	// slice names its EndpointSlice once registered.
	slice string
}

// Start runs o.Binary with an etcd of its own against cluster's
// kube-apiserver, as User (given the access a delegating API server
// needs), and waits until it serves. It does not register it: Register
// points the APIService at it. On an error it returns what it started, for
// Stop.
func Start(ctx context.Context, cluster *localcluster.Cluster, o Options) (s *Server, err error) {
	o.defaults()
	host, err := HostIP()
	if err != nil {
		return nil, err
	}
	s = &Server{Name: o.Name, Host: host, cluster: cluster, timeout: o.StartTimeout}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Stop())
		}
	}()
	if err := ensureAccess(ctx, cluster); err != nil {
		return s, err
	}
	kubeconfig, err := cluster.Kubeconfig(o.Name+".kubeconfig", User)
	if err != nil {
		return s, err
	}
	store := o.Store
	if store == nil {
		if s.Etcd, err = localcluster.StartEtcd(ctx, localcluster.Options{Name: o.Name + "-etcd", Dir: filepath.Join(o.Dir, o.Name+"-etcd"),
			LogDir: o.LogDir, AssetsDir: o.AssetsDir, Persist: o.Persist, StartTimeout: o.StartTimeout, EtcdArgs: o.EtcdArgs}); err != nil {
			return s, err
		}
		store = s.Etcd
	}
	// Reserved for this process as the control plane's ports are (FreePort
	// checks loopback; only this server binds the host's address).
	if s.Port, err = proc.FreePort(); err != nil {
		return s, err
	}
	certDir := filepath.Join(o.Dir, o.Name+"-serving")
	if err := s.writeServingCert(certDir); err != nil {
		return s, err
	}
	args := append([]string{
		"--etcd-servers=" + strings.Join(store.Endpoints(), ","),
		"--bind-address=" + host,
		"--secure-port=" + strconv.Itoa(s.Port),
		"--tls-cert-file=" + filepath.Join(certDir, "tls.crt"),
		"--tls-private-key-file=" + filepath.Join(certDir, "tls.key"),
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--controller-users=" + strings.Join(o.ControllerUsers, ","),
		"--storage-encoding=" + o.StorageEncoding,
	}, o.Args...)
	s.bin, s.args, s.logPath = o.Binary, args, filepath.Join(o.LogDir, o.Name+".log")
	err = s.run(ctx)
	return s, err
}

// run starts the server's process and waits until it serves.
func (s *Server) run(ctx context.Context) (err error) {
	if s.APIServer, err = proc.Start(s.Name, s.bin, s.logPath, s.args...); err != nil {
		return err
	}
	return s.APIServer.WaitFor(ctx, "ready", s.timeout, s.Ready)
}

// Ready checks the server's /readyz (its etcd included), as a readiness
// probe would.
func (s *Server) Ready(ctx context.Context) error {
	hc, err := rest.HTTPClientFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: s.CA}})
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	_, err = proc.GetOK(ctx, hc, s.URL()+"/readyz")
	return err
}

// Restart starts the server again with the same command line once its
// process has ended (killed, as a crash would), as its Deployment would,
// and waits until it serves.
func (s *Server) Restart(ctx context.Context) error {
	if s.APIServer.Exited() == nil {
		return fmt.Errorf("%s is still running", s.Name)
	}
	return s.run(ctx)
}

// URL is where clients reach it directly.
func (s *Server) URL() string { return "https://" + net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// Direct is base (its credentials) pointed at the server itself instead of
// kube-apiserver: a client certificate of the cluster's client CA or a token
// kube-apiserver's TokenReview accepts authenticates there too.
func (s *Server) Direct(base *rest.Config) *rest.Config {
	c := rest.CopyConfig(base)
	c.Host = s.URL()
	c.CAData, c.CAFile, c.ServerName, c.Insecure = s.CA, "", "", false
	return c
}

// Stop stops the server, then its etcd.
func (s *Server) Stop() error {
	var errs []error
	if s.APIServer != nil {
		errs = append(errs, s.APIServer.Stop(20*time.Second))
	}
	if s.Etcd != nil {
		errs = append(errs, s.Etcd.Stop())
	}
	return errors.Join(errs...)
}

// writeServingCert issues the serving certificate kube-apiserver checks, from
// a CA of its own as a deployment's would be: for the Service's DNS names
// (the APIService's caBundle is s.CA) and the address.
func (s *Server) writeServingCert(dir string) error {
	ca, err := pki.New(s.Name + "-ca")
	if err != nil {
		return err
	}
	svc := s.Name + "." + Namespace + ".svc"
	crt, key, err := ca.Serving(s.Name, svc, svc+".cluster.local", s.Host)
	if err != nil {
		return err
	}
	s.CA = ca.PEM
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return errors.Join(os.WriteFile(filepath.Join(dir, "tls.crt"), crt, 0o600), os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600))
}

// HostIP is the machine's first non-loopback IPv4 address of an interface
// that is up: an address an EndpointSlice accepts and this machine serves.
func HostIP() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", errors.New("no non-loopback IPv4 address on an interface that is up: kube-apiserver reaches an APIService's server only at one")
}
