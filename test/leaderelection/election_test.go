package leaderelection

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/suite"
)

const lockName = "leader"

var _ = Describe("Two controller-runtime managers electing on a DistributedLock", func() {
	var (
		ns           string
		cfgA, cfgB   *rest.Config
		userA, userB string
	)

	BeforeEach(func(ctx SpecContext) {
		ns = suite.Namespace(ctx)
		suite.NewLock(ctx, ns, lockName, locksv1alpha1.DistributedLockSpec{})
		cfgA, userA = suite.UserConfig(ctx)
		cfgB, userB = suite.UserConfig(ctx)
	})

	// elect starts a (connecting with kcA) and waits until it leads, then b,
	// and waits until b stands by in the lock's queue.
	elect := func(ctx context.Context, kcA string) (a, b *candidate, tokenA int64) {
		GinkgoHelper()
		a = startCandidate(kindKubelock, ns, lockName, "a", kcA, testTimings)
		tokenA = a.await("LEADING", 1, 60*time.Second).token()
		Expect(tokenA).To(BeNumerically(">", 0))
		b = startCandidate(kindKubelock, ns, lockName, "b", writeKubeconfig(userB, cfgB), testTimings)
		b.standingBy(ctx)
		Expect(waiters(ctx, ns, lockName)).To(Equal([]string{"b"}))
		Expect(b.has("LEADING")).To(BeFalse(), "b leads while a holds the lock")
		return a, b, tokenA
	}

	It("elects one and queues the other, whose writes to the leader's holding the server denies", func(ctx SpecContext) {
		elect(ctx, writeKubeconfig(userA, cfgA))
		held := suite.GetLock(ctx, ns, lockName)
		h := held.Status.Holder
		Expect(h.Identity).To(Equal("a"))
		Expect(h.User).To(Equal(userA))

		By("releasing the leader's lease as the waiting manager's user")
		intruder, err := lock.New(cfgB, lock.WithNamespace(ns), lock.WithIdentity("b"))
		Expect(err).NotTo(HaveOccurred())
		Expect(intruder.ReleaseLease(ctx, lockName, h.LeaseID)).To(MatchError(ContainSubstring("[kubelock:holder-only]")))

		By("renewing the leader's lease as the waiting manager's user")
		bc, err := client.New(cfgB, client.Options{Scheme: suite.Env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		renew := suite.GetLock(ctx, ns, lockName)
		now := metav1.NewMicroTime(time.Now())
		renew.Status.Holder.RenewTime = &now
		Expect(bc.Status().Update(ctx, renew)).To(MatchError(ContainSubstring("[kubelock:holder-only]")))

		after := suite.GetLock(ctx, ns, lockName)
		Expect(after.Status.Holder.LeaseID).To(Equal(h.LeaseID), "the leader still holds the lock")
		Expect(after.Status.RecentAcquisitions).To(Equal(held.Status.RecentAcquisitions), "no holding ended")
	})

	It("hands over to the waiting manager in under 500 ms when the leader stops gracefully", func(ctx SpecContext) {
		a, b, tokenA := elect(ctx, writeKubeconfig(userA, cfgA))
		leaseA := suite.GetLock(ctx, ns, lockName).Status.Holder.LeaseID
		a.signal(syscall.SIGTERM)
		released := a.await("RELEASING", 1, 30*time.Second)
		led := b.await("LEADING", 1, 30*time.Second)
		stopped := a.await("STOPPED", 1, 30*time.Second)

		Expect(stopped.at).To(BeTemporally("<", released.at), "a stops its work before it releases")
		Expect(led.token()).To(BeNumerically(">", tokenA))
		Expect(led.at.Sub(released.at)).To(BeNumerically("<", 500*time.Millisecond))
		Expect(finished(ctx, ns, lockName, leaseA)).To(HaveField("EndReason", locksv1alpha1.EndReasonReleased))
		fmt.Fprintf(GinkgoWriter, "hand-off: %s from a's release to b leading\n", led.at.Sub(released.at))
	})

	It("lets the waiting manager lead, with a higher token, once the controller expired the killed leader's holding", func(ctx SpecContext) {
		a, b, tokenA := elect(ctx, writeKubeconfig(userA, cfgA))
		leaseA := suite.GetLock(ctx, ns, lockName).Status.Holder.LeaseID
		killed := a.signal(syscall.SIGKILL)
		led := b.await("LEADING", 1, 60*time.Second)

		Expect(led.token()).To(BeNumerically(">", tokenA))
		f := finished(ctx, ns, lockName, leaseA)
		Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
		Expect(f.EndedBy).To(Equal(suite.ControllerUser))
		fmt.Fprintf(GinkgoWriter, "failover: %s from SIGKILL to b leading\n", led.at.Sub(killed))
	})

	It("stops a leader cut off from the apiserver before the next one leads (I5)", func(ctx SpecContext) {
		proxy, err := faultproxy.New(cfgA)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)
		a, b, _ := elect(ctx, writeKubeconfig(userA+"-proxied", proxy.Config()))
		leaseA := suite.GetLock(ctx, ns, lockName).Status.Holder.LeaseID

		proxy.SetRule(func(*http.Request) faultproxy.Action { return faultproxy.Refuse })
		cut := time.Now()
		stopped := a.await("STOPPED", 1, 60*time.Second)
		led := b.await("LEADING", 1, 60*time.Second)

		Expect(stopped.at).To(BeTemporally("<", led.at), "the cut-off leader stopped before the next one started")
		Expect(finished(ctx, ns, lockName, leaseA)).To(HaveField("EndReason", locksv1alpha1.EndReasonExpired))
		fmt.Fprintf(GinkgoWriter, "cut off: a stopped %s after the cut, b led %s later\n", stopped.at.Sub(cut), led.at.Sub(stopped.at))
	})
})

var _ = Describe("Failover and hand-off, kubelock against a Lease", func() {
	// LE_ROUNDS rounds per lock kind (default 3); each round kills a leader
	// (failover: SIGKILL to the next leader's start) and stops the next one
	// gracefully (hand-off: its release to the next leader's start).
	It("measures both with the same managers and timings", func(ctx SpecContext) {
		rounds := 3
		if v, err := strconv.Atoi(os.Getenv("LE_ROUNDS")); err == nil && v > 0 {
			rounds = v
		}
		ns := suite.Namespace(ctx)
		cfgA, userA := suite.UserConfig(ctx)
		cfgB, userB := suite.UserConfig(ctx)
		grantLeases(ctx, ns, userA)
		grantLeases(ctx, ns, userB)
		kcA, kcB := writeKubeconfig(userA, cfgA), writeKubeconfig(userB, cfgB)

		// Per kind: failover from SIGKILL, failover from the dead leader's
		// last renewal (its renewTime: independent of when in the renewal
		// cycle the kill fell), hand-off.
		figures := map[string]*[3][]time.Duration{kindKubelock: {}, kindLease: {}}
		for round := range rounds {
			for _, kind := range []string{kindKubelock, kindLease} {
				name := fmt.Sprintf("%s-%d", kind, round)
				if kind == kindKubelock {
					suite.NewLock(ctx, ns, name, locksv1alpha1.DistributedLockSpec{})
				}
				a := startCandidate(kind, ns, name, "a", kcA, testTimings)
				tokenA := a.await("LEADING", 1, 60*time.Second).token()
				b := startCandidate(kind, ns, name, "b", kcB, testTimings)
				b.standingBy(ctx)
				killed := a.signal(syscall.SIGKILL)
				renewed := lastRenewal(ctx, kind, ns, name)
				ledB := b.await("LEADING", 1, 90*time.Second)

				c := startCandidate(kind, ns, name, "c", kcA, testTimings)
				c.standingBy(ctx)
				b.signal(syscall.SIGTERM)
				released := b.await("RELEASING", 1, 30*time.Second)
				ledC := c.await("LEADING", 1, 30*time.Second)
				c.signal(syscall.SIGTERM)
				c.await("EXIT", 1, 30*time.Second)

				if kind == kindKubelock {
					Expect(ledB.token()).To(BeNumerically(">", tokenA))
					Expect(ledC.token()).To(BeNumerically(">", ledB.token()))
				}
				f := figures[kind]
				f[0] = append(f[0], ledB.at.Sub(killed))
				f[1] = append(f[1], ledB.at.Sub(renewed))
				f[2] = append(f[2], ledC.at.Sub(released.at))
			}
		}

		var table strings.Builder
		fmt.Fprintf(&table, "leader election, %d rounds, lease %s, renew deadline %s, retry period %s, controller expiry grace 2s\n",
			rounds, testTimings[0], testTimings[1], testTimings[2])
		fmt.Fprintf(&table, "%-9s %-30s %-30s %-30s\n", "lock", "failover from SIGKILL", "failover from last renewal", "hand-off from release")
		for _, kind := range []string{kindKubelock, kindLease} {
			f := figures[kind]
			fmt.Fprintf(&table, "%-9s %-30s %-30s %-30s\n", kind, spread(f[0]), spread(f[1]), spread(f[2]))
		}
		for _, kind := range []string{kindKubelock, kindLease} {
			f := figures[kind]
			fmt.Fprintf(&table, "%s rounds (ms): from SIGKILL %v, from last renewal %v, hand-off %v\n", kind, ms(f[0]), ms(f[1]), ms(f[2]))
		}
		AddReportEntry("failover and hand-off", table.String())
		fmt.Fprint(GinkgoWriter, table.String())

		for _, d := range figures[kindKubelock][2] {
			Expect(d).To(BeNumerically("<", 500*time.Millisecond), "kubelock hand-off")
		}
	})
})

// lastRenewal is the renewTime the leader of kind's lock ns/name last wrote.
func lastRenewal(ctx context.Context, kind, ns, name string) time.Time {
	GinkgoHelper()
	if kind == kindLease {
		l := &coordinationv1.Lease{}
		Expect(suite.Env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
		Expect(l.Spec.RenewTime).NotTo(BeNil())
		return l.Spec.RenewTime.Time
	}
	h := suite.GetLock(ctx, ns, name).Status.Holder
	Expect(h).NotTo(BeNil(), "the killed leader's holding ended within a lease")
	Expect(h.RenewTime).NotTo(BeNil())
	return h.RenewTime.Time
}

// spread is "p50 X, max Y" of ds.
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("p50 %s, max %s", s[(len(s)-1)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

func ms(ds []time.Duration) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.Milliseconds()
	}
	return out
}

// waiters are the identities in the lock's queue.
func waiters(ctx context.Context, ns, name string) []string {
	var ids []string
	for _, w := range suite.GetLock(ctx, ns, name).Status.Waiters {
		ids = append(ids, w.Identity)
	}
	return ids
}

// finished is the record of the ended holding leaseID.
func finished(ctx context.Context, ns, name, leaseID string) locksv1alpha1.FinishedHolding {
	GinkgoHelper()
	for _, f := range suite.GetLock(ctx, ns, name).Status.RecentAcquisitions {
		if f.LeaseID == leaseID {
			return f
		}
	}
	Fail("no record of lease " + leaseID)
	return locksv1alpha1.FinishedHolding{}
}
