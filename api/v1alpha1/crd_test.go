package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/kubelock/kubelock/api/v1alpha1"
)

var _ = Describe("the DistributedLock CRD", func() {
	It("is installed with its short name, category, status subresource and printer columns", func(ctx SpecContext) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: "distributedlocks.locks.kubelock.io"}, u)).To(Succeed())
		var crd apiextensionsv1.CustomResourceDefinition
		Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &crd)).To(Succeed())

		Expect(crd.Spec.Scope).To(Equal(apiextensionsv1.NamespaceScoped))
		Expect(crd.Spec.Names.ShortNames).To(Equal([]string{"dlock"}))
		Expect(crd.Spec.Names.Categories).To(Equal([]string{"locks"}))
		Expect(crd.Spec.Versions).To(HaveLen(1))
		v := crd.Spec.Versions[0]
		Expect(v.Name).To(Equal("v1alpha1"))
		Expect(v.Subresources).NotTo(BeNil())
		Expect(v.Subresources.Status).NotTo(BeNil())
		var columns []string
		for _, c := range v.AdditionalPrinterColumns {
			if c.Priority == 0 {
				columns = append(columns, c.Name)
			}
		}
		Expect(columns).To(Equal([]string{"Type", "Holders", "Holder", "Token", "Waiters", "Age"}))
	})

	It("round-trips a full object, spec and status", func(ctx SpecContext) {
		l := newLock()
		l.Labels = map[string]string{locksv1.AutoCreatedLabel: "true"}
		l.Annotations = map[string]string{locksv1.KeyAnnotation: "orders/4711"}
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		wantSpec := newLock().Spec

		token, err := locksv1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		h := holder("system:serviceaccount:shop:worker", 2)
		h.LeaseDurationSeconds = 60
		h.PodName = "worker-7d9f"
		h.PodUID = "0b7e4b6c-6f3a-4d5e-9c1a-2f0e8d7c6b5a"
		end := micro()
		l.Status = locksv1.DistributedLockStatus{
			Holder:       &h,
			HolderCount:  1,
			FencingToken: token,
			Transitions:  1,
			Waiters:      []locksv1.Waiter{waiter("alice", 3), waiter("bob", 4)},
			WaiterCount:  2,
			RecentAcquisitions: []locksv1.FinishedHolding{{
				RequestID: "req-1", LeaseID: "lease-0000000000000001", FencingToken: 1,
				Identity: "worker-1", EndTime: end, EndReason: locksv1.EndReasonExpired,
				EndedBy: "system:serviceaccount:kubelock-system:kubelock-manager",
			}},
			ObservedGeneration: 1,
			Conditions: []metav1.Condition{{
				Type: locksv1.ConditionHeld, Status: metav1.ConditionTrue, ObservedGeneration: 1,
				LastTransitionTime: metav1.NewTime(end.Truncate(time.Second)),
				Reason:             locksv1.ReasonAcquired, Message: "held by worker-2",
			}},
		}
		wantStatus := *l.Status.DeepCopy()
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())

		var got locksv1.DistributedLock
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(l), &got)).To(Succeed())
		Expect(cmp.Diff(wantSpec, got.Spec)).To(BeEmpty(), "spec (-want +got)")
		Expect(cmp.Diff(wantStatus, got.Status)).To(BeEmpty(), "status (-want +got)")
		Expect(got.Labels).To(Equal(l.Labels))
		Expect(got.Annotations).To(Equal(l.Annotations))
	})

	It("applies the documented spec defaults", func(ctx SpecContext) {
		l := newLock()
		l.Spec = locksv1.DistributedLockSpec{}
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		Expect(cmp.Diff(defaultSpec(), l.Spec)).To(BeEmpty(), "spec (-want +got)")
	})

	// The object default of spec must list every field with its own default: a
	// lock created without spec gets the same spec as one with "spec: {}".
	It("applies the same defaults to a lock created without spec", func(ctx SpecContext) {
		u, err := toUnstructured(newLock())
		Expect(err).NotTo(HaveOccurred())
		delete(u.Object, "spec")
		delete(u.Object, "status")
		Expect(env.Client.Create(ctx, u)).To(Succeed())
		got := &locksv1.DistributedLock{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: u.GetName()}, got)).To(Succeed())
		Expect(cmp.Diff(defaultSpec(), got.Spec)).To(BeEmpty(), "spec (-want +got)")
	})

	It("accepts every time Go's MicroTime and Time write, in any zone, and printable identities", func(ctx SpecContext) {
		l := newLock()
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		h := holder("alice", 1)
		h.Identity = "wörker-1 (Zürich) 東京"
		h.AcquireTime = metav1.NewMicroTime(time.Date(2, 1, 1, 0, 30, 0, 1000, time.FixedZone("", 3600)))
		renew := metav1.NewMicroTime(time.Date(9998, 12, 31, 23, 59, 59, 999999000, time.UTC))
		h.RenewTime = &renew
		acquire(ctx, env.Client, l, h)
		u, err := toUnstructured(l)
		Expect(err).NotTo(HaveOccurred())
		// Other writers send offsets; Go reads them.
		Expect(unstructured.SetNestedField(u.Object, "2026-11-29T09:00:00.000000+05:30", "status", "holder", "renewTime")).To(Succeed())
		Expect(env.Client.Status().Update(ctx, u)).To(Succeed())
		got := &locksv1.DistributedLock{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(l), got)).To(Succeed())
		Expect(got.Status.Holder.RenewTime.Time.Equal(time.Date(2026, 11, 29, 3, 30, 0, 0, time.UTC))).To(BeTrue())
	})

	It("rejects a status update with a stale resourceVersion with 409 Conflict", func(ctx SpecContext) {
		c := userClient(ctx, "alice")
		l := newLock()
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		acquire(ctx, c, l, holder("alice", 1))

		stale := l.DeepCopy()
		now := micro()
		l.Status.Holder.RenewTime = &now
		Expect(c.Status().Update(ctx, l)).To(Succeed())
		before, err := stored(ctx, l.Name)
		Expect(err).NotTo(HaveOccurred())

		stale.EndHolding(locksv1.EndReasonReleased, "alice", micro())
		err = c.Status().Update(ctx, stale)
		Expect(apierrors.IsConflict(err)).To(BeTrue(), "want 409 Conflict, got %v", err)
		Expect(stored(ctx, l.Name)).To(Equal(before))
	})

	It("returns resourceVersions that compare as increasing integers across writes", func(ctx SpecContext) {
		var rvs []string
		record := func(o interface{ GetResourceVersion() string }) { rvs = append(rvs, o.GetResourceVersion()) }

		a, b := newLock(), newLock()
		Expect(env.Client.Create(ctx, a)).To(Succeed())
		record(a)
		acquire(ctx, env.Client, a, holder(admin, 1))
		record(a)
		tokenA := a.Status.FencingToken
		Expect(env.Client.Create(ctx, b)).To(Succeed())
		record(b)
		a.Spec.MaxWaiters = ptr.To[int32](8)
		Expect(env.Client.Update(ctx, a)).To(Succeed())
		record(a)
		release(ctx, env.Client, a, admin)
		record(a)
		acquire(ctx, env.Client, b, holder(admin, 2))
		record(b)
		acquire(ctx, env.Client, a, holder(admin, 3))
		record(a)

		for i := 1; i < len(rvs); i++ {
			order, err := resourceversion.CompareResourceVersion(rvs[i-1], rvs[i])
			Expect(err).NotTo(HaveOccurred())
			Expect(order).To(Equal(-1), "write %d at %s is not after write %d at %s", i, rvs[i], i-1, rvs[i-1])
		}

		// A list read afterwards is at or after the last write.
		var list locksv1.DistributedLockList
		Expect(env.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(resourceversion.CompareResourceVersion(rvs[len(rvs)-1], list.ResourceVersion)).To(BeNumerically("<=", 0))

		// A token is the read revision + 1, so it never exceeds the revision its
		// write committed at, and the next acquisition's token is larger.
		Expect(resourceversion.CompareResourceVersion(strconv.FormatInt(tokenA, 10), rvs[1])).To(BeNumerically("<=", 0))
		Expect(a.Status.FencingToken).To(BeNumerically(">", tokenA))
		Expect(a.Status.FencingToken).To(BeNumerically(">", b.Status.FencingToken))
	})

	It("accepts the lock protocol's valid transitions from a lock user", func(ctx SpecContext) {
		alice, bob := userClient(ctx, "alice"), userClient(ctx, "bob")
		l := newLock()
		Expect(env.Client.Create(ctx, l)).To(Succeed())

		By("enqueueing into a lock that has no status yet, then leaving the queue")
		l.Status.AppendWaiter(waiter("bob", 100))
		Expect(bob.Status().Update(ctx, l)).To(Succeed())
		Expect(l.Status.RemoveWaiter("req-100")).To(BeTrue())
		Expect(bob.Status().Update(ctx, l)).To(Succeed())

		lastToken := l.Status.FencingToken
		for i := 1; i <= locksv1.MaxRecentAcquisitions+2; i++ {
			acquire(ctx, alice, l, holder("alice", i))
			Expect(l.Status.FencingToken).To(BeNumerically(">", lastToken))
			lastToken = l.Status.FencingToken

			By(fmt.Sprintf("round %d: renewing, queueing bob, releasing, and bob taking over from the head", i))
			now := micro()
			l.Status.Holder.RenewTime = &now
			Expect(alice.Status().Update(ctx, l)).To(Succeed())
			w := waiter("bob", 1000+i)
			l.Status.AppendWaiter(w)
			Expect(bob.Status().Update(ctx, l)).To(Succeed())
			release(ctx, alice, l, "alice")
			acquire(ctx, bob, l, holder("bob", 1000+i))
			Expect(l.Status.FencingToken).To(BeNumerically(">", lastToken))
			lastToken = l.Status.FencingToken
			Expect(l.Status.Waiters).To(BeEmpty())
			release(ctx, bob, l, "bob")
		}
		Expect(l.Status.Transitions).To(Equal(int64(2 * (locksv1.MaxRecentAcquisitions + 2))))
		Expect(l.Status.RecentAcquisitions).To(HaveLen(locksv1.MaxRecentAcquisitions))
	})
})

