// Package suite is what the Ginkgo envtest suites (test/integration,
// test/observability, test/e2e/cli, test/admission) share: the control plane
// with the admission webhook and the expiry controller in this process, as
// the operator runs them, on either backend of the lock API (Start, or
// StartLockAPI for kubelock-apiserver), and fresh namespaces, locks and lock
// users. Its functions fail the running spec on error.
package suite

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// ControllerUser is the controller's own user; the webhook lets only it expire.
const ControllerUser = "kubelock-controller"

// Env is the control plane Start started.
var Env *testenv.Env

var nsCount, userCount atomic.Int64

// Run runs the package's Ginkgo specs as the suite name, with Eventually's
// default timeout and polling interval.
func Run(t *testing.T, name string, timeout, polling time.Duration) {
	t.Helper()
	RegisterFailHandler(Fail)
	// controller-runtime's clients log through it (shown for a failed spec);
	// unset, it prints a "log.SetLogger(...) was never called" stack.
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	SetDefaultEventuallyTimeout(timeout)
	SetDefaultEventuallyPollingInterval(polling)
	RunSpecs(t, name)
}

// Start starts, for a BeforeSuite, the control plane with opts and the
// admission webhook served by this process, which lets controllerUser expire
// locks; DeferCleanup stops both.
func Start(controllerUser string, opts ...testenv.Option) *testenv.Env {
	return start(testenv.Start, controllerUser, opts)
}

// start is Start with the control plane startEnv starts.
func start(startEnv func(...testenv.Option) (*testenv.Env, error), controllerUser string, opts []testenv.Option) *testenv.Env {
	env, err := startEnv(append([]testenv.Option{testenv.WithWebhook()}, opts...)...)
	Expect(err).NotTo(HaveOccurred())
	// Cleanups run last-in first-out: the webhook stops before the control plane.
	DeferCleanup(func() { Expect(env.Stop()).To(Succeed()) })
	webhookCtx, stopWebhook := context.WithCancel(context.Background())
	DeferCleanup(stopWebhook)
	Expect(env.StartWebhook(webhookCtx, controllerUser)).To(Succeed())
	Env = env
	return env
}

// RunController runs the expiry controller in this process as
// controllerUser, as the operator runs it, and returns what stops it.
func RunController(controllerUser string, opts ...controllers.Option) (stop func()) {
	cfg, err := Env.ControllerConfig(controllerUser)
	Expect(err).NotTo(HaveOccurred())
	stopController, err := Env.RunController(cfg, opts...)
	Expect(err).NotTo(HaveOccurred())
	return func() { Expect(stopController()).To(Succeed()) }
}

// Namespace creates a namespace of its own for one spec.
func Namespace(ctx context.Context) string {
	name := fmt.Sprintf("ns-%d", nsCount.Add(1))
	Expect(Env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}

// NamespaceEach gives every spec of the container a namespace of its own, in
// *ns, holding the named locks (default spec).
func NamespaceEach(ns *string, locks ...string) {
	BeforeEach(func(ctx SpecContext) {
		*ns = Namespace(ctx)
		for _, name := range locks {
			NewLock(ctx, *ns, name, locksv1alpha1.DistributedLockSpec{})
		}
	})
}

// NewLock creates a lock object as an administrator would.
func NewLock(ctx context.Context, ns, name string, spec locksv1alpha1.DistributedLockSpec) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	Expect(Env.Client.Create(ctx, l)).To(Succeed())
	return l
}

// GetLock reads a lock as an administrator.
func GetLock(ctx context.Context, ns, name string) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	Expect(Env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
	return l
}

// UserConfig is a connection as a fresh authenticated lock user.
func UserConfig(ctx context.Context) (*rest.Config, string) {
	name := fmt.Sprintf("user-%d", userCount.Add(1))
	cfg, err := Env.UserConfig(ctx, name)
	Expect(err).NotTo(HaveOccurred())
	return cfg, name
}

// NewClient is a lock client as a fresh lock user in ns.
func NewClient(ctx context.Context, ns string, opts ...lock.Option) (*lock.Client, string) {
	cfg, user := UserConfig(ctx)
	c, err := lock.New(cfg, append([]lock.Option{lock.WithNamespace(ns), lock.WithIdentity(user)}, opts...)...)
	Expect(err).NotTo(HaveOccurred())
	return c, user
}

// GrantForceRelease gives user the force-release verb on locks and sessions in ns.
func GrantForceRelease(ctx context.Context, ns, user string) {
	Grant(ctx, ns, "breakglass-"+user, user, rbacv1.PolicyRule{
		APIGroups: []string{locksv1alpha1.GroupVersion.Group},
		Resources: []string{"distributedlocks", locksv1alpha1.LockSessionsResource},
		Verbs:     []string{locksv1alpha1.ForceReleaseVerb},
	})
}

// Grant gives user rule in ns, through a Role and a RoleBinding named name.
func Grant(ctx context.Context, ns, name, user string, rule rbacv1.PolicyRule) {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: []rbacv1.PolicyRule{rule}}
	Expect(Env.Client.Create(ctx, role)).To(Succeed())
	Expect(Env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	})).To(Succeed())
}

// WriteKubeconfig writes cfg (server, CA, client certificate or token) as
// user's kubeconfig file at path, for the processes a suite runs as user; its
// context's namespace is "default".
func WriteKubeconfig(path, user string, cfg *rest.Config) {
	server := cfg.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user, Namespace: "default"}
	kc.CurrentContext = "e2e"
	Expect(clientcmd.WriteToFile(*kc, path)).To(Succeed())
}
