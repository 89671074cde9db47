// Package observability tests what an operator sees of kubelock — metrics of
// the manager and of the client library, Events, the Held condition with the
// real kubectl, and the apiserver audit log — against a real kube-apiserver
// and etcd, with the admission webhook and the controller running in process.
package observability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// controllerUser is the controller's own user; the webhook lets only it expire.
const controllerUser = "kubelock-controller"

// grace is the controller's expiry grace: short, so an expiry takes seconds.
const grace = 200 * time.Millisecond

var (
	env *testenv.Env
	// auditLog is the apiserver's audit log, written with config/audit/policy.yaml.
	auditLog    string
	nsCounter   atomic.Int64
	userCounter atomic.Int64
)

func TestObservability(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(20 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	RunSpecs(t, "observability suite")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	dir, err := os.MkdirTemp("", "kubelock-audit-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	auditLog = filepath.Join(dir, "audit.log")
	env, err = testenv.Start(testenv.WithWebhook(), testenv.WithAPIServerArgs(
		"audit-policy-file", filepath.Join(testenv.RepoRoot(), "config", "audit", "policy.yaml"),
		"audit-log-path", auditLog,
		"audit-log-format", "json",
		"audit-log-mode", "blocking",
	))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(env.Stop()).To(Succeed()) })
	webhookCtx, stopWebhook := context.WithCancel(context.Background())
	DeferCleanup(stopWebhook)
	Expect(env.StartWebhook(webhookCtx, controllerUser)).To(Succeed())
	cfg, err := env.ControllerConfig(controllerUser)
	Expect(err).NotTo(HaveOccurred())
	startController(cfg)
})

// startController runs the controller in this process as the operator does,
// with a short grace; its metrics go to controller-runtime's registry.
func startController(cfg *rest.Config) {
	stop, err := env.RunController(cfg, controllers.WithExpiryGrace(grace), controllers.WithUsername(controllerUser))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(stop()).To(Succeed()) })
}

func newNamespace(ctx context.Context) string {
	name := fmt.Sprintf("obs-%d", nsCounter.Add(1))
	Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}

func newLock(ctx context.Context, ns, name string, spec locksv1alpha1.DistributedLockSpec) {
	Expect(env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec})).To(Succeed())
}

func getLock(ctx context.Context, ns, name string) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
	return l
}

// newUser is a fresh authenticated lock user.
func newUser(ctx context.Context) (*rest.Config, string) {
	name := fmt.Sprintf("user-%d", userCounter.Add(1))
	cfg, err := env.UserConfig(ctx, name)
	Expect(err).NotTo(HaveOccurred())
	return cfg, name
}

// newClient is a lock client as a fresh user in ns.
func newClient(ctx context.Context, ns string, opts ...lock.Option) (*lock.Client, string) {
	cfg, user := newUser(ctx)
	c, err := lock.New(cfg, append([]lock.Option{lock.WithNamespace(ns), lock.WithIdentity(user)}, opts...)...)
	Expect(err).NotTo(HaveOccurred())
	return c, user
}