// write is how an invalid case reaches the apiserver.
type write int

const (
	create write = iota // create the object
	update              // update the main resource (spec, metadata)
	status              // update the status subresource
)

// invalidCase is one write the apiserver must reject with its own message.
type invalidCase struct {
	// prepare, if set, changes the new lock before it is created (its type).
	prepare func(l *locksv1.DistributedLock)
	// setup brings a freshly created lock into the starting state with valid writes.
	setup func(ctx context.Context, l *locksv1.DistributedLock)
	write write
	// mutate changes the typed object before it is sent.
	mutate func(l *locksv1.DistributedLock)
	// raw changes the JSON object after mutate, for values the Go types omit.
	raw func(u map[string]any)
	// want is the substring the rejection must carry.
	want string
	// also are the messages of other rules the same write breaks by necessity.
	also []string
}

// Starting states.
var (
	fresh = func(context.Context, *locksv1.DistributedLock) {}
	free  = func(ctx context.Context, l *locksv1.DistributedLock) {
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
		Expect(l.Status.FencingToken).To(BeZero())
	}
	held = func(ctx context.Context, l *locksv1.DistributedLock) {
		free(ctx, l)
		acquire(ctx, env.Client, l, holder("alice", 1))
	}
	heldWithWaiters = func(ctx context.Context, l *locksv1.DistributedLock) {
		held(ctx, l)
		for i := 2; i <= 4; i++ {
			l.Status.AppendWaiter(waiter("bob", i))
		}
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
	}
	released = func(ctx context.Context, l *locksv1.DistributedLock) {
		held(ctx, l)
		release(ctx, env.Client, l, "alice")
	}
)

