package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
)

// sessionTTL is the shortest TTL a session may have.
const sessionTTL = locksv1alpha1.MinSessionTTLSeconds

var _ = Describe("sessions", func() {
	var (
		ctx context.Context
		ns  string
	)
	BeforeEach(func() {
		ctx = context.Background()
		ns = newNamespace(ctx)
	})

	It("ends the holdings and drops the waiters of a session that stops renewing, then deletes it", func() {
		startController()
		session := createSession(ctx, ns, "lapsing", adminUser, sessionTTL)
		var held []types.NamespacedName
		for i := range 3 {
			key := createLock(ctx, ns, fmt.Sprintf("held-%d", i), nil, locksv1alpha1.DistributedLockSpec{})
			acquireWith(ctx, key, fmt.Sprintf("lease-lapsing-%07d", i), sessionTTL, inSession(session.Name))
			held = append(held, key)
		}
		other := createLock(ctx, ns, "other", nil, locksv1alpha1.DistributedLockSpec{})
		acquire(ctx, other, "lease-other-00000001", 300)
		updateStatus(ctx, other, func(l *locksv1alpha1.DistributedLock) {
			w := waiter("in-session", time.Now(), time.Hour)
			w.Session = session.Name
			l.Status.AppendWaiter(w)
			l.Status.AppendWaiter(waiter("alone", time.Now(), time.Hour))
		})
		Eventually(sessionLocks).WithArguments(ctx, session).Should(BeEquivalentTo(3), "status.locks counts the holdings")

		By("renewing the session for a while, then stopping")
		var lastRenewSent time.Time
		for range 3 {
			lastRenewSent = renewSession(ctx, session)
			Consistently(holderID).WithArguments(ctx, held[0]).WithTimeout(time.Second).ShouldNot(BeEmpty())
		}
		awaitFree(ctx, held)
		expiredAfter := time.Since(lastRenewSent)
		Expect(expiredAfter).To(BeNumerically(">=", sessionTTL*time.Second+grace), "ended before TTL+grace after the last renewal was sent")
		AddReportEntry("session expiry: last renewal sent -> holdings ended", expiredAfter.String())
		GinkgoWriter.Printf("session TTL %ds + grace %s: holdings ended %s after the last renewal was sent\n", sessionTTL, grace, expiredAfter)

		Eventually(func() error { return env.Client.Get(ctx, session, &locksv1alpha1.LockSession{}) }).Should(Satisfy(apierrors.IsNotFound))
		for _, key := range held {
			last := lastEnded(ctx, key)
			Expect(last.EndReason).To(Equal(locksv1alpha1.EndReasonSessionExpired), "the holdings ended before the session was deleted")
			Expect(last.EndedBy).To(Equal(adminUser))
			Eventually(eventReasons).WithArguments(ctx, key).Should(ContainElement(controllers.EventSessionExpired))
		}
		Expect(waiterIDs(ctx, other)).To(Equal([]string{"alone"}))
		Expect(holderID(ctx, other)).To(Equal("lease-other-00000001"))
	})

	It("ends the holdings of a deleted session at once", func() {
		startController()
		session := createSession(ctx, ns, "closing", adminUser, 300)
		var held []types.NamespacedName
		for i := range 2 {
			key := createLock(ctx, ns, fmt.Sprintf("held-%d", i), nil, locksv1alpha1.DistributedLockSpec{})
			acquireWith(ctx, key, fmt.Sprintf("lease-closing-%07d", i), 300, inSession(session.Name))
			held = append(held, key)
		}
		Eventually(sessionLocks).WithArguments(ctx, session).Should(BeEquivalentTo(2))

		deleted := time.Now()
		Expect(env.Client.Delete(ctx, &locksv1alpha1.LockSession{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: session.Name}})).To(Succeed())
		awaitFree(ctx, held)
		GinkgoWriter.Printf("session deleted -> its holdings ended: %s\n", time.Since(deleted))
		Expect(time.Since(deleted)).To(BeNumerically("<", 2*time.Second), "a closed session's holdings end at once, not at a deadline")
		for _, key := range held {
			Expect(lastEnded(ctx, key).EndReason).To(Equal(locksv1alpha1.EndReasonSessionClosed))
			Eventually(eventReasons).WithArguments(ctx, key).Should(ContainElement(controllers.EventSessionClosed))
		}
	})

	It("ends a holding and drops a waiter whose session is missing or someone else's, and keeps a fresh one", func() {
		startController()
		foreign := createSession(ctx, ns, "foreign", "someone-else", 300)
		missing := createLock(ctx, ns, "missing", nil, locksv1alpha1.DistributedLockSpec{})
		acquireWith(ctx, missing, "lease-missing-000001", 300, inSession("never-created"))
		stolen := createLock(ctx, ns, "stolen", nil, locksv1alpha1.DistributedLockSpec{})
		acquireWith(ctx, stolen, "lease-stolen-0000001", 300, inSession(foreign.Name))
		queued := createLock(ctx, ns, "queued", nil, locksv1alpha1.DistributedLockSpec{})
		acquire(ctx, queued, "lease-queued-0000001", 300)
		updateStatus(ctx, queued, func(l *locksv1alpha1.DistributedLock) {
			w := waiter("ghost", time.Now(), time.Hour)
			w.Session = "never-created"
			l.Status.AppendWaiter(w)
		})

		By("creating a session and holding in it right away: the cache may not have it yet")
		fresh := createSession(ctx, ns, "fresh", adminUser, 300)
		kept := createLock(ctx, ns, "kept", nil, locksv1alpha1.DistributedLockSpec{})
		acquireWith(ctx, kept, "lease-kept-000000001", 300, inSession(fresh.Name))

		Eventually(holderID).WithArguments(ctx, missing).Should(BeEmpty())
		Expect(lastEnded(ctx, missing).EndReason).To(Equal(locksv1alpha1.EndReasonSessionClosed))
		Eventually(holderID).WithArguments(ctx, stolen).Should(BeEmpty())
		Expect(lastEnded(ctx, stolen).EndReason).To(Equal(locksv1alpha1.EndReasonSessionClosed))
		Eventually(waiterIDs).WithArguments(ctx, queued).Should(BeEmpty())
		Consistently(holderID).WithArguments(ctx, kept).WithTimeout(time.Second).Should(Equal("lease-kept-000000001"))
	})

	It("frees a holding bound to a pod without a session soon after the pod is deleted", func() {
		startController()
		user := "system:serviceaccount:" + ns + ":worker"
		measurePodDeletion(ctx, ns, "pod deletion -> holding without a session freed (lease 30 s)", locksv1alpha1.EndReasonExpired,
			func(pod *corev1.Pod, i int) []types.NamespacedName {
				key := createLock(ctx, ns, fmt.Sprintf("pod-held-%d", i), nil, locksv1alpha1.DistributedLockSpec{})
				leaseID := fmt.Sprintf("lease-pod-%010d", i)
				acquireWith(ctx, key, leaseID, 30, func(h *locksv1alpha1.LockHolder) {
					h.User, h.PodName, h.PodUID = user, pod.Name, string(pod.UID)
				})
				Consistently(holderID).WithArguments(ctx, key).WithTimeout(500*time.Millisecond).Should(Equal(leaseID), "a live pod keeps its holding")
				return []types.NamespacedName{key}
			})
		Expect(heldMessage(ctx, types.NamespacedName{Namespace: ns, Name: "pod-held-0"})).To(ContainSubstring("Expired"))
		Eventually(eventReasons).WithArguments(ctx, types.NamespacedName{Namespace: ns, Name: "pod-held-0"}).Should(ContainElement(controllers.EventExpired))
	})

	It("drops a waiter bound to a pod without a session soon after the pod is deleted, and keeps a live pod's", func() {
		startController()
		user := "system:serviceaccount:" + ns + ":worker"
		gone, live := createPod(ctx, ns, "waiter-gone"), createPod(ctx, ns, "waiter-live")
		key := createLock(ctx, ns, "pod-waited", nil, locksv1alpha1.DistributedLockSpec{})
		acquireWith(ctx, key, "lease-pod-waited-0001", 30, func(*locksv1alpha1.LockHolder) {})
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			for _, pod := range []*corev1.Pod{gone, live} {
				w := waiter("req-"+pod.Name, time.Now(), time.Hour)
				w.User, w.PodName, w.PodUID = user, pod.Name, string(pod.UID)
				l.Status.AppendWaiter(w)
			}
		})
		Consistently(waiterIDs).WithArguments(ctx, key).WithTimeout(500*time.Millisecond).Should(HaveLen(2), "live pods keep their queue entries")
		deleted := time.Now()
		Expect(env.Client.Delete(ctx, gone)).To(Succeed())
		Eventually(waiterIDs).WithArguments(ctx, key).Should(Equal([]string{"req-waiter-live"}))
		took := time.Since(deleted)
		GinkgoWriter.Printf("pod deletion -> its waiter without a session dropped: %s\n", took)
		Expect(took).To(BeNumerically("<", 2*time.Second), "the pod's deletion, not the waiter's deadline (an hour), dropped it")
		Eventually(eventReasons).WithArguments(ctx, key).Should(ContainElement(controllers.EventWaiterDropped))
		Expect(holderID(ctx, key)).To(Equal("lease-pod-waited-0001"), "the holding was not touched")
	})

	It("frees a pod-bound session's locks when the garbage collector deletes the session after its pod", func() {
		kcm, err := env.StartControllerManager(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(kcm.Stop)
		startController()
		user := "system:serviceaccount:" + ns + ":worker"
		measurePodDeletion(ctx, ns, "pod deletion -> all 3 locks of its session freed, via the garbage collector (TTL 30 s)", locksv1alpha1.EndReasonSessionClosed,
			func(pod *corev1.Pod, i int) []types.NamespacedName {
				session := &locksv1alpha1.LockSession{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod.Name,
						OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}},
					Spec: locksv1alpha1.LockSessionSpec{User: user, Identity: pod.Name, TTLSeconds: 30, PodName: pod.Name, PodUID: string(pod.UID)},
				}
				Expect(env.Client.Create(ctx, session)).To(Succeed())
				var held []types.NamespacedName
				for j := range 3 {
					key := createLock(ctx, ns, fmt.Sprintf("gc-%d-%d", i, j), nil, locksv1alpha1.DistributedLockSpec{})
					acquireWith(ctx, key, fmt.Sprintf("lease-gc-%04d-%06d", i, j), 30, func(h *locksv1alpha1.LockHolder) {
						h.User, h.PodName, h.PodUID, h.Session = user, pod.Name, string(pod.UID), session.Name
					})
					held = append(held, key)
				}
				Eventually(sessionLocks).WithArguments(ctx, client.ObjectKeyFromObject(session)).Should(BeEquivalentTo(3))
				return held
			})
	})

	It("runs no lock reconcile when a session of 40 locks is renewed", func() {
		// Idle checks of the locks earlier specs left behind would count as
		// lock reconciles whenever their short idle timeout came round.
		startController(controllers.WithIdleTimeout(time.Hour))
		session := createSession(ctx, ns, "forty", adminUser, sessionTTL)
		for i := range 40 {
			key := createLock(ctx, ns, fmt.Sprintf("lock-%02d", i), nil, locksv1alpha1.DistributedLockSpec{})
			acquireWith(ctx, key, fmt.Sprintf("lease-forty-%08d", i), sessionTTL, inSession(session.Name))
		}
		Eventually(sessionLocks).WithArguments(ctx, session).Should(BeEquivalentTo(40))
		awaitQuiet(controllers.ControllerName)

		lockReconciles, sessionReconciles := reconciles(controllers.ControllerName), reconciles(controllers.SessionControllerName)
		for range 4 {
			before := reconciles(controllers.SessionControllerName)
			renewSession(ctx, session)
			// The session controller sees each renewal...
			Eventually(reconciles).WithArguments(controllers.SessionControllerName).Should(BeNumerically(">", before))
			Consistently(holderID).WithArguments(ctx, types.NamespacedName{Namespace: ns, Name: "lock-00"}).
				WithTimeout(time.Second).ShouldNot(BeEmpty())
		}
		Expect(reconciles(controllers.SessionControllerName)).To(BeNumerically(">=", sessionReconciles+4))
		// ...and no lock is reconciled for them.
		Expect(reconciles(controllers.ControllerName)).To(Equal(lockReconciles))
	})

	It("observes sessions afresh after a controller restart: a restart only delays expiry", func() {
		first := startController()
		session := createSession(ctx, ns, "restart", adminUser, sessionTTL)
		key := createLock(ctx, ns, "restart", nil, locksv1alpha1.DistributedLockSpec{})
		acquireWith(ctx, key, "lease-restart-000001", sessionTTL, inSession(session.Name))
		Eventually(sessionLocks).WithArguments(ctx, session).Should(BeEquivalentTo(1))

		By("letting most of the TTL pass under the first controller, with no renewal")
		Consistently(holderID).WithArguments(ctx, key).WithTimeout(4 * time.Second).Should(Equal("lease-restart-000001"))
		first.stop()
		restarted := time.Now()
		startController()
		Consistently(holderID).WithArguments(ctx, key).
			WithTimeout(time.Until(restarted.Add(sessionTTL*time.Second + grace - 200*time.Millisecond))).
			Should(Equal("lease-restart-000001"))
		Eventually(holderID).WithArguments(ctx, key).Should(BeEmpty())
		Expect(time.Since(restarted)).To(BeNumerically(">=", sessionTTL*time.Second+grace))
		Expect(lastEnded(ctx, key).EndReason).To(Equal(locksv1alpha1.EndReasonSessionExpired))
		Eventually(func() error { return env.Client.Get(ctx, session, &locksv1alpha1.LockSession{}) }).Should(Satisfy(apierrors.IsNotFound))
	})
})

