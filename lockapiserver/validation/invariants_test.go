package validation

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

var at = time.Date(2026, 1, 2, 15, 4, 5, 123456000, time.UTC)

func micro(t time.Time) metav1.MicroTime { return metav1.NewMicroTime(t) }

func holder(n int) locksv1alpha1.LockHolder {
	return locksv1alpha1.LockHolder{
		Identity: fmt.Sprintf("worker-%d", n), User: "system:serviceaccount:shop:worker",
		LeaseID: fmt.Sprintf("lease-%011d", n), RequestID: fmt.Sprintf("req-%d", n), LeaseDurationSeconds: 30,
		PodName: "worker-7d9f", PodUID: "0b7e4b6c-6f3a-4d5e-9c1a-2f0e8d7c6b5a", AcquireTime: micro(at), RenewTime: ptr.To(micro(at.Add(time.Second))),
	}
}

func waiter(n int, mode locksv1alpha1.Mode) locksv1alpha1.Waiter {
	return locksv1alpha1.Waiter{Identity: fmt.Sprintf("waiter-%d", n), User: "alice", RequestID: fmt.Sprintf("wait-%d", n),
		EnqueueTime: micro(at), Deadline: micro(at.Add(time.Minute)), Mode: mode}
}

func finished(n int) locksv1alpha1.FinishedHolding {
	return locksv1alpha1.FinishedHolding{RequestID: fmt.Sprintf("old-%d", n), LeaseID: fmt.Sprintf("old-lease-%d", n), FencingToken: int64(n + 1),
		Identity: "worker-0", EndTime: micro(at), EndReason: locksv1alpha1.EndReasonReleased, EndedBy: "alice"}
}

// busyMutex is a valid held Mutex with a full history, two waiters and its
// Held condition: what most mutations start from.
func busyMutex() *locksv1alpha1.DistributedLock {
	h := holder(1)
	l := &locksv1alpha1.DistributedLock{
		TypeMeta:   metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "DistributedLock"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", Generation: 1},
		Status: locksv1alpha1.DistributedLockStatus{
			Holder: &h, HolderCount: 1, FencingToken: 40, Transitions: 9,
			Waiters: []locksv1alpha1.Waiter{waiter(1, locksv1alpha1.Exclusive), waiter(2, locksv1alpha1.Exclusive)}, WaiterCount: 2,
			ObservedGeneration: 1,
			Conditions: []metav1.Condition{{Type: locksv1alpha1.ConditionHeld, Status: metav1.ConditionTrue, ObservedGeneration: 1,
				LastTransitionTime: metav1.NewTime(at.Truncate(time.Second)), Reason: locksv1alpha1.ReasonAcquired, Message: "held"}},
		},
	}
	for i := range locksv1alpha1.MaxRecentAcquisitions {
		l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, finished(i))
	}
	SetLockDefaults(l)
	return l
}

// sharedLock is a valid RWMutex or Semaphore with two shared holders.
func sharedLock(typ locksv1alpha1.LockType) *locksv1alpha1.DistributedLock {
	l := busyMutex()
	l.Spec.Type = typ
	if typ == locksv1alpha1.Semaphore {
		l.Spec.Permits = ptr.To[int32](3)
	}
	l.Status.Holder = nil
	for i := range 2 {
		l.Status.SharedHolders = append(l.Status.SharedHolders, locksv1alpha1.SharedHolder{LockHolder: holder(10 + i), FencingToken: int64(30 + i), Slot: int32(i)})
	}
	l.Status.HolderCount = 2
	for i := range l.Status.Waiters {
		l.Status.Waiters[i].Mode = locksv1alpha1.Shared
	}
	return l
}

type lockCase struct {
	name   string
	base   func() *locksv1alpha1.DistributedLock
	mutate func(l *locksv1alpha1.DistributedLock)
}

func onMutex(name string, mutate func(*locksv1alpha1.DistributedLock)) lockCase {
	return lockCase{name, busyMutex, mutate}
}

func on(typ locksv1alpha1.LockType, name string, mutate func(*locksv1alpha1.DistributedLock)) lockCase {
	return lockCase{string(typ) + ": " + name, func() *locksv1alpha1.DistributedLock { return sharedLock(typ) }, mutate}
}

