package integration

import (
	"context"
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

// The pod-bound path end to end: a client with a token bound to its
// Pod holds locks in a session the Pod owns; deleting the Pod lets
// kube-controller-manager's garbage collector delete the session, and the
// controller ends its holdings (SessionClosed) and grants the next waiter.
// Serial: it measures latency, and the collector it starts sees every namespace.
var _ = backends.Describe("a pod-bound session with the garbage collector running", Serial, func() {
	It("frees all the locks of a deleted Pod's session for the next waiter within 2 s (10 trials)", func(ctx SpecContext) {
		const trials, n, ttl = 10, 3, 30 * time.Second
		kcm, err := env.StartControllerManager(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(kcm.Stop)
		ns := suite.Namespace(ctx)
		sa := lockUserServiceAccount(ctx, ns, "worker")
		b, _ := suite.NewClient(ctx, ns)

		type grant struct {
			at   time.Time
			lock *lock.Lock
		}
		// A's side of each trial: its session, when it was deleted, when A's session ended.
		type podSession struct {
			s       *lock.Session
			deleted time.Time
			ended   chan time.Time
		}
		var latencies []time.Duration
		var sessions []podSession
		var held []*lock.Lock
		for i := range trials {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("worker-%d", i)},
				// No node: it stays Pending. ServiceAccountName is set here:
				// envtest's apiserver runs without the ServiceAccount admission plugin.
				Spec: corev1.PodSpec{ServiceAccountName: sa.Name, AutomountServiceAccountToken: ptr.To(false),
					Containers: []corev1.Container{{Name: "c", Image: "example.invalid/worker"}}},
			}
			Expect(env.Client.Create(ctx, pod)).To(Succeed())
			a, err := lock.New(podBoundConfig(ctx, sa, pod), lock.WithNamespace(ns), lock.WithIdentity(pod.Name))
			Expect(err).NotTo(HaveOccurred())
			s, err := a.NewSession(ctx, lock.WithTTL(ttl))
			Expect(err).NotTo(HaveOccurred())
			sessionEnded := make(chan time.Time, 1)
			context.AfterFunc(s.Context(), func() { sessionEnded <- time.Now() })
			stored := &locksv1alpha1.LockSession{}
			Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.Name()}, stored)).To(Succeed())
			Expect(stored.Spec.PodName).To(Equal(pod.Name))
			Expect(stored.Spec.PodUID).To(BeEquivalentTo(pod.UID))
			Expect(stored.OwnerReferences).To(Equal([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}),
				"a session created with a pod-bound token is owned by its pod")

			mine := map[string]*lock.Lock{}
			for j := range n {
				key := fmt.Sprintf("podgc-%d-%d", i, j)
				suite.NewLock(ctx, ns, key, locksv1alpha1.DistributedLockSpec{})
				l, err := a.TryAcquire(ctx, key, lock.WithSession(s))
				Expect(err).NotTo(HaveOccurred())
				h := suite.GetLock(ctx, ns, key).Status.Holder
				Expect(h.Session).To(Equal(s.Name()))
				Expect(h.PodUID).To(BeEquivalentTo(pod.UID))
				mine[l.Name()] = l
				held = append(held, l)
			}

			granted := make(chan grant, n)
			for key := range mine {
				go func() {
					defer GinkgoRecover()
					next, err := b.Acquire(ctx, key, lock.WithWaitTimeout(time.Minute))
					Expect(err).NotTo(HaveOccurred())
					granted <- grant{time.Now(), next}
				}()
				Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, key).Status.Waiters }).Should(HaveLen(1), "B queues on %s", key)
			}

			// Default grace: a Pod never scheduled is deleted at once (no kubelet to wait for).
			Expect(env.Client.Delete(ctx, pod)).To(Succeed())
			deleted := time.Now()
			sessions = append(sessions, podSession{s: s, deleted: deleted, ended: sessionEnded})
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Satisfy(apierrors.IsNotFound))
			var latency time.Duration // until the last of B's Acquires returned
			for range n {
				var g grant
				Eventually(granted, 10*time.Second).Should(Receive(&g))
				latency = max(latency, g.at.Sub(deleted))
				prev := mine[g.lock.Name()]
				Expect(g.lock.FencingToken()).To(BeNumerically(">", prev.FencingToken()))
				ended := suite.GetLock(ctx, ns, g.lock.Name()).Status.RecentAcquisitions
				Expect(ended).To(ContainElement(And(HaveField("LeaseID", prev.LeaseID()), HaveField("EndReason", locksv1alpha1.EndReasonSessionClosed))))
				Expect(g.lock.Release(ctx)).To(Succeed())
			}
			latencies = append(latencies, latency)
		}

		// A, a process whose pod is gone only because no kubelet ran it, learns
		// of it at its next renewal (TTL/3): its session is gone or its token refused.
		var learned []time.Duration
		for _, ps := range sessions {
			var ended time.Time
			Eventually(ps.ended, ttl/3*2).Should(Receive(&ended))
			Expect(ended).To(BeTemporally(">", ps.deleted), "A's session lived until its pod was deleted")
			Expect(ps.s.Err()).To(MatchError(lock.ErrLockLost))
			learned = append(learned, ended.Sub(ps.deleted))
		}
		for _, l := range held {
			Expect(l.Done()).To(BeClosed(), "a lock's context ends with its session's")
			Expect(l.Err()).To(MatchError(lock.ErrLockLost))
		}

		GinkgoWriter.Printf("pod deletion -> next waiter holds all %d locks, in trial order: %v\n", n, latencies)
		GinkgoWriter.Printf("pod deletion -> the pod's own session context ends (its next renewal), in trial order: %v\n", learned)
		slices.Sort(latencies)
		p50, worst := latencies[trials/2], latencies[trials-1]
		report := fmt.Sprintf("p50 %s, max %s over %d trials, against the session TTL (lease) of %s", p50, worst, trials, ttl)
		GinkgoWriter.Println("pod deletion -> all locks free and held by the next waiter: " + report)
		AddReportEntry("pod deletion to the next waiter holding all "+fmt.Sprint(n)+" locks", report)
		Expect(worst).To(BeNumerically("<", 2*time.Second))
	})
})

// lockUserServiceAccount creates service account name in ns bound to the
// lock-user role.
func lockUserServiceAccount(ctx context.Context, ns, name string) *corev1.ServiceAccount {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	Expect(env.Client.Create(ctx, sa)).To(Succeed())
	Expect(env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: testenv.LockUserRole + "-sa-" + ns + "-" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: testenv.LockUserRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	})).To(Succeed())
	return sa
}

// podBoundConfig is a connection as sa with a token bound to pod, as the
// kubelet mounts one.
func podBoundConfig(ctx context.Context, sa *corev1.ServiceAccount, pod *corev1.Pod) *rest.Config {
	return tokenConfig(ctx, sa, &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID})
}

// unboundConfig is a connection as sa with a token bound to no object, as
// kubectl create token requests one.
func unboundConfig(ctx context.Context, sa *corev1.ServiceAccount) *rest.Config {
	return tokenConfig(ctx, sa, nil)
}

func tokenConfig(ctx context.Context, sa *corev1.ServiceAccount, bound *authenticationv1.BoundObjectReference) *rest.Config {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound}}
	Expect(env.Client.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg
}
