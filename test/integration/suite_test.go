// Package integration tests the lock protocol end to end: pkg/lock clients and
// the expiry controller against a real kube-apiserver and etcd.
package integration

import (
	"context"
	"fmt"
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

var (
	env              *testenv.Env
	controllerConfig *rest.Config
	// stopController stops the in-process controller started by startController.
	stopController func()
	nsCounter      atomic.Int64
	userCounter    atomic.Int64
)

func TestIntegration(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(15 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	RunSpecs(t, "lock protocol integration suite")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	var err error
	// Every spec runs with the admission webhook in front of the locks, so the
	// client library is proven against the server-side rules too.
	env, err = testenv.Start(testenv.WithWebhook())
	Expect(err).NotTo(HaveOccurred())
	webhookCtx, stopWebhook := context.WithCancel(context.Background())
	DeferCleanup(stopWebhook)
	Expect(env.StartWebhook(webhookCtx, controllerUser)).To(Succeed())
	controllerConfig, err = env.ControllerConfig(controllerUser)
	Expect(err).NotTo(HaveOccurred())
	startController()
})

var _ = AfterSuite(func() {
	if stopController != nil {
		stopController()
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// startController runs the expiry controller in this process with a short
// grace, as the operator runs it, against the shared control plane.
func startController() {
	stop, err := env.RunController(controllerConfig, controllers.WithExpiryGrace(200*time.Millisecond))
	Expect(err).NotTo(HaveOccurred())
	stopController = func() { Expect(stop()).To(Succeed()) }
}

// newNamespace creates a namespace of its own for one spec.
func newNamespace(ctx context.Context) string {
	name := fmt.Sprintf("it-%d", nsCounter.Add(1))
	Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}

// newLock creates a lock object as an administrator would.
func newLock(ctx context.Context, ns, name string, spec locksv1alpha1.DistributedLockSpec) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	Expect(env.Client.Create(ctx, l)).To(Succeed())
	return l
}

// userConfig is a connection as a fresh authenticated lock user.
func userConfig(ctx context.Context) (*rest.Config, string) {
	name := fmt.Sprintf("user-%d", userCounter.Add(1))
	cfg, err := env.UserConfig(ctx, name)
	Expect(err).NotTo(HaveOccurred())
	return cfg, name
}

// newClient is a lock client as a fresh user in ns.
func newClient(ctx context.Context, ns string, opts ...lock.Option) (*lock.Client, string) {
	cfg, user := userConfig(ctx)
	c, err := lock.New(cfg, append([]lock.Option{lock.WithNamespace(ns), lock.WithIdentity(user)}, opts...)...)
	Expect(err).NotTo(HaveOccurred())
	return c, user
}

func getLock(ctx context.Context, ns, name string) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
	return l
}

func int32p(v int32) *int32 { return &v }
