// Package testenv starts the one real control plane (etcd + kube-apiserver built
// by hack/build-control-plane.sh) that every integration suite runs against;
// suites that need the garbage collector add kube-controller-manager.
package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// LockUserRole is the ClusterRole a lock client needs; it lists its verbs
// explicitly so it never grants force-release.
const LockUserRole = "kubelock-test-lock-user"

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

	webhookAuth *webhookClientAuth
}

// Start starts etcd and kube-apiserver, installs the CRDs from config/crd/bases
// and the lock-user ClusterRole. Stop it with Env.Stop.
func Start(opts ...Option) (*Env, error) {
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
	auth, err := newWebhookClientAuth()
	if err != nil {
		return nil, err
	}
	// Options come after, so a suite may still replace the admission configuration.
	WithAPIServerArgs("admission-control-config-file", auth.admissionFile)(env)
	for _, o := range opts {
		o(env)
	}
	cfg, err := env.Start()
	if err != nil {
		// envtest leaves etcd and kube-apiserver running when a later step
		// (installing CRDs or webhooks) fails.
		_ = env.Stop()
		_ = os.RemoveAll(auth.dir)
		return nil, fmt.Errorf("starting the control plane from %s (build it with 'make control-plane'): %w", env.BinaryAssetsDirectory, err)
	}
	e := &Env{Environment: env, Config: cfg, Scheme: scheme,
		WebhookClientCA: auth.caPEM, WebhookClientCAFile: auth.caFile, webhookAuth: auth}
	if e.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		_ = e.Stop()
		return nil, err
	}
	if err := e.installLockUserRole(context.Background()); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// Stop stops the control plane and removes its files.
func (e *Env) Stop() error {
	err := e.Environment.Stop()
	if e.webhookAuth != nil {
		_ = os.RemoveAll(e.webhookAuth.dir)
	}
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

// AssetsDir is KUBEBUILDER_ASSETS when set, else the newest control-plane build
// under bin/k8s, so `go test` works without the Makefile too.
func AssetsDir() string {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	dirs, _ := filepath.Glob(filepath.Join(RepoRoot(), "bin", "k8s", "*"))
	sort.Strings(dirs)
	if len(dirs) == 0 {
		return filepath.Join(RepoRoot(), "bin", "k8s")
	}
	return dirs[len(dirs)-1]
}

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