func setSpec(field string, v int64) func(map[string]any) {
	return func(u map[string]any) {
		Expect(unstructured.SetNestedField(u, v, "spec", field)).To(Succeed())
	}
}

var _ = DescribeTable("the apiserver rejects an invalid write with its own message and leaves the lock unchanged",
	expectRejected,

	// spec
	Entry("spec: lease 0", invalidCase{write: create, raw: setSpec("leaseDurationSeconds", 0),
		want: "spec.leaseDurationSeconds: Invalid value: 0: spec.leaseDurationSeconds in body should be greater than or equal to 1"}),
	Entry("spec: lease 3601", invalidCase{write: create,
		mutate: func(l *locksv1.DistributedLock) {
			l.Spec.LeaseDurationSeconds = 3601
			l.Spec.MaxLeaseDurationSeconds = 3600
		},
		want: "spec.leaseDurationSeconds in body should be less than or equal to 3600",
		also: []string{"spec.leaseDurationSeconds: Invalid value: spec.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"}}),
	Entry("spec: max lease 3601", invalidCase{write: create,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.MaxLeaseDurationSeconds = 3601 },
		want:   "spec.maxLeaseDurationSeconds in body should be less than or equal to 3600"}),
	Entry("spec: lease above max lease", invalidCase{write: create,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.LeaseDurationSeconds = 301 },
		want:   "spec.leaseDurationSeconds: Invalid value: spec.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"}),
	Entry("spec: negative maxWaiters", invalidCase{write: create,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](-1) },
		want:   "spec.maxWaiters in body should be greater than or equal to 0"}),
	Entry("spec: maxWaiters above the hard cap", invalidCase{write: create,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](locksv1.MaxWaitersLimit + 1) },
		want:   "spec.maxWaiters in body should be less than or equal to 128"}),
	Entry("spec: handoff timeout 0", invalidCase{write: create, raw: setSpec("handoffTimeoutSeconds", 0),
		want: "spec.handoffTimeoutSeconds in body should be greater than or equal to 1"}),
	Entry("spec: maxWaitersPerUser above the hard cap", invalidCase{write: create, raw: setSpec("maxWaitersPerUser", locksv1.MaxWaitersLimit+1),
		want: "spec.maxWaitersPerUser in body should be less than or equal to 128"}),
	Entry("spec: negative maxWaitersPerUser", invalidCase{write: create, raw: setSpec("maxWaitersPerUser", -1),
		want: "spec.maxWaitersPerUser in body should be greater than or equal to 0"}),
	Entry("spec: maxWaitSeconds 0", invalidCase{write: create, raw: setSpec("maxWaitSeconds", 0),
		want: "spec.maxWaitSeconds in body should be greater than or equal to 1"}),
	Entry("spec: maxWaitSeconds above a day", invalidCase{write: create, raw: setSpec("maxWaitSeconds", 86401),
		want: "spec.maxWaitSeconds in body should be less than or equal to 86400"}),
	Entry("spec update: lease above max lease", invalidCase{setup: fresh, write: update,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.MaxLeaseDurationSeconds = 20 },
		want:   "spec.leaseDurationSeconds: Invalid value: spec.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"}),
	Entry("spec update: maxWaiters below the current queue", invalidCase{setup: heldWithWaiters, write: update,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](2) },
		want:   "status.waiters: Invalid value: the wait queue must not be longer than spec.maxWaiters"}),
	Entry("spec update: max lease below the holder's lease", invalidCase{setup: held, write: update,
		mutate: func(l *locksv1.DistributedLock) {
			l.Spec.LeaseDurationSeconds = 10
			l.Spec.MaxLeaseDurationSeconds = 20
		},
		want: "status.holder.leaseDurationSeconds: Invalid value: holder.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"}),

	// status: tokens and counters
	Entry("status: token decreases", invalidCase{setup: held, write: status,
		mutate: func(l *locksv1.DistributedLock) { l.Status.FencingToken = 1 },
		want:   "status.fencingToken: Invalid value: 1: fencingToken must not decrease"}),
	Entry("status: negative token", invalidCase{setup: fresh, write: status,
		mutate: func(l *locksv1.DistributedLock) { l.Status.FencingToken = -1 },
		want:   "status.fencingToken: Invalid value: -1: fencingToken in body should be greater than or equal to 0",
		// Even a never-written status defaults to token 0, so -1 is also a decrease.
		also: []string{"status.fencingToken: Invalid value: -1: fencingToken must not decrease"}}),

	// status: the holder
	Entry("status: holder lease above spec.maxLeaseDurationSeconds", invalidCase{setup: released, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			token, _ := locksv1.NextFencingToken(l.ResourceVersion)
			h := holder("bob", 2)
			h.LeaseDurationSeconds = 301
			l.Acquire(h, token)
		},
		want: "status.holder.leaseDurationSeconds: Invalid value: holder.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"}),
	Entry("status: holder identity too long", invalidCase{setup: released, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			token, _ := locksv1.NextFencingToken(l.ResourceVersion)
			h := holder("bob", 2)
			h.Identity = long(254)
			l.Acquire(h, token)
		},
		want: "status.holder.identity: Too long: may not be more than 253 bytes"}),
	Entry("status: holder leaseID too short", invalidCase{setup: released, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			token, _ := locksv1.NextFencingToken(l.ResourceVersion)
			h := holder("bob", 2)
			h.LeaseID = "short"
			l.Acquire(h, token)
		},
		want: `status.holder.leaseID: Invalid value: "short": holder.leaseID in body should be at least 16 chars long`}),

	// Pod fields reach the controller's read of the pod: a pod's name and UID only.
	Entry("status: holder podName that is no pod's name", invalidCase{setup: released, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			token, _ := locksv1.NextFencingToken(l.ResourceVersion)
			h := holder("bob", 2)
			h.PodName = "../../../../../version"
			l.Acquire(h, token)
		},
		want: `status.holder.podName: Invalid value: "../../../../../version": holder.podName in body should match '` + locksv1.PodNamePattern + "'"}),
	Entry("status: waiter podUID that is no pod's UID", invalidCase{setup: held, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			w := waiter("bob", 2)
			w.PodName, w.PodUID = "worker-7d9f", "0B7E4B6C-6F3A-4D5E-9C1A-2F0E8D7C6B5A"
			l.Status.AppendWaiter(w)
		},
		want: `status.waiters[0].podUID: Invalid value: "0B7E4B6C-6F3A-4D5E-9C1A-2F0E8D7C6B5A": waiters[0].podUID in body should match '` + locksv1.PodUIDPattern + "'"}),

	// status: the queue
	Entry("status: waiterCount does not match the queue", invalidCase{setup: heldWithWaiters, write: status,
		mutate: func(l *locksv1.DistributedLock) { l.Status.WaiterCount-- },
		want:   "status: Invalid value: waiterCount must equal the number of waiters"}),
	Entry("status: queue longer than spec.maxWaiters", invalidCase{setup: heldWithWaiters, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			l.Status.AppendWaiter(waiter("carol", 5))
			l.Status.AppendWaiter(waiter("carol", 6))
		},
		want: "status.waiters: Invalid value: the wait queue must not be longer than spec.maxWaiters"}),
	Entry("status: a queue grown past its cap of 128", invalidCase{setup: free, write: status,
		prepare: func(l *locksv1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](locksv1.MaxWaitersLimit) },
		mutate:  queueOf(locksv1.MaxWaitersLimit + 1),
		want:    "status.waiters must not grow beyond 128 entries: a lock is one etcd value, and etcd refuses one over 1.5 MiB",
		also:    []string{"status.waiters: Invalid value: the wait queue must not be longer than spec.maxWaiters"}}),
	Entry("status: a queue over the schema's bound of 1024", invalidCase{setup: free, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			queueOf(locksv1.StoredListLimit + 1)(l)
			l.Status.WaiterCount = locksv1.StoredListLimit
		},
		want: "status.waiters: Too many: 1025: must have at most 1024 items"}),
	Entry("status: a requestID queued twice", invalidCase{setup: heldWithWaiters, write: status,
		mutate: func(l *locksv1.DistributedLock) { l.Status.AppendWaiter(waiter("bob", 2)) },
		want:   `status.waiters[3]: Duplicate value: {"requestID":"req-2"}`}),

	// status: finished holdings
	Entry("status: more than 8 finished holdings", invalidCase{setup: released, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			for len(l.Status.RecentAcquisitions) <= locksv1.MaxRecentAcquisitions {
				l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, l.Status.RecentAcquisitions[0])
			}
		},
		want: "status.recentAcquisitions: Too many: 9: must have at most 8 items"}),
	Entry("status: a condition's message of 257 characters", invalidCase{setup: released, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			l.Status.Conditions[0].Message = strings.Repeat("m", locksv1.MaxConditionMessage+1)
		},
		want: "a condition's message is at most 256 characters"}),
	Entry("status: unknown endReason", invalidCase{setup: released, write: status,
		mutate: func(l *locksv1.DistributedLock) { l.Status.RecentAcquisitions[0].EndReason = "Vanished" },
		want:   `status.recentAcquisitions[0].endReason: Unsupported value: "Vanished": supported values: "Released", "Expired", "ForceReleased"`}),
	Entry("status: endedBy too long", invalidCase{setup: released, write: status,
		mutate: func(l *locksv1.DistributedLock) { l.Status.RecentAcquisitions[0].EndedBy = long(513) },
		want:   "status.recentAcquisitions[0].endedBy: Too long: may not be more than 512 bytes"}),

	// status: the whole object
	// Removing status defaults it back to an empty one, whose token 0 is a
	// decrease (admission refuses the rest of such a reset).
	Entry("status: status removed", invalidCase{setup: held, write: status,
		raw:  func(u map[string]any) { delete(u, "status") },
		want: "status.fencingToken: Invalid value: 0: fencingToken must not decrease"}),
)

