package integration

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
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

var _ = backends.Describe("reading a lock while the apiserver cannot answer", func() {
	It("sends the read again until it is answered, and returns a definite answer or the context's end at once", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "read", locksv1alpha1.DistributedLockSpec{})
		cfg, _ := suite.UserConfig(ctx)
		proxy, err := faultproxy.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)
		c, err := lock.New(proxy.Config(), lock.WithNamespace(ns), lock.WithIdentity("reader"))
		Expect(err).NotTo(HaveOccurred())
		held, err := c.Acquire(ctx, "read")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = held.Release(context.Background()) })

		// Each read of the lock is answered by fail(n), n counting from 1.
		var reads atomic.Int32
		failReads := func(fail func(n int32) faultproxy.Action) {
			reads.Store(0)
			proxy.SetRule(func(r *http.Request) faultproxy.Action {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/distributedlocks/") {
					return fail(reads.Add(1))
				}
				return faultproxy.Pass
			})
		}

		By("a 503, then a cut connection, then the answer")
		failReads(func(n int32) faultproxy.Action {
			return [...]faultproxy.Action{faultproxy.Unavailable, faultproxy.Refuse, faultproxy.Pass}[min(n, 3)-1]
		})
		got, err := c.Get(ctx, "read")
		Expect(err).NotTo(HaveOccurred())
		Expect(got.Status.Holder).NotTo(BeNil())
		Expect(got.Status.Holder.LeaseID).To(Equal(held.LeaseID()))
		Expect(reads.Load()).To(Equal(int32(3)), "the read was sent once per failure, then answered")

		By("a lock that does not exist: not found on the first try")
		failReads(func(int32) faultproxy.Action { return faultproxy.Pass })
		_, err = c.Get(ctx, "missing")
		Expect(err).To(MatchError(lock.ErrNotFound))
		Expect(reads.Load()).To(Equal(int32(1)))

		By("an apiserver that stays unavailable: the read ends with its context, saying why it failed")
		failReads(func(int32) faultproxy.Action { return faultproxy.Unavailable })
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err = c.Get(short, "read")
		Expect(err).To(MatchError(ContainSubstring("the server is currently unable to handle the request")))
		Expect(short.Err()).To(HaveOccurred(), "the read gave up before its context ended")
		Expect(reads.Load()).To(BeNumerically(">", 1))
	})
})