// createSession creates a session as its owner would; status stays empty
// until the first renewal.
func createSession(ctx context.Context, ns, name, user string, ttl int32) types.NamespacedName {
	s := &locksv1alpha1.LockSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       locksv1alpha1.LockSessionSpec{User: user, Identity: "client-" + name, TTLSeconds: ttl},
	}
	Expect(env.Client.Create(ctx, s)).To(Succeed())
	return client.ObjectKeyFromObject(s)
}

// renewSession writes status.renewTime as the owner does and returns when
// the renewal was sent.
func renewSession(ctx context.Context, key types.NamespacedName) time.Time {
	var sent time.Time
	Eventually(func() error {
		s := &locksv1alpha1.LockSession{}
		if err := env.Client.Get(ctx, key, s); err != nil {
			return err
		}
		sent = time.Now()
		s.Status.RenewTime = ptr.To(metav1.NewMicroTime(sent))
		return env.Client.Status().Update(ctx, s)
	}).Should(Succeed())
	return sent
}

func sessionLocks(ctx context.Context, key types.NamespacedName) (int32, error) {
	s := &locksv1alpha1.LockSession{}
	err := env.Client.Get(ctx, key, s)
	return s.Status.Locks, err
}

func inSession(name string) func(*locksv1alpha1.LockHolder) {
	return func(h *locksv1alpha1.LockHolder) { h.Session = name }
}

