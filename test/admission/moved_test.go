package admission

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
)

// The transition rules the CRD's CEL left to admission, so that a
// write costs less schema work (the table in docs/design.md, "The CRD's rules").
// Each case below was refused by the CRD itself, with admission off too. Now
// the apiserver stores it when no admission engine runs, and each engine
// refuses it with its rule's message, leaving the lock unchanged.

// movedCase is one such write.
type movedCase struct {
	name string
	h    hostile
}

const msgTransitions = "status.transitions must grow by exactly one on each acquisition and stay unchanged otherwise"

func movedCases() []movedCase {
	holderOnly, holderFields, fencingToken := tag(rules.RuleHolderOnly), tag(rules.RuleHolderFields), tag(rules.RuleFencingToken)
	endRecord, bookkeeping, slot := tag(rules.RuleEndRecord), tag(rules.RuleBookkeeping), tag(rules.RuleSlot)
	passes := func(from, to string) string {
		return holderOnly + "a held lock cannot pass to another leaseID (" + from + " → " + to + "); it must be released first"
	}
	heldFields := holderFields + "while lease " + leaseID("alice", 1) + " is held only holder.renewTime may change"
	rwReaders := state{spec: rwSpec, readers: []string{"alice", "bob"}}
	return []movedCase{
		// --- a holding keeps its leaseID, user, identity and requestID ----------------
		{"renew by the holder's user with its old leaseID", hostile{state: heldHistory, by: "alice",
			do:   update(renew, func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseID = leaseID("alice", 0) }),
			want: []string{passes(leaseID("alice", 1), leaseID("alice", 0))}}},
		{"JSON merge patch that sets another holder on a held lock", hostile{state: held, by: "bob",
			do:   patch(types.MergePatchType, map[string]any{"status": map[string]any{"holder": holderJSON("bob", 1)}}),
			want: []string{passes(leaseID("alice", 1), leaseID("bob", 1))}}},
		{"JSON patch that replaces the holder of a held lock", hostile{state: held, by: "bob",
			do:   patch(types.JSONPatchType, []map[string]any{{"op": "replace", "path": "/status/holder", "value": holderJSON("bob", 1)}}),
			want: []string{passes(leaseID("alice", 1), leaseID("bob", 1))}}},
		{"server-side apply that takes ownership of the holder", hostile{state: held, by: "bob",
			do:   apply(map[string]any{"holder": holderJSON("bob", 1)}),
			want: []string{passes(leaseID("alice", 1), leaseID("bob", 1))}}},
		{"taking over a holding in place: its user and identity rewritten, its leaseID kept", hostile{state: held, by: "bob",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				l.Status.Holder.User, l.Status.Holder.Identity = "bob", "bob"
			}),
			want: []string{heldFields}}},
		{"the holder changing its requestID while it holds", hostile{state: held, by: "alice",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.RequestID = requestID("alice", 9) }),
			want: []string{heldFields}}},

		// --- an ending holding is recorded ---------------------------------------------
		{"release by the holder's user with another leaseID in the record", hostile{state: held, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				lastRecord(l).LeaseID = leaseID("alice", 7)
			}),
			want: []string{endRecord + "the record must describe the ending holding: leaseID " + leaseID("alice", 1)}}},
		{"release without the record", hostile{state: held, by: "alice",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.Holder, l.Status.HolderCount = nil, 0 }),
			want: []string{endRecord + "ending the holding of lease " + leaseID("alice", 1) + " must append exactly its record"}}},
		{"JSON patch that removes the holder without a record", hostile{state: held, by: "bob",
			do: patch(types.JSONPatchType, []map[string]any{
				{"op": "remove", "path": "/status/holder"}, {"op": "replace", "path": "/status/holderCount", "value": 0},
			}),
			want: []string{endRecord + "ending the holding of lease " + leaseID("alice", 1) + " must append exactly its record"}}},

		// --- the token changes only with an acquisition, to the server's value ---------
		{"acquire with a token equal to the current one", hostile{state: freeHistory, by: "bob",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder("bob", 1), l.Status.FencingToken) }),
			want: []string{fencingToken + "an acquisition's fencingToken must be the lock's resourceVersion + 1"}}},
		{"a renewal that raises the token", hostile{state: held, by: "alice", do: update(renew, tokenDelta(+1)),
			want: []string{fencingToken + "fencingToken changes only when a lock is acquired; it is "}}},
		{"a reader raising status.fencingToken with a renewal", hostile{state: rwReaders, by: "bob",
			do:   update(renewShared("bob", 1), tokenDelta(+1)),
			want: []string{fencingToken + "fencingToken changes only when a lock is acquired; it is "}}},
		{"a new reader whose own token is above status.fencingToken", hostile{state: state{spec: rwSpec, readers: []string{"alice"}}, by: "bob",
			do: update(acquireShared(holder("bob", 1), 1), func(l *locksv1alpha1.DistributedLock) {
				l.Status.SharedHolders[1].FencingToken++
			}),
			want: []string{fencingToken + "a new shared holding's fencingToken must be the lock's resourceVersion + 1"}}},

		// --- transitions counts the acquisitions ------------------------------------------
		{"acquire without counting the transition", hostile{state: freeHistory, by: "bob",
			do:   update(acquire(holder("bob", 1)), func(l *locksv1alpha1.DistributedLock) { l.Status.Transitions-- }),
			want: []string{bookkeeping + msgTransitions}}},
		{"a renewal that counts a transition", hostile{state: held, by: "alice",
			do:   update(renew, func(l *locksv1alpha1.DistributedLock) { l.Status.Transitions++ }),
			want: []string{bookkeeping + msgTransitions}}},
		{"the controller resetting transitions", hostile{state: freeHistory, by: controllerUser,
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.Transitions = 0 }),
			want: []string{bookkeeping + msgTransitions}}},

		// --- a shared holding keeps everything but renewTime, on its slot ------------------
		{"changing an existing reader's token", hostile{state: rwReaders, by: "bob",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[1].FencingToken-- }),
			want: []string{slot + msgSharedKept}}},
		{"red team (held): replacing another reader's entry at its slot in one write", hostile{state: rwReaders, by: "bob",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[0].LockHolder = holder("bob", 2) }),
			want: []string{holderOnly + "a shared holding cannot pass to another leaseID (" + leaseID("alice", 1) + " → " + leaseID("bob", 2) + ")"}}},
		{"taking over another reader's entry in place: its user and identity rewritten", hostile{state: rwReaders, by: "bob",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				e := &l.Status.SharedHolders[0]
				e.User, e.Identity = "bob", "bob"
			}),
			want: []string{holderFields + "while lease " + leaseID("alice", 1) + " is held only its renewTime may change"}}},
		{"a reader changing its requestID while it holds", hostile{state: rwReaders, by: "alice",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[0].RequestID = requestID("alice", 9) }),
			want: []string{holderFields + "while lease " + leaseID("alice", 1) + " is held only its renewTime may change"}}},
	}
}

