package integration

import (
	"context"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = backends.Describe("apiserver unreachable (I4, I5)", Serial, func() {
	It("ends the holder's context before the controller, restarted meanwhile, can give the lock to anyone else", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		const lease = 4 * time.Second
		suite.NewLock(ctx, ns, "outage", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: int32(lease / time.Second)})

		cfg, _ := suite.UserConfig(ctx)
		proxy, err := faultproxy.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)
		a, err := lock.New(proxy.Config(), lock.WithNamespace(ns), lock.WithIdentity("cut-off"))
		Expect(err).NotTo(HaveOccurred())
		b, _ := suite.NewClient(ctx, ns)

		held, err := a.Acquire(ctx, "outage")
		Expect(err).NotTo(HaveOccurred())

		By("cutting the holder off from the apiserver and restarting the controller")
		proxy.SetRule(func(*http.Request) faultproxy.Action { return faultproxy.Refuse })
		cutAt := time.Now()
		stopController()
		startController()
		restartedAt := time.Now()

		type grant struct {
			at   time.Time
			lock *lock.Lock
		}
		granted := make(chan grant, 1)
		go func() {
			defer GinkgoRecover()
			next, err := b.Acquire(ctx, "outage", lock.WithWaitTimeout(time.Minute))
			Expect(err).NotTo(HaveOccurred())
			granted <- grant{time.Now(), next}
		}()

		By("renewing while cut off fails instead of succeeding locally (I4)")
		shortCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		Expect(held.Renew(shortCtx)).NotTo(Succeed())
		cancel()

		Eventually(held.Done(), 2*lease).Should(BeClosed())
		doneAt := time.Now()
		Expect(context.Cause(held.Context())).To(MatchError(lock.ErrLockLost))
		Expect(doneAt.Sub(cutAt)).To(BeNumerically("<", lease), "Done fires within one lease of the last proof")

		var g grant
		Eventually(granted, 4*lease).Should(Receive(&g))
		grantedAt, next := g.at, g.lock
		Expect(next.FencingToken()).To(BeNumerically(">", held.FencingToken()))
		Expect(doneAt.Before(grantedAt)).To(BeTrue(), "the holder stopped (%s) before the next holder started (%s)", doneAt, grantedAt)
		Expect(grantedAt.Sub(restartedAt)).To(BeNumerically(">=", lease), "a restarted controller never expires a lease early")
		stored := suite.GetLock(ctx, ns, "outage")
		ended := stored.Status.RecentAcquisitions
		Expect(ended).NotTo(BeEmpty())
		Expect(ended[0].LeaseID).To(Equal(held.LeaseID()))
		Expect(ended[0].EndReason).To(Equal(locksv1alpha1.EndReasonExpired))

		By("releasing the lost lock after the network heals never touches the new holding")
		proxy.SetRule(nil)
		before := suite.GetLock(ctx, ns, "outage")
		Expect(held.Release(ctx)).To(MatchError(lock.ErrLockLost))
		after := suite.GetLock(ctx, ns, "outage")
		Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
		Expect(after.Status.Holder.LeaseID).To(Equal(next.LeaseID()))
		Expect(next.Release(ctx)).To(Succeed())
	})
})
