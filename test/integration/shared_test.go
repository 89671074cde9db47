package integration

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

func semaphore(permits int32) locksv1alpha1.DistributedLockSpec {
	return locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: int32p(permits)}
}

var rwMutex = locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex}

// sharedEntry is the stored shared holding of l, nil when there is none.
func sharedEntry(obj *locksv1alpha1.DistributedLock, l *lock.Lock) *locksv1alpha1.SharedHolder {
	if i := obj.Status.SharedIndex(l.LeaseID()); i >= 0 {
		return &obj.Status.SharedHolders[i]
	}
	return nil
}

// slotOf is the slot of a shared holding; it fails the spec for an exclusive one.
func slotOf(l *lock.Lock) int32 {
	slot, ok := l.Slot()
	ExpectWithOffset(1, ok).To(BeTrue(), "a shared holding has a slot")
	return slot
}

// acquireLater acquires key in the background; the channel delivers the
// holding (nil on error, which fails the spec).
func acquireLater(ctx context.Context, c *lock.Client, key string, opts ...lock.AcquireOption) <-chan *lock.Lock {
	got := make(chan *lock.Lock, 1)
	go func() {
		defer GinkgoRecover()
		l, err := c.Acquire(ctx, key, opts...)
		Expect(err).NotTo(HaveOccurred())
		got <- l
	}()
	return got
}

// forceRelease breaks every holding of key as a fresh user with the
// force-release verb, and returns the records and that user's name.
func forceRelease(ctx context.Context, ns, key, reason string) ([]locksv1alpha1.FinishedHolding, string) {
	breaker, breakerName := suite.NewClient(ctx, ns)
	suite.GrantForceRelease(ctx, ns, breakerName)
	ended, err := breaker.ForceRelease(ctx, key, reason)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return ended, breakerName
}

// waiterModes are the modes of the stored queue, head first.
func waiterModes(ctx context.Context, ns, name string) []locksv1alpha1.Mode {
	var modes []locksv1alpha1.Mode
	for _, w := range suite.GetLock(ctx, ns, name).Status.Waiters {
		modes = append(modes, w.Mode)
	}
	return modes
}

