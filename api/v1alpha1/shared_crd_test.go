package v1alpha1_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	locksv1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Lock types for the shared-mode cases (RWMutex and Semaphore).
func rwMutex(l *locksv1.DistributedLock) { l.Spec.Type = locksv1.RWMutex }

func semaphore(permits int32) func(*locksv1.DistributedLock) {
	return func(l *locksv1.DistributedLock) {
		l.Spec.Type, l.Spec.Permits = locksv1.Semaphore, ptr.To(permits)
	}
}

// acquireShared adds h on slot with the token the design prescribes and writes it.
func acquireShared(ctx context.Context, l *locksv1.DistributedLock, h locksv1.LockHolder, slot int32) {
	token, err := locksv1.NextFencingToken(l.ResourceVersion)
	Expect(err).NotTo(HaveOccurred())
	l.AcquireShared(h, slot, token)
	Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
}

// Starting states of shared locks: readers (or permits) 1 and 2 on slots 0 and 1.
var (
	reading = func(ctx context.Context, l *locksv1.DistributedLock) {
		free(ctx, l)
		acquireShared(ctx, l, holder("alice", 1), 0)
		acquireShared(ctx, l, holder("bob", 2), 1)
	}
	writing = func(ctx context.Context, l *locksv1.DistributedLock) {
		free(ctx, l)
		acquire(ctx, env.Client, l, holder("alice", 1))
	}
)

// addShared is mutate for one more shared holding (user's holding n on slot)
// with the next token, counted once, as a valid acquisition would be.
func addShared(user string, n int, slot int32) func(*locksv1.DistributedLock) {
	return func(l *locksv1.DistributedLock) {
		token, err := locksv1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		l.AcquireShared(holder(user, n), slot, token)
	}
}

