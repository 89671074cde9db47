package rules

import (
	"strconv"
	"testing"
	"time"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestQueueRules: entries join at the tail in their writer's name, within
// the bounds of one write, a user and a pod, and leave by their owner (from
// its pod) or the controller. Each case is judged by the rules, by rule and
// message, and by the policy.
func TestQueueRules(t *testing.T) {
	runRuleCases(t, []ruleCase{
		// order and owners
		{name: "enqueue at the tail", old: heldBy(alice, waiter(bob, "rb")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.AppendWaiter(waiter("carol", "rc")) }, actor: Actor{Username: "carol"}},
		{name: "enqueue as someone else", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.AppendWaiter(waiter(bob, "rb")) }, actor: Actor{Username: "carol"}, rule: RuleIdentity},
		{name: "jump the queue", old: heldBy(alice, waiter(bob, "rb")), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Status.Waiters = append([]locksv1alpha1.Waiter{waiter("carol", "rc")}, l.Status.Waiters...)
			l.Status.WaiterCount = 2
		}, actor: Actor{Username: "carol"}, rule: RuleQueue},
		{name: "reorder the queue", old: heldBy(alice, waiter(bob, "rb"), waiter("carol", "rc")), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Status.Waiters[0], l.Status.Waiters[1] = l.Status.Waiters[1], l.Status.Waiters[0]
		}, actor: Actor{Username: "carol"}, rule: RuleQueue},
		{name: "leave the queue", old: heldBy(alice, waiter(bob, "rb")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("rb") }, actor: Actor{Username: bob}},
		{name: "remove another waiter", old: heldBy(alice, waiter(bob, "rb")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("rb") }, actor: Actor{Username: "carol"}, rule: RuleQueue},
		{name: "controller drops a waiter", old: heldBy(alice, waiter(bob, "rb")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("rb") }, actor: Actor{Username: ctrlr, IsController: true}},
		{name: "controller enqueues", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.AppendWaiter(waiter(ctrlr, "rx")) }, actor: Actor{Username: ctrlr, IsController: true}, rule: RuleControllerOnly},
		{name: "edit a queue entry", old: heldBy(alice, waiter(bob, "rb")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].Identity = "x" }, actor: Actor{Username: bob}, rule: RuleQueue},

		// bounds of one write
		{name: "two waiters in one write", old: heldBy(alice), edit: appendW(waiter(bob, "b1"), waiter(bob, "b2")), actor: Actor{Username: bob}, rule: RuleQueue, msg: msgOneWaiterPerWrite},
		{name: "a user's last allowed entry", old: perUser(heldBy(alice, waiter(bob, "b1")), 2), edit: appendW(waiter(bob, "b2")), actor: Actor{Username: bob}},
		{name: "a user's entry beyond maxWaitersPerUser", old: perUser(heldBy(alice, waiter(bob, "b1"), waiter(bob, "b2")), 2), edit: appendW(waiter(bob, "b3")), actor: Actor{Username: bob}, rule: RuleQueue, msg: msgWaitersPerUser},
		{name: "another user joins when one is at its bound", old: perUser(heldBy(alice, waiter(bob, "b1"), waiter(bob, "b2")), 2), edit: appendW(waiter("carol", "c1")), actor: Actor{Username: "carol"}},
		{name: "maxWaiters below maxWaitersPerUser bounds the user", old: func() *locksv1alpha1.DistributedLock {
			l := perUser(heldBy(alice, waiter(bob, "b1")), 16)
			one := int32(1)
			l.Spec.MaxWaiters = &one
			return l
		}(), edit: appendW(waiter(bob, "b2")), actor: Actor{Username: bob}, rule: RuleQueue, msg: msgWaitersPerUser},
		{name: "the default maxWaitersPerUser is 16", old: func() *locksv1alpha1.DistributedLock {
			l := heldBy(alice)
			for i := range locksv1alpha1.DefaultMaxWaitersPerUser {
				l.Status.AppendWaiter(waiter(bob, "b"+strconv.Itoa(i)))
			}
			return l
		}(), edit: appendW(waiter(bob, "b-last")), actor: Actor{Username: bob}, rule: RuleQueue, msg: msgWaitersPerUser},
		{name: "a second entry of one pod", old: heldBy(alice, podWaiter(bob, "b1", "p0")), edit: appendW(podWaiter(bob, "b2", "p0")), actor: podActor(bob, "p0"), rule: RuleQueue, msg: msgWaitersPerPod},
		{name: "an entry of another pod of the same account", old: heldBy(alice, podWaiter(bob, "b1", "p0")), edit: appendW(podWaiter(bob, "b2", "p1")), actor: podActor(bob, "p1")},
		{name: "leaving one's entry", old: heldBy(alice, waiter(bob, "b1")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: Actor{Username: bob}},

		// wait-bound
		{name: "a wait of exactly maxWaitSeconds", old: heldBy(alice), edit: appendW(deadlined(waiter(bob, "b1"), later(time.Hour))), actor: Actor{Username: bob}},
		{name: "a wait until 2099", old: heldBy(alice), edit: appendW(deadlined(waiter(bob, "b1"), later(time.Hour+time.Microsecond))), actor: Actor{Username: bob}, rule: RuleWaitBound, msg: msgWaitBound},
		{name: "a deadline at enqueueTime", old: heldBy(alice), edit: appendW(deadlined(waiter(bob, "b1"), now)), actor: Actor{Username: bob}, rule: RuleWaitBound, msg: msgWaitBound},
		{name: "a deadline before enqueueTime", old: heldBy(alice), edit: appendW(deadlined(waiter(bob, "b1"), later(-time.Second))), actor: Actor{Username: bob}, rule: RuleWaitBound, msg: msgWaitBound},
		{name: "a wait within a lower maxWaitSeconds", old: maxWaitOf(heldBy(alice), 60), edit: appendW(deadlined(waiter(bob, "b1"), later(time.Minute))), actor: Actor{Username: bob}},
		{name: "a wait beyond a lower maxWaitSeconds", old: maxWaitOf(heldBy(alice), 60), edit: appendW(deadlined(waiter(bob, "b1"), later(2*time.Minute))), actor: Actor{Username: bob}, rule: RuleWaitBound, msg: msgWaitBound},

		// pods
		{name: "a pod enqueues without its pod fields", old: heldBy(alice), edit: appendW(waiter(bob, "b1")), actor: podActor(bob, "p0"), rule: RulePodBinding, msg: `waiter.podUID "" is not the requesting pod's UID "` + uidOf("p0") + `"`},
		{name: "a pod enqueues in another pod's name", old: heldBy(alice), edit: appendW(podWaiter(bob, "b1", "p1")), actor: podActor(bob, "p0"), rule: RulePodBinding, msg: `waiter.podName "p1" is not the requesting pod "p0"`},
		{name: "another pod removes a pod's entry", old: heldBy(alice, podWaiter(bob, "b1", "p0")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodWaiter},
		{name: "the pod removes its entry", old: heldBy(alice, podWaiter(bob, "b1", "p0")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: podActor(bob, "p0")},
		{name: "the controller drops a pod's entry", old: heldBy(alice, podWaiter(bob, "b1", "p0")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: Actor{Username: ctrlr, IsController: true}},

		// modes
		{name: "a Shared waiter joins a Semaphore", old: reading(typed(sem, 1), alice), edit: appendW(sharedWaiter(bob, "rb")), actor: Actor{Username: bob}},

		{name: "a Shared waiter on a Mutex", old: heldBy(alice), edit: appendW(sharedWaiter(bob, "rb")), actor: Actor{Username: bob}, rule: RuleMode, msg: msgWaiterMode},
		{name: "an Exclusive waiter on a Semaphore", old: reading(typed(sem, 1), alice), edit: appendW(waiter(bob, "rb")), actor: Actor{Username: bob}, rule: RuleMode, msg: msgWaiterMode},

		// terminating
		{name: "join a terminating lock's queue", old: terminating(heldBy(alice)), edit: appendW(waiter(bob, "b1")), actor: Actor{Username: bob}, rule: RuleTerminating, msg: msgTerminating},
		{name: "leave a terminating lock's queue", old: terminating(heldBy(alice, waiter(bob, "b1"))), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: Actor{Username: bob}},
	})
}
