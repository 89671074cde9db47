package controllers_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/test/testenv"
)

// Timings of the controller under test: short, so that the suite runs in seconds.
const (
	grace       = time.Second
	idleTimeout = 2 * time.Second
)

var (
	env       *testenv.Env
	nsCounter atomic.Int64
	// adminUser is the envtest admin's user name, which the controller learns
	// with a SelfSubjectReview and writes to endedBy.
	adminUser string
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(20 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	SetDefaultConsistentlyPollingInterval(20 * time.Millisecond)
	RunSpecs(t, "controllers suite")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	metrics.Register() // as the operator's main does
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	adminUser = whoAmI()
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// controllerProcess is one in-process run of the controller, as after a start
// of the operator binary.
type controllerProcess struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startController starts a manager with the controller, the real clock, no
// configured user name (so it learns its own) and opts, and registers its stop.
func startController(opts ...controllers.Option) *controllerProcess {
	return startControllerOn(env.Config, opts...)
}

// startControllerOn is startController connected by cfg.
func startControllerOn(cfg *rest.Config, opts ...controllers.Option) *controllerProcess {
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Each spec starts its own manager in this one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	opts = append([]controllers.Option{controllers.WithExpiryGrace(grace), controllers.WithIdleTimeout(idleTimeout)}, opts...)
	_, err = controllers.Setup(mgr, opts...)
	Expect(err).NotTo(HaveOccurred())
	p := &controllerProcess{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(p.done)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	DeferCleanup(p.stop)
	return p
}

// stop stops the controller and waits until it has; stopping twice is fine.
func (p *controllerProcess) stop() {
	p.cancel()
	<-p.done
}

func whoAmI() string {
	review := &authenticationv1.SelfSubjectReview{}
	Expect(env.Client.Create(context.Background(), review)).To(Succeed())
	Expect(review.Status.UserInfo.Username).NotTo(BeEmpty())
	return review.Status.UserInfo.Username
}

// newNamespace creates a namespace of its own for one spec.
func newNamespace(ctx context.Context) string {
	name := fmt.Sprintf("ctrl-%d", nsCounter.Add(1))
	Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}
