package controllers_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/rest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/testmetrics"
)

// pathLike is the pod name an attacker wrote with a token bound to no pod,
// before admission refused it: made into a read, it fails every time.
const pathLike = "../../../../../version"

// This suite's apiserver runs no admission webhook or policy, so an
// administrator's status write stores what the CRD's schema lets through, as
// a lock written before admission was tightened; what the schema refuses is
// written straight into etcd.
var _ = Describe("entries written past admission", func() {
	var (
		ctx context.Context
		ns  string
		// sa is a service account of ns: its entries' pods are read in ns.
		sa string
	)
	BeforeEach(func() {
		ctx = context.Background()
		ns = newNamespace(ctx)
		sa = "system:serviceaccount:" + ns + ":worker"
	})

	// The attack: a waiter bound to the "pod" pathLike made the live read of
	// that pod fail, and with it every reconcile of its lock: a 6 s lease was
	// still held 60 s later, and after its release the entry stayed at the
	// head and nobody could acquire.
	It("expire, hand off and force-release a lock whose entries name pods and sessions that cannot exist, and leave other locks alone", func() {
		startController()
		errorsBefore := entryErrors("")
		podDropped, sessionDropped, handoffDropped := waitersDropped("PodDeleted"), waitersDropped("SessionClosed"), waitersDropped("HandoffTimeout")
		foreign := createSession(ctx, ns, "foreign", "someone-else", 300)
		own := createSession(ctx, ns, "own", adminUser, 300)
		waiters, pods := hostileWaiters(sa, foreign.Name)
		hostile := func(l *locksv1alpha1.DistributedLock) {
			for _, w := range waiters {
				l.Status.AppendWaiter(w)
			}
			l.Status.AppendWaiter(waiter("next", time.Now(), time.Hour))
		}

		By("writing holdings bound to a path and queues of hostile waiters (the pod names the CRD's pattern refuses straight into etcd)")
		expiring := createLock(ctx, ns, "expiring", nil, locksv1alpha1.DistributedLockSpec{HandoffTimeoutSeconds: 1})
		acquired := time.Now()
		// A long lease until the entries are planted, then 2 s from the
		// planting: the setup's own time (seconds on a loaded machine) must
		// not let the lease end before the holding is rewritten.
		acquireWith(ctx, expiring, "lease-expiring-00001", 300, boundTo(sa, "placeholder"))
		updateStatus(ctx, expiring, hostile)
		plantPods(ctx, expiring, pathLike, pods, 2)
		forced := createLock(ctx, ns, "forced", nil, locksv1alpha1.DistributedLockSpec{HandoffTimeoutSeconds: 1})
		acquireWith(ctx, forced, "lease-forced-0000001", 300, boundTo(sa, "placeholder"))
		updateStatus(ctx, forced, hostile)
		plantPods(ctx, forced, pathLike, pods, 0)
		bystander := createLock(ctx, ns, "bystander", nil, locksv1alpha1.DistributedLockSpec{})
		acquire(ctx, bystander, "lease-bystander-0001", 1)

		By("writing session names no LockSession can have straight into etcd, where the CRD's pattern does not apply")
		named := createLock(ctx, ns, "session-named", nil, locksv1alpha1.DistributedLockSpec{})
		acquireWith(ctx, named, "lease-named-00000001", 300, inSession(own.Name))
		updateStatus(ctx, named, func(l *locksv1alpha1.DistributedLock) {
			w := waiter("in-session", time.Now(), time.Hour)
			w.Session = own.Name
			l.Status.AppendWaiter(w)
		})
		rewriteStatus(ctx, named, func(status map[string]any) {
			Expect(unstructured.SetNestedField(status, pathLike, "holder", "session")).To(Succeed())
			waiters, _, _ := unstructured.NestedSlice(status, "waiters")
			Expect(waiters).To(HaveLen(1))
			w, ok := waiters[0].(map[string]any)
			Expect(ok).To(BeTrue())
			Expect(unstructured.SetNestedField(w, pathLike, "session")).To(Succeed())
			Expect(unstructured.SetNestedSlice(status, waiters, "waiters")).To(Succeed())
		})

		By("dropping at once every waiter whose pod or session cannot exist, is missing or is someone else's")
		Eventually(waiterIDs).WithArguments(ctx, expiring).Should(Equal([]string{"next"}))
		Eventually(waiterIDs).WithArguments(ctx, forced).Should(Equal([]string{"next"}))
		Eventually(waiterIDs).WithArguments(ctx, named).Should(BeEmpty())
		Expect(holderID(ctx, forced)).To(Equal("lease-forced-0000001"), "a holding bound to a path lives on its lease")

		By("ending at once the holding whose session cannot exist")
		Eventually(holderID).WithArguments(ctx, named).Should(BeEmpty())
		Expect(lastEnded(ctx, named).LeaseID).To(Equal("lease-named-00000001"))
		Expect(lastEnded(ctx, named).EndReason).To(Equal(locksv1alpha1.EndReasonSessionClosed))

		By("expiring the holding bound to a path at its lease and grace, not before")
		Eventually(holderID).WithArguments(ctx, expiring).Should(BeEmpty())
		Expect(time.Since(acquired)).To(BeNumerically(">=", 2*time.Second+grace))
		ended := lastEnded(ctx, expiring)
		Expect(ended.LeaseID).To(Equal("lease-expiring-00001"))
		Expect(ended.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))

		By("dropping the head that does not claim the lock it expired within the hand-off timeout")
		Eventually(waiterIDs).WithArguments(ctx, expiring).Should(BeEmpty())
		Expect(time.Since(ended.EndTime.Time)).To(BeNumerically(">=", time.Second))

		By("handing off after a force-release of the holding bound to a path")
		released := time.Now()
		updateStatus(ctx, forced, func(l *locksv1alpha1.DistributedLock) {
			l.EndHolding(locksv1alpha1.EndReasonForceReleased, adminUser, metav1.NewMicroTime(time.Now()))
		})
		Eventually(eventReasons).WithArguments(ctx, forced).Should(ContainElement("ForceReleased"))
		Eventually(waiterIDs).WithArguments(ctx, forced).Should(BeEmpty())
		Expect(time.Since(released)).To(BeNumerically(">=", time.Second))

		By("expiring another lock's lease as ever")
		Eventually(holderID).WithArguments(ctx, bystander).Should(BeEmpty())

		By("counting every drop by its reason, and reading no name that cannot exist")
		hostilePods, hostileSessions := 4, 2 // per lock: see hostileWaiters
		Expect(waitersDropped("PodDeleted") - podDropped).To(BeEquivalentTo(2 * hostilePods))
		Expect(waitersDropped("SessionClosed") - sessionDropped).To(BeEquivalentTo(2*hostileSessions + 1))
		Expect(waitersDropped("HandoffTimeout") - handoffDropped).To(BeEquivalentTo(2))
		Expect(entryErrors("")).To(Equal(errorsBefore), "a read of a name no object can have would have failed")
	})

	It("decides all but the entries whose session or pod cannot be read, and reads them again", func() {
		// The live reads of one session and one pod fail until healed; every
		// other request reaches the apiserver.
		var failing atomic.Bool
		failing.Store(true)
		cfg := rest.CopyConfig(env.Config)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				if failing.Load() && r.Method == http.MethodGet &&
					(strings.HasSuffix(r.URL.Path, "/locksessions/flaky-session") || strings.HasSuffix(r.URL.Path, "/pods/flaky-pod")) {
					return nil, errors.New("injected: this read does not reach the apiserver")
				}
				return rt.RoundTrip(r)
			})
		}
		startControllerOn(cfg)
		sessionErrors, podErrors := entryErrors("session"), entryErrors("pod")
		podDropped := waitersDropped("PodDeleted")

		key := createLock(ctx, ns, "flaky", nil, locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex})
		acquireShared(ctx, key, "lease-flaky-session1", 300, inSession("flaky-session"))
		acquireShared(ctx, key, "lease-lapsing-000001", 1, nil)
		updateStatus(ctx, key, func(l *locksv1alpha1.DistributedLock) {
			w := waiter("flaky-pod", time.Now(), time.Hour)
			w.User, w.PodName, w.PodUID, w.Mode = sa, "flaky-pod", string(uuid.NewUUID()), locksv1alpha1.Exclusive
			l.Status.AppendWaiter(w)
			l.Status.AppendWaiter(waiter("short", time.Now(), 2*time.Second))
		})

		By("expiring the other reader and dropping the other waiter at its deadline while the reads fail")
		Eventually(sharedIDs).WithArguments(ctx, key).Should(Equal([]string{"lease-flaky-session1"}))
		Eventually(waiterIDs).WithArguments(ctx, key).Should(Equal([]string{"flaky-pod"}))
		Eventually(entryErrors).WithArguments("session").Should(BeNumerically(">", sessionErrors))
		Eventually(entryErrors).WithArguments("pod").Should(BeNumerically(">", podErrors))

		By("keeping the entries that depend on what cannot be read as they are")
		Consistently(func(g Gomega) {
			g.Expect(sharedIDs(ctx, key)).To(Equal([]string{"lease-flaky-session1"}))
			g.Expect(waiterIDs(ctx, key)).To(Equal([]string{"flaky-pod"}))
		}, 2*time.Second).Should(Succeed())

		By("reading them again once the reads succeed: the session and the pod do not exist")
		failing.Store(false)
		Eventually(sharedIDs).WithArguments(ctx, key).Should(BeEmpty())
		Expect(finishedOf(ctx, key, "lease-flaky-session1").EndReason).To(Equal(locksv1alpha1.EndReasonSessionClosed))
		Eventually(waiterIDs).WithArguments(ctx, key).Should(BeEmpty())
		Expect(waitersDropped("PodDeleted") - podDropped).To(BeEquivalentTo(1))
	})
})

