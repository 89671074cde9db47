// Package lockapi starts kubelock-apiserver next to a testenv control plane
// for the suites and the benchmark: the binary built from
// cmd/kubelock-apiserver, an etcd of its own (internal/localcluster's) or one
// its replicas share, and its registration with kube-apiserver (an
// APIService, a Service and an EndpointSlice per replica, and the RBAC a
// delegating API server needs).
//
// kube-apiserver must run with the aggregation layer (ControlPlane starts
// it so). It refuses loopback endpoints, so the server listens on HostIP,
// the machine's first non-loopback IPv4 address.
package lockapi

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/internal/pki"
	childproc "github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/test/testenv"
)

const (
	// Namespace holds the lock apiserver's Services.
	Namespace = "kubelock-system"
	// APIServiceName is the group version's APIService.
	APIServiceName = "v1alpha1.locks.kubelock.io"
	// User is the lock apiserver's own user in kube-apiserver.
	User = "kubelock-apiserver"
	// etcdPrefix is the server's --etcd-prefix: its stores' keys are under
	// etcdPrefix/<group>/<resource>.
	etcdPrefix = "/registry/locks.kubelock.io"
	// ControllerUser is the user name the lock apiserver treats as kubelock's controller.
	ControllerUser = "kubelock-test-controller"
)

// ControlPlane starts a control plane for a lock apiserver to serve the
// lock API to: the aggregation layer on (proxied requests carry the user in
// X-Remote-* headers and go to an APIService's endpoints), and no lock CRDs
// (a group version is served by a CRD or by an APIService, never both).
func ControlPlane(opts ...testenv.Option) (*testenv.Env, error) {
	return testenv.StartAggregated(append(opts, func(env *envtest.Environment) {
		env.CRDDirectoryPaths = nil
		env.ErrorIfCRDPathMissing = false
	})...)
}

// Options say how to run one lock apiserver.
type Options struct {
	// Name names its Service and files; "kubelock-apiserver" when empty.
	Name string
	// StorageEncoding is --storage-encoding: json (default) or cbor.
	StorageEncoding string
	// Args are extra flags.
	Args []string
	// Etcd, when set, is the store to serve from instead of an etcd of its
	// own: replicas of one server share it, and Stop leaves it running.
	Etcd *localcluster.Etcd
}

// Server is a running lock apiserver and its etcd.
type Server struct {
	Name      string
	Etcd      *localcluster.Etcd
	APIServer *childproc.Child
	// Host and Port are where it listens.
	Host string
	Port int
	// CA signed its serving certificate.
	CA []byte

	// ownEtcd: Start started Etcd for this server alone, and Stop stops it.
	ownEtcd bool
	// bin, args and logPath start it again (Restart).
	bin     string
	args    []string
	logPath string
}

// Build builds cmd/kubelock-apiserver into dir and returns the binary's path.
func Build(ctx context.Context, dir string) (string, error) {
	return testenv.Build(ctx, dir, "./cmd/kubelock-apiserver")
}

// Start runs bin (see Build) with an etcd of its own, both with their files
// in dir, against env's kube-apiserver, and waits until it serves. It does
// not register it: Register points the APIService at it.
func Start(ctx context.Context, env *testenv.Env, bin, dir string, o Options) (s *Server, err error) {
	if o.Name == "" {
		o.Name = "kubelock-apiserver"
	}
	if o.StorageEncoding == "" {
		o.StorageEncoding = "json"
	}
	host, err := HostIP()
	if err != nil {
		return nil, err
	}
	s = &Server{Name: o.Name, Host: host}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	if err := ensureAccess(ctx, env); err != nil {
		return s, err
	}
	kubeconfig, err := writeKubeconfig(env, filepath.Join(dir, o.Name+".kubeconfig"))
	if err != nil {
		return s, err
	}
	if s.Etcd = o.Etcd; s.Etcd == nil {
		s.ownEtcd = true
		if s.Etcd, err = localcluster.StartEtcd(ctx, localcluster.Options{Name: o.Name + "-etcd", Dir: filepath.Join(dir, o.Name+"-etcd"), AssetsDir: testenv.AssetsDir()}); err != nil {
			return s, err
		}
	}
	// Reserved for this process as the control plane's ports are (FreePort
	// checks loopback; only this server binds the host's address).
	if s.Port, err = childproc.FreePort(); err != nil {
		return s, err
	}
	certDir := filepath.Join(dir, o.Name+"-serving")
	if err := s.writeServingCert(certDir); err != nil {
		return s, err
	}
	s.bin, s.logPath = bin, filepath.Join(dir, o.Name+".log")
	s.args = append([]string{
		"--etcd-servers=" + strings.Join(s.Etcd.Endpoints(), ","),
		"--bind-address=" + host,
		"--secure-port=" + strconv.Itoa(s.Port),
		"--tls-cert-file=" + filepath.Join(certDir, "tls.crt"),
		"--tls-private-key-file=" + filepath.Join(certDir, "tls.key"),
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--controller-users=" + ControllerUser,
		"--storage-encoding=" + o.StorageEncoding,
	}, o.Args...)
	err = s.run(ctx)
	return s, err
}

// run starts the server's process and waits until it serves.
func (s *Server) run(ctx context.Context) (err error) {
	if s.APIServer, err = childproc.Start(s.Name, s.bin, s.logPath, s.args...); err != nil {
		return err
	}
	return s.APIServer.WaitFor(ctx, "ready", 2*time.Minute, s.Ready)
}