// movedCase is a status write the CRD refused until its transition rules moved
// to admission (docs/design.md, "The CRD's rules"). With no admission engine
// the apiserver now stores it; rule names the admission rule that refuses it
// in both engines (test/admission, "rules the CRD left to admission").
type movedCase struct {
	prepare func(l *locksv1.DistributedLock)
	setup   func(ctx context.Context, l *locksv1.DistributedLock)
	mutate  func(l *locksv1.DistributedLock)
	rule    string
}

var _ = DescribeTable("the CRD leaves transition rules to admission: with no admission engine the apiserver stores these writes",
	expectStoredWithoutAdmission,

	Entry("status: token grows while the same holder holds", movedCase{setup: held, rule: "fencing-token",
		mutate: func(l *locksv1.DistributedLock) { l.Status.FencingToken++ }}),
	Entry("status: token grows while the lock is free", movedCase{setup: released, rule: "fencing-token",
		mutate: func(l *locksv1.DistributedLock) { l.Status.FencingToken += 10 }}),
	Entry("status: acquisition keeps the old token", movedCase{setup: released, rule: "fencing-token",
		mutate: func(l *locksv1.DistributedLock) {
			token := l.Status.FencingToken
			l.Acquire(holder("bob", 2), token)
		}}),
	Entry("status: transitions grow by two on an acquisition", movedCase{setup: released, rule: "bookkeeping",
		mutate: func(l *locksv1.DistributedLock) {
			token, _ := locksv1.NextFencingToken(l.ResourceVersion)
			l.Acquire(holder("bob", 2), token)
			l.Status.Transitions++
		}}),
	Entry("status: transitions change without an acquisition", movedCase{setup: held, rule: "bookkeeping",
		mutate: func(l *locksv1.DistributedLock) { l.Status.Transitions++ }}),
	Entry("status: holder replaced by a different leaseID", movedCase{setup: held, rule: "holder-only",
		mutate: func(l *locksv1.DistributedLock) {
			l.Status.Holder.LeaseID = "lease-ffffffffffffffff"
		}}),
	Entry("status: holder swapped for a new leaseID in one write, the old holding recorded", movedCase{setup: held, rule: "holder-only",
		mutate: func(l *locksv1.DistributedLock) {
			old := *l.Status.Holder
			l.EndHolding(locksv1.EndReasonReleased, "alice", micro())
			old.LeaseID = "lease-eeeeeeeeeeeeeeee"
			l.Status.Holder = &old
			l.Status.HolderCount = 1
		}}),
	Entry("status: holder.user changes", movedCase{setup: held, rule: "holder-fields",
		mutate: func(l *locksv1.DistributedLock) { l.Status.Holder.User = "mallory" }}),
	Entry("status: holder.identity changes", movedCase{setup: held, rule: "holder-fields",
		mutate: func(l *locksv1.DistributedLock) { l.Status.Holder.Identity = "someone-else" }}),
	Entry("status: holder.requestID changes", movedCase{setup: held, rule: "holder-fields",
		mutate: func(l *locksv1.DistributedLock) { l.Status.Holder.RequestID = "req-other" }}),
	Entry("status: holder.session changes", movedCase{rule: "holder-fields",
		setup: func(ctx context.Context, l *locksv1.DistributedLock) {
			free(ctx, l)
			h := holder("alice", 1)
			h.Session = "session-a"
			acquire(ctx, env.Client, l, h)
		},
		mutate: func(l *locksv1.DistributedLock) { l.Status.Holder.Session = "session-b" }}),
	Entry("status: holder removed without recording it", movedCase{setup: held, rule: "end-record",
		mutate: func(l *locksv1.DistributedLock) { l.Status.Holder, l.Status.HolderCount = nil, 0 }}),
)

