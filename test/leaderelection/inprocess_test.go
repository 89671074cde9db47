package leaderelection

import (
	"context"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientle "k8s.io/client-go/tools/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	kle "github.com/kubelock/kubelock/pkg/lock/leaderelection"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

var _ = Describe("client-go's elector on a ResourceLock, in this process", func() {
	var ns string
	BeforeEach(func(ctx SpecContext) {
		ns = suite.Namespace(ctx)
		suite.NewLock(ctx, ns, lockName, locksv1alpha1.DistributedLockSpec{})
	})

	short := kle.Options{LeaseDuration: 8 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 2 * time.Second}
	newLock := func(ctx context.Context, id string, o kle.Options) *kle.ResourceLock {
		GinkgoHelper()
		cfg, _ := suite.UserConfig(ctx)
		rl, err := kle.New(cfg, lockName, o, lock.WithNamespace(ns), lock.WithIdentity(id))
		Expect(err).NotTo(HaveOccurred())
		return rl
	}
	// run runs an elector with cfg until the spec ends; led is closed when it leads.
	run := func(cfg clientle.LeaderElectionConfig) (led chan struct{}, stop func()) {
		GinkgoHelper()
		led = make(chan struct{})
		cfg.Callbacks.OnStartedLeading = func(context.Context) { close(led) }
		cfg.Callbacks.OnStoppedLeading = func() {}
		le, err := clientle.NewLeaderElector(cfg)
		Expect(err).NotTo(HaveOccurred())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); le.Run(ctx) }()
		stop = func() { cancel(); <-done }
		DeferCleanup(stop)
		return led, stop
	}

	It("tells a waiting candidate who leads with ReportLeaderChanges", func(ctx SpecContext) {
		a := newLock(ctx, "a", short)
		ledA, _ := run(a.ElectionConfig(clientle.LeaderCallbacks{}))
		Eventually(ledA).Should(BeClosed())

		o := short
		o.ReportLeaderChanges = true
		b := newLock(ctx, "b", o)
		var mu sync.Mutex
		var seen []string
		cfg := b.ElectionConfig(clientle.LeaderCallbacks{})
		cfg.Callbacks.OnNewLeader = func(id string) { mu.Lock(); defer mu.Unlock(); seen = append(seen, id) }
		run(cfg)
		Eventually(func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), seen...) }).Should(ContainElement("a"))
		Expect(b.FencingToken()).To(BeZero(), "b does not lead")
		Expect(a.FencingToken()).To(Equal(a.Holding().FencingToken()))
	})

	It("tells OnCampaign of every failed attempt, and once that a later one waits in the queue", func(ctx SpecContext) {
		var mu sync.Mutex
		heard := map[string][]error{}
		listen := func(id string) kle.Options {
			o := short
			o.OnCampaign = func(err error) { mu.Lock(); defer mu.Unlock(); heard[id] = append(heard[id], err) }
			return o
		}
		reports := func(id string) func() []error {
			return func() []error { mu.Lock(); defer mu.Unlock(); return slices.Clone(heard[id]) }
		}
		a := newLock(ctx, "a", listen("a"))
		ledA, _ := run(a.ElectionConfig(clientle.LeaderCallbacks{}))
		Eventually(ledA).Should(BeClosed())

		// b is a user with no right on locks yet: every attempt is refused.
		user := "no-rights-" + ns
		u, err := suite.Env.AddUser(envtest.User{Name: user}, nil)
		Expect(err).NotTo(HaveOccurred())
		b, err := kle.New(u.Config(), lockName, listen("b"), lock.WithNamespace(ns), lock.WithIdentity("b"))
		Expect(err).NotTo(HaveOccurred())
		run(b.ElectionConfig(clientle.LeaderCallbacks{}))
		Eventually(func() int { return len(reports("b")()) }).Should(BeNumerically(">=", 2), "one report per failed attempt")
		Expect(reports("b")()).To(HaveEach(MatchError(ContainSubstring("forbidden"))))

		Expect(suite.Env.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: testenv.LockUserRole},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		})).To(Succeed())
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, lockName).Status.Waiters }).Should(
			ContainElement(HaveField("Identity", "b")))
		Eventually(func() error { r := reports("b")(); return r[len(r)-1] }).Should(Succeed(), "b waits: healthy")
		Expect(slices.DeleteFunc(reports("b")(), func(err error) bool { return err != nil })).To(HaveLen(1), "nil once")
		Expect(reports("a")()).To(BeEmpty(), "the leader never failed")
	})

	It("refuses to lead for an elector with other timings, and frees the lock it never claimed", func(ctx SpecContext) {
		rl := newLock(ctx, "a", short)
		cfg := rl.ElectionConfig(clientle.LeaderCallbacks{})
		cfg.LeaseDuration = 15 * time.Second // controller-runtime's default, not the lock's 8 s
		led, stop := run(cfg)
		Eventually(func() *lock.Lock { return rl.Holding() }).ShouldNot(BeNil(), "the campaign takes the free lock")
		Consistently(led).WithTimeout(3 * time.Second).ShouldNot(BeClosed())
		stop()
		Eventually(func() *locksv1alpha1.LockHolder { return suite.GetLock(ctx, ns, lockName).Status.Holder }).Should(BeNil())
		Expect(rl.Holding().Err()).To(MatchError(lock.ErrReleased))
	})

	It("serves one term: after a release the same ResourceLock does not lead again", func(ctx SpecContext) {
		rl := newLock(ctx, "a", short)
		led, stop := run(rl.ElectionConfig(clientle.LeaderCallbacks{}))
		Eventually(led).Should(BeClosed())
		token := rl.FencingToken()
		Expect(token).To(BeNumerically(">", 0))
		stop() // ReleaseOnCancel
		Expect(suite.GetLock(ctx, ns, lockName).Status.Holder).To(BeNil())
		Expect(rl.FencingToken()).To(BeZero())

		again, _ := run(rl.ElectionConfig(clientle.LeaderCallbacks{}))
		Consistently(again).WithTimeout(3 * time.Second).ShouldNot(BeClosed())
		Expect(suite.GetLock(ctx, ns, lockName).Status.Holder).To(BeNil(), "nothing written for the second term")
	})
})