var _ = backends.Describe("shared holdings: Semaphore permits and RWMutex readers", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns)

	It("gives each permit the lowest free slot and a token of old resourceVersion + 1, and releases only its own entry", func() {
		suite.NewLock(ctx, ns, "pool", semaphore(3))
		var held []*lock.Lock
		for i := range 3 {
			c, user := suite.NewClient(ctx, ns)
			before := suite.GetLock(ctx, ns, "pool")
			l, err := c.Acquire(ctx, "pool") // a Semaphore is acquired shared without asking
			Expect(err).NotTo(HaveOccurred())
			want, err := locksv1alpha1.NextFencingToken(before.ResourceVersion)
			Expect(err).NotTo(HaveOccurred())
			Expect(l.FencingToken()).To(Equal(want))
			Expect(l.Shared()).To(BeTrue())
			slot, ok := l.Slot()
			Expect(ok).To(BeTrue())
			Expect(slot).To(Equal(int32(i)))

			stored := suite.GetLock(ctx, ns, "pool")
			e := sharedEntry(stored, l)
			Expect(e).NotTo(BeNil())
			Expect(e.Slot).To(Equal(int32(i)))
			Expect(e.FencingToken).To(Equal(want))
			Expect(e.User).To(Equal(user))
			Expect(stored.Status.FencingToken).To(Equal(want))
			Expect(stored.Status.Holder).To(BeNil())
			Expect(stored.Status.HolderCount).To(Equal(int32(i + 1)))
			Expect(stored.Status.Transitions).To(Equal(int64(i + 1)))
			held = append(held, l)
		}

		By("a fourth permit is refused while all three are taken")
		d, _ := suite.NewClient(ctx, ns)
		_, err := d.TryAcquire(ctx, "pool")
		var locked *lock.LockedError
		Expect(errors.As(err, &locked)).To(BeTrue(), "got %v", err)
		Expect(locked.Shared).To(Equal(3))
		Expect(locked.Error()).To(ContainSubstring("3 shared holder(s)"))

		By("slot 1 releases: only its entry goes, recorded with its slot; the token and Held stay")
		before := suite.GetLock(ctx, ns, "pool")
		Expect(held[1].Release(ctx)).To(Succeed())
		stored := suite.GetLock(ctx, ns, "pool")
		Expect(stored.Status.SharedHolders).To(HaveLen(2))
		Expect(sharedEntry(stored, held[0])).To(Equal(sharedEntry(before, held[0])))
		Expect(sharedEntry(stored, held[2])).To(Equal(sharedEntry(before, held[2])))
		Expect(stored.Status.FencingToken).To(Equal(before.Status.FencingToken))
		Expect(stored.Status.HolderCount).To(Equal(int32(2)))
		Expect(meta.IsStatusConditionTrue(stored.Status.Conditions, locksv1alpha1.ConditionHeld)).To(BeTrue())
		f := stored.Status.FindFinished(held[1].RequestID())
		Expect(f).NotTo(BeNil())
		Expect(f.Slot).To(HaveValue(Equal(int32(1))))
		Expect(f.FencingToken).To(Equal(held[1].FencingToken()))
		Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonReleased))

		By("the next permit takes the freed slot 1 with a higher token")
		l, err := d.TryAcquire(ctx, "pool")
		Expect(err).NotTo(HaveOccurred())
		Expect(slotOf(l)).To(Equal(int32(1)))
		Expect(l.FencingToken()).To(BeNumerically(">", held[2].FencingToken()))
		for _, l := range append(held, l) {
			Expect(l.Release(ctx)).To(Succeed())
		}
		stored = suite.GetLock(ctx, ns, "pool")
		Expect(stored.Status.SharedHolders).To(BeEmpty())
		Expect(meta.IsStatusConditionFalse(stored.Status.Conditions, locksv1alpha1.ConditionHeld)).To(BeTrue())
	})

	It("refuses Shared on a Mutex with ErrMode and writes nothing", func() {
		suite.NewLock(ctx, ns, "plain", locksv1alpha1.DistributedLockSpec{})
		c, _ := suite.NewClient(ctx, ns)
		before := suite.GetLock(ctx, ns, "plain")
		_, err := c.Acquire(ctx, "plain", lock.WithShared())
		Expect(err).To(MatchError(lock.ErrMode))
		_, err = c.TryAcquire(ctx, "plain", lock.WithShared())
		Expect(err).To(MatchError(lock.ErrMode))
		Expect(suite.GetLock(ctx, ns, "plain").ResourceVersion).To(Equal(before.ResourceVersion))
	})

	It("lets readers share an RWMutex while a writer waits, and queues a later reader behind the writer (FIFO across modes)", func() {
		suite.NewLock(ctx, ns, "table", rwMutex)
		r1c, _ := suite.NewClient(ctx, ns)
		r2c, _ := suite.NewClient(ctx, ns)
		r1, err := r1c.Acquire(ctx, "table", lock.WithShared())
		Expect(err).NotTo(HaveOccurred())
		r2, err := r2c.TryAcquire(ctx, "table", lock.WithShared())
		Expect(err).NotTo(HaveOccurred(), "readers never block readers")
		Expect(slotOf(r1)).To(Equal(int32(0)))
		Expect(slotOf(r2)).To(Equal(int32(1)))

		wc, _ := suite.NewClient(ctx, ns)
		_, err = wc.TryAcquire(ctx, "table")
		Expect(err).To(MatchError(lock.ErrLocked))
		writer := acquireLater(ctx, wc, "table")
		Eventually(func() []locksv1alpha1.Mode { return waiterModes(ctx, ns, "table") }).
			Should(Equal([]locksv1alpha1.Mode{locksv1alpha1.Exclusive}))

		By("a reader arriving while the writer waits queues behind it")
		r3c, _ := suite.NewClient(ctx, ns)
		_, err = r3c.TryAcquire(ctx, "table", lock.WithShared())
		Expect(err).To(MatchError(lock.ErrLocked))
		reader3 := acquireLater(ctx, r3c, "table", lock.WithShared())
		Eventually(func() []locksv1alpha1.Mode { return waiterModes(ctx, ns, "table") }).
			Should(Equal([]locksv1alpha1.Mode{locksv1alpha1.Exclusive, locksv1alpha1.Shared}))

		By("the writer gets the lock once both readers left; the third reader still waits")
		Expect(r1.Release(ctx)).To(Succeed())
		Consistently(writer, 300*time.Millisecond).ShouldNot(Receive())
		Expect(r2.Release(ctx)).To(Succeed())
		var w *lock.Lock
		Eventually(writer).Should(Receive(&w))
		Expect(w.Shared()).To(BeFalse())
		_, ok := w.Slot()
		Expect(ok).To(BeFalse())
		stored := suite.GetLock(ctx, ns, "table")
		Expect(stored.Status.Holder.LeaseID).To(Equal(w.LeaseID()))
		Expect(stored.Status.SharedHolders).To(BeEmpty())
		Expect(waiterModes(ctx, ns, "table")).To(Equal([]locksv1alpha1.Mode{locksv1alpha1.Shared}))
		Consistently(reader3, 300*time.Millisecond).ShouldNot(Receive())

		Expect(w.Release(ctx)).To(Succeed())
		var r3 *lock.Lock
		Eventually(reader3).Should(Receive(&r3))
		Expect(r3.FencingToken()).To(BeNumerically(">", w.FencingToken()))
		Expect(r3.Release(ctx)).To(Succeed())
	})

	It("lets consecutive shared waiters at the head acquire without waiting for each other", func() {
		suite.NewLock(ctx, ns, "table", rwMutex)
		wc, _ := suite.NewClient(ctx, ns)
		w, err := wc.Acquire(ctx, "table")
		Expect(err).NotTo(HaveOccurred())
		var readers []<-chan *lock.Lock
		for i := range 3 {
			c, _ := suite.NewClient(ctx, ns)
			readers = append(readers, acquireLater(ctx, c, "table", lock.WithShared()))
			Eventually(func() int32 { return suite.GetLock(ctx, ns, "table").Status.WaiterCount }).Should(Equal(int32(i + 1)))
		}
		Expect(w.Release(ctx)).To(Succeed())
		var held []*lock.Lock
		for _, r := range readers {
			var l *lock.Lock
			Eventually(r).Should(Receive(&l))
			held = append(held, l)
		}
		stored := suite.GetLock(ctx, ns, "table")
		Expect(stored.Status.SharedHolders).To(HaveLen(3), "all three hold at once")
		Expect(stored.Status.Waiters).To(BeEmpty())
		for _, l := range held {
			Expect(l.Release(ctx)).To(Succeed())
		}
	})

	It("renews only its own entry's renewTime", func() {
		suite.NewLock(ctx, ns, "pool", semaphore(2))
		ac, _ := suite.NewClient(ctx, ns, lock.WithoutAutoRenew())
		bc, _ := suite.NewClient(ctx, ns, lock.WithoutAutoRenew())
		a, err := ac.Acquire(ctx, "pool")
		Expect(err).NotTo(HaveOccurred())
		b, err := bc.Acquire(ctx, "pool")
		Expect(err).NotTo(HaveOccurred())
		before := suite.GetLock(ctx, ns, "pool")
		deadline := a.ExpiresAt()
		Eventually(func() error { return a.Renew(ctx) }).Should(Succeed())
		Expect(a.ExpiresAt()).To(BeTemporally(">", deadline))
		after := suite.GetLock(ctx, ns, "pool")
		Expect(sharedEntry(after, a).RenewTime.Time).To(BeTemporally(">", sharedEntry(before, a).RenewTime.Time))
		Expect(sharedEntry(after, b)).To(Equal(sharedEntry(before, b)))
		renewed := sharedEntry(after, a).DeepCopy()
		renewed.RenewTime = sharedEntry(before, a).RenewTime
		Expect(renewed).To(Equal(sharedEntry(before, a)), "nothing but renewTime changed in the entry")
		Expect(after.Status.FencingToken).To(Equal(before.Status.FencingToken))
		Expect(after.Status.Transitions).To(Equal(before.Status.Transitions))
		Expect(after.Status.HolderCount).To(Equal(before.Status.HolderCount))
		Expect(after.Status.RecentAcquisitions).To(Equal(before.Status.RecentAcquisitions))
		Expect(a.Release(ctx)).To(Succeed())
		Expect(b.Release(ctx)).To(Succeed())
	})

	It("ends a permit that cannot renew at its own safe deadline (I5), before the controller expires that entry alone", func() {
		spec := semaphore(2)
		spec.LeaseDurationSeconds = 2
		suite.NewLock(ctx, ns, "pool", spec)
		paused, _ := suite.NewClient(ctx, ns, lock.WithoutAutoRenew()) // renews nothing, as a paused process
		live, _ := suite.NewClient(ctx, ns)
		a, err := paused.Acquire(ctx, "pool")
		Expect(err).NotTo(HaveOccurred())
		b, err := live.Acquire(ctx, "pool")
		Expect(err).NotTo(HaveOccurred())

		Eventually(a.Done(), 5*time.Second).Should(BeClosed())
		doneAt := time.Now()
		Expect(a.Err()).To(MatchError(lock.ErrLockLost))
		var f *locksv1alpha1.FinishedHolding
		Eventually(func() *locksv1alpha1.FinishedHolding {
			f = suite.GetLock(ctx, ns, "pool").Status.FindFinished(a.RequestID())
			return f
		}, 10*time.Second).ShouldNot(BeNil())
		Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
		Expect(f.Slot).To(HaveValue(Equal(slotOf(a))))
		Expect(f.EndTime.Time).To(BeTemporally(">", doneAt), "the client stopped before the controller ended the entry")

		stored := suite.GetLock(ctx, ns, "pool")
		Expect(sharedEntry(stored, b)).NotTo(BeNil(), "the renewing permit keeps its entry")
		Expect(b.Err()).NotTo(HaveOccurred())
		Expect(b.Release(ctx)).To(Succeed())
	})

	It("finds a retried request's shared holding (I6), and says when it ended", func() {
		suite.NewLock(ctx, ns, "pool", semaphore(2))
		c, _ := suite.NewClient(ctx, ns)
		l, err := c.Acquire(ctx, "pool", lock.WithRequestID("req-7"))
		Expect(err).NotTo(HaveOccurred())
		again, err := c.Acquire(ctx, "pool", lock.WithRequestID("req-7"))
		Expect(err).NotTo(HaveOccurred())
		Expect(again.LeaseID()).To(Equal(l.LeaseID()))
		Expect(again.FencingToken()).To(Equal(l.FencingToken()))
		Expect(slotOf(again)).To(Equal(int32(0)))
		stored := suite.GetLock(ctx, ns, "pool")
		Expect(stored.Status.SharedHolders).To(HaveLen(1))
		Expect(stored.Status.Transitions).To(Equal(int64(1)))

		Expect(l.Release(ctx)).To(Succeed())
		_, err = c.Acquire(ctx, "pool", lock.WithRequestID("req-7"))
		Expect(err).To(MatchError(lock.ErrLockLost))
		Expect(err.Error()).To(ContainSubstring("already ended: Released"))
	})

	It("holds a permit in a session: the entry names it and ends with it", func() {
		suite.NewLock(ctx, ns, "pool", semaphore(2))
		c, _ := suite.NewClient(ctx, ns)
		s, err := c.NewSession(ctx)
		Expect(err).NotTo(HaveOccurred())
		l, err := c.Acquire(ctx, "pool", lock.WithSession(s))
		Expect(err).NotTo(HaveOccurred())
		e := sharedEntry(suite.GetLock(ctx, ns, "pool"), l)
		Expect(e.Session).To(Equal(s.Name()))
		Expect(e.LeaseDurationSeconds).To(Equal(int32(s.TTL() / time.Second)))
		Expect(l.Renew(ctx)).To(Succeed(), "a holding in a session renews nothing itself")
		Expect(s.Close(ctx)).To(Succeed())
		Expect(l.Done()).To(BeClosed())
		Expect(l.Err()).To(MatchError(lock.ErrSessionClosed))
		Eventually(func() *locksv1alpha1.FinishedHolding {
			return suite.GetLock(ctx, ns, "pool").Status.FindFinished(l.RequestID())
		}).Should(HaveField("EndReason", locksv1alpha1.EndReasonSessionClosed), "the controller ends the entry with its session")
	})

	It("force-releases every holding, more than one write's worth, each recorded", func() {
		suite.NewLock(ctx, ns, "table", rwMutex)
		var readers []*lock.Lock
		for range 10 {
			c, _ := suite.NewClient(ctx, ns)
			l, err := c.Acquire(ctx, "table", lock.WithShared())
			Expect(err).NotTo(HaveOccurred())
			readers = append(readers, l)
		}
		ended, breakerName := forceRelease(ctx, ns, "table", "maintenance")
		Expect(ended).To(HaveLen(10))
		leases := map[string]bool{}
		for _, f := range ended {
			Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonForceReleased))
			Expect(f.EndedBy).To(Equal(breakerName))
			Expect(f.Message).To(Equal("maintenance"))
			Expect(f.Slot).NotTo(BeNil())
			leases[f.LeaseID] = true
		}
		stored := suite.GetLock(ctx, ns, "table")
		Expect(stored.Status.SharedHolders).To(BeEmpty())
		Expect(stored.Status.HolderCount).To(BeZero())
		for _, l := range readers {
			Expect(leases).To(HaveKey(l.LeaseID()))
			Expect(l.Renew(ctx)).To(MatchError(lock.ErrLockLost))
			Expect(l.Done()).To(BeClosed())
		}
	})
})
