package controllers_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/test/testmetrics"
)

var _ = Describe("the expiry controller", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	It("keeps a renewed lease and expires it lease+grace after renewals stop", func() {
		startController()
		key := createLock(ctx, newNamespace(ctx), "renewed", nil, locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 1})
		token := acquire(ctx, key, "lease-renewed-000001", 1)

		By("renewing every 250 ms for four times lease+grace")
		lastRenewSent := time.Now()
		Consistently(func(g Gomega) {
			if time.Since(lastRenewSent) >= 250*time.Millisecond {
				sent := time.Now()
				g.Expect(renew(ctx, key, "lease-renewed-000001")).To(Succeed())
				lastRenewSent = sent
			}
			h := getLock(ctx, key).Status.Holder
			g.Expect(h).NotTo(BeNil())
			g.Expect(h.LeaseID).To(Equal("lease-renewed-000001"))
		}, 8*time.Second).Should(Succeed())

		By("stopping the renewals")
		var l *locksv1alpha1.DistributedLock
		Eventually(func() *locksv1alpha1.LockHolder {
			l = getLock(ctx, key)
			return l.Status.Holder
		}).Should(BeNil())
		sinceRenew := time.Since(lastRenewSent)
		Expect(sinceRenew).To(BeNumerically(">=", time.Second+grace), "expired before lease+grace after the last renewal was sent")
		// A loose bound: only that expiry happens at all, also on a loaded machine.
		Expect(sinceRenew).To(BeNumerically("<", time.Second+grace+10*time.Second), "expired far too late")

		Expect(l.Status.RecentAcquisitions).NotTo(BeEmpty())
		last := l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
		Expect(last.LeaseID).To(Equal("lease-renewed-000001"))
		Expect(last.FencingToken).To(Equal(token))
		Expect(last.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
		Expect(last.EndedBy).To(Equal(adminUser), "the controller writes the name it learned with a SelfSubjectReview")
		Expect(l.Status.FencingToken).To(Equal(token))
		held := meta.FindStatusCondition(l.Status.Conditions, locksv1alpha1.ConditionHeld)
		Expect(held).NotTo(BeNil())
		Expect(held.Status).To(Equal(metav1.ConditionFalse))
		Expect(held.Reason).To(Equal(locksv1alpha1.ReasonExpired))

		By("emitting the Event of the expiry it caused")
		// Acquired is emitted only when the controller saw the lock free before
		// it saw it held; on a loaded machine the workqueue may fold the create and
		// the acquisition into one reconcile, which is then a first observation.
		Eventually(eventReasons).WithArguments(ctx, key).Should(ContainElement("Expired"))
	})

	// observeTransitions repairs Held, then releases, acquires and force-releases
	// the lock key, returning once the controller has reported the force-release.
	observeTransitions := func(key types.NamespacedName) {
		acquire(ctx, key, "lease-observed-00001", 30)

		By("repairing a Held condition a client left inconsistent")
		// The repair is also the sign that the controller has seen this holding:
		// it leaves a never-used lock alone, and reports no transition for what
		// happened before its first observation.
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions = nil })
		Eventually(func() metav1.ConditionStatus {
			c := meta.FindStatusCondition(getLock(ctx, key).Status.Conditions, locksv1alpha1.ConditionHeld)
			if c == nil {
				return ""
			}
			return c.Status
		}).Should(Equal(metav1.ConditionTrue))

		released, acquired := transitionsObserved("Released"), transitionsObserved("Acquired")
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			l.EndHolding(locksv1alpha1.EndReasonReleased, adminUser, metav1.NewMicroTime(time.Now()))
		})
		Eventually(transitionsObserved).WithArguments("Released").Should(BeNumerically(">", released))
		acquire(ctx, key, "lease-observed-00002", 30)
		Eventually(transitionsObserved).WithArguments("Acquired").Should(BeNumerically(">", acquired))
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			l.EndHolding(locksv1alpha1.EndReasonForceReleased, "operator", metav1.NewMicroTime(time.Now()))
		})
		Eventually(eventReasons).WithArguments(ctx, key).Should(ContainElement("ForceReleased"))
	}

	It("reports force-releases as Events, and counts acquisitions and releases in metrics only", func() {
		startController()
		key := createLock(ctx, newNamespace(ctx), "observed", nil, locksv1alpha1.DistributedLockSpec{})
		observeTransitions(key)
		// The recorder sends Events in the order they were emitted: had the
		// release or acquisition been one, it would be stored by now.
		Expect(eventReasons(ctx, key)).To(Equal([]string{"ForceReleased"}))
	})

	It("with EventsAll reports acquisitions and releases too", func() {
		startController(controllers.WithEvents(controllers.EventsAll))
		key := createLock(ctx, newNamespace(ctx), "observed-all", nil, locksv1alpha1.DistributedLockSpec{})
		observeTransitions(key)
		Eventually(eventReasons).WithArguments(ctx, key).Should(ContainElements("Released", "Acquired", "ForceReleased"))
	})

	It("drops the head of a free lock that does not claim it within handoffTimeoutSeconds", func() {
		startController()
		key := createLock(ctx, newNamespace(ctx), "handoff", nil, locksv1alpha1.DistributedLockSpec{HandoffTimeoutSeconds: 1})
		// Times are taken before the write they measure from: the controller
		// cannot observe a write before it is sent.
		queued := time.Now()
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			l.Status.AppendWaiter(waiter("first", time.Now(), time.Hour))
			l.Status.AppendWaiter(waiter("second", time.Now(), time.Hour))
		})

		Eventually(waiterIDs).WithArguments(ctx, key).Should(Equal([]string{"second"}))
		Expect(time.Since(queued)).To(BeNumerically(">=", time.Second))

		By("giving the new head its own hand-off time, from when it became head")
		Eventually(waiterIDs).WithArguments(ctx, key).Should(BeEmpty())
		Expect(time.Since(queued)).To(BeNumerically(">=", 2*time.Second))
		Expect(getLock(ctx, key).Status.WaiterCount).To(BeZero())
		Eventually(eventReasons).WithArguments(ctx, key).Should(ContainElement("WaiterDropped"))
	})

	It("drops a waiter at its deadline by its own clock, whatever the client's clock says", func() {
		startController()
		key := createLock(ctx, newNamespace(ctx), "deadline", nil, locksv1alpha1.DistributedLockSpec{})
		acquire(ctx, key, "lease-deadline-00001", 30)
		// The client's clock is 25 years behind: its deadline is long past by
		// the controller's wall clock, yet the wait it asked for is 2 s.
		skewed := time.Now().AddDate(-25, 0, 0)
		queued := time.Now()
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			l.Status.AppendWaiter(waiter("patient", time.Now(), time.Hour))
			l.Status.AppendWaiter(waiter("skewed", skewed, 2*time.Second))
		})
		Consistently(waiterIDs).WithArguments(ctx, key).WithTimeout(time.Until(queued.Add(1800 * time.Millisecond))).
			Should(Equal([]string{"patient", "skewed"}))
		Eventually(waiterIDs).WithArguments(ctx, key).Should(Equal([]string{"patient"}))
		Expect(time.Since(queued)).To(BeNumerically(">=", 2*time.Second))
		Expect(getLock(ctx, key).Status.Holder).NotTo(BeNil(), "dropping a waiter leaves the holder alone")
	})

	It("never expires a lease earlier than lease+grace after a controller restart", func() {
		first := startController()
		key := createLock(ctx, newNamespace(ctx), "restart", nil, locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 2})
		acquire(ctx, key, "lease-restart-000001", 2)

		By("letting most of the lease pass under the first controller")
		Consistently(holderID).WithArguments(ctx, key).WithTimeout(1500 * time.Millisecond).Should(Equal("lease-restart-000001"))

		By("restarting the controller: its successor has observed nothing yet")
		first.stop()
		restarted := time.Now()
		startController()
		Consistently(holderID).WithArguments(ctx, key).
			WithTimeout(time.Until(restarted.Add(2*time.Second + grace - 200*time.Millisecond))).
			Should(Equal("lease-restart-000001"))
		Eventually(holderID).WithArguments(ctx, key).Should(BeEmpty())
		Expect(time.Since(restarted)).To(BeNumerically(">=", 2*time.Second+grace))
		l := getLock(ctx, key)
		Expect(l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1].EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
	})

	It("deletes an idle auto-created lock, and only that one", func() {
		startController()
		ns := newNamespace(ctx)
		auto := map[string]string{locksv1alpha1.AutoCreatedLabel: "true"}
		created := time.Now()
		idle := createLock(ctx, ns, "auto-idle", auto, locksv1alpha1.DistributedLockSpec{})
		declared := createLock(ctx, ns, "declared", nil, locksv1alpha1.DistributedLockSpec{})
		busy := createLock(ctx, ns, "auto-busy", auto, locksv1alpha1.DistributedLockSpec{})
		acquire(ctx, busy, "lease-busy-00000001", 30)

		Eventually(func() error {
			return env.Client.Get(ctx, idle, &locksv1alpha1.DistributedLock{})
		}).Should(Satisfy(apierrors.IsNotFound))
		Expect(time.Since(created)).To(BeNumerically(">=", idleTimeout))

		Consistently(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, declared, &locksv1alpha1.DistributedLock{})).To(Succeed())
			g.Expect(env.Client.Get(ctx, busy, &locksv1alpha1.DistributedLock{})).To(Succeed())
		}, idleTimeout+time.Second).Should(Succeed())
	})
})