// expectStoredWithoutAdmission makes the write c describes and expects the
// apiserver to store it: this suite runs no admission engine.
func expectStoredWithoutAdmission(ctx SpecContext, c movedCase) {
	Expect(c.rule).NotTo(BeEmpty(), "name the admission rule that refuses the write")
	l := newLock()
	if c.prepare != nil {
		c.prepare(l)
	}
	Expect(env.Client.Create(ctx, l)).To(Succeed())
	c.setup(ctx, l)
	before := l.ResourceVersion
	c.mutate(l)
	// What the client sends: the JSON round trip drops condition times' fractions.
	b, err := json.Marshal(l.Status)
	Expect(err).NotTo(HaveOccurred())
	var sent locksv1.DistributedLockStatus
	Expect(json.Unmarshal(b, &sent)).To(Succeed())
	Expect(env.Client.Status().Update(ctx, l)).To(Succeed(), "the CRD alone refuses it; admission rule %s should", c.rule)
	Expect(l.ResourceVersion).NotTo(Equal(before))
	Expect(cmp.Diff(sent, l.Status)).To(BeEmpty(), "stored status (-sent +stored)")
}

// expectRejected makes the write c describes and expects the apiserver's own
// rejection, with the stored lock unchanged.
func expectRejected(ctx SpecContext, c invalidCase) {
	l := newLock()
	if c.prepare != nil {
		c.prepare(l)
	}
	if c.write != create {
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		c.setup(ctx, l)
	}
	before, beforeErr := stored(ctx, l.Name)

	if c.mutate != nil {
		c.mutate(l)
	}
	u, err := toUnstructured(l)
	Expect(err).NotTo(HaveOccurred())
	if c.raw != nil {
		c.raw(u.Object)
	}
	switch c.write {
	case create:
		err = env.Client.Create(ctx, u)
	case update:
		err = env.Client.Update(ctx, u)
	case status:
		err = env.Client.Status().Update(ctx, u)
	}
	Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
	GinkgoWriter.Println("rejected:", err)
	Expect(err.Error()).To(ContainSubstring(c.want))
	Expect(causes(err)).To(HaveLen(1+len(c.also)), "want only the rule under test to fail")
	for _, m := range c.also {
		Expect(err.Error()).To(ContainSubstring(m))
	}

	after, afterErr := stored(ctx, l.Name)
	if c.write == create {
		Expect(apierrors.IsNotFound(afterErr)).To(BeTrue(), "want no object, got %v %s", afterErr, after)
		return
	}
	Expect(beforeErr).NotTo(HaveOccurred())
	Expect(afterErr).NotTo(HaveOccurred())
	Expect(after).To(Equal(before), "the stored object changed")
}