// The CRD keeps the shared-mode invariants that must hold with admission off.
var _ = DescribeTable("the apiserver rejects an invalid shared-mode write with its own message and leaves the lock unchanged",
	expectRejected,

	// spec: type and permits
	Entry("spec: a Semaphore without permits", invalidCase{write: create, prepare: func(l *locksv1.DistributedLock) { l.Spec.Type = locksv1.Semaphore },
		want: "spec.permits: Invalid value: spec.permits is required for a Semaphore and allowed only for it"}),
	Entry("spec: permits on a Mutex", invalidCase{write: create, prepare: func(l *locksv1.DistributedLock) { l.Spec.Permits = ptr.To[int32](3) },
		want: "spec.permits: Invalid value: spec.permits is required for a Semaphore and allowed only for it"}),
	Entry("spec: permits on an RWMutex", invalidCase{write: create, prepare: func(l *locksv1.DistributedLock) {
		rwMutex(l)
		l.Spec.Permits = ptr.To[int32](3)
	}, want: "spec.permits: Invalid value: spec.permits is required for a Semaphore and allowed only for it"}),
	Entry("spec: zero permits", invalidCase{write: create, prepare: semaphore(0),
		want: "spec.permits in body should be greater than or equal to 1"}),
	Entry("spec: 65 permits", invalidCase{write: create, prepare: semaphore(locksv1.MaxSharedHolders + 1),
		want: "spec.permits in body should be less than or equal to 64"}),
	Entry("status: 65 readers", invalidCase{prepare: rwMutex, setup: free, write: status, mutate: readers(locksv1.MaxSharedHolders + 1),
		want: "status.sharedHolders must not grow beyond 64 entries: a lock is one etcd value, and etcd refuses one over 1.5 MiB"}),
	Entry("spec: an unknown type", invalidCase{write: create, prepare: func(l *locksv1.DistributedLock) { l.Spec.Type = "Spinlock" },
		want: `spec.type: Unsupported value: "Spinlock": supported values: "Mutex", "RWMutex", "Semaphore"`}),
	Entry("spec update: a Mutex turned into an RWMutex", invalidCase{setup: fresh, write: update, mutate: rwMutex,
		want: "spec.type: Invalid value: \"RWMutex\": spec.type is immutable; create a new lock instead"}),
	Entry("spec update: a Semaphore turned into a Mutex", invalidCase{prepare: semaphore(3), setup: fresh, write: update,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.Type, l.Spec.Permits = locksv1.Mutex, nil },
		want:   "spec.type is immutable; create a new lock instead"}),
	Entry("spec update: permits shrink", invalidCase{prepare: semaphore(3), setup: fresh, write: update,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.Permits = ptr.To[int32](2) },
		want:   "spec.permits: Invalid value: 2: spec.permits may grow but never shrink"}),
	Entry("spec update: permits removed from a Semaphore", invalidCase{prepare: semaphore(3), setup: fresh, write: update,
		mutate: func(l *locksv1.DistributedLock) { l.Spec.Permits = nil },
		want:   "spec.permits: Invalid value: spec.permits is required for a Semaphore and allowed only for it"}),

	// status: holdings fit the type
	Entry("status: a Mutex with a shared holder", invalidCase{setup: free, write: status, mutate: addShared("bob", 2, 0),
		want: "status.sharedHolders: Invalid value: a Mutex has no shared holders"}),
	Entry("status: an RWMutex with a writer and a reader", invalidCase{prepare: rwMutex, setup: writing, write: status, mutate: addShared("bob", 2, 0),
		want: "status.holder: Invalid value: an RWMutex has a writer or readers, never both"}),
	Entry("status: an RWMutex with readers and a writer", invalidCase{prepare: rwMutex, setup: reading, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			token, _ := locksv1.NextFencingToken(l.ResourceVersion)
			l.Acquire(holder("carol", 3), token)
		},
		want: "status.holder: Invalid value: an RWMutex has a writer or readers, never both"}),
	Entry("status: a Semaphore with an exclusive holder", invalidCase{prepare: semaphore(3), setup: free, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			token, _ := locksv1.NextFencingToken(l.ResourceVersion)
			l.Acquire(holder("carol", 3), token)
		},
		want: "status.holder: Invalid value: a Semaphore has no exclusive holder; its permits are shared holdings"}),
	Entry("status: a Semaphore over its permits", invalidCase{prepare: semaphore(2), setup: reading, write: status, mutate: addShared("carol", 3, 2),
		want: "status.sharedHolders: Invalid value: a Semaphore has at most spec.permits holders, on slots in [0, permits)"}),
	Entry("status: a Semaphore slot out of range", invalidCase{prepare: semaphore(3), setup: free, write: status, mutate: addShared("carol", 3, 5),
		want: "status.sharedHolders: Invalid value: a Semaphore has at most spec.permits holders, on slots in [0, permits)"}),
	Entry("status: a reader's slot 1024", invalidCase{prepare: rwMutex, setup: free, write: status, mutate: addShared("carol", 3, 1024),
		want: "status.sharedHolders[0].slot: Invalid value: 1024: sharedHolders[0].slot in body should be less than or equal to 1023"}),
	Entry("status: a negative slot", invalidCase{prepare: rwMutex, setup: free, write: status, mutate: addShared("carol", 3, -1),
		want: "status.sharedHolders[0].slot: Invalid value: -1: sharedHolders[0].slot in body should be greater than or equal to 0"}),
	Entry("status: two shared holdings on one slot", invalidCase{prepare: semaphore(3), setup: reading, write: status, mutate: addShared("carol", 3, 1),
		want: `status.sharedHolders[2]: Duplicate value: {"slot":1}`}),
	Entry("status: a Shared waiter on a Mutex", invalidCase{setup: held, write: status, mutate: func(l *locksv1.DistributedLock) {
		w := waiter("bob", 2)
		w.Mode = locksv1.Shared
		l.Status.AppendWaiter(w)
	}, want: "status.waiters: Invalid value: a Mutex's waiters are Exclusive and a Semaphore's are Shared"}),
	Entry("status: an Exclusive waiter on a Semaphore", invalidCase{prepare: semaphore(2), setup: reading, write: status, mutate: func(l *locksv1.DistributedLock) {
		l.Status.AppendWaiter(waiter("carol", 3))
	}, want: "status.waiters: Invalid value: a Mutex's waiters are Exclusive and a Semaphore's are Shared"}),
	Entry("status: a waiter of an unknown mode", invalidCase{prepare: rwMutex, setup: reading, write: status, mutate: func(l *locksv1.DistributedLock) {
		w := waiter("carol", 3)
		w.Mode = "Upgradable"
		l.Status.AppendWaiter(w)
	}, want: `status.waiters[0].mode: Unsupported value: "Upgradable": supported values: "Exclusive", "Shared"`}),
	Entry("status: a shared lease above spec.maxLeaseDurationSeconds", invalidCase{prepare: rwMutex, setup: free, write: status,
		mutate: func(l *locksv1.DistributedLock) {
			addShared("carol", 3, 0)(l)
			l.Status.SharedHolders[0].LeaseDurationSeconds = 301
		},
		want: "status.sharedHolders: Invalid value: a shared holding's leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"}),
	Entry("status: a record's slot 1024", invalidCase{prepare: rwMutex, setup: reading, write: status, mutate: func(l *locksv1.DistributedLock) {
		l.EndShared("lease-0000000000000002", locksv1.EndReasonReleased, "bob", micro())
		l.Status.RecentAcquisitions[0].Slot = ptr.To[int32](1024)
	}, want: "status.recentAcquisitions[0].slot: Invalid value: 1024: recentAcquisitions[0].slot in body should be less than or equal to 1023"}),

	// status: holderCount
	Entry("status: a new reader not counted", invalidCase{prepare: rwMutex, setup: reading, write: status, mutate: func(l *locksv1.DistributedLock) {
		addShared("carol", 3, 2)(l)
		l.Status.HolderCount--
	}, want: "status: Invalid value: holderCount must equal the number of holdings, exclusive and shared"}),
	Entry("status: a released reader still counted", invalidCase{prepare: rwMutex, setup: reading, write: status, mutate: func(l *locksv1.DistributedLock) {
		l.EndShared("lease-0000000000000002", locksv1.EndReasonReleased, "bob", micro())
		l.Status.HolderCount++
	}, want: "status: Invalid value: holderCount must equal the number of holdings, exclusive and shared"}),
)

