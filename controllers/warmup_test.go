package controllers_test

import (
	"context"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
)

var _ = Describe("a standby replica", func() {
	It("observes renewals before it leads: the new leader times each lapsed lease and session from the last renewal it saw, never from its takeover, never earlier than lease + grace", func() {
		ctx := context.Background()
		ns := newNamespace(ctx)
		const lease = 2
		lapsing := createLock(ctx, ns, "lapsing", nil, locksv1alpha1.DistributedLockSpec{})
		acquire(ctx, lapsing, "lease-lapsing-000001", lease)
		session := createSession(ctx, ns, "lapsing", adminUser, sessionTTL)
		inIt := createLock(ctx, ns, "in-session", nil, locksv1alpha1.DistributedLockSpec{})
		acquireWith(ctx, inIt, "lease-in-session-01", sessionTTL, inSession(session.Name))

		By("starting a replica while another leads")
		election := holdElection(ctx, ns)
		r, electedAt := startStandby(ns, election.Name)

		By("renewing both once more, until the standby has seen it")
		lockRenewSent := time.Now()
		Expect(renew(ctx, lapsing, "lease-lapsing-000001")).To(Succeed())
		lockMark := getLock(ctx, lapsing).Status.Holder.RenewTime.UnixMicro()
		sessionRenewSent := renewSession(ctx, session)
		s := &locksv1alpha1.LockSession{}
		Expect(env.Client.Get(ctx, session, s)).To(Succeed())
		sessionMark := s.Status.RenewTime.UnixMicro()
		Eventually(func() int64 { m, _ := r.RenewalSeen(lapsing, "lease-lapsing-000001"); return m }).Should(Equal(lockMark))
		Eventually(func() int64 { m, _ := r.SessionRenewalSeen(session); return m }).Should(Equal(sessionMark))

		By("letting both lapse under the old leader, which is gone: a standby ends nothing")
		due := sessionRenewSent.Add(sessionTTL*time.Second + grace)
		Consistently(func(g Gomega) {
			g.Expect(holderID(ctx, lapsing)).To(Equal("lease-lapsing-000001"))
			g.Expect(holderID(ctx, inIt)).To(Equal("lease-in-session-01"))
		}).WithTimeout(time.Until(due.Add(500 * time.Millisecond))).Should(Succeed())

		By("the old leader's Lease going away: the standby leads")
		Expect(env.Client.Delete(ctx, election)).To(Succeed())
		awaitFree(ctx, []types.NamespacedName{lapsing, inIt})
		freedAt := time.Now()
		Expect(electedAt.Load()).NotTo(BeNil())
		elected := *electedAt.Load()
		Expect(freedAt.Sub(lockRenewSent)).To(BeNumerically(">=", lease*time.Second+grace), "expired before lease + grace after the last renewal was sent")
		Expect(freedAt.Sub(sessionRenewSent)).To(BeNumerically(">=", sessionTTL*time.Second+grace), "ended before TTL + grace after the session's last renewal was sent")
		Expect(freedAt).To(BeTemporally("<", elected.Add(lease*time.Second+grace)), "the new leader timed the lease from its takeover")
		Expect(lastEnded(ctx, lapsing).EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
		Expect(lastEnded(ctx, inIt).EndReason).To(Equal(locksv1alpha1.EndReasonSessionExpired))
		GinkgoWriter.Printf("led %s after the session's deadline; both ended %s after the takeover\n", elected.Sub(due), freedAt.Sub(elected))
	})
})

// holdElection writes a leader Lease held by another replica for an hour,
// as a leader that died without releasing it leaves it.
func holdElection(ctx context.Context, ns string) *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "standby-election"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("the-old-leader"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &now, RenewTime: &now,
		},
	}
	Expect(env.Client.Create(ctx, l)).To(Succeed())
	return l
}

// startStandby starts a manager with the controller that elects its leader
// on the Lease named election in ns, and returns its reconciler and, once
// it leads, when it became leader.
func startStandby(ns, election string) (*controllers.Reconciler, *atomic.Pointer[time.Time]) {
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                  env.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
		LeaderElection:          true,
		LeaderElectionNamespace: ns,
		LeaderElectionID:        election,
		LeaseDuration:           ptr.To(2 * time.Second),
		RenewDeadline:           ptr.To(time.Second),
		RetryPeriod:             ptr.To(100 * time.Millisecond),
	})
	Expect(err).NotTo(HaveOccurred())
	r, err := controllers.Setup(mgr, controllers.WithExpiryGrace(grace), controllers.WithIdleTimeout(idleTimeout),
		controllers.WithNamespaces(ns))
	Expect(err).NotTo(HaveOccurred())
	var electedAt atomic.Pointer[time.Time]
	go func() {
		select {
		case <-mgr.Elected():
			now := time.Now()
			electedAt.Store(&now)
		case <-ctx.Done():
		}
	}()
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	DeferCleanup(func() {
		cancel()
		<-done
	})
	return r, &electedAt
}
