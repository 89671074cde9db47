package rules

import (
	"testing"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestAcquireRules: who may add a holding, exclusive or shared, with which
// token, lease ID and place in the queue. Each case is judged by the rules,
// by rule and message, and by the policy (expectPolicyAgrees).
func TestAcquireRules(t *testing.T) {
	runRuleCases(t, []ruleCase{
		// exclusive
		{name: "acquire free lock", old: free(), edit: func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder(alice, "l1", "r1"), 101) }, actor: Actor{Username: alice}},
		{name: "acquire as someone else", old: free(), edit: func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder(bob, "l1", "r1"), 101) }, actor: Actor{Username: alice}, rule: RuleIdentity},
		{name: "acquire with a forged token", old: free(), edit: func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder(alice, "l1", "r1"), 500) }, actor: Actor{Username: alice}, rule: RuleFencingToken},
		{name: "acquire with a token one too low", old: free(), edit: func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder(alice, "l1", "r1"), 100) }, actor: Actor{Username: alice}, rule: RuleFencingToken},
		{name: "controller acquires", old: free(), edit: func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder(ctrlr, "l1", "r1"), 101) }, actor: Actor{Username: ctrlr, IsController: true}, rule: RuleControllerOnly},
		{name: "acquire by the queue head", old: queued(waiter(bob, "rb"), waiter(alice, "ra")), edit: func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder(bob, "l1", "rb"), 101) }, actor: Actor{Username: bob}},
		{name: "acquire past the queue head", old: queued(waiter(bob, "rb"), waiter(alice, "ra")), edit: func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder(alice, "l1", "ra"), 101) }, actor: Actor{Username: alice}, rule: RuleQueueHead},
		{name: "acquire with the head's requestID by another user", old: queued(waiter(bob, "rb"), waiter(alice, "ra")), edit: func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder(alice, "l1", "rb"), 101) }, actor: Actor{Username: alice}, rule: RuleQueueHead},
		{name: "acquire with another pod's name", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			h := holder(alice, "l1", "r1")
			h.PodName = "other"
			l.Acquire(h, 101)
		}, actor: Actor{Username: alice, Extra: map[string][]string{ExtraPodName: {"mine"}}}, rule: RulePodBinding},

		// shared
		{name: "a reader acquires a free RWMutex", old: typed(rw, 0), edit: share(alice, "l1", "r1", 0), actor: Actor{Username: alice}},
		{name: "a reader acquires beside readers", old: reading(typed(rw, 0), alice, bob), edit: share(carol, "l1", "r1", 2), actor: Actor{Username: carol}},
		{name: "a reader takes any free slot", old: reading(typed(rw, 0), alice, bob), edit: share(carol, "l1", "r1", 63), actor: Actor{Username: carol}},
		{name: "a permit up to the limit", old: reading(typed(sem, 3), alice, bob), edit: share(carol, "l1", "r1", 2), actor: Actor{Username: carol}},
		{name: "a shared head acquires", old: withWaiters(reading(typed(rw, 0), alice), sharedWaiter(bob, "rb"), sharedWaiter(carol, "rc")),
			edit: share(bob, "lb", "rb", 1), actor: Actor{Username: bob}},
		{name: "the next shared head acquires without waiting for the first", old: withWaiters(reading(typed(rw, 0), alice, bob), sharedWaiter(carol, "rc")),
			edit: share(carol, "lc", "rc", 2), actor: Actor{Username: carol}},
		{name: "a writer acquires once the readers left", old: withWaiters(typed(rw, 0), waiter(bob, "rb")), edit: acquireAs(bob, "l1", "rb"), actor: Actor{Username: bob}},
		{name: "a reader releases one entry and takes another", old: reading(typed(rw, 0), alice, bob),
			edit: edits(endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob), share(bob, "lb2", "rb2", 5)), actor: Actor{Username: bob}},

		// modes: a holding fits the lock's type
		{name: "a reader acquires while a writer holds", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Spec.Type = rw
			share(bob, "l1", "r1", 0)(l)
		}, actor: Actor{Username: bob}, rule: RuleMode, msg: msgBothModes},
		{name: "a writer acquires while readers hold", old: reading(typed(rw, 0), alice), edit: acquireAs(bob, "l1", "r1"), actor: Actor{Username: bob}, rule: RuleMode, msg: msgBothModes},
		{name: "a shared entry on a Mutex", old: free(), edit: share(bob, "l1", "r1", 0), actor: Actor{Username: bob}, rule: RuleMode, msg: msgMutexShared},
		{name: "an exclusive holder on a Semaphore", old: typed(sem, 2), edit: acquireAs(bob, "l1", "r1"), actor: Actor{Username: bob}, rule: RuleMode, msg: msgSemaphoreHolder},

		// slots
		{name: "a permit over the limit", old: reading(typed(sem, 2), alice, bob), edit: share(carol, "l1", "r1", 2), actor: Actor{Username: carol}, rule: RuleSlot, msg: "slot 2 is out of range: a new shared holding takes a free slot in [0, 2)"},
		{name: "a reader's slot out of range", old: typed(rw, 0), edit: share(carol, "l1", "r1", 1024), actor: Actor{Username: carol}, rule: RuleSlot, msg: "slot 1024 is out of range"},
		{name: "a negative slot", old: typed(rw, 0), edit: share(carol, "l1", "r1", -1), actor: Actor{Username: carol}, rule: RuleSlot, msg: "slot -1 is out of range"},
		{name: "a slot collision", old: reading(typed(sem, 3), alice, bob), edit: share(carol, "l1", "r1", 1), actor: Actor{Username: carol}, rule: RuleSlot, msg: "slot 1 is taken", crd: true},
		{name: "two entries in one write", old: typed(rw, 0), edit: edits(share(bob, "l1", "r1", 0), share(bob, "l2", "r2", 1)), actor: Actor{Username: bob}, rule: RuleSlot, msg: msgOneAcquisition},
		{name: "a writer and a reader in one write", old: typed(rw, 0), edit: edits(acquireAs(bob, "l1", "r1"), share(bob, "l2", "r2", 1)), actor: Actor{Username: bob}, rule: RuleSlot, msg: msgOneAcquisition},
		{name: "an entry moves to another slot", old: reading(typed(rw, 0), alice, bob), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].Slot = 9 },
			actor: Actor{Username: bob}, rule: RuleSlot, msg: msgSharedKept + ": lease lease-bob cannot move from slot 1 to slot 9"},

		// tokens
		{name: "change the token while held", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken++ }, actor: Actor{Username: alice}, rule: RuleFencingToken},
		{name: "a new reader's token above resourceVersion + 1", old: reading(typed(rw, 0), alice), edit: func(l *locksv1alpha1.DistributedLock) {
			l.AcquireShared(holder(bob, "l1", "r1"), 1, 205)
		}, actor: Actor{Username: bob}, rule: RuleFencingToken, msg: "an acquisition's fencingToken must be the lock's resourceVersion + 1 = 201, not 205"},
		{name: "a new reader's entry token differs from status", old: reading(typed(rw, 0), alice), edit: func(l *locksv1alpha1.DistributedLock) {
			share(bob, "l1", "r1", 1)(l)
			l.Status.SharedHolders[1].FencingToken = 60
		}, actor: Actor{Username: bob}, rule: RuleFencingToken, msg: "a new shared holding's fencingToken must be the lock's resourceVersion + 1 = 201, not 60"},
		{name: "a release that raises the token", old: reading(typed(rw, 0), alice, bob), edit: edits(endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob), func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken++ }),
			actor: Actor{Username: bob}, rule: RuleFencingToken, msg: "fencingToken changes only when a lock is acquired"},

		// identity, controller, pods, the queue's head
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
		{name: "a pod acquires without its pod fields", old: free(), edit: acquireAs(bob, "l1", "r1"), actor: podActor(bob, "p0"), rule: RulePodBinding, msg: `holder.podUID "" is not the requesting pod's UID "` + uidOf("p0") + `"`},
		{name: "another pod acquires with a pod's head entry", old: queued(podWaiter(bob, "b1", "p0")), edit: func(l *locksv1alpha1.DistributedLock) {
			h := holder(bob, "l1", "b1")
			h.PodName, h.PodUID = "p1", uidOf("p1")
			l.Acquire(h, 101)
		}, actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodWaiter},

		// lease IDs
		{name: "a reader reuses another reader's leaseID", old: reading(typed(rw, 0), alice), edit: share(bob, "lease-alice", "r1", 1), actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgLeaseID},
		{name: "a writer reuses a reader's finished leaseID", old: func() *locksv1alpha1.DistributedLock {
			l := reading(typed(rw, 0), alice)
			l.EndShared("lease-alice", locksv1alpha1.EndReasonReleased, alice, now)
			return l
		}(), edit: acquireAs(bob, "lease-alice", "r1"), actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgLeaseID},

		{name: "acquire with a finished leaseID", old: released(), edit: acquireAs(bob, "lease-a", "r2"), actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgLeaseID},
		{name: "acquire with a fresh leaseID", old: released(), edit: acquireAs(bob, "lease-b", "r2"), actor: Actor{Username: bob}},

		// terminating
		{name: "acquire a terminating lock", old: terminating(free()), edit: acquireAs(alice, "l1", "r1"), actor: Actor{Username: alice}, rule: RuleTerminating, msg: msgTerminating},
	})
}