// lastEnded is the lock's most recent finished holding.
func lastEnded(ctx context.Context, key types.NamespacedName) locksv1alpha1.FinishedHolding {
	r := getLock(ctx, key).Status.RecentAcquisitions
	ExpectWithOffset(1, r).NotTo(BeEmpty())
	return r[len(r)-1]
}

func heldMessage(ctx context.Context, key types.NamespacedName) string {
	for _, c := range getLock(ctx, key).Status.Conditions {
		if c.Type == locksv1alpha1.ConditionHeld {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// reconciles is controller-runtime's count of reconciles of the named controller.
func reconciles(controller string) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// awaitQuiet waits until the named controller has run no reconcile for a second.
func awaitQuiet(controller string) {
	last, since := reconciles(controller), time.Now()
	Eventually(func() time.Duration {
		if n := reconciles(controller); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since)
	}).Should(BeNumerically(">=", time.Second))
}

// createPod creates a pod of service account "worker" (envtest's apiserver
// runs without the ServiceAccount admission plugin); with no node it stays
// Pending, and a delete removes it at once, as a kubelet would after it stopped.
func createPod(ctx context.Context, ns, name string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: "worker", AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "worker", Image: "worker"}}},
	}
	Expect(env.Client.Create(ctx, pod)).To(Succeed())
	return pod
}