// The shared-mode transition rules the CRD left to admission (see movedCase).
var _ = DescribeTable("the CRD leaves shared-mode transition rules to admission: with no admission engine the apiserver stores these writes",
	expectStoredWithoutAdmission,

	Entry("status: a shared holding's token above status.fencingToken", movedCase{prepare: rwMutex, setup: reading, rule: "fencing-token",
		mutate: func(l *locksv1.DistributedLock) {
			addShared("carol", 3, 2)(l)
			l.Status.SharedHolders[2].FencingToken = l.Status.FencingToken + 1
		}}),
	Entry("status: status.fencingToken raised past the new reader's token", movedCase{prepare: rwMutex, setup: reading, rule: "fencing-token",
		mutate: func(l *locksv1.DistributedLock) {
			addShared("carol", 3, 2)(l)
			l.Status.FencingToken++
		}}),
	Entry("status: a reader's token changes", movedCase{prepare: rwMutex, setup: reading, rule: "slot",
		mutate: func(l *locksv1.DistributedLock) { l.Status.SharedHolders[0].FencingToken++ }}),
	Entry("status: a new reader not counted in transitions", movedCase{prepare: rwMutex, setup: reading, rule: "bookkeeping",
		mutate: func(l *locksv1.DistributedLock) {
			addShared("carol", 3, 2)(l)
			l.Status.Transitions--
		}}),
	Entry("status: a reader added with an old token", movedCase{prepare: rwMutex, setup: reading, rule: "fencing-token",
		mutate: func(l *locksv1.DistributedLock) {
			token := l.Status.FencingToken
			addShared("carol", 3, 2)(l)
			l.Status.SharedHolders[2].FencingToken, l.Status.FencingToken = token, token
		}}),
	Entry("status: a reader's slot passed to another leaseID", movedCase{prepare: rwMutex, setup: reading, rule: "holder-only",
		mutate: func(l *locksv1.DistributedLock) { l.Status.SharedHolders[1].LeaseID = "lease-ffffffffffffffff" }}),
	Entry("status: a reader's user changes", movedCase{prepare: rwMutex, setup: reading, rule: "holder-fields",
		mutate: func(l *locksv1.DistributedLock) { l.Status.SharedHolders[1].User = "mallory" }}),
)

var _ = Describe("the DistributedLock CRD with shared modes", func() {
	It("accepts the shared protocol's valid transitions: readers, a writer after them, permits that grow", func(ctx SpecContext) {
		l := newLock()
		rwMutex(l)
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		reading(ctx, l)
		Expect(l.Status.HolderCount).To(Equal(int32(2)))
		now := micro()
		l.Status.SharedHolders[0].RenewTime = &now
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
		Expect(l.EndShared("lease-0000000000000001", locksv1.EndReasonReleased, "alice", micro())).To(BeTrue())
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
		Expect(l.EndShared("lease-0000000000000002", locksv1.EndReasonReleased, "bob", micro())).To(BeTrue())
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
		acquire(ctx, env.Client, l, holder("carol", 3))
		Expect(l.Status.Transitions).To(Equal(int64(3)))
		Expect(l.Status.HolderCount).To(Equal(int32(1)))
		Expect(*l.Status.RecentAcquisitions[0].Slot).To(Equal(int32(0)))

		s := newLock()
		semaphore(2)(s)
		Expect(env.Client.Create(ctx, s)).To(Succeed())
		reading(ctx, s)
		s.Spec.Permits = ptr.To[int32](3)
		Expect(env.Client.Update(ctx, s)).To(Succeed(), "permits may grow")
		acquireShared(ctx, s, holder("carol", 3), 2)
		Expect(s.Status.SharedHolders).To(HaveLen(3))
		w := waiter("dave", 4)
		w.Mode = locksv1.Shared
		s.Status.AppendWaiter(w)
		Expect(env.Client.Status().Update(ctx, s)).To(Succeed())
	})

	It("defaults a waiter's mode to Exclusive and the type to Mutex", func(ctx SpecContext) {
		l := newLock()
		l.Spec.Type = ""
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		Expect(l.Spec.Type).To(Equal(locksv1.Mutex))
		u, err := toUnstructured(l)
		Expect(err).NotTo(HaveOccurred())
		w := map[string]any{"identity": "w", "user": "bob", "requestID": "req-9",
			"enqueueTime": "2026-11-29T09:00:00.000000Z", "deadline": "2026-11-29T09:01:00.000000Z"}
		Expect(unstructured.SetNestedSlice(u.Object, []any{w}, "status", "waiters")).To(Succeed())
		Expect(unstructured.SetNestedField(u.Object, int64(1), "status", "waiterCount")).To(Succeed())
		Expect(env.Client.Status().Update(ctx, u)).To(Succeed())
		got, err := stored(ctx, l.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(ContainSubstring(`"mode":"Exclusive"`))
	})
})
