package rules

import (
	"testing"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestFreshRequestIDs: a new holding or queue entry never carries a
// requestID status still knows, whoever writes it; the client's own retry
// answers from status and writes nothing (red team).
func TestFreshRequestIDs(t *testing.T) {
	enqueue := func(w locksv1alpha1.Waiter) func(*locksv1alpha1.DistributedLock) {
		return func(l *locksv1alpha1.DistributedLock) { l.Status.AppendWaiter(w) }
	}
	runRuleCases(t, []ruleCase{
		{name: "a waiter with the holder's requestID", old: heldBy(alice), edit: enqueue(waiter(bob, "req-a")),
			actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgRequestID},
		{name: "the holder queueing again with its holding's requestID", old: heldBy(alice), edit: enqueue(waiter(alice, "req-a")),
			actor: Actor{Username: alice}, rule: RuleLeaseID, msg: msgRequestID},
		{name: "a waiter with a recorded requestID", old: released(), edit: enqueue(waiter(bob, "req-a")),
			actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgRequestID},
		{name: "an acquisition with a recorded requestID", old: released(), edit: acquireAs(bob, "lease-b", "req-a"),
			actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgRequestID},
		{name: "a waiter with a fresh requestID", old: released(), edit: enqueue(waiter(bob, "req-b")), actor: Actor{Username: bob}},
		{name: "an acquisition with a fresh requestID", old: released(), edit: acquireAs(bob, "lease-b", "req-b"), actor: Actor{Username: bob}},
		{name: "the head acquiring with its queue entry's requestID", old: func() *locksv1alpha1.DistributedLock {
			l := released()
			l.Status.AppendWaiter(waiter(bob, "req-b"))
			return l
		}(), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Status.RemoveWaiter("req-b")
			acquireAs(bob, "lease-b", "req-b")(l)
		}, actor: Actor{Username: bob}},
	})
}