func defaultSpec() locksv1.DistributedLockSpec {
	return locksv1.DistributedLockSpec{
		Type:                    locksv1.Mutex,
		LeaseDurationSeconds:    locksv1.DefaultLeaseDurationSeconds,
		MaxLeaseDurationSeconds: locksv1.DefaultMaxLeaseDurationSeconds,
		MaxWaiters:              ptr.To[int32](locksv1.DefaultMaxWaiters),
		HandoffTimeoutSeconds:   locksv1.DefaultHandoffTimeoutSeconds,
		MaxWaitersPerUser:       ptr.To[int32](locksv1.DefaultMaxWaitersPerUser),
		MaxWaitSeconds:          locksv1.DefaultMaxWaitSeconds,
	}
}

// setStatus sets one nested status string of the unstructured lock.
func setStatus(v string, path ...string) func(map[string]any) {
	return func(u map[string]any) {
		Expect(setNested(u, v, append([]string{"status"}, path...)...)).To(Succeed())
	}
}

// setNested sets a string at path, where a numeric element indexes a list.
func setNested(u map[string]any, v string, path ...string) error {
	var cur any = u
	for i, p := range path {
		last := i == len(path)-1
		switch c := cur.(type) {
		case map[string]any:
			if last {
				c[p] = v
				return nil
			}
			cur = c[p]
		case []any:
			n, err := strconv.Atoi(p)
			if err != nil || n >= len(c) {
				return fmt.Errorf("no element %s", p)
			}
			cur = c[n]
		default:
			return fmt.Errorf("cannot descend into %T at %s", cur, p)
		}
	}
	return nil
}