// measurePodDeletion runs 10 trials: hold creates a pod's holdings, the pod
// is deleted, and the time until all of them are free is measured. It reports
// p50 and max and requires every trial under 2 s.
func measurePodDeletion(ctx context.Context, ns, what string, reason locksv1alpha1.EndReason, hold func(pod *corev1.Pod, trial int) []types.NamespacedName) {
	const trials = 10
	var latencies []time.Duration
	for i := range trials {
		pod := createPod(ctx, ns, fmt.Sprintf("worker-%d", i))
		held := hold(pod, i)
		deleted := time.Now()
		Expect(env.Client.Delete(ctx, pod)).To(Succeed())
		awaitFree(ctx, held)
		latencies = append(latencies, time.Since(deleted))
		for _, key := range held {
			Expect(lastEnded(ctx, key).EndReason).To(Equal(reason))
		}
	}
	slices.Sort(latencies)
	p50, worst := latencies[trials/2], latencies[trials-1]
	AddReportEntry(what, fmt.Sprintf("p50 %s, max %s", p50, worst))
	GinkgoWriter.Printf("%s over %d trials: p50 %s, max %s, all %v\n", what, trials, p50, worst, latencies)
	Expect(worst).To(BeNumerically("<", 2*time.Second))
}

// awaitFree waits until none of keys has a holder.
func awaitFree(ctx context.Context, keys []types.NamespacedName) {
	EventuallyWithOffset(1, func(g Gomega) {
		for _, key := range keys {
			g.Expect(holderID(ctx, key)).To(BeEmpty())
		}
	}).Should(Succeed())
}
