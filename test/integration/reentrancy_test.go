package integration

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = backends.Describe("reentrant holdings (WithReentrancy)", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns, "orders")

	It("holds the lock until the N-th release: N acquisitions, one holding, one token", func() {
		const n = 5
		c, _ := suite.NewClient(ctx, ns, lock.WithReentrancy())
		first, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		rv := suite.GetLock(ctx, ns, "orders").ResourceVersion
		for range n - 1 {
			l, err := c.Acquire(ctx, "orders")
			Expect(err).NotTo(HaveOccurred())
			Expect(l).To(BeIdenticalTo(first), "the same holding: token, Context and Done")
			l, err = c.TryAcquire(ctx, "orders")
			Expect(err).NotTo(HaveOccurred())
			Expect(l).To(BeIdenticalTo(first))
			Expect(first.Release(ctx)).To(Succeed()) // keeps the count at one more per round
		}
		Expect(suite.GetLock(ctx, ns, "orders").ResourceVersion).To(Equal(rv), "a re-entry writes nothing")

		for i := range n - 1 {
			Expect(first.Release(ctx)).To(Succeed())
			Expect(first.Err()).NotTo(HaveOccurred(), "release %d of %d", i+1, n)
			stored := suite.GetLock(ctx, ns, "orders")
			Expect(stored.Status.Holder).NotTo(BeNil(), "held on the server after release %d of %d", i+1, n)
			Expect(stored.Status.Holder.LeaseID).To(Equal(first.LeaseID()))
			Expect(stored.Status.FencingToken).To(Equal(first.FencingToken()))
		}
		Expect(first.Renew(ctx)).To(Succeed(), "still renewable before the last release")

		Expect(first.Release(ctx)).To(Succeed())
		Expect(first.Done()).To(BeClosed())
		Expect(first.Err()).To(MatchError(lock.ErrReleased))
		stored := suite.GetLock(ctx, ns, "orders")
		Expect(stored.Status.Holder).To(BeNil(), "free on the server after the N-th release")
		Expect(stored.Status.Transitions).To(Equal(int64(1)))
		Expect(stored.Status.FindFinished(first.RequestID()).EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		Expect(first.Release(ctx)).To(Succeed(), "releasing again is a no-op")

		next, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		Expect(next).NotTo(BeIdenticalTo(first))
		Expect(next.FencingToken()).To(BeNumerically(">", first.FencingToken()))
		Expect(next.Release(ctx)).To(Succeed())
	})

	It("re-enters a shared holding as one entry, and refuses the other mode with ErrMode", func() {
		suite.NewLock(ctx, ns, "table", rwMutex)
		c, _ := suite.NewClient(ctx, ns, lock.WithReentrancy())
		r, err := c.Acquire(ctx, "table", lock.WithShared())
		Expect(err).NotTo(HaveOccurred())
		again, err := c.Acquire(ctx, "table", lock.WithShared())
		Expect(err).NotTo(HaveOccurred())
		Expect(again).To(BeIdenticalTo(r))
		Expect(suite.GetLock(ctx, ns, "table").Status.SharedHolders).To(HaveLen(1))

		_, err = c.Acquire(ctx, "table", lock.WithWaitTimeout(time.Second))
		Expect(err).To(MatchError(lock.ErrMode), "no upgrade: it would wait for itself")
		Expect(suite.GetLock(ctx, ns, "table").Status.Waiters).To(BeEmpty())

		Expect(r.Release(ctx)).To(Succeed())
		Expect(suite.GetLock(ctx, ns, "table").Status.SharedHolders).To(HaveLen(1))
		Expect(r.Release(ctx)).To(Succeed())
		Expect(suite.GetLock(ctx, ns, "table").Status.SharedHolders).To(BeEmpty())

		w, err := c.Acquire(ctx, "table")
		Expect(err).NotTo(HaveOccurred())
		_, err = c.Acquire(ctx, "table", lock.WithShared())
		Expect(err).To(MatchError(lock.ErrMode), "no downgrade")
		Expect(w.Release(ctx)).To(Succeed())
	})

	It("re-enters from concurrent goroutines of one client", func() {
		c, _ := suite.NewClient(ctx, ns, lock.WithReentrancy())
		const n = 8
		got := make(chan *lock.Lock, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				defer GinkgoRecover()
				l, err := c.Acquire(ctx, "orders")
				Expect(err).NotTo(HaveOccurred())
				got <- l
			})
		}
		wg.Wait()
		close(got)
		var held []*lock.Lock
		for l := range got {
			held = append(held, l)
		}
		Expect(held).To(HaveLen(n))
		for _, l := range held {
			Expect(l).To(BeIdenticalTo(held[0]))
		}
		stored := suite.GetLock(ctx, ns, "orders")
		Expect(stored.Status.Transitions).To(Equal(int64(1)))
		Expect(stored.Status.Waiters).To(BeEmpty())
		for _, l := range held {
			Expect(l.Release(ctx)).To(Succeed())
		}
		Expect(suite.GetLock(ctx, ns, "orders").Status.Holder).To(BeNil())
	})

	It("ends every re-entry when the lock is force-released", func() {
		c, _ := suite.NewClient(ctx, ns, lock.WithReentrancy())
		var entries []*lock.Lock
		for range 3 {
			l, err := c.Acquire(ctx, "orders")
			Expect(err).NotTo(HaveOccurred())
			entries = append(entries, l)
		}
		forceRelease(ctx, ns, "orders", "test")
		Expect(entries[0].Renew(ctx)).To(MatchError(lock.ErrLockLost))
		for _, l := range entries {
			Expect(l.Done()).To(BeClosed())
			Expect(l.Err()).To(MatchError(lock.ErrLockLost))
			Expect(l.Release(ctx)).To(MatchError(lock.ErrLockLost))
		}
		next, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		Expect(next).NotTo(BeIdenticalTo(entries[0]), "a lost holding is never re-entered")
		Expect(next.Release(ctx)).To(Succeed())
	})

	It("ends every re-entry when the lease expires", func() {
		suite.NewLock(ctx, ns, "short", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 2})
		c, _ := suite.NewClient(ctx, ns, lock.WithReentrancy(), lock.WithoutAutoRenew())
		first, err := c.Acquire(ctx, "short")
		Expect(err).NotTo(HaveOccurred())
		second, err := c.Acquire(ctx, "short")
		Expect(err).NotTo(HaveOccurred())
		Eventually(second.Done(), 5*time.Second).Should(BeClosed())
		Expect(first.Done()).To(BeClosed())
		Expect(first.Err()).To(MatchError(lock.ErrLockLost))
		Eventually(func() *locksv1alpha1.LockHolder { return suite.GetLock(ctx, ns, "short").Status.Holder }, 10*time.Second).Should(BeNil())
		Expect(suite.GetLock(ctx, ns, "short").Status.FindFinished(first.RequestID()).EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
	})

	It("without the option, a second acquire of a held key waits, as sync.Mutex does", func() {
		c, _ := suite.NewClient(ctx, ns)
		l, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		_, err = c.TryAcquire(ctx, "orders")
		Expect(err).To(MatchError(lock.ErrLocked))
		_, err = c.Acquire(ctx, "orders", lock.WithWaitTimeout(500*time.Millisecond))
		Expect(err).To(MatchError(lock.ErrTimeout))
		Expect(l.Release(ctx)).To(Succeed())
	})
})
