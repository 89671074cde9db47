// Package testenv starts the one real control plane (etcd + kube-apiserver built
// by hack/build-control-plane.sh) that every integration suite runs against;
// suites that need the garbage collector add kube-controller-manager.
// internal/localcluster starts the processes; envtest installs the CRDs and
// webhooks into them and provisions users, as it does for a cluster of its own.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/internal/pki"
)

const (
	// LockUserRole is the ClusterRole a lock client needs; it lists its verbs
	// explicitly so it never grants force-release.
	LockUserRole = "kubelock-test-lock-user"
	// WebhookClientCN is the common name of the client certificate the test
	// kube-apiserver presents to every admission webhook.
	WebhookClientCN = pki.WebhookClientCN
)

// Env is a running control plane with the kubelock CRDs installed.
type Env struct {
	*envtest.Environment
	// Config is an admin's connection (system:masters).
	Config *rest.Config
	// Client is an admin's client.
	Client client.Client
	// Scheme knows the built-in types and the kubelock API.
	Scheme *k8sruntime.Scheme
	// WebhookClientCA is the PEM CA of the client certificate the apiserver
	// presents to every admission webhook; WebhookClientCAFile holds it.
	// Webhook servers of the suites require it (StartWebhook does).
	WebhookClientCA     []byte
	WebhookClientCAFile string
	// Cluster is the processes: etcd, kube-apiserver and the
	// kube-controller-manager StartControllerManager starts.
	Cluster *localcluster.Cluster

	dir string // the cluster's data, certificates and logs
}

// Start starts etcd and kube-apiserver, installs the CRDs from config/crd/bases
// and the lock-user ClusterRole. Stop it with Env.Stop.
func Start(opts ...Option) (*Env, error) { return start(false, opts) }

// StartAggregated is Start with kube-apiserver's aggregation layer on
// (localcluster's Options.Aggregation): for a control plane an APIService's
// server serves part of.
func StartAggregated(opts ...Option) (*Env, error) { return start(true, opts) }

