package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
)

// Lock types of the shared-mode cases (RWMutex and Semaphore).
var (
	rwSpec   = locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex}
	sem3Spec = locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: int32p(3)}
)

// The fixed messages of the shared-mode rules, as both engines give them.
const (
	msgOneAcquisition = "one write may acquire at most one holding: the exclusive holder or one shared holder"
	msgSharedKept     = "a shared holding's slot and fencingToken never change while it lasts"
	msgHolderCount    = "status.holderCount must equal the number of holdings, exclusive and shared"
)

// The CRD's own messages for the shared invariants (api/v1alpha1), which
// the apiserver gives before either engine runs.
const (
	crdBothModes        = "an RWMutex has a writer or readers, never both"
	crdMutexShared      = "a Mutex has no shared holders"
	crdSemHolder        = "a Semaphore has no exclusive holder; its permits are shared holdings"
	crdPermits          = "a Semaphore has at most spec.permits holders, on slots in [0, permits)"
	crdWaiterMode       = "a Mutex's waiters are Exclusive and a Semaphore's are Shared"
	crdHolderCount      = "holderCount must equal the number of holdings, exclusive and shared"
	crdSlotMaximum      = "slot in body should be less than or equal to 1023"
	crdDuplicateSlot    = `Duplicate value: {"slot":1}`
	crdSharedCap        = "status.sharedHolders must not grow beyond 64 entries: a lock is one etcd value, and etcd refuses one over 1.5 MiB"
	crdWaitersCap       = "status.waiters must not grow beyond 128 entries: a lock is one etcd value, and etcd refuses one over 1.5 MiB"
	crdConditionMessage = "a condition's message is at most 256 characters"
)

// planted brings the built lock to what fn makes of it straight in etcd,
// past the CRD and admission (or the lock apiserver's rules): a lock an
// earlier release stored, within the bounds it had.
func planted(fn func(*locksv1alpha1.DistributedLock)) func(ctx context.Context, key client.ObjectKey) {
	return func(ctx context.Context, key client.ObjectKey) {
		l := &locksv1alpha1.DistributedLock{}
		Expect(env.Client.Get(ctx, key, l)).To(Succeed())
		before := l.ResourceVersion
		fn(l)
		l.SyncCounts()
		Expect(rewriteStored(ctx, key, func(obj map[string]any) {
			obj["spec"], obj["status"] = asJSON(l.Spec), asJSON(l.Status)
		})).To(Succeed())
		Eventually(func() string { return get(ctx, key).ResourceVersion }).ShouldNot(Equal(before), "the apiserver's cache has the planted lock")
	}
}

// asJSON is v as encoding/json writes it into a map.
func asJSON(v any) any {
	b, err := json.Marshal(v)
	Expect(err).NotTo(HaveOccurred())
	var out any
	Expect(json.Unmarshal(b, &out)).To(Succeed())
	return out
}

