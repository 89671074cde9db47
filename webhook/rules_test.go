package webhook

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

const (
	alice = "alice"
	bob   = "bob"
	ctrlr = "system:serviceaccount:kubelock-system:kubelock-controller-manager"
)

var now = metav1.NewMicroTime(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))

func free() *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", ResourceVersion: "100"},
		Status:     locksv1alpha1.DistributedLockStatus{FencingToken: 50, Transitions: 3},
	}
}

func holder(user, lease, req string) locksv1alpha1.LockHolder {
	return locksv1alpha1.LockHolder{Identity: user + "-pod", User: user, LeaseID: lease, RequestID: req, LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}
}

func waiter(user, req string) locksv1alpha1.Waiter {
	return locksv1alpha1.Waiter{Identity: user + "-pod", User: user, RequestID: req, EnqueueTime: now, Deadline: now}
}

// heldBy returns a lock held by user with lease "lease-a", at resourceVersion 200.
func heldBy(user string, waiters ...locksv1alpha1.Waiter) *locksv1alpha1.DistributedLock {
	l := free()
	for _, w := range waiters {
		l.Status.AppendWaiter(w)
	}
	l.Acquire(holder(user, "lease-a", "req-a"), 101)
	l.ResourceVersion = "200"
	return l
}

func TestValidateStatusUpdate(t *testing.T) {
	cases := []struct {
		name  string
		old   *locksv1alpha1.DistributedLock
		edit  func(*locksv1alpha1.DistributedLock)
		actor Actor
		rule  Rule // "" = allowed
	}{
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
		{name: "renew by the holder", old: heldBy(alice), edit: renew, actor: Actor{Username: alice}},
		{name: "renew by another user", old: heldBy(alice), edit: renew, actor: Actor{Username: bob}, rule: RuleHolderOnly},
		{name: "change the lease while held", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseDurationSeconds = 3600 }, actor: Actor{Username: alice}, rule: RuleHolderFields},
		{name: "steal with another leaseID", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseID = "lease-b" }, actor: Actor{Username: alice}, rule: RuleHolderOnly},
		{name: "change the token while held", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken++ }, actor: Actor{Username: alice}, rule: RuleFencingToken},
		{name: "release by the holder", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonReleased, alice), actor: Actor{Username: alice}},
		{name: "release by another user", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonReleased, bob), actor: Actor{Username: bob}, rule: RuleHolderOnly},
		{name: "release recorded in someone else's name", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonReleased, bob), actor: Actor{Username: alice}, rule: RuleIdentity},
		{name: "release without a record", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder = nil }, actor: Actor{Username: alice}, rule: RuleEndRecord},
		{name: "release with a wrong record", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			end(locksv1alpha1.EndReasonReleased, alice)(l)
			l.Status.RecentAcquisitions[0].FencingToken = 7
		}, actor: Actor{Username: alice}, rule: RuleEndRecord},
		{name: "expire by the controller", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonExpired, ctrlr), actor: Actor{Username: ctrlr, IsController: true}},
		{name: "expire by a user", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonExpired, bob), actor: Actor{Username: bob}, rule: RuleControllerOnly},
		{name: "force-release with the verb", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonForceReleased, bob), actor: Actor{Username: bob, CanForceRelease: true}},
		{name: "force-release without the verb", old: heldBy(alice), edit: end(locksv1alpha1.EndReasonForceReleased, bob), actor: Actor{Username: bob}, rule: RuleForceRelease},
		{name: "rewrite history", old: released(), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions[0].EndedBy = bob }, actor: Actor{Username: bob}, rule: RuleHistory},
		{name: "drop history", old: released(), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RecentAcquisitions = nil }, actor: Actor{Username: alice}, rule: RuleHistory},
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
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next := tc.old.DeepCopy()
			tc.edit(next)
			errs := ValidateStatusUpdate(tc.old, next, tc.actor)
			if tc.rule == "" {
				if len(errs) > 0 {
					t.Fatalf("denied: %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("allowed, want a denial by rule %s", tc.rule)
			}
			tag := "[kubelock:" + string(tc.rule) + "]"
			if !strings.Contains(errs.ToAggregate().Error(), tag) {
				t.Fatalf("denied with %v, want rule %s", errs.ToAggregate(), tc.rule)
			}
			if ruleOf(errs[0]) == "internal" {
				t.Fatalf("denial without a rule tag: %v", errs[0])
			}
		})
	}
}

func TestValidateDelete(t *testing.T) {
	forced := heldBy(alice)
	forced.Annotations = map[string]string{locksv1alpha1.ForceDeleteAnnotation: "true"}
	cases := []struct {
		name  string
		lock  *locksv1alpha1.DistributedLock
		actor Actor
		deny  bool
	}{
		{name: "free lock", lock: free(), actor: Actor{Username: bob}},
		{name: "held lock", lock: heldBy(alice), actor: Actor{Username: alice}, deny: true},
		{name: "held lock with the annotation", lock: forced, actor: Actor{Username: bob}},
		{name: "held lock with the force-release verb", lock: heldBy(alice), actor: Actor{Username: bob, CanForceRelease: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateDelete(tc.lock, tc.actor)
			if got := len(errs) > 0; got != tc.deny {
				t.Fatalf("denied = %v (%v), want %v", got, errs.ToAggregate(), tc.deny)
			}
			if tc.deny && !strings.Contains(errs.ToAggregate().Error(), "[kubelock:held-delete]") {
				t.Fatalf("message %v lacks the rule", errs.ToAggregate())
			}
		})
	}
}

func TestNeedsForceCheckOnlyForForceRelease(t *testing.T) {
	for reason, want := range map[locksv1alpha1.EndReason]bool{
		locksv1alpha1.EndReasonReleased: false, locksv1alpha1.EndReasonExpired: false, locksv1alpha1.EndReasonForceReleased: true,
	} {
		old := heldBy(alice)
		next := old.DeepCopy()
		end(reason, bob)(next)
		if got := NeedsForceCheck(old, next); got != want {
			t.Errorf("%s: NeedsForceCheck = %v, want %v", reason, got, want)
		}
	}
}

func queued(ws ...locksv1alpha1.Waiter) *locksv1alpha1.DistributedLock {
	l := free()
	for _, w := range ws {
		l.Status.AppendWaiter(w)
	}
	return l
}

func released() *locksv1alpha1.DistributedLock {
	l := heldBy(alice)
	l.EndHolding(locksv1alpha1.EndReasonReleased, alice, now)
	return l
}

func renew(l *locksv1alpha1.DistributedLock) {
	t := metav1.NewMicroTime(now.Add(time.Second))
	l.Status.Holder.RenewTime = &t
}

func end(reason locksv1alpha1.EndReason, by string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.EndHolding(reason, by, now) }
}
