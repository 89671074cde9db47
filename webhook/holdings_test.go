package webhook

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

const carol = "carol"

// typed is a free lock of type t (permits for a Semaphore) at resourceVersion 100.
func typed(t locksv1alpha1.LockType, permits int32) *locksv1alpha1.DistributedLock {
	l := free()
	l.Spec.Type = t
	if t == locksv1alpha1.Semaphore {
		l.Spec.Permits = &permits
	}
	return l
}

// reading gives l shared holdings by users on slots 0, 1, …, leases
// "lease-<user>", requests "req-<user>", and moves it to resourceVersion 200.
func reading(l *locksv1alpha1.DistributedLock, users ...string) *locksv1alpha1.DistributedLock {
	for i, u := range users {
		l.AcquireShared(holder(u, "lease-"+u, "req-"+u), int32(i), l.Status.FencingToken+1)
	}
	l.ResourceVersion = "200"
	return l
}

func withWaiters(l *locksv1alpha1.DistributedLock, ws ...locksv1alpha1.Waiter) *locksv1alpha1.DistributedLock {
	for _, w := range ws {
		l.Status.AppendWaiter(w)
	}
	return l
}

func sharedWaiter(user, req string) locksv1alpha1.Waiter {
	w := waiter(user, req)
	w.Mode = locksv1alpha1.Shared
	return w
}

// share acquires a shared holding for user on slot with the right token.
func share(user, lease, req string, slot int32) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		token, _ := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		l.AcquireShared(holder(user, lease, req), slot, token)
	}
}

func endShared(lease string, reason locksv1alpha1.EndReason, by string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.EndShared(lease, reason, by, now) }
}

func renewShared(lease string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		i := l.Status.SharedIndex(lease)
		t := metav1.NewMicroTime(now.Add(time.Second))
		l.Status.SharedHolders[i].RenewTime = &t
	}
}

func edits(fns ...func(*locksv1alpha1.DistributedLock)) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		for _, fn := range fns {
			fn(l)
		}
	}
}

