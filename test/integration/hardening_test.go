package integration

import (
	"context"
	"errors"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

// The client within the server's queue bounds: it asks for no more
// than spec.maxWaitSeconds and spec.maxWaitersPerUser allow, and writes the pod
// of its bound token.
var _ = backends.Describe("queue bounds and pod binding from the client", func() {
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
		cancel, done := waitFor(waiter, "capped", lock.WithWaitTimeout(10*time.Minute))
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

		_, err = second.Acquire(ctx, "shared", lock.WithWaitTimeout(time.Minute))
		Expect(errors.Is(err, lock.ErrQueueFull)).To(BeTrue(), "want ErrQueueFull, got %v", err)

		other, _ := suite.NewClient(ctx, ns)
		cancelOther, doneOther := waitFor(other, "shared")
		defer stop(cancelOther, doneOther)
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, "shared").Status.Waiters }).Should(HaveLen(2))
	})

	It("writes the pod its token is bound to into the holding and the queue entry, and no pod with a token bound to none", func() {
		suite.NewLock(ctx, ns, "pods", locksv1alpha1.DistributedLockSpec{})
		sa := lockUserServiceAccount(ctx, ns, "worker")
		user := "system:serviceaccount:" + ns + ":" + sa.Name
		pods := make([]*corev1.Pod, 2)
		for i := range pods {
			pods[i] = &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("worker-%d", i)},
				Spec: corev1.PodSpec{ServiceAccountName: sa.Name, AutomountServiceAccountToken: ptr.To(false),
					Containers: []corev1.Container{{Name: "c", Image: "example.invalid/worker"}}},
			}
			Expect(env.Client.Create(ctx, pods[i])).To(Succeed())
		}
		// The pod's own name in its environment, as the samples set it, is
		// not what a client writes: only its token's pod is.
		GinkgoT().Setenv("POD_NAME", "not-the-token-pod")
		p0, err := lock.New(podBoundConfig(ctx, sa, pods[0]), lock.WithNamespace(ns), lock.WithIdentity("worker-0"))
		Expect(err).NotTo(HaveOccurred())
		l, err := p0.Acquire(ctx, "pods", lock.WithWaitTimeout(time.Minute))
		Expect(err).NotTo(HaveOccurred())
		h := suite.GetLock(ctx, ns, "pods").Status.Holder
		Expect(h.PodName).To(Equal(pods[0].Name))
		Expect(h.PodUID).To(BeEquivalentTo(pods[0].UID))
		Expect(l.Renew(ctx)).To(Succeed())

		p1, err := lock.New(podBoundConfig(ctx, sa, pods[1]), lock.WithNamespace(ns), lock.WithIdentity("worker-1"))
		Expect(err).NotTo(HaveOccurred())
		cancel, done := waitFor(p1, "pods", lock.WithWaitTimeout(time.Minute))
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, "pods").Status.Waiters }).Should(HaveLen(1))
		w := suite.GetLock(ctx, ns, "pods").Status.Waiters[0]
		Expect(w.User).To(Equal(user))
		Expect(w.PodName).To(Equal(pods[1].Name))
		Expect(w.PodUID).To(BeEquivalentTo(pods[1].UID))

		// A token of the same account bound to no pod (kubectl create token)
		// queues without pod fields, as admission demands.
		unbound, err := lock.New(unboundConfig(ctx, sa), lock.WithNamespace(ns), lock.WithIdentity("ci"))
		Expect(err).NotTo(HaveOccurred())
		cancelUnbound, doneUnbound := waitFor(unbound, "pods", lock.WithWaitTimeout(time.Minute))
		defer stop(cancelUnbound, doneUnbound)
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, "pods").Status.Waiters }).Should(HaveLen(2))
		w = suite.GetLock(ctx, ns, "pods").Status.Waiters[1]
		Expect(w.User).To(Equal(user))
		Expect(w.PodName).To(BeEmpty())
		Expect(w.PodUID).To(BeEmpty())

		// The holding passes to the other pod of the same account in FIFO order.
		Expect(l.Release(ctx)).To(Succeed())
		Eventually(done).Should(Receive(Succeed()))
		cancel()
	})
})