var year = func(y int) metav1.MicroTime { return micro(time.Date(y, 6, 1, 0, 0, 0, 0, time.UTC)) }

// lockCases are valid objects and single steps off them, each field's
// bounds from both sides, and every rule.
var lockCases = []lockCase{
	onMutex("as it is", func(*locksv1alpha1.DistributedLock) {}),
	on(locksv1alpha1.RWMutex, "as it is", func(*locksv1alpha1.DistributedLock) {}),
	on(locksv1alpha1.Semaphore, "as it is", func(*locksv1alpha1.DistributedLock) {}),
	onMutex("free", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder, l.Status.HolderCount = nil, 0 }),
	// spec
	onMutex("type unknown", func(l *locksv1alpha1.DistributedLock) { l.Spec.Type = "Barrier" }),
	onMutex("permits on a Mutex", func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = ptr.To[int32](2) }),
	on(locksv1alpha1.Semaphore, "no permits", func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = nil }),
	on(locksv1alpha1.Semaphore, "64 permits", func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = ptr.To[int32](64) }),
	on(locksv1alpha1.Semaphore, "65 permits", func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = ptr.To[int32](65) }),
	on(locksv1alpha1.Semaphore, "0 permits", func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = ptr.To[int32](0) }),
	onMutex("lease above the maximum lease", func(l *locksv1alpha1.DistributedLock) { l.Spec.LeaseDurationSeconds = 301 }),
	onMutex("lease 0", func(l *locksv1alpha1.DistributedLock) { l.Spec.LeaseDurationSeconds = 0 }),
	onMutex("maximum lease 3600", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxLeaseDurationSeconds = 3600 }),
	onMutex("maximum lease 3601", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxLeaseDurationSeconds = 3601 }),
	onMutex("maxWaiters 0 with waiters", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](0) }),
	onMutex("maxWaiters 128", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](128) }),
	onMutex("maxWaiters 129", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](129) }),
	onMutex("maxWaitersPerUser 129", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaitersPerUser = ptr.To[int32](129) }),
	onMutex("maxWaiters -1", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](-1) }),
	onMutex("maxWaitersPerUser -1", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaitersPerUser = ptr.To[int32](-1) }),
	onMutex("handoffTimeout 3601", func(l *locksv1alpha1.DistributedLock) { l.Spec.HandoffTimeoutSeconds = 3601 }),
	onMutex("maxWaitSeconds 86400", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaitSeconds = 86400 }),
	onMutex("maxWaitSeconds 86401", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaitSeconds = 86401 }),
	// holder
	onMutex("identity empty", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Identity = "" }),
	onMutex("identity of 253 characters, more bytes", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Identity = strings.Repeat("é", 253) }),
	onMutex("identity of 254 characters", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Identity = strings.Repeat("a", 254) }),
	onMutex("identity with an escape", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Identity = "w\x1b[2J" }),
	onMutex("identity with a bidi override", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Identity = "w\u202e" }),
	onMutex("user of 513 characters", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.User = strings.Repeat("u", 513) }),
	onMutex("leaseID of 15 characters", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseID = strings.Repeat("a", 15) }),
	onMutex("leaseID of 64 characters", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseID = strings.Repeat("a", 64) }),
	onMutex("leaseID of 65 characters", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseID = strings.Repeat("a", 65) }),
	onMutex("leaseID with a dot", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseID = "lease.0000000000001" }),
	onMutex("requestID with a slash", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.RequestID = "req/1" }),
	onMutex("holder lease 0", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseDurationSeconds = 0 }),
	onMutex("holder lease above the lock's maximum", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseDurationSeconds = 301 }),
	onMutex("podUID of 65 characters", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.PodUID = strings.Repeat("0", 65) }),
	onMutex("session not a DNS name", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Session = "My_Session" }),
	onMutex("session a DNS name", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Session = "my-session.a" }),
	onMutex("acquireTime missing", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.AcquireTime = metav1.MicroTime{} }),
	onMutex("acquireTime in year 1", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.AcquireTime = year(1) }),
	onMutex("acquireTime in year 2", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.AcquireTime = year(2) }),
	onMutex("acquireTime in year 9998", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.AcquireTime = year(9998) }),
	onMutex("acquireTime in year 9999", func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.AcquireTime = year(9999) }),
	onMutex("acquireTime on 0001-12-31", func(l *locksv1alpha1.DistributedLock) {
		l.Status.Holder.AcquireTime = micro(time.Date(1, 12, 31, 23, 0, 0, 0, time.UTC))
	}),
	onMutex("renewTime on 9999-01-01", func(l *locksv1alpha1.DistributedLock) {
		l.Status.Holder.RenewTime = ptr.To(micro(time.Date(9999, 1, 1, 1, 0, 0, 0, time.UTC)))
	}),
	onMutex("renewTime on 9999-01-02", func(l *locksv1alpha1.DistributedLock) {
		l.Status.Holder.RenewTime = ptr.To(micro(time.Date(9999, 1, 2, 0, 0, 0, 0, time.UTC)))
	}),
	// counts and numbers
	onMutex("holderCount off", func(l *locksv1alpha1.DistributedLock) { l.Status.HolderCount = 2 }),
	onMutex("waiterCount off", func(l *locksv1alpha1.DistributedLock) { l.Status.WaiterCount = 1 }),
	onMutex("fencingToken -1", func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken = -1 }),
	onMutex("transitions -1", func(l *locksv1alpha1.DistributedLock) { l.Status.Transitions = -1 }),
	onMutex("observedGeneration -1", func(l *locksv1alpha1.DistributedLock) { l.Status.ObservedGeneration = -1 }),
	// shared holders
	onMutex("a shared holder on a Mutex", func(l *locksv1alpha1.DistributedLock) {
		l.Status.SharedHolders = []locksv1alpha1.SharedHolder{{LockHolder: holder(5), FencingToken: 1}}
		l.Status.HolderCount = 2
	}),
	on(locksv1alpha1.RWMutex, "a writer and readers", func(l *locksv1alpha1.DistributedLock) {
		h := holder(1)
		l.Status.Holder, l.Status.HolderCount = &h, 3
	}),
	on(locksv1alpha1.Semaphore, "an exclusive holder", func(l *locksv1alpha1.DistributedLock) {
		h := holder(1)
		l.Status.Holder, l.Status.SharedHolders, l.Status.HolderCount = &h, nil, 1
	}),
	on(locksv1alpha1.RWMutex, "two readers on one slot", func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].Slot = 0 }),
	on(locksv1alpha1.RWMutex, "slot 1023", func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].Slot = 1023 }),
	on(locksv1alpha1.RWMutex, "slot 1024", func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].Slot = 1024 }),
	on(locksv1alpha1.Semaphore, "a slot at permits", func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].Slot = 3 }),
	on(locksv1alpha1.Semaphore, "more holders than permits", func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = ptr.To[int32](1) }),
	on(locksv1alpha1.RWMutex, "a shared token of 0", func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[0].FencingToken = 0 }),
	on(locksv1alpha1.RWMutex, "a shared lease above the maximum", func(l *locksv1alpha1.DistributedLock) {
		l.Status.SharedHolders[0].LeaseDurationSeconds = 301
	}),
	on(locksv1alpha1.RWMutex, "64 readers", readers(64)),
	on(locksv1alpha1.RWMutex, "65 readers", readers(65)),
	on(locksv1alpha1.RWMutex, "1025 readers", readers(1025)),
	on(locksv1alpha1.RWMutex, "a reader with a bad identity", func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[0].Identity = "" }),
	// waiters
	onMutex("a Shared waiter on a Mutex", func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].Mode = locksv1alpha1.Shared }),
	on(locksv1alpha1.Semaphore, "an Exclusive waiter", func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].Mode = locksv1alpha1.Exclusive }),
	on(locksv1alpha1.RWMutex, "waiters of both modes", func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].Mode = locksv1alpha1.Exclusive }),
	onMutex("a waiter's mode unknown", func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].Mode = "Both" }),
	onMutex("two waiters with one requestID", func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[1].RequestID = "wait-1" }),
	onMutex("128 waiters", queue(128)),
	onMutex("129 waiters", queue(129)),
	onMutex("more waiters than maxWaiters", func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = ptr.To[int32](1) }),
	onMutex("a waiter without a deadline", func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].Deadline = metav1.MicroTime{} }),
	onMutex("a waiter's user empty", func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].User = "" }),
	onMutex("a waiter's podName with a tab", func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].PodName = "pod\t1" }),
	// history
	onMutex("nine finished holdings", func(l *locksv1alpha1.DistributedLock) {
		l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, finished(9))
	}),
	onMutex("an end reason unknown", func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions[0].EndReason = "Vanished" }),
	onMutex("endedBy empty", func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions[0].EndedBy = "" }),
	onMutex("a finished token of 0", func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions[0].FencingToken = 0 }),
	onMutex("a finished slot of 1024", func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions[0].Slot = ptr.To[int32](1024) }),
	onMutex("a message of 256 characters", func(l *locksv1alpha1.DistributedLock) {
		l.Status.RecentAcquisitions[0].Message = strings.Repeat("m", 256)
	}),
	onMutex("a message of 257 characters", func(l *locksv1alpha1.DistributedLock) {
		l.Status.RecentAcquisitions[0].Message = strings.Repeat("m", 257)
	}),
	onMutex("a finished requestID with a slash (no pattern)", func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions[0].RequestID = "a/b" }),
	// conditions
	onMutex("nine conditions", func(l *locksv1alpha1.DistributedLock) {
		for i := range 8 {
			c := l.Status.Conditions[0]
			c.Type = fmt.Sprintf("Other%d", i)
			l.Status.Conditions = append(l.Status.Conditions, c)
		}
	}),
	onMutex("two Held conditions", func(l *locksv1alpha1.DistributedLock) {
		l.Status.Conditions = append(l.Status.Conditions, l.Status.Conditions[0])
	}),
	onMutex("a condition type with a space", func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions[0].Type = "Is Held" }),
	onMutex("a prefixed condition type", func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions[0].Type = "locks.kubelock.io/Held" }),
	onMutex("a condition status Maybe", func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions[0].Status = "Maybe" }),
	onMutex("a condition without reason", func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions[0].Reason = "" }),
	onMutex("a condition reason with a dash", func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions[0].Reason = "Not-Held" }),
	onMutex("a condition without a time", func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions[0].LastTransitionTime = metav1.Time{} }),
	onMutex("a condition observedGeneration -1", func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions[0].ObservedGeneration = -1 }),
	onMutex("a condition message of 256 characters", func(l *locksv1alpha1.DistributedLock) {
		l.Status.Conditions[0].Message = strings.Repeat("m", 256)
	}),
	onMutex("a condition message of 257 characters", func(l *locksv1alpha1.DistributedLock) {
		l.Status.Conditions[0].Message = strings.Repeat("m", 257)
	}),
	onMutex("a condition message of 32769 characters", func(l *locksv1alpha1.DistributedLock) {
		l.Status.Conditions[0].Message = strings.Repeat("m", 32769)
	}),
}