// TestSharedRules covers the shared-mode rules (issue 16): each allowed
// transition and the hostile writes next to it, by rule and message.
func TestSharedRules(t *testing.T) {
	rw, sem := locksv1alpha1.RWMutex, locksv1alpha1.Semaphore
	ctl := Actor{Username: ctrlr, IsController: true}
	runRuleCases(t, []ruleCase{
		// allowed transitions
		{name: "a reader acquires a free RWMutex", old: typed(rw, 0), edit: share(alice, "l1", "r1", 0), actor: Actor{Username: alice}},
		{name: "a reader acquires beside readers", old: reading(typed(rw, 0), alice, bob), edit: share(carol, "l1", "r1", 2), actor: Actor{Username: carol}},
		{name: "a reader takes any free slot", old: reading(typed(rw, 0), alice, bob), edit: share(carol, "l1", "r1", 700), actor: Actor{Username: carol}},
		{name: "a permit up to the limit", old: reading(typed(sem, 3), alice, bob), edit: share(carol, "l1", "r1", 2), actor: Actor{Username: carol}},
		{name: "a shared head acquires", old: withWaiters(reading(typed(rw, 0), alice), sharedWaiter(bob, "rb"), sharedWaiter(carol, "rc")),
			edit: share(bob, "lb", "rb", 1), actor: Actor{Username: bob}},
		{name: "the next shared head acquires without waiting for the first", old: withWaiters(reading(typed(rw, 0), alice, bob), sharedWaiter(carol, "rc")),
			edit: share(carol, "lc", "rc", 2), actor: Actor{Username: carol}},
		{name: "a writer acquires once the readers left", old: withWaiters(typed(rw, 0), waiter(bob, "rb")), edit: acquireAs(bob, "l1", "rb"), actor: Actor{Username: bob}},
		{name: "a reader renews its own entry", old: reading(typed(rw, 0), alice, bob), edit: renewShared("lease-bob"), actor: Actor{Username: bob}},
		{name: "a reader releases, recorded with its slot", old: reading(typed(rw, 0), alice, bob), edit: endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob), actor: Actor{Username: bob}},
		{name: "the last reader releases", old: reading(typed(rw, 0), alice), edit: endShared("lease-alice", locksv1alpha1.EndReasonReleased, alice), actor: Actor{Username: alice}},
		{name: "the controller expires two entries in one write", old: reading(typed(sem, 3), alice, bob, carol),
			edit: edits(endShared("lease-alice", locksv1alpha1.EndReasonExpired, ctrlr), endShared("lease-carol", locksv1alpha1.EndReasonSessionClosed, ctrlr)), actor: ctl},
		{name: "force-release ends every permit", old: reading(typed(sem, 3), alice, bob, carol),
			edit:  edits(endShared("lease-alice", locksv1alpha1.EndReasonForceReleased, "op"), endShared("lease-bob", locksv1alpha1.EndReasonForceReleased, "op"), endShared("lease-carol", locksv1alpha1.EndReasonForceReleased, "op")),
			actor: Actor{Username: "op", CanForceRelease: true}},
		{name: "a reader releases one entry and takes another", old: reading(typed(rw, 0), alice, bob),
			edit: edits(endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob), share(bob, "lb2", "rb2", 5)), actor: Actor{Username: bob}},
		{name: "a Shared waiter joins a Semaphore", old: reading(typed(sem, 1), alice), edit: appendW(sharedWaiter(bob, "rb")), actor: Actor{Username: bob}},

		// modes
		{name: "a reader acquires while a writer holds", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Spec.Type = rw
			share(bob, "l1", "r1", 0)(l)
		}, actor: Actor{Username: bob}, rule: RuleMode, msg: msgBothModes},
		{name: "a writer acquires while readers hold", old: reading(typed(rw, 0), alice), edit: acquireAs(bob, "l1", "r1"), actor: Actor{Username: bob}, rule: RuleMode, msg: msgBothModes},
		{name: "a shared entry on a Mutex", old: free(), edit: share(bob, "l1", "r1", 0), actor: Actor{Username: bob}, rule: RuleMode, msg: msgMutexShared},
		{name: "an exclusive holder on a Semaphore", old: typed(sem, 2), edit: acquireAs(bob, "l1", "r1"), actor: Actor{Username: bob}, rule: RuleMode, msg: msgSemaphoreHolder},
		{name: "a Shared waiter on a Mutex", old: heldBy(alice), edit: appendW(sharedWaiter(bob, "rb")), actor: Actor{Username: bob}, rule: RuleMode, msg: msgWaiterMode},
		{name: "an Exclusive waiter on a Semaphore", old: reading(typed(sem, 1), alice), edit: appendW(waiter(bob, "rb")), actor: Actor{Username: bob}, rule: RuleMode, msg: msgWaiterMode},

		// slots
		{name: "a permit over the limit", old: reading(typed(sem, 2), alice, bob), edit: share(carol, "l1", "r1", 2), actor: Actor{Username: carol}, rule: RuleSlot, msg: "slot 2 is out of range: a new shared holding takes a free slot in [0, 2)"},
		{name: "a reader's slot out of range", old: typed(rw, 0), edit: share(carol, "l1", "r1", 1024), actor: Actor{Username: carol}, rule: RuleSlot, msg: "slot 1024 is out of range"},
		{name: "a negative slot", old: typed(rw, 0), edit: share(carol, "l1", "r1", -1), actor: Actor{Username: carol}, rule: RuleSlot, msg: "slot -1 is out of range"},
		{name: "a slot collision", old: reading(typed(sem, 3), alice, bob), edit: share(carol, "l1", "r1", 1), actor: Actor{Username: carol}, rule: RuleSlot, msg: "slot 1 is taken", crd: true},
		{name: "two entries in one write", old: typed(rw, 0), edit: edits(share(bob, "l1", "r1", 0), share(bob, "l2", "r2", 1)), actor: Actor{Username: bob}, rule: RuleSlot, msg: msgOneAcquisition},
		{name: "a writer and a reader in one write", old: typed(rw, 0), edit: edits(acquireAs(bob, "l1", "r1"), share(bob, "l2", "r2", 1)), actor: Actor{Username: bob}, rule: RuleSlot, msg: msgOneAcquisition},
		{name: "an entry moves to another slot", old: reading(typed(rw, 0), alice, bob), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].Slot = 9 },
			actor: Actor{Username: bob}, rule: RuleSlot, msg: msgSharedKept + ": lease lease-bob cannot move from slot 1 to slot 9"},
		{name: "an entry's token changes", old: reading(typed(rw, 0), alice, bob), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].FencingToken++ },
			actor: Actor{Username: bob}, rule: RuleSlot, msg: msgSharedKept},

		// tokens
		{name: "a new reader's token above resourceVersion + 1", old: reading(typed(rw, 0), alice), edit: func(l *locksv1alpha1.DistributedLock) {
			l.AcquireShared(holder(bob, "l1", "r1"), 1, 205)
		}, actor: Actor{Username: bob}, rule: RuleFencingToken, msg: "an acquisition's fencingToken must be the lock's resourceVersion + 1 = 201, not 205"},
		{name: "a new reader's entry token differs from status", old: reading(typed(rw, 0), alice), edit: func(l *locksv1alpha1.DistributedLock) {
			share(bob, "l1", "r1", 1)(l)
			l.Status.SharedHolders[1].FencingToken = 60
		}, actor: Actor{Username: bob}, rule: RuleFencingToken, msg: "a new shared holding's fencingToken must be the lock's resourceVersion + 1 = 201, not 60"},
		{name: "a release that raises the token", old: reading(typed(rw, 0), alice, bob), edit: edits(endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob), func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken++ }),
			actor: Actor{Username: bob}, rule: RuleFencingToken, msg: "fencingToken changes only when a lock is acquired"},

		// identity, controller, queue, lease IDs
		{name: "a reader in someone else's name", old: typed(rw, 0), edit: share(alice, "l1", "r1", 0), actor: Actor{Username: bob}, rule: RuleIdentity, msg: `sharedHolder.user must be the requesting user "bob", not "alice"`},
		{name: "the controller takes a permit", old: typed(sem, 2), edit: share(ctrlr, "l1", "r1", 0), actor: ctl, rule: RuleControllerOnly, msg: "the controller may expire holdings but never acquire a lock"},
		{name: "a pod takes a permit in another pod's name", old: typed(sem, 2), edit: func(l *locksv1alpha1.DistributedLock) {
			h := holder(bob, "l1", "r1")
			h.PodName, h.PodUID = "p1", uidOf("p1")
			l.AcquireShared(h, 0, 101)
		}, actor: podActor(bob, "p0"), rule: RulePodBinding, msg: `sharedHolder.podName "p1" is not the requesting pod "p0"`},
		{name: "a writer jumps readers queued before it", old: withWaiters(typed(rw, 0), sharedWaiter(bob, "rb"), sharedWaiter(carol, "rc"), waiter("dave", "rd")),
			edit: acquireAs("dave", "l1", "rd"), actor: Actor{Username: "dave"}, rule: RuleQueueHead, msg: "only the head of the wait queue (requestID rb of \"bob\") may acquire; request rd of \"dave\" is not"},
		{name: "a reader jumps a writer queued before it", old: withWaiters(reading(typed(rw, 0), alice), waiter(carol, "rc")),
			edit: share(bob, "l1", "rb", 1), actor: Actor{Username: bob}, rule: RuleQueueHead, msg: "only the head of the wait queue (requestID rc of \"carol\")"},
		{name: "a reader reuses another reader's leaseID", old: reading(typed(rw, 0), alice), edit: share(bob, "lease-alice", "r1", 1), actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgLeaseID},
		{name: "a writer reuses a reader's finished leaseID", old: func() *locksv1alpha1.DistributedLock {
			l := reading(typed(rw, 0), alice)
			l.EndShared("lease-alice", locksv1alpha1.EndReasonReleased, alice, now)
			return l
		}(), edit: acquireAs(bob, "lease-alice", "r1"), actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgLeaseID},

		// only an entry's owner renews or releases it
		{name: "one permit holder renews another's", old: reading(typed(sem, 3), alice, bob), edit: renewShared("lease-alice"), actor: Actor{Username: bob}, rule: RuleHolderOnly, msg: `only the holder "alice" may renew lease lease-alice; "bob" is not the holder`},
		{name: "one permit holder releases another's", old: reading(typed(sem, 3), alice, bob), edit: endShared("lease-alice", locksv1alpha1.EndReasonReleased, bob), actor: Actor{Username: bob}, rule: RuleHolderOnly, msg: `only the holder "alice" may release lease lease-alice; "bob" is not the holder`},
		{name: "another pod renews a pod's permit", old: func() *locksv1alpha1.DistributedLock {
			l := typed(sem, 2)
			h := holder(bob, "lease-bob", "rb")
			h.PodName, h.PodUID = "p0", uidOf("p0")
			l.AcquireShared(h, 0, 51)
			return l
		}(), edit: renewShared("lease-bob"), actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodHolding},
		{name: "a reader changes its lease while held", old: reading(typed(rw, 0), alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[0].LeaseDurationSeconds = 3600 },
			actor: Actor{Username: alice}, rule: RuleHolderFields, msg: "while lease lease-alice is held only its renewTime may change"},
		{name: "a reader's entry passes to another leaseID", old: reading(typed(rw, 0), alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[0].LeaseID = "lease-x" },
			actor: Actor{Username: alice}, rule: RuleHolderOnly, msg: "a shared holding cannot pass to another leaseID (lease-alice → lease-x)"},

		// ends are recorded, by the right writers
		{name: "an unrecorded removal", old: reading(typed(rw, 0), alice, bob), edit: func(l *locksv1alpha1.DistributedLock) {
			endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob)(l)
			l.Status.RecentAcquisitions = nil
		}, actor: Actor{Username: bob}, rule: RuleEndRecord, msg: "ending the holding of lease lease-bob must append exactly its record"},
		{name: "a record without the slot", old: reading(typed(rw, 0), alice, bob), edit: func(l *locksv1alpha1.DistributedLock) {
			endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob)(l)
			l.Status.RecentAcquisitions[0].Slot = nil
		}, actor: Actor{Username: bob}, rule: RuleEndRecord, msg: "the record must describe the ending holding: leaseID lease-bob, requestID req-bob, fencingToken 52, identity bob-pod, slot 1"},
		{name: "two ends, one record", old: reading(typed(rw, 0), alice, bob), edit: func(l *locksv1alpha1.DistributedLock) {
			endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob)(l)
			l.Status.SharedHolders = nil
			l.Status.HolderCount = 0
		}, actor: Actor{Username: bob}, rule: RuleEndRecord, msg: "ending the holdings of leases lease-alice, lease-bob must append exactly their records"},
		{name: "nine ends in one write", old: reading(typed(rw, 0), "u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"), edit: func(l *locksv1alpha1.DistributedLock) {
			for _, u := range []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"} {
				endShared("lease-"+u, locksv1alpha1.EndReasonExpired, ctrlr)(l)
			}
		}, actor: ctl, rule: RuleEndRecord, msg: msgTooManyEnds},
		{name: "a non-controller writes Expired for a shared entry", old: reading(typed(sem, 3), alice, bob), edit: endShared("lease-alice", locksv1alpha1.EndReasonExpired, bob), actor: Actor{Username: bob}, rule: RuleControllerOnly, msg: `only the kubelock controller may expire a lease; "bob" is not the controller`},
		{name: "a reader ends its own entry as SessionClosed", old: reading(typed(sem, 3), alice), edit: endShared("lease-alice", locksv1alpha1.EndReasonSessionClosed, alice), actor: Actor{Username: alice}, rule: RuleControllerOnly, msg: "only the kubelock controller may end a holding for its session"},
		{name: "force-release of a permit without the verb", old: reading(typed(sem, 3), alice), edit: endShared("lease-alice", locksv1alpha1.EndReasonForceReleased, bob), actor: Actor{Username: bob}, rule: RuleForceRelease, msg: `user "bob" may not force-release`},
		{name: "a release recorded in someone else's name", old: reading(typed(sem, 3), alice), edit: endShared("lease-alice", locksv1alpha1.EndReasonReleased, bob), actor: Actor{Username: alice}, rule: RuleIdentity, msg: `endedBy must be the requesting user "alice", not "bob"`},

		// bookkeeping
		{name: "a reader not counted in holderCount", old: reading(typed(rw, 0), alice), edit: edits(share(bob, "l1", "r1", 1), func(l *locksv1alpha1.DistributedLock) { l.Status.HolderCount = 1 }),
			actor: Actor{Username: bob}, rule: RuleBookkeeping, msg: msgHolderCount},
		{name: "a release that says Held False while a reader holds", old: reading(typed(rw, 0), alice, bob), edit: edits(endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob), func(l *locksv1alpha1.DistributedLock) {
			l.Status.Conditions[0].Status, l.Status.Conditions[0].Reason = metav1.ConditionFalse, locksv1alpha1.ReasonReleased
		}), actor: Actor{Username: bob}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "a reader acquiring without the Held condition", old: typed(rw, 0), edit: edits(share(bob, "l1", "r1", 0), func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions = nil }),
			actor: Actor{Username: bob}, rule: RuleBookkeeping, msg: msgConditionsInStep},
	})
}