// sharedHostileEntries are the shared-mode cases of the hostile table; both
// engines run them (hostileEntries appends them).
func sharedHostileEntries() []TableEntry {
	tag := func(r rules.Rule) string { return "[kubelock:" + string(r) + "] " }
	rwWriter := state{spec: rwSpec, holder: "alice"}
	rwReaders := state{spec: rwSpec, readers: []string{"alice", "bob"}}
	sem3Two := state{spec: sem3Spec, readers: []string{"alice", "bob"}}
	sem3Full := state{spec: sem3Spec, readers: []string{"alice", "bob", "carol"}}
	return []TableEntry{
		// --- modes: exclusive and shared never together -----------------------
		Entry("shared: a reader acquiring while a writer holds", hostile{state: rwWriter, by: "bob",
			do: update(acquireShared(holder("bob", 1), 0)), want: []string{crdBothModes}}),
		Entry("shared: a writer acquiring while readers hold", hostile{state: rwReaders, by: "carol",
			do: update(acquire(holder("carol", 1))), want: []string{crdBothModes}}),
		Entry("shared: a shared entry on a Mutex", hostile{state: free, by: "bob",
			do: update(acquireShared(holder("bob", 1), 0)), want: []string{crdMutexShared}}),
		Entry("shared: an exclusive holder on a Semaphore", hostile{state: state{spec: sem3Spec}, by: "bob",
			do: update(acquire(holder("bob", 1))), want: []string{crdSemHolder}}),
		Entry("shared: a Shared waiter on a Mutex", hostile{state: held, by: "bob",
			do: update(enqueue(modeWaiter("bob", 1, locksv1alpha1.Shared))), want: []string{crdWaiterMode}}),
		Entry("shared: an Exclusive waiter on a Semaphore", hostile{state: sem3Full, by: "dave",
			do: update(enqueue(modeWaiter("dave", 1, locksv1alpha1.Exclusive))), want: []string{crdWaiterMode}}),

		// --- slots: free, in range, one new entry per write, never moved --------
		Entry("shared: a permit over the limit", hostile{state: sem3Full, by: "dave",
			do: update(acquireShared(holder("dave", 1), 3)), want: []string{crdPermits}}),
		Entry("shared: a slot collision", hostile{state: sem3Two, by: "carol",
			do: update(acquireShared(holder("carol", 1), 1)), want: []string{crdDuplicateSlot}}),
		Entry("shared: a reader's slot out of range (1024)", hostile{state: state{spec: rwSpec}, by: "bob",
			do: update(acquireShared(holder("bob", 1), locksv1alpha1.StoredListLimit)), want: []string{crdSlotMaximum}}),
		// --- the size caps: a lock is one etcd value ----------------------------
		Entry("shared: a reader on slot 64, past the readers' cap", hostile{state: state{spec: rwSpec}, by: "bob",
			do:   update(acquireShared(holder("bob", 1), locksv1alpha1.MaxSharedHolders)),
			want: []string{tag(rules.RuleSlot) + "slot 64 is out of range: a new shared holding takes a free slot in [0, 64)"}}),
		Entry("shared: a 65th reader beside 64", hostile{state: state{spec: rwSpec}, setup: planted(fillReaders("alice", locksv1alpha1.MaxSharedHolders)), by: "bob",
			do: update(acquireShared(holder("bob", 1), locksv1alpha1.MaxSharedHolders)), want: []string{crdSharedCap}}),
		Entry("shared: a permit on slot 70 of a Semaphore stored with 100 permits by an earlier release", hostile{state: state{spec: sem3Spec},
			setup: planted(func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = int32p(100) }), by: "bob",
			do:   update(acquireShared(holder("bob", 1), 70)),
			want: []string{tag(rules.RuleSlot) + "slot 70 is out of range: a new shared holding takes a free slot in [0, 64)"}}),
		Entry("shared: a 129th waiter on a lock stored with maxWaiters 200 by an earlier release", hostile{state: state{spec: rwSpec},
			setup: planted(func(l *locksv1alpha1.DistributedLock) {
				l.Spec.MaxWaiters, l.Spec.MaxWaitersPerUser = int32p(200), int32p(200)
				for i := range locksv1alpha1.MaxWaitersLimit {
					l.Status.AppendWaiter(waiter("alice", i))
				}
			}), by: "bob",
			do: update(enqueue(waiter("bob", 1))), want: []string{crdWaitersCap}}),
		Entry("shared: a condition message of 257 characters by the controller", hostile{state: state{spec: rwSpec, readers: []string{"alice"}}, by: controllerUser,
			do: update(func(l *locksv1alpha1.DistributedLock) {
				l.Status.Conditions[0].Message = strings.Repeat("m", locksv1alpha1.MaxConditionMessage+1)
			}), want: []string{crdConditionMessage}}),
		Entry("shared: a permit's slot beyond spec.permits", hostile{state: sem3Two, by: "carol",
			do: update(acquireShared(holder("carol", 1), 7)), want: []string{crdPermits}}),
		Entry("shared: two readers added in one write", hostile{state: state{spec: rwSpec}, by: "bob",
			do: update(acquireShared(holder("bob", 1), 0), acquireShared(holder("bob", 2), 1), func(l *locksv1alpha1.DistributedLock) {
				l.Status.Transitions-- // counted once: the slot rule, not the count, must refuse it
			}),
			want: []string{tag(rules.RuleSlot) + msgOneAcquisition}}),
		Entry("shared: changing an existing entry's slot", hostile{state: rwReaders, by: "bob",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].Slot = 9 }),
			want: []string{tag(rules.RuleSlot) + msgSharedKept + ": lease " + leaseID("bob", 1) + " cannot move from slot 1 to slot 9"}}),

		// --- tokens: the server's, resourceVersion + 1 --------------------------
		Entry("shared: a new reader with a forged token above resourceVersion + 1", hostile{state: state{spec: rwSpec, readers: []string{"alice"}}, by: "bob",
			do:   update(acquireShared(holder("bob", 1), 1), sharedTokenDelta(+7)),
			want: []string{tag(rules.RuleFencingToken) + "an acquisition's fencingToken must be the lock's resourceVersion + 1"}}),
		Entry("shared: a merge patch taking a permit with the token 2^62", hostile{state: state{spec: sem3Spec}, by: "bob",
			do: func(ctx context.Context, u *user, key client.ObjectKey) error {
				l := get(ctx, key)
				h := holderJSON("bob", 1)
				h["fencingToken"], h["slot"] = int64(1)<<62, 0
				return patch(types.MergePatchType, map[string]any{"status": map[string]any{
					"sharedHolders": []any{h}, "holderCount": 1, "fencingToken": int64(1) << 62, "transitions": l.Status.Transitions + 1,
				}})(ctx, u, key)
			},
			want: []string{tag(rules.RuleFencingToken) + "an acquisition's fencingToken must be the lock's resourceVersion + 1"}}),

		// --- FIFO across modes -----------------------------------------------------
		Entry("shared: a writer jumping readers queued before it", hostile{state: state{spec: rwSpec, waiters: []string{shared("bob"), shared("carol")}}, by: "dave",
			do: update(acquire(holder("dave", 1))),
			want: []string{tag(rules.RuleQueueHead) + "only the head of the wait queue (requestID " + requestID("bob", 1) + ` of "bob") may acquire; request ` +
				requestID("dave", 1) + ` of "dave" is not`}}),
		Entry("shared: a reader jumping a writer queued before it", hostile{state: state{spec: rwSpec, readers: []string{"alice"}, waiters: []string{"carol"}}, by: "bob",
			do: update(acquireShared(holder("bob", 1), 1)),
			want: []string{tag(rules.RuleQueueHead) + "only the head of the wait queue (requestID " + requestID("carol", 1) + ` of "carol") may acquire; request ` +
				requestID("bob", 1) + ` of "bob" is not`}}),
		Entry("shared: a permit taken past the Shared waiters", hostile{state: state{spec: sem3Spec, readers: []string{"alice"}, waiters: []string{"bob"}}, by: "carol",
			do:   update(acquireShared(holder("carol", 1), 1)),
			want: []string{tag(rules.RuleQueueHead) + "only the head of the wait queue (requestID " + requestID("bob", 1)}}),

		// --- only an entry's owner renews or releases it ------------------------------
		Entry("shared: one permit holder releasing another's permit", hostile{state: sem3Two, by: "bob",
			do:   update(endShared("alice", 1, locksv1alpha1.EndReasonReleased, "bob")),
			want: []string{tag(rules.RuleHolderOnly) + `only the holder "alice" may release lease ` + leaseID("alice", 1) + `; "bob" is not the holder`}}),
		Entry("shared: one permit holder renewing another's permit", hostile{state: sem3Two, by: "bob",
			do:   update(renewShared("alice", 1)),
			want: []string{tag(rules.RuleHolderOnly) + `only the holder "alice" may renew lease ` + leaseID("alice", 1) + `; "bob" is not the holder`}}),
		Entry("shared: a reader releasing another's reading recorded in its name", hostile{state: rwReaders, by: "bob",
			do:   update(endShared("alice", 1, locksv1alpha1.EndReasonReleased, "alice")),
			want: []string{tag(rules.RuleIdentity) + `endedBy must be the requesting user "bob", not "alice"`}}),
		Entry("shared: another pod renewing a pod's permit", hostile{state: state{spec: sem3Spec}, setup: podTakesPermit, by: otherPod,
			do: update(renewShared(podSA, 1)), want: []string{tag(rules.RulePodBinding) + msgPodHolding}}),
		Entry("shared: a reader changing its lease while it holds", hostile{state: rwReaders, by: "alice",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[0].LeaseDurationSeconds = 60 }),
			want: []string{tag(rules.RuleHolderFields) + "while lease " + leaseID("alice", 1) + " is held only its renewTime may change"}}),

		// --- every ended entry recorded, by writers who may end it ----------------------
		Entry("shared: an unrecorded removal", hostile{state: rwReaders, by: "bob",
			do: update(endShared("bob", 1, locksv1alpha1.EndReasonReleased, "bob"), func(l *locksv1alpha1.DistributedLock) {
				l.Status.RecentAcquisitions = l.Status.RecentAcquisitions[:len(l.Status.RecentAcquisitions)-1]
			}),
			want: []string{tag(rules.RuleEndRecord) + "ending the holding of lease " + leaseID("bob", 1) + " must append exactly its record to recentAcquisitions"}}),
		Entry("shared: a JSON patch that removes every reader", hostile{state: rwReaders, by: "bob",
			do: patch(types.JSONPatchType, []map[string]any{
				{"op": "remove", "path": "/status/sharedHolders"}, {"op": "replace", "path": "/status/holderCount", "value": 0},
			}),
			want: []string{tag(rules.RuleEndRecord) + "ending the holdings of leases " + leaseID("alice", 1) + ", " + leaseID("bob", 1) +
				" must append exactly their records to recentAcquisitions"}}),
		Entry("shared: a release recorded without its slot", hostile{state: rwReaders, by: "bob",
			do:   update(endShared("bob", 1, locksv1alpha1.EndReasonReleased, "bob"), func(l *locksv1alpha1.DistributedLock) { lastRecord(l).Slot = nil }),
			want: []string{tag(rules.RuleEndRecord) + "the record must describe the ending holding: leaseID " + leaseID("bob", 1), ", slot 1"}}),
		Entry("shared: a non-controller writing Expired for a shared entry", hostile{state: sem3Two, by: "bob",
			do:   update(endShared("alice", 1, locksv1alpha1.EndReasonExpired, "bob")),
			want: []string{tag(rules.RuleControllerOnly) + `only the kubelock controller may expire a lease; "bob" is not the controller`}}),
		Entry("shared: a permit holder ending its own permit as SessionExpired", hostile{state: sem3Two, by: "alice",
			do:   update(endShared("alice", 1, locksv1alpha1.EndReasonSessionExpired, "alice")),
			want: []string{tag(rules.RuleControllerOnly) + `only the kubelock controller may end a holding for its session; "alice" is not the controller`}}),
		Entry("shared: force-releasing a permit without the verb", hostile{state: sem3Two, by: "bob",
			do:   update(endShared("alice", 1, locksv1alpha1.EndReasonForceReleased, "bob")),
			want: []string{tag(rules.RuleForceRelease) + `user "bob" may not force-release`}}),

		// --- identity, lease IDs, bookkeeping -------------------------------------------
		Entry("shared: a reader in someone else's name", hostile{state: state{spec: rwSpec}, by: "bob",
			do:   update(acquireShared(holder("alice", 1), 0)),
			want: []string{tag(rules.RuleIdentity) + `sharedHolder.user must be the requesting user "bob", not "alice"`}}),
		Entry("shared: the controller taking a permit", hostile{state: state{spec: sem3Spec}, by: controllerUser,
			do:   update(acquireShared(holder(controllerUser, 1), 0)),
			want: []string{tag(rules.RuleControllerOnly) + "the controller may expire holdings but never acquire a lock"}}),
		Entry("shared: a reader reusing another reader's leaseID", hostile{state: state{spec: rwSpec, readers: []string{"alice"}}, by: "bob",
			do:   update(acquireShared(withLease(holder("bob", 1), leaseID("alice", 1)), 1)),
			want: []string{tag(rules.RuleLeaseID) + msgLeaseID}}),
		Entry("shared: a permit reusing a finished permit's leaseID", hostile{state: sem3Two,
			setup: func(ctx context.Context, key client.ObjectKey) {
				Expect(write(ctx, alice, key, endShared("alice", 1, locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
			}, by: "carol",
			do:   update(acquireShared(withLease(holder("carol", 1), leaseID("alice", 1)), 0)),
			want: []string{tag(rules.RuleLeaseID) + msgLeaseID}}),
		Entry("shared: a new reader not counted in holderCount", hostile{state: state{spec: rwSpec, readers: []string{"alice"}}, by: "bob",
			do:   update(acquireShared(holder("bob", 1), 1), func(l *locksv1alpha1.DistributedLock) { l.Status.HolderCount-- }),
			want: []string{crdHolderCount}}),
		Entry("shared: a release that says Held False while a reader holds", hostile{state: rwReaders, by: "bob",
			do: update(endShared("bob", 1, locksv1alpha1.EndReasonReleased, "bob"), func(l *locksv1alpha1.DistributedLock) {
				l.Status.Conditions[0].Status, l.Status.Conditions[0].Reason = metav1.ConditionFalse, locksv1alpha1.ReasonReleased
			}),
			want: []string{tag(rules.RuleBookkeeping) + msgConditions}}),
	}
}

// withLease is h with the leaseID id.
func withLease(h locksv1alpha1.LockHolder, id string) locksv1alpha1.LockHolder {
	h.LeaseID = id
	return h
}

// modeWaiter is user's queue entry n asking for mode.
func modeWaiter(user string, n int, mode locksv1alpha1.Mode) locksv1alpha1.Waiter {
	w := waiter(user, n)
	w.Mode = mode
	return w
}

// sharedTokenDelta moves the newest shared entry's token and status.fencingToken by d together.
func sharedTokenDelta(d int64) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		hs := l.Status.SharedHolders
		hs[len(hs)-1].FencingToken += d
		l.Status.FencingToken += d
	}
}