func TestInvariantsAgreeWithTheCRD(t *testing.T) {
	c := loadCRD(t, "distributedlocks")
	valid := 0
	for _, tc := range lockCases {
		l := tc.base()
		tc.mutate(l)
		goErrs := ValidateLock(l)
		agree(t, tc.name, goErrs, c.validate(asJSON(t, l), nil))
		if len(goErrs) == 0 {
			valid++
		}
	}
	// Both sides of the bounds: a table that only refuses proves little.
	if valid < 15 || len(lockCases)-valid < 40 {
		t.Errorf("%d valid and %d invalid cases; the table lost its balance", valid, len(lockCases)-valid)
	}
}

func TestTransitionRulesAgreeWithTheCRD(t *testing.T) {
	c := loadCRD(t, "distributedlocks")
	for _, tc := range []lockCase{
		onMutex("nothing changed", func(*locksv1alpha1.DistributedLock) {}),
		onMutex("type changed", func(l *locksv1alpha1.DistributedLock) {
			l.Spec.Type = locksv1alpha1.RWMutex
		}),
		on(locksv1alpha1.Semaphore, "permits grew", func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = ptr.To[int32](4) }),
		on(locksv1alpha1.Semaphore, "permits shrank", func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = ptr.To[int32](2) }),
		onMutex("token grew", func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken++ }),
		onMutex("token fell", func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken-- }),
		// A lock stored with more than the caps (by an earlier release) may
		// shrink, not grow.
		on(locksv1alpha1.RWMutex, "70 readers kept", readers(70)),
		{"RWMutex: 70 readers, one released", over(readers(70)), func(l *locksv1alpha1.DistributedLock) { dropReader(l) }},
		{"RWMutex: 70 readers, one more", over(readers(70)), readers(71)},
		// A spec stored above this release's caps stays valid while unchanged
		// (the CRD ratchets it): every write of such a lock must go on.
		{"Semaphore: 100 permits stored, a renewal", storedWith(locksv1alpha1.Semaphore, permits(100)), renewReader},
		{"Semaphore: 100 permits stored, raised to 101", storedWith(locksv1alpha1.Semaphore, permits(100)), permits(101)},
		{"Mutex: maxWaiters 1024 stored, a renewal", storedWith(locksv1alpha1.Mutex, maxWaiters(1024)), func(l *locksv1alpha1.DistributedLock) {
			l.Status.Holder.RenewTime = ptr.To(micro(at.Add(time.Second)))
		}},
		{"Mutex: maxWaitersPerUser 1024 stored, lowered to 1000", storedWith(locksv1alpha1.Mutex, func(l *locksv1alpha1.DistributedLock) {
			l.Spec.MaxWaiters, l.Spec.MaxWaitersPerUser = ptr.To[int32](1024), ptr.To[int32](1024)
		}), func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaitersPerUser = ptr.To[int32](1000) }},
	} {
		oldObj := tc.base()
		newObj := oldObj.DeepCopy()
		tc.mutate(newObj)
		agree(t, tc.name, ValidateLockUpdate(newObj, oldObj), c.validate(asJSON(t, newObj), asJSON(t, oldObj)))
	}
}

