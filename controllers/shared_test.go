package controllers_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/test/testmetrics"
)

var _ = Describe("shared modes", func() {
	var (
		ctx context.Context
		ns  string
	)
	BeforeEach(func() {
		ctx = context.Background()
		ns = newNamespace(ctx)
	})

	It("expires a lapsed reader while the other readers keep theirs, and the writer queued behind gets the lock once all readers are gone", func() {
		startController()
		// A short hand-off timeout: the writer is not dropped while readers
		// hold, however long that lasts, only once the lock admits it.
		key := createLock(ctx, ns, "rw", nil, locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex, HandoffTimeoutSeconds: 3})
		lapsedSent := time.Now()
		lapsedToken, lapsedSlot := acquireShared(ctx, key, "lease-reader-lapsed1", 1, nil)
		acquireShared(ctx, key, "lease-reader-kept-01", 2, nil)
		acquireShared(ctx, key, "lease-reader-kept-02", 2, nil)
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			w := waiter("writer", time.Now(), time.Hour)
			w.Mode = locksv1alpha1.Exclusive
			l.Status.AppendWaiter(w)
		})

		By("renewing two readers every 250 ms; the third never renews")
		renewing := []string{"lease-reader-kept-01", "lease-reader-kept-02"}
		// lastRenew is when the latest round of renewals was sent.
		lastRenew := time.Now()
		keepRenewing := func(g Gomega) {
			if time.Since(lastRenew) >= 250*time.Millisecond {
				sent := time.Now()
				for _, id := range renewing {
					g.Expect(renewShared(ctx, key, id)).To(Succeed())
				}
				lastRenew = sent
			}
		}
		Eventually(func(g Gomega) {
			keepRenewing(g)
			g.Expect(sharedIDs(ctx, key)).To(Equal([]string{"lease-reader-kept-01", "lease-reader-kept-02"}))
		}).Should(Succeed())
		lapsedAfter := time.Since(lapsedSent)
		Expect(lapsedAfter).To(BeNumerically(">=", time.Second+grace), "a reader expired before lease+grace")
		AddReportEntry("lapsed reader (lease 1 s + grace 1 s): acquisition sent -> seen expired", lapsedAfter.String())
		GinkgoWriter.Printf("lapsed reader (lease 1 s + grace 1 s): acquisition sent -> seen expired: %s\n", lapsedAfter)
		rec := finishedOf(ctx, key, "lease-reader-lapsed1")
		Expect(rec).NotTo(BeNil())
		Expect(rec.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
		Expect(rec.EndedBy).To(Equal(adminUser))
		Expect(rec.FencingToken).To(Equal(lapsedToken))
		Expect(rec.Slot).To(Equal(ptr.To(lapsedSlot)))
		l := getLock(ctx, key)
		Expect(l.Status.HolderCount).To(BeEquivalentTo(2))
		Expect(meta.IsStatusConditionTrue(l.Status.Conditions, locksv1alpha1.ConditionHeld)).To(BeTrue(), "Held stays True while readers hold")
		Eventually(eventReasons).WithArguments(ctx, key).Should(ContainElement(controllers.EventExpired))

		By("keeping the renewed readers, and the writer at the head, for longer than lease+grace and the hand-off timeout")
		Consistently(func(g Gomega) {
			keepRenewing(g)
			g.Expect(sharedIDs(ctx, key)).To(HaveLen(2))
			g.Expect(waiterIDs(ctx, key)).To(Equal([]string{"writer"}))
		}, 4*time.Second).Should(Succeed())

		By("one reader releasing, the other ceasing to renew")
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			Expect(l.EndShared("lease-reader-kept-01", locksv1alpha1.EndReasonReleased, adminUser, metav1.NewMicroTime(time.Now()))).To(BeTrue())
		})

		By("the writer acquiring as soon as the lock admits it")
		var token int64
		Eventually(func(g Gomega) {
			l := getLock(ctx, key)
			g.Expect(l.Status.Waiters).NotTo(BeEmpty(), "the writer was dropped")
			g.Expect(l.Status.Waiters[0].RequestID).To(Equal("writer"))
			g.Expect(l.Admits(locksv1alpha1.Exclusive)).To(BeTrue())
			token = acquireAsHead(ctx, g, l, "lease-writer-000001")
		}).Should(Succeed())
		writerAfter := time.Since(lastRenew)
		Expect(writerAfter).To(BeNumerically(">=", 2*time.Second+grace), "the last reader expired before lease+grace after its last renewal was sent")
		AddReportEntry("last reader (lease 2 s + grace 1 s): last renewal sent -> writer acquired", writerAfter.String())
		GinkgoWriter.Printf("last reader (lease 2 s + grace 1 s): last renewal sent -> writer acquired: %s\n", writerAfter)
		l = getLock(ctx, key)
		Expect(l.Status.Holder.LeaseID).To(Equal("lease-writer-000001"))
		Expect(l.Status.SharedHolders).To(BeEmpty())
		Expect(l.Status.FencingToken).To(Equal(token))
		Expect(finishedOf(ctx, key, "lease-reader-kept-02").EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
		Expect(finishedOf(ctx, key, "lease-reader-kept-01").EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
	})

	It("drops a shared head that does not claim an admitting lock in time, and keeps the exclusive head behind it while readers hold", func() {
		startController()
		key := createLock(ctx, ns, "handoff", nil, locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex, HandoffTimeoutSeconds: 1})
		acquireShared(ctx, key, "lease-reader-000001", 300, nil)
		queued := time.Now()
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			r := waiter("reader", time.Now(), time.Hour)
			r.Mode = locksv1alpha1.Shared
			w := waiter("writer", time.Now(), time.Hour)
			w.Mode = locksv1alpha1.Exclusive
			l.Status.AppendWaiter(r)
			l.Status.AppendWaiter(w)
		})
		Eventually(waiterIDs).WithArguments(ctx, key).Should(Equal([]string{"writer"}))
		Expect(time.Since(queued)).To(BeNumerically(">=", time.Second))
		Consistently(waiterIDs).WithArguments(ctx, key).WithTimeout(3 * time.Second).Should(Equal([]string{"writer"}))
		Expect(sharedIDs(ctx, key)).To(Equal([]string{"lease-reader-000001"}))
	})

	It("expires more permits than one write can record, each on its own, in several writes", func() {
		key := createLock(ctx, ns, "sem", nil, locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: ptr.To[int32](10)})
		expired := func() float64 {
			v, err := testmetrics.Value(ctrlmetrics.Registry, "kubelock_controller_expirations_total", nil)
			Expect(err).NotTo(HaveOccurred())
			return v
		}
		before := expired()
		tokens := map[int32]int64{}
		for i := range 10 {
			token, slot := acquireShared(ctx, key, fmt.Sprintf("lease-permit-%07d", i), 1, nil)
			Expect(slot).To(BeEquivalentTo(i))
			tokens[slot] = token
		}

		By("starting the controller now: it sees all ten permits at once, so all lapse together")
		started := time.Now()
		startController()
		Eventually(sharedIDs).WithArguments(ctx, key).Should(BeEmpty())
		allGone := time.Since(started)
		Expect(allGone).To(BeNumerically(">=", time.Second+grace))
		AddReportEntry("ten permits (lease 1 s + grace 1 s): controller started -> all seen expired", allGone.String())
		GinkgoWriter.Printf("ten permits (lease 1 s + grace 1 s): controller started -> all seen expired: %s\n", allGone)
		Eventually(expired).Should(Equal(before+10), "each permit expired once")

		l := getLock(ctx, key)
		Expect(l.Status.HolderCount).To(BeZero())
		Expect(meta.IsStatusConditionFalse(l.Status.Conditions, locksv1alpha1.ConditionHeld)).To(BeTrue())
		// Eight ended in the first write, the last two in the next: status
		// keeps the newest eight records.
		var slots []int32
		for _, f := range l.Status.RecentAcquisitions {
			Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
			Expect(f.Slot).NotTo(BeNil())
			Expect(f.FencingToken).To(Equal(tokens[*f.Slot]), "each record carries its own permit's token")
			slots = append(slots, *f.Slot)
		}
		Expect(slots).To(Equal([]int32{2, 3, 4, 5, 6, 7, 8, 9}))
	})

	It("counts shared holdings in a session's status.locks and ends them SessionClosed when it is deleted", func() {
		startController()
		session := createSession(ctx, ns, "shared", adminUser, 300)
		sem := createLock(ctx, ns, "sem", nil, locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: ptr.To[int32](3)})
		rw := createLock(ctx, ns, "rw", nil, locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex})
		acquireShared(ctx, sem, "lease-sem-session-01", 300, inSession(session.Name))
		acquireShared(ctx, sem, "lease-sem-session-02", 300, inSession(session.Name))
		acquireShared(ctx, sem, "lease-sem-alone-0001", 300, nil)
		acquireShared(ctx, rw, "lease-rw-session-001", 300, inSession(session.Name))
		Eventually(sessionLocks).WithArguments(ctx, session).Should(BeEquivalentTo(3), "status.locks counts every holding in the session")

		By("a permit released: the count follows")
		updateStatus(ctx, sem, func(l *locksv1alpha1.DistributedLock) {
			l.EndShared("lease-sem-session-02", locksv1alpha1.EndReasonReleased, adminUser, metav1.NewMicroTime(time.Now()))
		})
		Eventually(sessionLocks).WithArguments(ctx, session).Should(BeEquivalentTo(2))

		Expect(env.Client.Delete(ctx, &locksv1alpha1.LockSession{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: session.Name}})).To(Succeed())
		Eventually(sharedIDs).WithArguments(ctx, rw).Should(BeEmpty())
		Eventually(sharedIDs).WithArguments(ctx, sem).Should(Equal([]string{"lease-sem-alone-0001"}))
		Expect(finishedOf(ctx, sem, "lease-sem-session-01").EndReason).To(Equal(locksv1alpha1.EndReasonSessionClosed))
		Expect(finishedOf(ctx, rw, "lease-rw-session-001").EndReason).To(Equal(locksv1alpha1.EndReasonSessionClosed))
	})

	It("frees a pod-bound permit without a session when its pod is deleted", func() {
		startController()
		user := "system:serviceaccount:" + ns + ":worker"
		pod := createPod(ctx, ns, "worker-0")
		key := createLock(ctx, ns, "sem", nil, locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: ptr.To[int32](2)})
		acquireShared(ctx, key, "lease-pod-permit-001", 30, func(h *locksv1alpha1.LockHolder) {
			h.User, h.PodName, h.PodUID = user, pod.Name, string(pod.UID)
		})
		acquireShared(ctx, key, "lease-other-permit01", 30, nil)
		Consistently(sharedIDs).WithArguments(ctx, key).WithTimeout(500 * time.Millisecond).Should(HaveLen(2))
		Expect(env.Client.Delete(ctx, pod)).To(Succeed())
		Eventually(sharedIDs).WithArguments(ctx, key).Should(Equal([]string{"lease-other-permit01"}))
		Expect(finishedOf(ctx, key, "lease-pod-permit-001").EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
	})
})