// hostileWaiters are waiters of service account sa bound to pods that cannot
// exist (a path, an upper-case name, a UID that is no UUID) or do not exist,
// and waiters in a missing session and in foreign, someone else's. The CRD's
// schema refuses the names and UIDs no pod can have, so the waiters carry a
// pod that could exist, and pods says, by request ID, what plantPods writes
// in its place straight into etcd.
func hostileWaiters(sa, foreign string) (ws []locksv1alpha1.Waiter, pods map[string][2]string) {
	pods = map[string][2]string{}
	for i, pod := range [][2]string{{pathLike, string(uuid.NewUUID())}, {"Worker-0", string(uuid.NewUUID())},
		{"worker-0", "uid-worker-0"}, {"no-such-pod", string(uuid.NewUUID())}} {
		w := waiter("pod-"+string(rune('a'+i)), time.Now(), time.Hour)
		w.User, w.PodName, w.PodUID = sa, "placeholder", string(uuid.NewUUID())
		pods[w.RequestID] = pod
		ws = append(ws, w)
	}
	for _, session := range []string{"never-created", foreign} {
		w := waiter("session-"+session, time.Now(), time.Hour)
		w.Session = session
		ws = append(ws, w)
	}
	return ws, pods
}

// plantPods writes, straight into etcd, holderPod as the holding's pod name
// and each waiter's pod (name and UID) that pods gives by request ID; with
// leaseSeconds, the holding renewed now for that lease.
func plantPods(ctx context.Context, key types.NamespacedName, holderPod string, pods map[string][2]string, leaseSeconds int64) {
	rewriteStatus(ctx, key, func(status map[string]any) {
		holder, found, _ := unstructured.NestedMap(status, "holder")
		Expect(found).To(BeTrue(), "the holding to bind to %q has ended before it was planted", holderPod)
		holder["podName"] = holderPod
		if leaseSeconds > 0 {
			// Renewed now, for leaseSeconds.
			holder["leaseDurationSeconds"] = leaseSeconds
			holder["renewTime"] = metav1.NewMicroTime(time.Now()).UTC().Format(metav1.RFC3339Micro)
		}
		Expect(unstructured.SetNestedMap(status, holder, "holder")).To(Succeed())
		waiters, _, _ := unstructured.NestedSlice(status, "waiters")
		for _, e := range waiters {
			w, ok := e.(map[string]any)
			Expect(ok).To(BeTrue())
			id, _ := w["requestID"].(string) // the schema's: a string
			if pod, ok := pods[id]; ok {
				w["podName"], w["podUID"] = pod[0], pod[1]
			}
		}
		Expect(unstructured.SetNestedSlice(status, waiters, "waiters")).To(Succeed())
	})
}