// readers is a mutate that gives an RWMutex n readers on slots 0..n-1.
func readers(n int) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Status.SharedHolders = nil
		for i := range n {
			l.Status.SharedHolders = append(l.Status.SharedHolders, locksv1alpha1.SharedHolder{LockHolder: holder(10 + i), FencingToken: int64(30 + i), Slot: int32(i)})
		}
		l.Status.HolderCount = int32(n)
	}
}

// dropReader is a mutate that releases an RWMutex's last reader.
func dropReader(l *locksv1alpha1.DistributedLock) {
	l.Status.SharedHolders = l.Status.SharedHolders[:len(l.Status.SharedHolders)-1]
	l.Status.HolderCount--
}

// queue is a mutate that gives a lock n waiters. (A queue stored above its
// cap by an earlier release has a spec.maxWaiters above the schema's
// maximum, which only the apiserver's ratcheting lets stand: this harness
// has none, so only readers test the cap's ratchet here.)
func queue(n int) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Status.Waiters = nil
		for i := range n {
			l.Status.AppendWaiter(waiter(i, l.DefaultMode()))
		}
	}
}

// over is an RWMutex that mutate took beyond the caps, as an earlier
// release stored it.
// storedWith is a lock of typ as mutate leaves it: a Mutex busy with a
// holder and waiters, or two shared holders.
func storedWith(typ locksv1alpha1.LockType, mutate func(*locksv1alpha1.DistributedLock)) func() *locksv1alpha1.DistributedLock {
	return func() *locksv1alpha1.DistributedLock {
		l := busyMutex()
		if typ != locksv1alpha1.Mutex {
			l = sharedLock(typ)
		}
		mutate(l)
		return l
	}
}