func TestNeedsForceCheckForSharedEnds(t *testing.T) {
	old := reading(typed(locksv1alpha1.Semaphore, 3), alice, bob)
	for reason, want := range map[locksv1alpha1.EndReason]bool{
		locksv1alpha1.EndReasonReleased: false, locksv1alpha1.EndReasonExpired: false, locksv1alpha1.EndReasonForceReleased: true,
	} {
		next := old.DeepCopy()
		endShared("lease-alice", locksv1alpha1.EndReasonExpired, ctrlr)(next)
		endShared("lease-bob", reason, bob)(next)
		if got := NeedsForceCheck(old, next); got != want {
			t.Errorf("%s: NeedsForceCheck = %v, want %v", reason, got, want)
		}
	}
	renewed := old.DeepCopy()
	renewShared("lease-bob")(renewed)
	if NeedsForceCheck(old, renewed) {
		t.Error("a renewal needs no force check")
	}
}

func TestValidateDeleteOfSharedLock(t *testing.T) {
	l := reading(typed(locksv1alpha1.Semaphore, 3), alice, bob)
	errs := ValidateDelete(l, Actor{Username: carol})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "[kubelock:held-delete] lock l is held by alice (lease lease-alice)") {
		t.Fatalf("got %v", errs.ToAggregate())
	}
	if errs := ValidateDelete(l, Actor{Username: carol, CanForceRelease: true}); len(errs) > 0 {
		t.Fatalf("force-release denied: %v", errs.ToAggregate())
	}
}