// acquireShared adds a shared holding the way a client does (lowest free
// slot, token from the resourceVersion the write is conditioned on), adjusted
// by change when not nil, and returns its token and slot.
func acquireShared(ctx context.Context, key types.NamespacedName, leaseID string, leaseSeconds int32, change func(*locksv1alpha1.LockHolder)) (int64, int32) {
	var token int64
	var slot int32
	updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
		t, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		s, free := l.FreeSlot()
		Expect(free).To(BeTrue(), "no free slot")
		token, slot = t, s
		now := metav1.NewMicroTime(time.Now())
		h := locksv1alpha1.LockHolder{
			Identity: "reader-" + leaseID, User: adminUser, LeaseID: leaseID, RequestID: "req-" + leaseID,
			LeaseDurationSeconds: leaseSeconds, AcquireTime: now, RenewTime: &now,
		}
		if change != nil {
			change(&h)
		}
		l.AcquireShared(h, slot, token)
	})
	return token, slot
}

// acquireAsHead acquires l exclusively as the waiter at its head, in one
// write conditioned on l's version, and returns the token; it fails through g
// (for Eventually to retry) when the lock changed meanwhile.
func acquireAsHead(ctx context.Context, g Gomega, l *locksv1alpha1.DistributedLock, leaseID string) int64 {
	token, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
	g.Expect(err).NotTo(HaveOccurred())
	now := metav1.NewMicroTime(time.Now())
	l.Acquire(locksv1alpha1.LockHolder{
		Identity: "writer", User: adminUser, LeaseID: leaseID, RequestID: l.Status.Waiters[0].RequestID,
		LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now,
	}, token)
	g.Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
	return token
}

// renewShared advances the renewTime of shared holding leaseID, failing if it no longer holds.
func renewShared(ctx context.Context, key types.NamespacedName, leaseID string) error {
	for {
		l := getLock(ctx, key)
		i := l.Status.SharedIndex(leaseID)
		if i < 0 {
			return fmt.Errorf("shared lease %s is no longer held", leaseID)
		}
		now := metav1.NewMicroTime(time.Now())
		l.Status.SharedHolders[i].RenewTime = &now
		err := env.Client.Status().Update(ctx, l)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// sharedIDs lists the leaseIDs of the lock's shared holdings.
func sharedIDs(ctx context.Context, key types.NamespacedName) []string {
	ids := []string{}
	for _, h := range getLock(ctx, key).Status.SharedHolders {
		ids = append(ids, h.LeaseID)
	}
	return ids
}

// finishedOf is the record of the ended holding leaseID, nil when status no longer has it.
func finishedOf(ctx context.Context, key types.NamespacedName, leaseID string) *locksv1alpha1.FinishedHolding {
	for _, f := range getLock(ctx, key).Status.RecentAcquisitions {
		if f.LeaseID == leaseID {
			return &f
		}
	}
	return nil
}