// podTakesPermit: worker-0 takes the permit on slot 0.
func podTakesPermit(ctx context.Context, key client.ObjectKey) {
	Expect(write(ctx, podUser, key, acquireShared(podHolder(1, pod0Name, pod0UID), 0))).To(Succeed())
}

// sharedSpecs are the shared-mode paths both engines must admit, and the
// writes at the bound of 64 shared holders; ns is the engine's namespace.
func sharedSpecs(e engine, ns *string) {
	It("admits readers beside readers, a writer after them in FIFO order, and each release recorded with its slot", func(ctx SpecContext) {
		key := state{spec: rwSpec}.build(ctx, *ns)
		Expect(write(ctx, alice, key, acquireShared(holder("alice", 1), 0))).To(Succeed())
		Expect(write(ctx, bob, key, acquireShared(holder("bob", 1), 1))).To(Succeed(), "a reader beside a reader")
		Expect(write(ctx, bob, key, renewShared("bob", 1))).To(Succeed())
		Expect(write(ctx, carol, key, enqueue(waiter("carol", 1)))).To(Succeed(), "a writer queues behind the readers")
		Expect(write(ctx, dave, key, enqueue(modeWaiter("dave", 1, locksv1alpha1.Shared)))).To(Succeed(), "a reader queues behind the writer")
		Expect(write(ctx, alice, key, endShared("alice", 1, locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
		l := get(ctx, key)
		Expect(l.Status.Conditions[0].Status).To(Equal(metav1.ConditionTrue), "Held while a reader remains")
		Expect(*lastRecord(l).Slot).To(Equal(int32(0)))
		Expect(write(ctx, bob, key, endShared("bob", 1, locksv1alpha1.EndReasonReleased, "bob"))).To(Succeed())
		Expect(write(ctx, carol, key, acquire(holder("carol", 1)))).To(Succeed(), "the writer at the head")
		Expect(write(ctx, carol, key, end(locksv1alpha1.EndReasonReleased, "carol"))).To(Succeed())
		Expect(write(ctx, dave, key, acquireShared(holder("dave", 1), 0))).To(Succeed(), "the reader at the head")
		l = get(ctx, key)
		Expect(l.Status.Holder).To(BeNil())
		Expect(l.Status.SharedHolders).To(HaveLen(1))
		Expect(l.Status.HolderCount).To(Equal(int32(1)))
		Expect(l.Status.Waiters).To(BeEmpty())
		Expect(l.Status.Transitions).To(Equal(int64(4)))
		Expect(l.Status.FencingToken).To(Equal(l.Status.SharedHolders[0].FencingToken))
		slots := []string{}
		for _, r := range l.Status.RecentAcquisitions {
			if r.Slot == nil {
				slots = append(slots, "exclusive")
			} else {
				slots = append(slots, strconv.Itoa(int(*r.Slot)))
			}
		}
		Expect(slots).To(Equal([]string{"0", "1", "exclusive"}))
	})

	It("admits consecutive shared heads taking permits one after another, and a freed slot taken by the next", func(ctx SpecContext) {
		key := state{spec: locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: int32p(3)},
			readers: []string{"alice"}, waiters: []string{"bob", "carol", "dave"}}.build(ctx, *ns)
		Expect(write(ctx, bob, key, acquireShared(holder("bob", 1), 1))).To(Succeed(), "the head")
		Expect(write(ctx, carol, key, acquireShared(holder("carol", 1), 2))).To(Succeed(), "the next head, while bob holds")
		Expect(write(ctx, dave, key, acquireShared(holder("dave", 1), 3))).NotTo(Succeed(), "no fourth permit")
		Expect(write(ctx, alice, key, endShared("alice", 1, locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
		Expect(write(ctx, dave, key, acquireShared(holder("dave", 1), 0))).To(Succeed(), "the freed slot")
		l := get(ctx, key)
		Expect(l.Status.SharedHolders).To(HaveLen(3))
		Expect(l.Status.Waiters).To(BeEmpty())
		tokens := map[string]int64{}
		for _, h := range l.Status.SharedHolders {
			tokens[h.User] = h.FencingToken
		}
		Expect(tokens["carol"]).To(BeNumerically(">", tokens["bob"]))
		Expect(tokens["dave"]).To(BeNumerically(">", tokens["carol"]))
	})

	It("lets the controller expire shared entries and a breaker force-release the rest, each recorded", func(ctx SpecContext) {
		key := state{spec: sem3Spec, readers: []string{"alice", "bob", "carol"}}.build(ctx, *ns)
		Expect(write(ctx, ctlr, key, func(l *locksv1alpha1.DistributedLock) {
			endShared("alice", 1, locksv1alpha1.EndReasonExpired, controllerUser)(l)
			endShared("bob", 1, locksv1alpha1.EndReasonSessionClosed, controllerUser)(l)
		})).To(Succeed())
		Expect(write(ctx, breakglass, key, endShared("carol", 1, locksv1alpha1.EndReasonForceReleased, "breakglass"))).To(Succeed())
		l := get(ctx, key)
		Expect(l.Status.SharedHolders).To(BeEmpty())
		Expect(l.Status.HolderCount).To(BeZero())
		Expect(l.Status.RecentAcquisitions).To(HaveLen(3))
		Expect(lastRecord(l).EndReason).To(Equal(locksv1alpha1.EndReasonForceReleased))
		Expect(*lastRecord(l).Slot).To(Equal(int32(2)))
	})

	It("admits a pod-bound permit renewed and released from its pod", func(ctx SpecContext) {
		key := state{spec: sem3Spec}.build(ctx, *ns)
		podTakesPermit(ctx, key)
		Expect(write(ctx, podUser, key, renewShared(podSA, 1))).To(Succeed())
		Expect(write(ctx, podUser, key, endShared(podSA, 1, locksv1alpha1.EndReasonReleased, podSA))).To(Succeed())
	})

	// Both engines compare each write with the stored holdings; the policy's
	// CEL has a runtime cost budget per request. At the schema's bound (64
	// shared holders) the writes a protocol makes must fit it, and a hostile
	// write must be denied by its rule, not by the budget (a lock an earlier
	// release stored with 1,024 readers: test/policytest's TestCostAtTheBound).
	It("judges writes of an RWMutex with 64 readers within CEL's cost budget", func(ctx SpecContext) {
		ssr := &authenticationv1.SelfSubjectReview{}
		Expect(env.Client.Create(ctx, ssr)).To(Succeed())
		admin := &user{name: ssr.Status.UserInfo.Username, c: env.Client}
		key := state{spec: rwSpec}.build(ctx, *ns)
		took := func(e engine, what string, err error, start time.Time) {
			GinkgoWriter.Printf("64 readers, %s, %s: %v in %v\n", e, what, err, time.Since(start).Round(time.Millisecond))
		}
		renewAll := func(l *locksv1alpha1.DistributedLock) {
			for i := range l.Status.SharedHolders {
				if l.Status.SharedHolders[i].User == admin.name {
					t := metav1.NewMicroTime(l.Status.SharedHolders[i].RenewTime.Add(time.Second))
					l.Status.SharedHolders[i].RenewTime = &t
				}
			}
		}
		// 63 readers in one write past the rules (as the queue's bound
		// is built above); the engine under test then judges the writes at
		// the bound.
		unchecked(ctx, e, admin, func(write func(client.ObjectKey, func(*locksv1alpha1.DistributedLock)) error) {
			Expect(write(key, fillReaders(admin.name, locksv1alpha1.MaxSharedHolders-1))).To(Succeed())
			// A write's time at this size with no rules, for comparison (a
			// figure on a shared machine, not an assertion).
			start := time.Now()
			took(engineNone, "one user renewing its 63 entries", write(key, renewAll), start)
		})

		start := time.Now()
		err := write(ctx, bob, key, acquireShared(holder("bob", 1), locksv1alpha1.MaxSharedHolders-1))
		took(e, "the 64th reader", err, start)
		Expect(err).NotTo(HaveOccurred())
		start = time.Now()
		err = write(ctx, admin, key, renewAll)
		took(e, "one user renewing its 63 entries", err, start)
		Expect(err).NotTo(HaveOccurred())
		start = time.Now()
		err = write(ctx, bob, key, renewShared(admin.name, 5))
		took(e, "a reader renewing another's entry", err, start)
		Expect(err).To(MatchError(ContainSubstring(`[kubelock:holder-only] only the holder "` + admin.name + `" may renew`)))
		start = time.Now()
		err = write(ctx, admin, key, func(l *locksv1alpha1.DistributedLock) {
			l.Status.SharedHolders, l.Status.HolderCount = l.Status.SharedHolders[locksv1alpha1.MaxSharedHolders-1:], 1
		})
		took(e, "removing 63 entries unrecorded", err, start)
		Expect(err).To(MatchError(ContainSubstring("[kubelock:end-record] one write may end at most 8 holdings")))
		start = time.Now()
		err = write(ctx, ctlr, key, func(l *locksv1alpha1.DistributedLock) {
			for n := range 8 {
				endShared(admin.name, 40+n, locksv1alpha1.EndReasonExpired, controllerUser)(l)
			}
		})
		took(e, "the controller expiring 8 entries", err, start)
		Expect(err).NotTo(HaveOccurred())
		start = time.Now()
		err = write(ctx, bob, key, endShared("bob", 1, locksv1alpha1.EndReasonReleased, "bob"))
		took(e, "a reader releasing", err, start)
		Expect(err).NotTo(HaveOccurred())
		Expect(get(ctx, key).Status.HolderCount).To(Equal(int32(locksv1alpha1.MaxSharedHolders - 9)))
	})
}

// fillReaders gives the lock n readers of user, holdings 0..n-1 on slots
// 0..n-1, in one write: a shortcut past admission for the bound's test,
// within the CRD's rules (one acquisition counted, every token the write's).
func fillReaders(user string, n int) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		tok, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		transitions := l.Status.Transitions
		for i := range n {
			h := holder(user, i)
			h.Identity = fmt.Sprintf("reader-%d", i)
			l.AcquireShared(h, int32(i), tok)
		}
		l.Status.Transitions = transitions + 1
	}
}