func start(aggregation bool, opts []Option) (*Env, error) {
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	root := RepoRoot()
	env := &envtest.Environment{
		Scheme:                scheme,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: AssetsDir(),
	}
	for _, o := range opts {
		o(env)
	}
	dir, err := os.MkdirTemp("", "kubelock-testenv-")
	if err != nil {
		return nil, err
	}
	o := clusterOptions(env, dir)
	o.Aggregation = aggregation
	cluster, err := localcluster.Start(context.Background(), o)
	if err != nil {
		// Its logs stay in dir for the error's reader.
		return nil, fmt.Errorf("starting the control plane from %s (build it with 'make control-plane'): %w", env.BinaryAssetsDirectory, err)
	}
	e := &Env{Environment: env, Scheme: scheme, Cluster: cluster, dir: dir,
		WebhookClientCA: cluster.WebhookClientCA, WebhookClientCAFile: cluster.WebhookClientCAFile}
	if err := e.install(); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// clusterOptions are envtest's control plane: its flags (kube-apiserver
// without the ServiceAccount admission plugin, so pods need no service
// account to exist), and those the options set.
func clusterOptions(env *envtest.Environment, dir string) localcluster.Options {
	var etcdArgs []string
	if env.ControlPlane.Etcd != nil {
		etcdArgs = env.ControlPlane.Etcd.Configure().AsStrings(nil)
	}
	return localcluster.Options{
		Name: "kubelock-test", Dir: dir, AssetsDir: env.BinaryAssetsDirectory, Admin: adminUser,
		EtcdArgs:      etcdArgs,
		APIServerArgs: append([]string{"--disable-admission-plugins=ServiceAccount"}, env.ControlPlane.GetAPIServer().Configure().AsStrings(nil)...),
		StartTimeout:  startTimeout(env),
	}
}

// adminUser is Config's user, in system:masters (envtest's name for it).
const adminUser = "admin"

// install points envtest at the cluster, which installs the CRDs and
// webhooks, then installs the lock-user role.
func (e *Env) install() error {
	env, c := e.Environment, e.Cluster
	env.UseExistingCluster = ptr.To(true)
	env.ControlPlane.KubectlPath = filepath.Join(env.BinaryAssetsDirectory, "kubectl")
	api := env.ControlPlane.GetAPIServer()
	api.CertDir = e.dir // kubeconfigs for Kubectl
	api.SecureServing = envtest.SecureServing{
		ListenAddr: envtest.ListenAddr{Address: "127.0.0.1", Port: strconv.Itoa(c.APIServer().Port)},
		CA:         c.CA.PEM,
		Authn:      clientCerts{c.CA},
	}
	if env.ControlPlane.Etcd == nil {
		env.ControlPlane.Etcd = &envtest.Etcd{}
	}
	etcdURL, err := url.Parse(c.Etcd.Members[0].ClientURL)
	if err != nil {
		return err
	}
	env.ControlPlane.Etcd.URL = etcdURL
	admin, err := env.AddUser(envtest.User{Name: adminUser, Groups: []string{"system:masters"}}, &rest.Config{QPS: 1000, Burst: 2000})
	if err != nil {
		return err
	}
	env.Config = admin.Config()
	if e.Config, err = env.Start(); err != nil {
		return err
	}
	if e.Client, err = client.New(e.Config, client.Options{Scheme: e.Scheme}); err != nil {
		return err
	}
	return e.installLockUserRole(context.Background())
}

// startTimeout is how long each process may take to start: the
// environment's ControlPlaneStartTimeout, else
// KUBEBUILDER_CONTROLPLANE_START_TIMEOUT, as envtest reads them.
func startTimeout(env *envtest.Environment) time.Duration {
	if env.ControlPlaneStartTimeout != 0 {
		return env.ControlPlaneStartTimeout
	}
	if d, err := time.ParseDuration(os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT")); err == nil {
		return d
	}
	return localcluster.DefaultStartTimeout
}

// Stop stops the control plane and removes its files.
func (e *Env) Stop() error {
	err := errors.Join(e.Environment.Stop(), e.Cluster.Stop())
	_ = os.RemoveAll(e.dir)
	return err
}

// Option adjusts the envtest environment before it starts.
type Option func(*envtest.Environment)

// WithAPIServerArgs sets extra kube-apiserver flags.
func WithAPIServerArgs(kv ...string) Option {
	return func(env *envtest.Environment) {
		args := env.ControlPlane.GetAPIServer().Configure()
		for i := 0; i+1 < len(kv); i += 2 {
			args.Set(kv[i], kv[i+1])
		}
	}
}

// WithEtcdArgs sets extra etcd flags.
func WithEtcdArgs(kv ...string) Option {
	return func(env *envtest.Environment) {
		if env.ControlPlane.Etcd == nil {
			env.ControlPlane.Etcd = &envtest.Etcd{}
		}
		args := env.ControlPlane.Etcd.Configure()
		for i := 0; i+1 < len(kv); i += 2 {
			args.Set(kv[i], kv[i+1])
		}
	}
}

// RepoRoot is the repository's top folder, found from this source file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Build builds the command pkg (a package path from the repository's root,
// such as ./cmd/manager) into dir and returns the binary's path.
func Build(ctx context.Context, dir, pkg string) (string, error) {
	bin := filepath.Join(dir, path.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// AssetsDir is KUBEBUILDER_ASSETS when set, else the newest control-plane build
// under bin/k8s, so `go test` works without the Makefile too.
func AssetsDir() string { return localcluster.AssetsDir(RepoRoot()) }

// UserConfig returns a connection authenticated as name (a real client
// certificate, so request.userInfo carries that name), bound to the lock-user role.
func (e *Env) UserConfig(ctx context.Context, name string, groups ...string) (*rest.Config, error) {
	u, err := e.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: LockUserRole + "-" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: LockUserRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
	}
	if err := e.Client.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return u.Config(), nil
}

func (e *Env) installLockUserRole(ctx context.Context) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: LockUserRole},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks"}, Verbs: []string{"get", "list", "watch", "create"}},
			{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks/status"}, Verbs: []string{"get", "update", "patch"}},
			{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"locksessions"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
			{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"locksessions/status"}, Verbs: []string{"get", "update", "patch"}},
			{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"selfsubjectreviews"}, Verbs: []string{"create"}},
		},
	}
	return e.Client.Create(ctx, role)
}
