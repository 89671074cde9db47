package admission

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/rules"
)

var _ = Describe("admission", Ordered, ContinueOnFailure, func() {
	for _, e := range crdEngines {
		statusSpecs(e)
	}

	// The engines take turns so that a change in the machine's load spreads
	// over all three rather than favouring one.
	It("measures a renew loop with no admission, the webhook and the policy", func(ctx SpecContext) {
		ns := namespace(ctx, "adm-throughput")
		runs := map[engine]*renewRun{}
		order := []engine{engineNone, engineWebhook, enginePolicy}
		for range renewRounds {
			for _, e := range order {
				activate(ctx, e)
				r := measureRenew(ctx, ns, renewFor/renewRounds)
				if runs[e] == nil {
					runs[e] = &renewRun{}
				}
				runs[e].add(r)
			}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%d renewers, each its own held lock; %d rounds of %v per engine, taking turns\n", renewers, renewRounds, renewFor/renewRounds)
		for _, e := range order {
			fmt.Fprintf(&b, "%-8s %s\n", string(e)+":", runs[e])
		}
		AddReportEntry("renew throughput, same run", b.String())
	})
})

// statusSpecs are the status table and the admitted paths of a lock's
// status, with engine e.
func statusSpecs(e engine) {
	Context("with the "+string(e)+" engine", func() {
		var ns string
		BeforeAll(func(ctx SpecContext) {
			activate(ctx, e)
			ns = namespace(ctx, "adm-"+string(e))
		})

		DescribeTable("rejects a hostile request and leaves the lock unchanged",
			func(ctx SpecContext, h hostile) {
				key := h.state.build(ctx, ns)
				if h.setup != nil {
					h.setup(ctx, key)
				}
				before, beforeRaw := get(ctx, key), getRaw(ctx, key)

				err := h.do(ctx, actor(h.by), key)
				Expect(err).To(HaveOccurred(), "the write was admitted")
				Expect(isDenial(err)).To(BeTrue(), "not a denial: %v", err)
				want := h.wantOf(e)
				for _, w := range want {
					Expect(err.Error()).To(ContainSubstring(w))
				}
				if strings.HasPrefix(want[0], "[kubelock:") {
					// The admission engine under test said it, not the other one.
					Expect(err.Error()).To(ContainSubstring(denialPrefix(e)))
				}
				GinkgoWriter.Printf("HOSTILE\t%s\t%s\t%v\n", CurrentSpecReport().LeafNodeText, e, err)
				AddReportEntry("message", err.Error(), ReportEntryVisibilityNever)

				after, afterRaw := get(ctx, key), getRaw(ctx, key)
				Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
				Expect(cmp.Diff(before, after)).To(BeEmpty())
				Expect(string(afterRaw)).To(Equal(string(beforeRaw)))
			},
			hostileEntries(),
		)

		sharedSpecs(e, &ns)

		It("lets another user join after one user added all the entries it may", func(ctx SpecContext) {
			key := held.build(ctx, ns)
			limit := get(ctx, key).MaxWaitersPerUser()
			Expect(limit).To(Equal(locksv1alpha1.DefaultMaxWaitersPerUser))
			fills("bob", limit)(ctx, key)
			err := write(ctx, bob, key, enqueue(waiter("bob", limit+1)))
			Expect(err).To(MatchError(ContainSubstring("[kubelock:queue] " + msgWaitersPerUser)))
			Expect(write(ctx, carol, key, enqueue(waiter("carol", 1)))).To(Succeed())
			l := get(ctx, key)
			Expect(l.Status.Waiters).To(HaveLen(limit + 1))
			Expect(l.Status.Waiters[limit].User).To(Equal("carol"))
		})

		It("lets the controller expire an abandoned lease after hostile writes were denied", func(ctx SpecContext) {
			key := free.build(ctx, ns)
			Expect(write(ctx, alice, key, acquire(leaseOf("alice", 1)))).To(Succeed())
			// alice is gone; bob tries to freeze the lock and to fill it.
			freezers := map[string]func(context.Context, *user, client.ObjectKey) error{
				"eight foreign conditions": setConditions(func() []map[string]any {
					var cs []map[string]any
					for i := range locksv1alpha1.MaxConditions {
						cs = append(cs, map[string]any{"type": fmt.Sprintf("Squat%d", i), "status": "True", "reason": "Squatting",
							"message": "full", "lastTransitionTime": nowRFC3339()})
					}
					return cs
				}()...),
				"observedGeneration 99":           patch(types.MergePatchType, map[string]any{"status": map[string]any{"observedGeneration": 99}}),
				"a lower-case t":                  setConditions(heldCond("True", locksv1alpha1.ReasonAcquired, strings.Replace(nowRFC3339(), "T", "t", 1))),
				"a waiter without microseconds":   addWaiterRaw(rawWaiter("bob", 1, nowRFC3339(), rawTime(time.Minute))),
				"two waiters at once":             update(enqueue(waiter("bob", 1)), enqueue(waiter("bob", 2))),
				"a waiter with alice's requestID": update(enqueue(waiterWithRequest(waiter("bob", 1), requestID("alice", 1)))),
			}
			before := getRaw(ctx, key)
			for _, n := range slices.Sorted(maps.Keys(freezers)) {
				Expect(freezers[n](ctx, bob, key)).NotTo(Succeed(), n)
			}
			Expect(string(getRaw(ctx, key))).To(Equal(string(before)))
			fills("bob", locksv1alpha1.DefaultMaxWaitersPerUser)(ctx, key)

			cfg, err := env.ControllerConfig(controllerUser)
			Expect(err).NotTo(HaveOccurred())
			stop, err := env.RunController(cfg, controllers.WithExpiryGrace(200*time.Millisecond), controllers.WithUsername(controllerUser))
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { Expect(stop()).To(Succeed()) })
			Eventually(func(g Gomega) {
				l := get(ctx, key)
				g.Expect(l.Status.Holder).To(BeNil())
				g.Expect(lastRecord(l).LeaseID).To(Equal(leaseID("alice", 1)))
				g.Expect(lastRecord(l).EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
				g.Expect(lastRecord(l).EndedBy).To(Equal(controllerUser))
			}).Should(Succeed())
		})

		It("admits a pod-bound holder's and waiter's whole cycle from its own pod", func(ctx SpecContext) {
			key := free.build(ctx, ns)
			podHolds(ctx, key)
			Expect(write(ctx, podUser, key, renew)).To(Succeed())
			Expect(write(ctx, otherPodUser(), key, enqueue(podWaiter(2, pod1Name, pod1UID)))).To(Succeed())
			Expect(write(ctx, podUser, key, end(locksv1alpha1.EndReasonReleased, podSA))).To(Succeed())
			Expect(write(ctx, otherPodUser(), key, acquire(func() locksv1alpha1.LockHolder {
				h := podHolder(2, pod1Name, pod1UID)
				return h
			}()))).To(Succeed())
			Expect(write(ctx, podUser, key, enqueue(podWaiter(3, pod0Name, pod0UID)))).To(Succeed())
			Expect(write(ctx, podUser, key, removeWaiter(requestID(podSA, 3)))).To(Succeed())
			Expect(write(ctx, otherPodUser(), key, renew)).To(Succeed())
			Expect(write(ctx, otherPodUser(), key, end(locksv1alpha1.EndReasonReleased, podSA))).To(Succeed())
			l := get(ctx, key)
			Expect(l.Status.Holder).To(BeNil())
			Expect(l.Status.Waiters).To(BeEmpty())
			Expect(l.Status.RecentAcquisitions).To(HaveLen(2))
		})

		It("admits a pod queueing with its real bound token once another credential's forgery of it was refused", func(ctx SpecContext) {
			key := held.build(ctx, ns)
			pods, sa := podsOf(ctx, ns, 1)
			p := pods[0]
			inPod := func(n int) locksv1alpha1.Waiter {
				w := waiter(p.user.name, n)
				w.PodName, w.PodUID = p.pod.Name, string(p.pod.UID)
				return w
			}
			unbound := unboundTokenUser(ctx, sa)
			Expect(write(ctx, unbound, key, enqueue(inPod(1)))).To(MatchError(ContainSubstring(rules.MsgNoPodToken)))
			Expect(write(ctx, p.user, key, enqueue(inPod(2)))).To(Succeed())
			Expect(write(ctx, unbound, key, enqueue(waiter(p.user.name, 3)))).To(Succeed(), "without pod fields")
			ws := get(ctx, key).Status.Waiters
			Expect(ws).To(HaveLen(2))
			Expect(ws[0].PodUID).To(BeEquivalentTo(p.pod.UID))
			Expect(ws[1].PodUID).To(BeEmpty())
		})

		It("admits a lock user keeping observedGeneration and the Held condition in step", func(ctx SpecContext) {
			key := free.build(ctx, ns)
			Expect(write(ctx, alice, key, acquire(holder("alice", 1)))).To(Succeed())
			Expect(write(ctx, alice, key, func(l *locksv1alpha1.DistributedLock) {
				l.Status.ObservedGeneration = l.Generation
				renew(l)
			})).To(Succeed())
			l := get(ctx, key)
			Expect(l.Status.ObservedGeneration).To(Equal(l.Generation))
			Expect(l.Status.Conditions).To(HaveLen(1))
			Expect(l.Status.Conditions[0].Status).To(Equal(metav1.ConditionTrue))
			Expect(write(ctx, alice, key, end(locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
			l = get(ctx, key)
			Expect(l.Status.Conditions).To(HaveLen(1))
			Expect(l.Status.Conditions[0].Status).To(Equal(metav1.ConditionFalse))
			Expect(l.Status.Conditions[0].Reason).To(Equal(locksv1alpha1.ReasonReleased))

			// The controller may write other conditions; a lock user's
			// write that leaves them alone stays admitted.
			Expect(setConditions(heldCond("False", locksv1alpha1.ReasonReleased, nowRFC3339()),
				map[string]any{"type": "Idle", "status": "True", "reason": "NoHolder", "message": "", "lastTransitionTime": nowRFC3339()},
			)(ctx, ctlr, key)).To(Succeed())
			Expect(write(ctx, bob, key, enqueue(waiter("bob", 1)))).To(Succeed())
			Expect(get(ctx, key).Status.Conditions).To(HaveLen(2))
		})

		It("admits acquire, renew, enqueue, leaving the queue, release and hand-off by the right users", func(ctx SpecContext) {
			key := free.build(ctx, ns)
			Expect(write(ctx, alice, key, acquire(holder("alice", 1)))).To(Succeed())
			Expect(write(ctx, alice, key, renew)).To(Succeed())
			Expect(write(ctx, bob, key, enqueue(waiter("bob", 1)))).To(Succeed())
			Expect(write(ctx, carol, key, enqueue(waiter("carol", 1)))).To(Succeed())
			Expect(write(ctx, dave, key, enqueue(waiter("dave", 1)))).To(Succeed())
			Expect(write(ctx, carol, key, func(l *locksv1alpha1.DistributedLock) {
				Expect(l.Status.RemoveWaiter(requestID("carol", 1))).To(BeTrue())
			})).To(Succeed())
			Expect(write(ctx, alice, key, end(locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
			Expect(write(ctx, bob, key, acquire(holder("bob", 1)))).To(Succeed())
			Expect(write(ctx, bob, key, end(locksv1alpha1.EndReasonReleased, "bob"))).To(Succeed())
			Expect(write(ctx, dave, key, acquire(holder("dave", 1)))).To(Succeed())

			l := get(ctx, key)
			Expect(l.Status.Holder.User).To(Equal("dave"))
			Expect(l.Status.Waiters).To(BeEmpty())
			Expect(l.Status.Transitions).To(Equal(int64(3)))
			Expect(l.Status.RecentAcquisitions).To(HaveLen(2))
			Expect(l.Status.RecentAcquisitions[1].EndedBy).To(Equal("bob"))
		})

		It("admits a pod's service account acquiring in its own pod's name", func(ctx SpecContext) {
			key := free.build(ctx, ns)
			h := holder(podSA, 1)
			h.PodName, h.PodUID = pod0Name, pod0UID
			Expect(write(ctx, podUser, key, acquire(h))).To(Succeed())
		})

		It("admits a force-release by a user with the force-release verb", func(ctx SpecContext) {
			key := heldQueue.build(ctx, ns)
			Expect(write(ctx, breakglass, key, end(locksv1alpha1.EndReasonForceReleased, "breakglass"))).To(Succeed())
			l := get(ctx, key)
			Expect(l.Status.Holder).To(BeNil())
			Expect(l.Status.Waiters).To(HaveLen(2))
			last := lastRecord(l)
			Expect(last.EndReason).To(Equal(locksv1alpha1.EndReasonForceReleased))
			Expect(last.EndedBy).To(Equal("breakglass"))
			Expect(last.LeaseID).To(Equal(leaseID("alice", 1)))
		})

		It("lets the controller expire a holding and drop waiters", func(ctx SpecContext) {
			key := heldQueue.build(ctx, ns)
			Expect(write(ctx, ctlr, key, func(l *locksv1alpha1.DistributedLock) {
				l.EndHolding(locksv1alpha1.EndReasonExpired, controllerUser, metav1.NowMicro())
				Expect(l.Status.RemoveWaiter(requestID("bob", 1))).To(BeTrue())
			})).To(Succeed())
			l := get(ctx, key)
			Expect(l.Status.Holder).To(BeNil())
			Expect(lastRecord(l).EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
			Expect(lastRecord(l).EndedBy).To(Equal(controllerUser))
			Expect(l.Status.Waiters).To(HaveLen(1))
			Expect(write(ctx, ctlr, key, func(l *locksv1alpha1.DistributedLock) {
				Expect(l.Status.RemoveWaiter(requestID("carol", 1))).To(BeTrue())
			})).To(Succeed())
		})

		It("keeps recentAcquisitions bounded, dropping the oldest record", func(ctx SpecContext) {
			key := free.build(ctx, ns)
			for i := range locksv1alpha1.MaxRecentAcquisitions + 2 {
				Expect(write(ctx, alice, key, acquire(holder("alice", i)))).To(Succeed())
				Expect(write(ctx, alice, key, end(locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
			}
			l := get(ctx, key)
			Expect(l.Status.RecentAcquisitions).To(HaveLen(locksv1alpha1.MaxRecentAcquisitions))
			Expect(l.Status.RecentAcquisitions[0].LeaseID).To(Equal(leaseID("alice", 2)))
		})

		It("admits an enqueue and a hand-off at the queue's hard bound, within CEL's cost budget", func(ctx SpecContext) {
			ssr := &authenticationv1.SelfSubjectReview{}
			Expect(env.Client.Create(ctx, ssr)).To(Succeed())
			admin := &user{name: ssr.Status.UserInfo.Username, c: env.Client}
			key := state{spec: locksv1alpha1.DistributedLockSpec{
				MaxWaiters:        int32p(locksv1alpha1.MaxWaitersLimit),
				MaxWaitersPerUser: int32p(locksv1alpha1.MaxWaitersLimit),
			}, holder: "alice"}.build(ctx, ns)
			// The rules admit this queue only one waiter per write: 127
			// writes of a growing object (1,023 took over 8 minutes per engine
			// on a loaded 2-core machine). The same object is built in one write
			// past the rules; the engine under test then judges the writes
			// at the bound.
			unchecked(ctx, e, admin, func(write func(client.ObjectKey, func(*locksv1alpha1.DistributedLock)) error) {
				Expect(write(key, func(l *locksv1alpha1.DistributedLock) {
					for i := range locksv1alpha1.MaxWaitersLimit - 1 {
						l.Status.AppendWaiter(waiter(admin.name, i))
					}
				})).To(Succeed())
			})
			Expect(write(ctx, dave, key, enqueue(waiter("dave", 1)))).To(Succeed())
			Expect(write(ctx, carol, key, enqueue(waiter("carol", 1)))).
				To(MatchError(ContainSubstring("status.waiters must not grow beyond 128 entries")), "one more than the bound")
			Expect(write(ctx, alice, key, end(locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
			Expect(write(ctx, admin, key, acquire(holder(admin.name, 1)))).NotTo(Succeed(), "not the head's request")
			Expect(write(ctx, admin, key, func(l *locksv1alpha1.DistributedLock) {
				h := holder(admin.name, 0)
				h.RequestID = requestID(admin.name, 0)
				acquire(h)(l)
			})).To(Succeed())
			Expect(get(ctx, key).Status.Waiters).To(HaveLen(locksv1alpha1.MaxWaitersLimit - 1))
		})

		It("deletes a held lock only with force", func(ctx SpecContext) {
			del := func(u *user, key client.ObjectKey) error {
				return u.c.Delete(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
			}
			Expect(del(deleter, free.build(ctx, ns))).To(Succeed(), "a free lock")
			annotated := state{holder: "alice", annotations: map[string]string{locksv1alpha1.ForceDeleteAnnotation: "true"}}
			Expect(del(deleter, annotated.build(ctx, ns))).To(Succeed(), "with the force-delete annotation")
			Expect(del(breakglass, held.build(ctx, ns))).To(Succeed(), "by a user with the force-release verb")
			notTrue := state{holder: "alice", annotations: map[string]string{locksv1alpha1.ForceDeleteAnnotation: "yes"}}
			err := del(deleter, notTrue.build(ctx, ns))
			Expect(err).To(MatchError(ContainSubstring("[kubelock:held-delete]")))
		})

		if e == engineWebhook {
			It("fails closed while the webhook is down: no lock write passes, no lock changes", func(ctx SpecContext) {
				keys := map[string]client.ObjectKey{
					"free": free.build(ctx, ns), "held": held.build(ctx, ns), "queue": heldQueue.build(ctx, ns),
				}
				before := map[string][]byte{}
				for n, k := range keys {
					before[n] = getRaw(ctx, k)
				}
				stopWebhook()
				DeferCleanup(func(ctx SpecContext) {
					stopWebhook = startWebhookServer()
					Eventually(func() engine { return probe(ctx, ns) }).Should(Equal(engineWebhook))
				})
				writes := map[string]func() error{
					"acquire":     func() error { return write(ctx, bob, keys["free"], acquire(holder("bob", 1))) },
					"renew":       func() error { return write(ctx, alice, keys["held"], renew) },
					"release":     func() error { return write(ctx, alice, keys["held"], end(locksv1alpha1.EndReasonReleased, "alice")) },
					"enqueue":     func() error { return write(ctx, dave, keys["queue"], enqueue(waiter("dave", 1))) },
					"leave queue": func() error { return write(ctx, carol, keys["queue"], removeWaiter(requestID("carol", 1))) },
					"expire": func() error {
						return write(ctx, ctlr, keys["queue"], end(locksv1alpha1.EndReasonExpired, controllerUser))
					},
					"force-release": func() error {
						return write(ctx, breakglass, keys["held"], end(locksv1alpha1.EndReasonForceReleased, "breakglass"))
					},
					"delete held": func() error {
						return breakglass.c.Delete(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: keys["held"].Name}})
					},
					"delete free": func() error {
						return deleter.c.Delete(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: keys["free"].Name}})
					},
				}
				for _, n := range slices.Sorted(maps.Keys(writes)) {
					err := writes[n]()
					Expect(err).To(MatchError(ContainSubstring(`failed calling webhook "vdistributedlock`)), n)
					GinkgoWriter.Printf("webhook down, %s: %v\n", n, err)
				}
				for n, k := range keys {
					Expect(string(getRaw(ctx, k))).To(Equal(string(before[n])), n)
				}
			})
		}

	})
}

// The policy cannot import Go constants; it carries copies that must not drift.
var _ = Describe("the policy's copies of Go constants", func() {
	It("has v1alpha1.TimePattern as its timePattern", func() {
		var vap *admissionregistrationv1.ValidatingAdmissionPolicy
		for _, o := range policyObjects() {
			if p, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicy); ok && p.Name == policyName {
				vap = p
			}
		}
		Expect(vap).NotTo(BeNil())
		var expr string
		for _, v := range vap.Spec.Variables {
			if v.Name == "timePattern" {
				expr = v.Expression
			}
		}
		Expect(expr).To(Equal("r'" + locksv1alpha1.TimePattern + "'"))
	})
})

func removeWaiter(id string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter(id) }
}

func denialPrefix(e engine) string {
	switch e {
	case enginePolicy:
		return policyDenied
	case engineLockAPI:
		return lockAPIDenied
	}
	return webhookDenied
}

const (
	renewers     = 16
	renewFor     = 5 * time.Second
	renewRounds  = 2
	renewWarmups = 3
)

// renewRun is the outcome of renew loops: renewals, their latencies, the time taken.
type renewRun struct {
	lat     []time.Duration
	elapsed time.Duration
	load    []string
}

func (r *renewRun) add(o *renewRun) {
	r.lat = append(r.lat, o.lat...)
	r.elapsed += o.elapsed
	r.load = append(r.load, o.load...)
}

func (r *renewRun) String() string {
	all := slices.Sorted(slices.Values(r.lat))
	pct := func(p float64) time.Duration { return all[int(p*float64(len(all)-1))].Round(100 * time.Microsecond) }
	return fmt.Sprintf("%5d renewals in %.1fs = %4.0f ops/s, p50 %v, p99 %v (load average %s)",
		len(all), r.elapsed.Seconds(), float64(len(all))/r.elapsed.Seconds(), pct(0.50), pct(0.99), strings.Join(r.load, ", "))
}

// measureRenew runs renewers goroutines, each renewing its own held lock with
// status updates for d. A figure, not an assertion.
func measureRenew(ctx context.Context, ns string, d time.Duration) *renewRun {
	locks := make([]*locksv1alpha1.DistributedLock, renewers)
	for i := range locks {
		key := free.build(ctx, ns)
		Expect(write(ctx, alice, key, acquire(holder("alice", i)))).To(Succeed())
		locks[i] = &locksv1alpha1.DistributedLock{}
		Expect(alice.c.Get(ctx, key, locks[i])).To(Succeed())
		for range renewWarmups {
			renew(locks[i])
			Expect(alice.c.Status().Update(ctx, locks[i])).To(Succeed())
		}
	}
	lat := make([][]time.Duration, renewers)
	errs := make([]error, renewers)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range locks {
		wg.Go(func() {
			l := locks[i]
			for time.Now().Before(deadline) {
				renew(l)
				t := time.Now()
				if err := alice.c.Status().Update(ctx, l); err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], time.Since(t))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		Expect(err).NotTo(HaveOccurred())
	}
	return &renewRun{lat: slices.Concat(lat...), elapsed: elapsed, load: []string{loadAverage()}}
}

// loadAverage is the machine's 1-minute load average, to judge the figures by.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}