// createLock creates a lock as an administrator would. The controller leaves
// a lock nobody used alone (no write per created lock).
func createLock(ctx context.Context, ns, name string, labels map[string]string, spec locksv1alpha1.DistributedLockSpec) types.NamespacedName {
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: spec}
	Expect(env.Client.Create(ctx, l)).To(Succeed())
	return client.ObjectKeyFromObject(l)
}

func getLock(ctx context.Context, key types.NamespacedName) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	ExpectWithOffset(1, env.Client.Get(ctx, key, l)).To(Succeed())
	return l
}

// updateStatus applies change to the current lock and writes its status,
// retrying on conflicts like a well-behaved client.
func updateStatus(ctx context.Context, key types.NamespacedName, change func(*locksv1alpha1.DistributedLock)) {
	Eventually(func() error {
		l := getLock(ctx, key)
		change(l)
		return env.Client.Status().Update(ctx, l)
	}).Should(Succeed())
}

// acquire writes a holding the way a client does, with the token computed from
// the resourceVersion the write is conditioned on, and returns the token.
func acquire(ctx context.Context, key types.NamespacedName, leaseID string, leaseSeconds int32) int64 {
	return acquireWith(ctx, key, leaseID, leaseSeconds, func(*locksv1alpha1.LockHolder) {})
}

