package rules

import (
	"testing"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestRenewReleaseRules: only a holding's owner, from its pod, renews or
// releases it, and nothing but renewTime changes while it lasts. Each case is
// judged by the rules, by rule and message, and by the policy.
func TestRenewReleaseRules(t *testing.T) {
	runRuleCases(t, []ruleCase{
		// the exclusive holder
		{name: "renew by the holder", old: heldBy(alice), edit: renew, actor: Actor{Username: alice}},
		{name: "renew by another user", old: heldBy(alice), edit: renew, actor: Actor{Username: bob}, rule: RuleHolderOnly},
		{name: "change the lease while held", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseDurationSeconds = 3600 }, actor: Actor{Username: alice}, rule: RuleHolderFields},
		{name: "steal with another leaseID", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseID = "lease-b" }, actor: Actor{Username: alice}, rule: RuleHolderOnly},
		{name: "take over the holding in place, keeping its leaseID", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Status.Holder.User, l.Status.Holder.Identity = bob, "bob-pod"
		}, actor: Actor{Username: bob}, rule: RuleHolderFields},
		{name: "change the requestID while held", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.RequestID = "req-b" }, actor: Actor{Username: alice}, rule: RuleHolderFields},
		{name: "name a session while held", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Session = "s1" }, actor: Actor{Username: alice}, rule: RuleHolderFields},
		{name: "release by the holder", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonReleased, alice), actor: Actor{Username: alice}},
		{name: "release by another user", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonReleased, bob), actor: Actor{Username: bob}, rule: RuleHolderOnly},
		{name: "release a terminating lock", old: terminating(heldBy(alice)), edit: end(locksv1alpha1.EndReasonReleased, alice), actor: Actor{Username: alice}},

		// shared entries
		{name: "a reader renews its own entry", old: reading(typed(rw, 0), alice, bob), edit: renewShared("lease-bob"), actor: Actor{Username: bob}},
		{name: "a reader releases, recorded with its slot", old: reading(typed(rw, 0), alice, bob), edit: endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob), actor: Actor{Username: bob}},
		{name: "the last reader releases", old: reading(typed(rw, 0), alice), edit: endShared("lease-alice", locksv1alpha1.EndReasonReleased, alice), actor: Actor{Username: alice}},
		{name: "an entry's token changes", old: reading(typed(rw, 0), alice, bob), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].FencingToken++ },
			actor: Actor{Username: bob}, rule: RuleSlot, msg: msgSharedKept},

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

		// pods
		{name: "the holding pod renews", old: podHeld(bob, "p0"), edit: renew, actor: podActor(bob, "p0")},
		{name: "another pod renews", old: podHeld(bob, "p0"), edit: renew, actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodHolding},
		{name: "the same user without a pod renews a pod's holding", old: podHeld(bob, "p0"), edit: renew, actor: Actor{Username: bob}, rule: RulePodBinding, msg: msgPodHolding},
		{name: "another pod releases", old: podHeld(bob, "p0"), edit: end(locksv1alpha1.EndReasonReleased, bob), actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodHolding},
		{name: "the holding pod releases", old: podHeld(bob, "p0"), edit: end(locksv1alpha1.EndReasonReleased, bob), actor: podActor(bob, "p0")},
	})
}