// movedEntries are the cases for the hostile table, which runs them with each engine.
func movedEntries() []TableEntry {
	var es []TableEntry
	for _, c := range movedCases() {
		es = append(es, Entry("left to admission by the CRD: "+c.name, c.h))
	}
	return es
}

// storedWithoutAdmission makes h's write with no admission engine and
// expects the apiserver to store it: the CRD no longer refuses it.
func storedWithoutAdmission(ctx context.Context, ns string, h hostile) {
	key := h.state.build(ctx, ns)
	if h.setup != nil {
		h.setup(ctx, key)
	}
	before := get(ctx, key)
	Expect(h.do(ctx, actor(h.by), key)).To(Succeed(), "the CRD refuses it; it is admission's: %s", h.want[0])
	Expect(get(ctx, key).ResourceVersion).NotTo(Equal(before.ResourceVersion))
}

var _ = Describe("rules the CRD left to admission, with no admission engine", Ordered, func() {
	var ns string
	BeforeAll(func(ctx SpecContext) {
		activate(ctx, engineNone)
		ns = namespace(ctx, "adm-none")
	})
	for _, c := range movedCases() {
		It("stores "+c.name, func(ctx SpecContext) { storedWithoutAdmission(ctx, ns, c.h) })
	}
	// A holding's session, too (the session table runs the engines).
	It("stores a holding and a permit moved to another session of their user", func(ctx SpecContext) {
		key, other := heldInSession(ctx, ns, "alice", locksv1alpha1.DistributedLockSpec{})
		Expect(write(ctx, alice, key, func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Session = other.Name })).To(Succeed())
		key, other = heldInSession(ctx, ns, "alice", sem3Spec)
		Expect(write(ctx, alice, key, func(l *locksv1alpha1.DistributedLock) { l.Status.SharedHolders[0].Session = other.Name })).To(Succeed())
	})
})

// heldInSession is a lock in ns of spec that user holds in a session of its
// own (holding number 1; shared on slot 0 when the type has no exclusive
// mode), and a second session of the same user.
func heldInSession(ctx context.Context, ns, user string, spec locksv1alpha1.DistributedLockSpec) (client.ObjectKey, *locksv1alpha1.LockSession) {
	s, other := sessionOf(ns, user), sessionOf(ns, user)
	for _, x := range []*locksv1alpha1.LockSession{s, other} {
		Expect(who(user).c.Create(ctx, x)).To(Succeed())
	}
	l := createLock(ctx, ns, spec)
	h := holder(user, 1)
	h.Session = s.Name
	take := acquire(h)
	if !l.Supports(locksv1alpha1.Exclusive) {
		take = acquireShared(h, 0)
	}
	key := client.ObjectKeyFromObject(l)
	Expect(write(ctx, who(user), key, take)).To(Succeed())
	return key, other
}

// movedSessionEntries: a holding or a permit moved to another session of its
// user is refused by both engines (the session table runs them).
func movedSessionEntries() []TableEntry {
	move := func(spec locksv1alpha1.DistributedLockSpec, edit func(l *locksv1alpha1.DistributedLock, session string)) func(context.Context, *user, *locksv1alpha1.LockSession) error {
		return func(ctx context.Context, u *user, s *locksv1alpha1.LockSession) error {
			key, other := heldInSession(ctx, s.Namespace, u.name, spec)
			return write(ctx, u, key, func(l *locksv1alpha1.DistributedLock) { edit(l, other.Name) })
		}
	}
	held := "while lease " + leaseID("alice", 1) + " is held only "
	return []TableEntry{
		Entry("left to admission by the CRD: a holding moved to another session of its user", sessionHostile{owner: "alice", by: "alice",
			do:   move(locksv1alpha1.DistributedLockSpec{}, func(l *locksv1alpha1.DistributedLock, s string) { l.Status.Holder.Session = s }),
			want: []string{tag(rules.RuleHolderFields) + held + "holder.renewTime may change"}, lock: true}),
		Entry("left to admission by the CRD: a permit moved to another session of its user", sessionHostile{owner: "alice", by: "alice",
			do:   move(sem3Spec, func(l *locksv1alpha1.DistributedLock, s string) { l.Status.SharedHolders[0].Session = s }),
			want: []string{tag(rules.RuleHolderFields) + held + "its renewTime may change"}, lock: true}),
	}
}