func permits(n int32) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.Spec.Permits = &n }
}

func maxWaiters(n int32) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = &n }
}

// renewReader is a mutate that renews the first shared holding.
func renewReader(l *locksv1alpha1.DistributedLock) {
	l.Status.SharedHolders[0].RenewTime = ptr.To(micro(at.Add(time.Second)))
}

func over(mutate func(*locksv1alpha1.DistributedLock)) func() *locksv1alpha1.DistributedLock {
	return func() *locksv1alpha1.DistributedLock {
		l := sharedLock(locksv1alpha1.RWMutex)
		mutate(l)
		return l
	}
}

func TestSessionChecksAgreeWithTheCRD(t *testing.T) {
	c := loadCRD(t, "locksessions")
	base := func() *locksv1alpha1.LockSession {
		s := &locksv1alpha1.LockSession{
			TypeMeta:   metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "LockSession"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "s"},
			Spec:       locksv1alpha1.LockSessionSpec{User: "alice", Identity: "worker-0", PodName: "p", PodUID: "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"},
			Status:     locksv1alpha1.LockSessionStatus{RenewTime: ptr.To(micro(at)), Locks: 2},
		}
		SetSessionDefaults(s)
		return s
	}
	for name, mutate := range map[string]func(*locksv1alpha1.LockSession){
		"as it is":         func(*locksv1alpha1.LockSession) {},
		"no user":          func(s *locksv1alpha1.LockSession) { s.Spec.User = "" },
		"identity escaped": func(s *locksv1alpha1.LockSession) { s.Spec.Identity = "\x07" },
		"TTL 4":            func(s *locksv1alpha1.LockSession) { s.Spec.TTLSeconds = 4 },
		"TTL 3600":         func(s *locksv1alpha1.LockSession) { s.Spec.TTLSeconds = 3600 },
		"TTL 3601":         func(s *locksv1alpha1.LockSession) { s.Spec.TTLSeconds = 3601 },
		"podUID too long":  func(s *locksv1alpha1.LockSession) { s.Spec.PodUID = strings.Repeat("u", 65) },
		"renewed in 9999":  func(s *locksv1alpha1.LockSession) { s.Status.RenewTime = ptr.To(year(9999)) },
		"locks -1":         func(s *locksv1alpha1.LockSession) { s.Status.Locks = -1 },
	} {
		s := base()
		mutate(s)
		agree(t, name, ValidateSession(s), c.validate(asJSON(t, s), nil))
	}
	oldObj, newObj := base(), base()
	newObj.Spec.Identity = "worker-1"
	agree(t, "spec changed", ValidateSessionUpdate(newObj, oldObj), c.validate(asJSON(t, newObj), asJSON(t, oldObj)))
}

