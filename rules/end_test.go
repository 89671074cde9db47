package rules

import (
	"errors"
	"slices"
	"strings"
	"testing"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestEndRules: each holding that ends is recorded in the same write, with
// an endReason its writer may give; force-release needs the verb. Each case
// is judged by the rules, by rule and message, and by the policy.
func TestEndRules(t *testing.T) {
	runRuleCases(t, []ruleCase{
		// the exclusive holder
		{name: "release recorded in someone else's name", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonReleased, bob), actor: Actor{Username: alice}, rule: RuleIdentity},
		{name: "release without a record", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder = nil }, actor: Actor{Username: alice}, rule: RuleEndRecord},
		{name: "release with a wrong record", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			end(locksv1alpha1.EndReasonReleased, alice)(l)
			l.Status.RecentAcquisitions[0].FencingToken = 7
		}, actor: Actor{Username: alice}, rule: RuleEndRecord},
		{name: "expire by the controller", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonExpired, ctrlr), actor: Actor{Username: ctrlr, IsController: true}},
		{name: "expire by a user", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonExpired, bob), actor: Actor{Username: bob}, rule: RuleControllerOnly},
		{name: "force-release with the verb", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonForceReleased, bob), actor: Actor{Username: bob, Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}},
		{name: "force-release without the verb", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonForceReleased, bob), actor: Actor{Username: bob}, rule: RuleForceRelease},
		{name: "rewrite history", old: released(), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions[0].EndedBy = bob }, actor: Actor{Username: bob}, rule: RuleHistory},
		{name: "drop history", old: released(), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions = nil }, actor: Actor{Username: alice}, rule: RuleHistory},
		{name: "the controller expires a pod's holding", old: podHeld(bob, "p0"), edit: end(locksv1alpha1.EndReasonExpired, ctrlr), actor: Actor{Username: ctrlr, IsController: true}},
		{name: "expire a terminating lock", old: terminating(heldBy(alice)), edit: end(locksv1alpha1.EndReasonExpired, ctrlr), actor: Actor{Username: ctrlr, IsController: true}},

		// shared entries
		{name: "the controller expires two entries in one write", old: reading(typed(sem, 3), alice, bob, carol),
			edit: edits(endShared("lease-alice", locksv1alpha1.EndReasonExpired, ctrlr), endShared("lease-carol", locksv1alpha1.EndReasonSessionClosed, ctrlr)), actor: ctl},
		{name: "force-release ends every permit", old: reading(typed(sem, 3), alice, bob, carol),
			edit:  edits(endShared("lease-alice", locksv1alpha1.EndReasonForceReleased, "op"), endShared("lease-bob", locksv1alpha1.EndReasonForceReleased, "op"), endShared("lease-carol", locksv1alpha1.EndReasonForceReleased, "op")),
			actor: Actor{Username: "op", Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}},
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
	})
}

// The force-release verb is asked (a SubjectAccessReview is not free) only
// of a write that records a holding as ForceReleased, and once per write.
func TestForceReleaseIsAskedOnlyForForceReleased(t *testing.T) {
	for reason, want := range map[locksv1alpha1.EndReason]bool{
		locksv1alpha1.EndReasonReleased: false, locksv1alpha1.EndReasonExpired: false, locksv1alpha1.EndReasonForceReleased: true,
	} {
		old := heldBy(alice)
		next := old.DeepCopy()
		end(reason, bob)(next)
		a, r := recording(Actor{Username: bob})
		ValidateStatusUpdate(old, next, a)
		if got := slices.Contains(r.asked, locksv1alpha1.ForceReleaseVerb); got != want {
			t.Errorf("%s: asked for force-release = %v, want %v", reason, got, want)
		}
	}
}

func TestForceReleaseIsAskedOnlyForForceReleasedSharedEnds(t *testing.T) {
	old := reading(typed(locksv1alpha1.Semaphore, 3), alice, bob)
	for reason, want := range map[locksv1alpha1.EndReason]bool{
		locksv1alpha1.EndReasonReleased: false, locksv1alpha1.EndReasonExpired: false, locksv1alpha1.EndReasonForceReleased: true,
	} {
		next := old.DeepCopy()
		endShared("lease-alice", locksv1alpha1.EndReasonExpired, ctrlr)(next)
		endShared("lease-bob", reason, bob)(next)
		a, r := recording(Actor{Username: bob})
		ValidateStatusUpdate(old, next, a)
		if got := slices.Contains(r.asked, locksv1alpha1.ForceReleaseVerb); got != want {
			t.Errorf("%s: asked for force-release = %v, want %v", reason, got, want)
		}
	}
	renewed := old.DeepCopy()
	renewShared("lease-bob")(renewed)
	a, r := recording(Actor{Username: bob})
	ValidateStatusUpdate(old, renewed, a)
	if len(r.asked) > 0 {
		t.Errorf("a renewal asked for %v", r.asked)
	}
	forced := old.DeepCopy()
	endShared("lease-alice", locksv1alpha1.EndReasonForceReleased, "op")(forced)
	endShared("lease-bob", locksv1alpha1.EndReasonForceReleased, "op")(forced)
	a, r = recording(Actor{Username: "op", Authorizer: allow(locksv1alpha1.ForceReleaseVerb)})
	if errs := ValidateStatusUpdate(old, forced, a); len(errs) > 0 || len(r.asked) != 1 {
		t.Errorf("force-release of two permits: %v, asked %v, want admitted and one check", errs.ToAggregate(), r.asked)
	}
}

// A check that cannot be made fails the write: it is neither admitted nor
// denied by a rule.
func TestForceReleaseCheckThatFails(t *testing.T) {
	old := heldBy(alice)
	next := old.DeepCopy()
	end(locksv1alpha1.EndReasonForceReleased, bob)(next)
	broken := AuthorizerFunc(func(Check) (bool, error) { return false, errors.New("connection refused") })
	errs := ValidateStatusUpdate(old, next, Actor{Username: bob, Authorizer: broken})
	if !Failed(errs) || !strings.Contains(errs.ToAggregate().Error(), "connection refused") {
		t.Fatalf("got %v, want a failed check", errs.ToAggregate())
	}
}

func TestSessionEndReasonsAreTheController(t *testing.T) {
	for _, r := range []locksv1alpha1.EndReason{locksv1alpha1.EndReasonSessionExpired, locksv1alpha1.EndReasonSessionClosed} {
		for _, a := range []Actor{{Username: alice}, {Username: ctrlr, IsController: true}} {
			o := heldBy(alice)
			n := o.DeepCopy()
			end(r, a.Username)(n)
			errs := ValidateStatusUpdate(o, n, a)
			if got := len(errs) == 0; got != a.IsController {
				t.Errorf("%s by %s: admitted %v, want %v: %v", r, a.Username, got, a.IsController, errs)
			}
		}
	}
}