// boundTo binds a holding to the pod podName (of a fresh UID) of service account sa.
func boundTo(sa, podName string) func(*locksv1alpha1.LockHolder) {
	return func(h *locksv1alpha1.LockHolder) { h.User, h.PodName, h.PodUID = sa, podName, string(uuid.NewUUID()) }
}

// rewriteStatus changes the lock's status as stored in etcd, past the
// apiserver's validation.
func rewriteStatus(ctx context.Context, key types.NamespacedName, change func(status map[string]any)) {
	gr := locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource()
	Eventually(func() error {
		return env.RewriteStored(ctx, gr, key, func(obj map[string]any) {
			status, ok := obj["status"].(map[string]any)
			Expect(ok).To(BeTrue())
			change(status)
		})
	}).Should(Succeed())
}

// entryErrors is kubelock_controller_entry_errors_total{kind} in this
// process, summed over kinds when kind is empty.
func entryErrors(kind string) float64 {
	labels := map[string]string{}
	if kind != "" {
		labels["kind"] = kind
	}
	v, err := testmetrics.Value(ctrlmetrics.Registry, "kubelock_controller_entry_errors_total", labels)
	Expect(err).NotTo(HaveOccurred())
	return v
}

// waitersDropped is kubelock_controller_waiters_dropped_total{reason} in this process.
func waitersDropped(reason string) float64 {
	v, err := testmetrics.Value(ctrlmetrics.Registry, "kubelock_controller_waiters_dropped_total", map[string]string{"reason": reason})
	Expect(err).NotTo(HaveOccurred())
	return v
}