// stringFields set one string field of a busy lock.
var stringFields = []func(l *locksv1alpha1.DistributedLock, s string){
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Holder.Identity = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Holder.User = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Holder.LeaseID = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Holder.RequestID = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Holder.PodName = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Holder.PodUID = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Holder.Session = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Waiters[0].Identity = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Waiters[0].RequestID = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Waiters[0].Session = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.RecentAcquisitions[0].LeaseID = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.RecentAcquisitions[0].Message = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Conditions[0].Type = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Conditions[0].Reason = s },
	func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Conditions[0].Message = s },
}

// FuzzStringFieldsAgreeWithTheCRD writes any string into one field: the
// lengths (in characters) and patterns must judge it as the CRD does.
func FuzzStringFieldsAgreeWithTheCRD(f *testing.F) {
	for i := range stringFields {
		for _, s := range []string{"", "a", "worker-1", "0123456789abcdef", "a.b-c_d", "é\u200b", "x\x00y", "bob\u2028alice", strings.Repeat("ü", 64)} {
			f.Add(uint8(i), s)
		}
	}
	c := loadCRD(f, "distributedlocks")
	f.Fuzz(func(t *testing.T, field uint8, s string) {
		if !utf8.ValidString(s) {
			return // JSON carries no invalid UTF-8: the decoder replaces it
		}
		l := busyMutex()
		stringFields[int(field)%len(stringFields)](l, s)
		agree(t, fmt.Sprintf("field %d = %q", int(field)%len(stringFields), s), ValidateLock(l), c.validate(asJSON(t, l), nil))
	})
}
