// Package lockapi starts kubelock-apiserver next to a testenv control plane
// for the suites and the benchmark, through internal/locallockapi (the
// binary built from cmd/kubelock-apiserver, an etcd of its own, and its
// registration with kube-apiserver), and lets a test rewrite what it stores.
package lockapi

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/internal/locallockapi"
	"github.com/kubelock/kubelock/test/testenv"
)

const (
	// Namespace holds the lock apiserver's Services.
	Namespace = locallockapi.Namespace
	// APIServiceName is the group version's APIService.
	APIServiceName = locallockapi.APIServiceName
	// User is the lock apiserver's own user in kube-apiserver.
	User = locallockapi.User
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
	// Store is another server's etcd to serve from, as a replica does (Stop
	// leaves it running); nil: an etcd of its own.
	Store *localcluster.Etcd
	// EtcdArgs are extra flags of its own etcd.
	EtcdArgs []string
	// ControllerUsers are users kubelock's rules treat as its controller,
	// besides ControllerUser.
	ControllerUsers []string
}

// Server is a running lock apiserver and its etcd.
type Server struct {
	*locallockapi.Server
}

// Build builds cmd/kubelock-apiserver into dir and returns the binary's path.
func Build(ctx context.Context, dir string) (string, error) {
	return testenv.Build(ctx, dir, "./cmd/kubelock-apiserver")
}

// Start runs bin (see Build) with an etcd of its own, both with their files
// in dir, against env's kube-apiserver, with ControllerUser as the
// controller, and waits until it serves. It does not register it: Register
// points the APIService at it. On an error it returns what it started (nil
// when nothing), for Stop.
func Start(ctx context.Context, env *testenv.Env, bin, dir string, o Options) (*Server, error) {
	s, err := locallockapi.Start(ctx, env.Cluster, locallockapi.Options{Name: o.Name, Binary: bin, Dir: dir, AssetsDir: testenv.AssetsDir(),
		ControllerUsers: append([]string{ControllerUser}, o.ControllerUsers...), StorageEncoding: o.StorageEncoding, Args: o.Args,
		Store: o.Store, EtcdArgs: o.EtcdArgs})
	if s == nil {
		return nil, err
	}
	return &Server{s}, err
}

// Register points the APIService at s and waits until env's kube-apiserver
// serves the lock API from it.
func (s *Server) Register(ctx context.Context, _ *testenv.Env) error { return s.Server.Register(ctx) }

// Register points the APIService at replicas of one server behind one
// Service (locallockapi.Register).
func Register(ctx context.Context, _ *testenv.Env, replicas ...*Server) error {
	rs := make([]*locallockapi.Server, len(replicas))
	for i, r := range replicas {
		rs[i] = r.Server
	}
	return locallockapi.Register(ctx, rs...)
}

// SetReady marks the replica's endpoint ready or not (locallockapi's).
func (s *Server) SetReady(ctx context.Context, _ *testenv.Env, ready bool) error {
	return s.Server.SetReady(ctx, ready)
}

// RewriteStored changes an object as stored in the server's etcd, behind
// its back: no rules, no validation (see testenv.Env.RewriteStored).
func (s *Server) RewriteStored(ctx context.Context, gr schema.GroupResource, key types.NamespacedName, change func(obj map[string]any)) error {
	return testenv.RewriteKey(ctx, s.Etcd.Endpoints(), testenv.StoragePath(etcdPrefix, gr, key), change)
}
