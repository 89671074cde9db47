package admission

import (
	. "github.com/onsi/ginkgo/v2"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
)

// The red team's shared-mode cases (after issue 16): the holes it found,
// each denied by both engines with its rule's message, and the most
// instructive attacks that were already denied. Both engines run them
// (hostileEntries appends them).

const msgAcquirerQueued = "an acquisition takes its own entry out of the wait queue in the same write: its requestID may not stay in status.waiters (or join it)"

// keepHead puts the old queue's head back at the head after fn acquired
// with its requestID (which removed it).
func keepHead(fn func(*locksv1alpha1.DistributedLock)) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		head := l.Status.Waiters[0]
		fn(l)
		l.Status.Waiters = append([]locksv1alpha1.Waiter{head}, l.Status.Waiters...)
		l.Status.WaiterCount = int32(len(l.Status.Waiters))
	}
}

// withRequest is h with the requestID id.
func withRequest(h locksv1alpha1.LockHolder, id string) locksv1alpha1.LockHolder {
	h.RequestID = id
	return h
}

// firstShared moves the newest shared entry to the front of the list (the
// list is keyed by slot; its order is the writer's).
func firstShared(l *locksv1alpha1.DistributedLock) {
	hs := l.Status.SharedHolders
	last := hs[len(hs)-1]
	l.Status.SharedHolders = append([]locksv1alpha1.SharedHolder{last}, hs[:len(hs)-1]...)
}

func redteamSharedEntries() []TableEntry {
	sem3Queue := state{spec: sem3Spec, waiters: []string{"bob", "carol"}}
	return []TableEntry{
		// --- holes: admitted by both engines before the red team ---------------------
		// bob, the head, takes a permit and stays the head: he takes the
		// next permit, and the next, while carol (queued behind him) waits;
		// on an RWMutex he fills 1,024 reader slots past a waiting writer.
		Entry("red team: the head taking a permit and staying at the head of the queue", hostile{state: sem3Queue, by: "bob",
			do:   update(keepHead(acquireShared(holder("bob", 1), 0))),
			want: []string{tag(rules.RuleQueueHead) + msgAcquirerQueued}}),
		Entry("red team: a reader acquiring and joining the queue with the same requestID in one write", hostile{state: state{spec: rwSpec}, by: "bob",
			do:   update(acquireShared(holder("bob", 1), 0), enqueue(modeWaiter("bob", 1, locksv1alpha1.Shared))),
			want: []string{tag(rules.RuleQueueHead) + msgAcquirerQueued}}),
		// bob copies alice's requestID onto his own permit, first in the list:
		// alice's retried acquire finds bob's entry by requestID and fails
		// ("request ID … belongs to user bob"), her permit left to expire.
		Entry("red team: a permit taken with the requestID of another user's current permit", hostile{state: state{spec: sem3Spec, readers: []string{"alice"}}, by: "bob",
			do:   update(acquireShared(withRequest(holder("bob", 1), requestID("alice", 1)), 1), firstShared),
			want: []string{tag(rules.RuleLeaseID) + msgRequestID}}),

		// --- held: denied before the red team ------------------------------------------
		// Nothing counts it as an acquisition (status.fencingToken and
		// transitions unchanged); admission sees a new entry and wants the server's token.
		Entry("red team (held): a new permit with an older token, status.fencingToken and transitions unchanged", hostile{state: state{spec: sem3Spec, readers: []string{"alice"}}, by: "bob",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				token, transitions := l.Status.FencingToken, l.Status.Transitions
				acquireShared(holder("bob", 1), 1)(l)
				l.Status.SharedHolders[1].FencingToken = token - 1
				l.Status.FencingToken, l.Status.Transitions = token, transitions
			}),
			want: []string{tag(rules.RuleFencingToken) + "an acquisition's fencingToken must be the lock's resourceVersion + 1"}}),
		// A writer waiting behind readers turns into a reader in place to
		// take a slot beside them.
		Entry("red team (held): a waiter changing its mode in place", hostile{state: state{spec: rwSpec, readers: []string{"alice"}, waiters: []string{"carol"}}, by: "carol",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].Mode = locksv1alpha1.Shared }),
			want: []string{tag(rules.RuleQueue) + "queue entry " + requestID("carol", 1) + " cannot change; leave the queue and join again"}}),
		Entry("red team (held): a permit holder ending another's permit as Expired in the controller's name", hostile{state: state{spec: sem3Spec, readers: []string{"alice", "bob"}}, by: "bob",
			do:   update(endShared("alice", 1, locksv1alpha1.EndReasonExpired, controllerUser)),
			want: []string{tag(rules.RuleIdentity) + `endedBy must be the requesting user "bob", not "` + controllerUser + `"`}}),
	}
}
