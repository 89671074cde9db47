package integration

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
	kwebhook "github.com/kubelock/kubelock/webhook"
)

// The client within the server's queue bounds (issue 13): it asks for no more
// than spec.maxWaitSeconds and spec.maxWaitersPerUser allow, and writes the pod
// of its bound token.
var _ = Describe("queue bounds and pod binding from the client", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns)

	// waitFor starts an Acquire of key by c in the background and returns its
	// cancel; the result goes to done.
	waitFor := func(c *lock.Client, key string, opts ...lock.AcquireOption) (cancel func(), done <-chan error) {
		actx, cancelFn := context.WithCancel(ctx)
		ch := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			l, err := c.Acquire(actx, key, opts...)
			if err == nil {
				err = l.Release(ctx)
			}
			ch <- err
		}()
		return cancelFn, ch
	}

	// stop ends a background Acquire and waits for it.
	stop := func(cancel func(), done <-chan error) {
		cancel()
		if err := <-done; err != nil {
			GinkgoWriter.Println("background acquire ended:", err)
		}
	}

	It("caps its queue entry's deadline at spec.maxWaitSeconds", func() {
		suite.NewLock(ctx, ns, "capped", locksv1alpha1.DistributedLockSpec{MaxWaitSeconds: 60})
		holder, _ := suite.NewClient(ctx, ns)
		l, err := holder.Acquire(ctx, "capped")
		Expect(err).NotTo(HaveOccurred())
		defer func() { Expect(l.Release(ctx)).To(Succeed()) }()

		waiter, _ := suite.NewClient(ctx, ns)
		cancel, done := waitFor(waiter, "capped", lock.WaitTimeout(10*time.Minute))
		defer stop(cancel, done)
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, "capped").Status.Waiters }).Should(HaveLen(1))
		w := suite.GetLock(ctx, ns, "capped").Status.Waiters[0]
		Expect(w.Deadline.Sub(w.EnqueueTime.Time)).To(Equal(time.Minute))
	})

	It("refuses a user's entry beyond spec.maxWaitersPerUser, and another user still queues", func() {
		suite.NewLock(ctx, ns, "shared", locksv1alpha1.DistributedLockSpec{MaxWaitersPerUser: int32p(1)})
		holder, _ := suite.NewClient(ctx, ns)
		l, err := holder.Acquire(ctx, "shared")
		Expect(err).NotTo(HaveOccurred())
		defer func() { Expect(l.Release(ctx)).To(Succeed()) }()

		// Two processes of one user: two clients on one connection's user.
		cfg, _ := suite.UserConfig(ctx)
		first, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("first"))
		Expect(err).NotTo(HaveOccurred())
		second, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("second"))
		Expect(err).NotTo(HaveOccurred())
		cancel, done := waitFor(first, "shared")
		defer stop(cancel, done)
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, "shared").Status.Waiters }).Should(HaveLen(1))

		_, err = second.Acquire(ctx, "shared", lock.WaitTimeout(time.Minute))
		Expect(errors.Is(err, lock.ErrQueueFull)).To(BeTrue(), "want ErrQueueFull, got %v", err)

		other, _ := suite.NewClient(ctx, ns)
		cancelOther, doneOther := waitFor(other, "shared")
		defer stop(cancelOther, doneOther)
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, "shared").Status.Waiters }).Should(HaveLen(2))
	})

	It("writes the pod its token is bound to into the holding and the queue entry, not the configured one", func() {
		suite.NewLock(ctx, ns, "pods", locksv1alpha1.DistributedLockSpec{})
		_, user := suite.UserConfig(ctx)
		podConfig := func(pod string) *rest.Config {
			cfg := rest.CopyConfig(env.Config)
			cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Extra: map[string][]string{
				kwebhook.ExtraPodName: {pod}, kwebhook.ExtraPodUID: {"uid-" + pod},
			}}
			return cfg
		}
		p0, err := lock.New(podConfig("worker-0"), lock.WithNamespace(ns), lock.WithIdentity("worker-0"), lock.WithPod("env-name", "env-uid"))
		Expect(err).NotTo(HaveOccurred())
		l, err := p0.Acquire(ctx, "pods", lock.WaitTimeout(time.Minute))
		Expect(err).NotTo(HaveOccurred())
		h := suite.GetLock(ctx, ns, "pods").Status.Holder
		Expect(h.PodName).To(Equal("worker-0"))
		Expect(h.PodUID).To(Equal("uid-worker-0"))
		Expect(l.Renew(ctx)).To(Succeed())

		p1, err := lock.New(podConfig("worker-1"), lock.WithNamespace(ns), lock.WithIdentity("worker-1"))
		Expect(err).NotTo(HaveOccurred())
		cancel, done := waitFor(p1, "pods", lock.WaitTimeout(time.Minute))
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, "pods").Status.Waiters }).Should(HaveLen(1))
		w := suite.GetLock(ctx, ns, "pods").Status.Waiters[0]
		Expect(w.User).To(Equal(user))
		Expect(w.PodName).To(Equal("worker-1"))
		Expect(w.PodUID).To(Equal("uid-worker-1"))

		// The holding passes to the other pod of the same account in FIFO order.
		Expect(l.Release(ctx)).To(Succeed())
		Eventually(done).Should(Receive(Succeed()))
		cancel()
	})
})