// The CRD's patterns refuse every time string Go's metav1 types cannot read
// back, and identities with control or format characters, before either
// admission engine runs: times Go cannot parse, and control characters in names.
var _ = DescribeTable("the apiserver refuses a status string Go cannot read, and keeps the lock unchanged",
	func(ctx SpecContext, value string, path ...string) {
		l := newLock()
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		heldWithWaiters(ctx, l)
		before, err := stored(ctx, l.Name)
		Expect(err).NotTo(HaveOccurred())
		u, err := toUnstructured(l)
		Expect(err).NotTo(HaveOccurred())
		setStatus(value, path...)(u.Object)
		err = env.Client.Status().Update(ctx, u)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
		field := "status"
		for _, p := range path {
			if _, nerr := strconv.Atoi(p); nerr == nil {
				field += "[" + p + "]"
			} else {
				field += "." + p
			}
		}
		Expect(err.Error()).To(ContainSubstring(field + ": Invalid value: "))
		Expect(err.Error()).To(ContainSubstring(strings.TrimPrefix(field, "status.") + " in body should match"))
		after, err := stored(ctx, l.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(after).To(Equal(before), "the stored object changed")
	},
	Entry("a lower-case t", "2026-11-29t09:00:00.000000Z", "waiters", "0", "enqueueTime"),
	Entry("a lower-case z", "2026-11-29T09:00:00.000000z", "waiters", "0", "deadline"),
	Entry("no microseconds", "2026-11-29T09:00:00Z", "waiters", "0", "enqueueTime"),
	Entry("nanoseconds", "2026-11-29T09:00:00.000000001Z", "holder", "acquireTime"),
	Entry("a leap second", "2026-12-31T23:59:60.000000Z", "holder", "renewTime"),
	Entry("local time without a zone", "2026-11-29T09:00:00.000000", "waiters", "1", "deadline"),
	Entry("year 0 that Go writes back as year -1", "0000-01-01T00:30:00.000000+01:00", "holder", "renewTime"),
	Entry("Go's zero time, which Go writes back as null", "0001-01-01T00:00:00.000000Z", "waiters", "1", "enqueueTime"),
	Entry("year 9999 that Go writes back as year 10000", "9999-12-31T23:30:00.000000-01:00", "waiters", "0", "deadline"),
	Entry("an identity with a terminal escape", "worker-\x1b[2J", "waiters", "0", "identity"),
	Entry("an identity with a newline", "worker\nroot", "waiters", "1", "identity"),
	Entry("an identity with a right-to-left override", "worker-\u202egnp.exe", "waiters", "0", "identity"),
	Entry("an identity with a zero-width space", "work\u200ber", "holder", "identity"),
)
