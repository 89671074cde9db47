package controllers_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/testmetrics"
)

var _ = Describe("a malformed lock", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	// A time the CRD's date-time format admits but metav1.MicroTime cannot
	// parse used to fail the controller's whole LIST/WATCH decode, and so the
	// expiry of every lock. It is planted in etcd directly, so the test does not
	// depend on what the CRD schema or admission let through.
	It("does not stop the controller from expiring other locks, and is counted once per version", func() {
		ns := newNamespace(ctx)
		bad := createLock(ctx, ns, "malformed", nil, locksv1alpha1.DistributedLockSpec{})
		updateStatus(ctx, bad, func(l *locksv1alpha1.DistributedLock) {
			l.Status.Waiters = []locksv1alpha1.Waiter{waiter("req-queued", time.Now(), time.Hour)}
			l.Status.WaiterCount = 1
		})
		plant(ctx, bad, "enqueueTime", "2026-01-01T00:00:00Z") // no microseconds
		decodeErrors := func() float64 {
			v, err := testmetrics.Value(ctrlmetrics.Registry, "kubelock_controller_lock_decode_errors_total", map[string]string{"namespace": ns})
			Expect(err).NotTo(HaveOccurred())
			return v
		}

		By("starting the controller with the malformed lock in its first LIST")
		startController()
		expires := func(name, leaseID string) {
			key := createLock(ctx, ns, name, nil, locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 1})
			token := acquire(ctx, key, leaseID, 1)
			Eventually(func(g Gomega) {
				l := getLock(ctx, key)
				g.Expect(l.Status.Holder).To(BeNil())
				f := l.Status.FindFinished("req-" + leaseID)
				g.Expect(f).NotTo(BeNil())
				g.Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
				g.Expect(f.FencingToken).To(Equal(token))
			}).Should(Succeed(), "the abandoned lease of %s is expired", name)
		}
		expires("abandoned-1", "lease-abandoned-000001")
		Eventually(decodeErrors).Should(BeNumerically("==", 1))

		By("malforming it again while the controller watches: a lower-case t")
		plant(ctx, bad, "deadline", "2099-01-01t00:00:00.000000Z")
		expires("abandoned-2", "lease-abandoned-000002")
		Eventually(decodeErrors).Should(BeNumerically("==", 2))
		Consistently(decodeErrors, 2*time.Second).Should(BeNumerically("==", 2), "one count per malformed resourceVersion, not per reconcile")

		By("leaving the malformed object as it was")
		Expect(env.Client.Get(ctx, bad, &locksv1alpha1.DistributedLock{})).To(MatchError(ContainSubstring("parsing time")))
		Expect(env.Client.Delete(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: bad.Namespace, Name: bad.Name}})).To(Succeed())
	})
})

// plant sets field of the lock's first waiter to value in etcd, then waits
// until the apiserver serves the rewritten object (which typed clients cannot
// decode any more).
func plant(ctx context.Context, key types.NamespacedName, field, value string) {
	gr := locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource()
	Expect(env.RewriteStored(ctx, gr, key, func(obj map[string]any) {
		waiters, _, err := unstructured.NestedSlice(obj, "status", "waiters")
		Expect(err).NotTo(HaveOccurred())
		Expect(waiters).NotTo(BeEmpty())
		w, ok := waiters[0].(map[string]any)
		Expect(ok).To(BeTrue())
		w[field] = value
		Expect(unstructured.SetNestedSlice(obj, waiters, "status", "waiters")).To(Succeed())
	})).To(Succeed())
	Eventually(func() error { return env.Client.Get(ctx, key, &locksv1alpha1.DistributedLock{}) }).
		Should(MatchError(ContainSubstring("parsing time")))
}