// Ready checks the server's /readyz (its etcd included), as a readiness
// probe would.
func (s *Server) Ready(ctx context.Context) error {
	hc, err := rest.HTTPClientFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: s.CA}})
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	_, err = childproc.GetOK(ctx, hc, s.URL()+"/readyz")
	return err
}

// Restart starts the server again with the same command line, once its
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

// RewriteStored changes an object as stored in the server's etcd, behind
// its back: no rules, no validation (see testenv.Env.RewriteStored).
func (s *Server) RewriteStored(ctx context.Context, gr schema.GroupResource, key types.NamespacedName, change func(obj map[string]any)) error {
	return testenv.RewriteKey(ctx, s.Etcd.Endpoints(), testenv.StoragePath(etcdPrefix, gr, key), change)
}

// Stop stops the server, then its etcd.
func (s *Server) Stop() error {
	var errs []error
	if s.APIServer != nil {
		errs = append(errs, s.APIServer.Stop(20*time.Second))
	}
	if s.Etcd != nil && s.ownEtcd {
		errs = append(errs, s.Etcd.Stop())
	}
	return errors.Join(errs...)
}

// writeServingCert issues the serving certificate kube-apiserver checks: for
// the Service's DNS names (the APIService's caBundle is s.CA) and the address.
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

// Register points the APIService at s, through a Service of its own and an
// EndpointSlice with its address, and waits until kube-apiserver serves the
// lock API from it.
func (s *Server) Register(ctx context.Context, env *testenv.Env) error {
	return Register(ctx, env, s)
}

// Register points the APIService at replicas of one server (Started with
// one Name, each in a folder of its own) behind one Service, as a
// Deployment's pods are: an EndpointSlice per replica (each listens on its
// own port), and a caBundle with each replica's CA. It waits until
// kube-apiserver serves the lock API. With --enable-aggregator-routing,
// kube-apiserver sends each request to a ready endpoint picked at random.
func Register(ctx context.Context, env *testenv.Env, replicas ...*Server) error {
	s, cl := replicas[0], env.Client
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: s.Name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt(s.Port)}}},
	}
	if err := cl.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	var bundle []byte
	for _, r := range replicas {
		if err := cl.Create(ctx, r.endpointSlice(true)); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		bundle = append(bundle, r.CA...)
	}
	// Unstructured: the test scheme does not know apiregistration.
	as := apiService()
	spec := map[string]any{
		"group": locksv1alpha1.GroupVersion.Group, "version": locksv1alpha1.GroupVersion.Version,
		"service":              map[string]any{"namespace": Namespace, "name": s.Name, "port": int64(443)},
		"caBundle":             base64.StdEncoding.EncodeToString(bundle),
		"groupPriorityMinimum": int64(1000),
		"versionPriority":      int64(15),
	}
	switch err := cl.Get(ctx, client.ObjectKeyFromObject(as), as); {
	case apierrors.IsNotFound(err):
		as.Object["spec"] = spec
		if err := cl.Create(ctx, as); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		as.Object["spec"] = spec
		if err := cl.Update(ctx, as); err != nil {
			return err
		}
	}
	return s.APIServer.WaitFor(ctx, "served through kube-apiserver", 2*time.Minute, func(ctx context.Context) error {
		return s.serves(ctx, env)
	})
}

// endpointSlice is the replica's endpoint in its Service, ready or not.
func (s *Server) endpointSlice(ready bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: fmt.Sprintf("%s-%d", s.Name, s.Port),
			Labels: map[string]string{discoveryv1.LabelServiceName: s.Name, discoveryv1.LabelManagedBy: "kubelock-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{s.Host}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(s.Port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
}

// SetReady marks the replica's endpoint ready or not, as the EndpointSlice
// controller does when its pod's readiness probe passes or fails:
// kube-apiserver sends requests only to ready endpoints.
func (s *Server) SetReady(ctx context.Context, env *testenv.Env, ready bool) error {
	slice := s.endpointSlice(ready)
	return env.Client.Patch(ctx, slice, client.Merge)
}

// serves checks that the APIService names s and is available.
func (s *Server) serves(ctx context.Context, env *testenv.Env) error {
	as := apiService()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(as), as); err != nil {
		return err
	}
	if name, _, _ := unstructured.NestedString(as.Object, "spec", "service", "name"); name != s.Name {
		return fmt.Errorf("the APIService names service %q", name)
	}
	conditions, _, _ := unstructured.NestedSlice(as.Object, "status", "conditions")
	for _, c := range conditions {
		if c, ok := c.(map[string]any); ok && c["type"] == "Available" && c["status"] == "True" {
			return nil
		}
	}
	return fmt.Errorf("the APIService is not available yet: %v", conditions)
}

func apiService() *unstructured.Unstructured {
	as := &unstructured.Unstructured{}
	as.SetAPIVersion("apiregistration.k8s.io/v1")
	as.SetKind("APIService")
	as.SetName(APIServiceName)
	return as
}

// ensureAccess creates the namespace and lets User do what a delegating
// API server does: TokenReviews and SubjectAccessReviews, and reading the
// authentication ConfigMap in kube-system.
func ensureAccess(ctx context.Context, env *testenv.Env) error {
	subject := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: User}}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: User + ":auth-delegator"}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: User + ":authentication-reader"}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"}},
	} {
		if err := env.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// writeKubeconfig writes User's kubeconfig (a client certificate) to path.
func writeKubeconfig(env *testenv.Env, path string) (string, error) {
	u, err := env.AddUser(envtest.User{Name: User}, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, kc, 0o600)
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
	return "", errors.New("lockapi: no non-loopback IPv4 address on an interface that is up")
}