// acquireWith is acquire with the holding adjusted by change (a session, a pod).
func acquireWith(ctx context.Context, key types.NamespacedName, leaseID string, leaseSeconds int32, change func(*locksv1alpha1.LockHolder)) int64 {
	var token int64
	updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
		t, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		token = t
		now := metav1.NewMicroTime(time.Now())
		h := locksv1alpha1.LockHolder{
			Identity: "holder-" + leaseID, User: adminUser, LeaseID: leaseID, RequestID: "req-" + leaseID,
			LeaseDurationSeconds: leaseSeconds, AcquireTime: now, RenewTime: &now,
		}
		change(&h)
		l.Acquire(h, token)
	})
	return token
}

// renew advances the holder's renewTime, failing if leaseID no longer holds.
func renew(ctx context.Context, key types.NamespacedName, leaseID string) error {
	for {
		l := getLock(ctx, key)
		if l.Status.Holder == nil || l.Status.Holder.LeaseID != leaseID {
			return fmt.Errorf("lease %s is no longer held", leaseID)
		}
		now := metav1.NewMicroTime(time.Now())
		l.Status.Holder.RenewTime = &now
		err := env.Client.Status().Update(ctx, l)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func waiter(requestID string, enqueued time.Time, wait time.Duration) locksv1alpha1.Waiter {
	return locksv1alpha1.Waiter{
		Identity: "waiter-" + requestID, User: adminUser, RequestID: requestID,
		EnqueueTime: metav1.NewMicroTime(enqueued), Deadline: metav1.NewMicroTime(enqueued.Add(wait)),
	}
}

func holderID(ctx context.Context, key types.NamespacedName) string {
	if h := getLock(ctx, key).Status.Holder; h != nil {
		return h.LeaseID
	}
	return ""
}

func waiterIDs(ctx context.Context, key types.NamespacedName) []string {
	var ids []string
	for _, w := range getLock(ctx, key).Status.Waiters {
		ids = append(ids, w.RequestID)
	}
	return ids
}

// eventReasons lists the reasons of the Events about the lock.
func eventReasons(ctx context.Context, key types.NamespacedName) ([]string, error) {
	var list eventsv1.EventList
	if err := env.Client.List(ctx, &list, client.InNamespace(key.Namespace)); err != nil {
		return nil, err
	}
	var reasons []string
	for _, e := range list.Items {
		if e.Regarding.Name == key.Name {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons, nil
}

// transitionsObserved is kubelock_controller_transitions_observed_total{kind}
// in this process (every spec's controller counts into it).
func transitionsObserved(kind string) float64 {
	v, err := testmetrics.Value(ctrlmetrics.Registry, "kubelock_controller_transitions_observed_total", map[string]string{"kind": kind})
	Expect(err).NotTo(HaveOccurred())
	return v
}
