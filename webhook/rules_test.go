package webhook

import (
	"strconv"
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
	return locksv1alpha1.Waiter{Identity: user + "-pod", User: user, RequestID: req, EnqueueTime: now, Deadline: metav1.NewMicroTime(now.Add(time.Minute))}
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
		// crd: the policy engine leaves this denial to the CRD's rules.
		crd bool
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
		// Rules the CRD left to admission (docs/design.md, "The CRD's rules").
		{name: "take over the holding in place, keeping its leaseID", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Status.Holder.User, l.Status.Holder.Identity = bob, "bob-pod"
		}, actor: Actor{Username: bob}, rule: RuleHolderFields},
		{name: "change the requestID while held", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.RequestID = "req-b" }, actor: Actor{Username: alice}, rule: RuleHolderFields},
		{name: "name a session while held", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Session = "s1" }, actor: Actor{Username: alice}, rule: RuleHolderFields},
		{name: "acquire without counting the transition", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Acquire(holder(alice, "l1", "r1"), 101)
			l.Status.Transitions--
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping},
		{name: "a renewal that counts a transition", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			renew(l)
			l.Status.Transitions++
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping},
		{name: "the controller resetting transitions", old: released(), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Transitions = 0 }, actor: Actor{Username: ctrlr, IsController: true}, rule: RuleBookkeeping},
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
			defer func() { expectPolicyAgrees(t, tc.old, next, tc.actor, errs, tc.crd) }()
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

func podActor(user, pod string) Actor {
	return Actor{Username: user, Extra: map[string][]string{ExtraPodName: {pod}, ExtraPodUID: {uidOf(pod)}}}
}

func podWaiter(user, req, pod string) locksv1alpha1.Waiter {
	w := waiter(user, req)
	w.PodName, w.PodUID = pod, uidOf(pod)
	return w
}

func podHeld(user, pod string) *locksv1alpha1.DistributedLock {
	l := free()
	h := holder(user, "lease-a", "req-a")
	h.PodName, h.PodUID = pod, uidOf(pod)
	l.Acquire(h, 101)
	l.ResourceVersion = "200"
	return l
}

func terminating(l *locksv1alpha1.DistributedLock) *locksv1alpha1.DistributedLock {
	ts := metav1.NewTime(now.Time)
	l.DeletionTimestamp = &ts
	return l
}

func perUser(l *locksv1alpha1.DistributedLock, n int32) *locksv1alpha1.DistributedLock {
	l.Spec.MaxWaitersPerUser = &n
	return l
}

func appendW(ws ...locksv1alpha1.Waiter) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		for _, w := range ws {
			l.Status.AppendWaiter(w)
		}
	}
}

func acquireAs(user, lease, req string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		token, _ := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		l.Acquire(holder(user, lease, req), token)
	}
}

// TestHardeningRules covers the rules of issue 13, each with the case it
// allows and the one it denies, by exact message.
func TestHardeningRules(t *testing.T) {
	later := func(d time.Duration) metav1.MicroTime { return metav1.NewMicroTime(now.Add(d)) }
	runRuleCases(t, []ruleCase{
		// bookkeeping
		{name: "observedGeneration set to generation", old: generation(free(), 4), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.ObservedGeneration = 4 }, actor: Actor{Username: alice}},
		{name: "observedGeneration forged", old: generation(free(), 4), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.ObservedGeneration = 99 }, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgObservedGeneration},
		{name: "controller sets any observedGeneration", old: generation(free(), 4), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.ObservedGeneration = 3 }, actor: Actor{Username: ctrlr, IsController: true}},
		{name: "foreign condition", old: free(), edit: addCondition("Frozen", metav1.ConditionTrue, "Attack"), actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "eight foreign conditions", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			for i := range locksv1alpha1.MaxConditions {
				addCondition("C"+string(rune('a'+i)), metav1.ConditionTrue, "Attack")(l)
			}
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "controller writes another condition", old: free(), edit: addCondition("Degraded", metav1.ConditionTrue, "Whatever"), actor: Actor{Username: ctrlr, IsController: true}},
		{name: "Held True without a holder", old: free(), edit: addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired), actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held False NeverHeld on a free lock", old: free(), edit: addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld), actor: Actor{Username: alice}},
		{name: "Held with an unknown reason", old: free(), edit: addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, "Whatever"), actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with a long message", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = strings.Repeat("é", locksv1alpha1.MaxConditionMessage+1)
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with a terminal escape in its message", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = "free \x1b[2J"
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with a bidi override in its message", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = "free \u202e"
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with a paragraph separator in its message (red team)", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = "free\u2029Released by alice"
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with 256 characters of message", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = strings.Repeat("é", locksv1alpha1.MaxConditionMessage)
		}, actor: Actor{Username: alice}},
		{name: "acquire without the Held condition", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			acquireAs(alice, "l1", "r1")(l)
			l.Status.Conditions = nil
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditionsInStep},
		{name: "release keeping Held True", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			c := l.Status.Conditions
			end(locksv1alpha1.EndReasonReleased, alice)(l)
			l.Status.Conditions = c
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditionsInStep},
		{name: "renew keeps conditions", old: heldBy(alice), edit: renew, actor: Actor{Username: alice}},
		// time-format: the decoded check (the raw one is TestValidateRawStatusTimes)
		{name: "history time that Go cannot marshal back", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			l.EndHolding(locksv1alpha1.EndReasonReleased, alice, metav1.NewMicroTime(time.Date(0, 1, 1, 0, 30, 0, 0, time.FixedZone("", 3600))))
		}, actor: Actor{Username: alice}, rule: RuleTimeFormat, msg: msgMicroTime, crd: true},
		// queue
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
		// pod-binding
		{name: "a pod acquires without its pod fields", old: free(), edit: acquireAs(bob, "l1", "r1"), actor: podActor(bob, "p0"), rule: RulePodBinding, msg: `holder.podUID "" is not the requesting pod's UID "` + uidOf("p0") + `"`},
		{name: "a pod enqueues without its pod fields", old: heldBy(alice), edit: appendW(waiter(bob, "b1")), actor: podActor(bob, "p0"), rule: RulePodBinding, msg: `waiter.podUID "" is not the requesting pod's UID "` + uidOf("p0") + `"`},
		{name: "a pod enqueues in another pod's name", old: heldBy(alice), edit: appendW(podWaiter(bob, "b1", "p1")), actor: podActor(bob, "p0"), rule: RulePodBinding, msg: `waiter.podName "p1" is not the requesting pod "p0"`},
		{name: "the holding pod renews", old: podHeld(bob, "p0"), edit: renew, actor: podActor(bob, "p0")},
		{name: "another pod renews", old: podHeld(bob, "p0"), edit: renew, actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodHolding},
		{name: "the same user without a pod renews a pod's holding", old: podHeld(bob, "p0"), edit: renew, actor: Actor{Username: bob}, rule: RulePodBinding, msg: msgPodHolding},
		{name: "another pod releases", old: podHeld(bob, "p0"), edit: end(locksv1alpha1.EndReasonReleased, bob), actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodHolding},
		{name: "the holding pod releases", old: podHeld(bob, "p0"), edit: end(locksv1alpha1.EndReasonReleased, bob), actor: podActor(bob, "p0")},
		{name: "the controller expires a pod's holding", old: podHeld(bob, "p0"), edit: end(locksv1alpha1.EndReasonExpired, ctrlr), actor: Actor{Username: ctrlr, IsController: true}},
		{name: "another pod removes a pod's entry", old: heldBy(alice, podWaiter(bob, "b1", "p0")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodWaiter},
		{name: "the pod removes its entry", old: heldBy(alice, podWaiter(bob, "b1", "p0")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: podActor(bob, "p0")},
		{name: "another pod acquires with a pod's head entry", old: queued(podWaiter(bob, "b1", "p0")), edit: func(l *locksv1alpha1.DistributedLock) {
			h := holder(bob, "l1", "b1")
			h.PodName, h.PodUID = "p1", uidOf("p1")
			l.Acquire(h, 101)
		}, actor: podActor(bob, "p1"), rule: RulePodBinding, msg: msgPodWaiter},
		{name: "the controller drops a pod's entry", old: heldBy(alice, podWaiter(bob, "b1", "p0")), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: Actor{Username: ctrlr, IsController: true}},
		// bookkeeping: managedFields (red team)
		{name: "a 17th managedFields apply entry", old: managers(heldBy(alice), MaxManagedFields), edit: addManager, actor: Actor{Username: bob}, rule: RuleBookkeeping, msg: msgManagedFields},
		{name: "a new update entry next to 16 apply entries", old: managers(heldBy(alice), MaxManagedFields), edit: func(l *locksv1alpha1.DistributedLock) {
			renew(l)
			l.ManagedFields = append(l.ManagedFields, metav1.ManagedFieldsEntry{Manager: "new-program", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"})
		}, actor: Actor{Username: alice}},
		{name: "a 16th managedFields entry", old: managers(heldBy(alice), MaxManagedFields-1), edit: addManager, actor: Actor{Username: bob}},
		{name: "a write that keeps 20 managedFields entries", old: managers(heldBy(alice), 20), edit: renew, actor: Actor{Username: alice}},
		{name: "the controller adds a 17th managedFields entry", old: managers(heldBy(alice), MaxManagedFields), edit: addManager, actor: Actor{Username: ctrlr, IsController: true}},
		// lease-id
		{name: "acquire with a finished leaseID", old: released(), edit: acquireAs(bob, "lease-a", "r2"), actor: Actor{Username: bob}, rule: RuleLeaseID, msg: msgLeaseID},
		{name: "acquire with a fresh leaseID", old: released(), edit: acquireAs(bob, "lease-b", "r2"), actor: Actor{Username: bob}},
		// terminating
		{name: "acquire a terminating lock", old: terminating(free()), edit: acquireAs(alice, "l1", "r1"), actor: Actor{Username: alice}, rule: RuleTerminating, msg: msgTerminating},
		{name: "join a terminating lock's queue", old: terminating(heldBy(alice)), edit: appendW(waiter(bob, "b1")), actor: Actor{Username: bob}, rule: RuleTerminating, msg: msgTerminating},
		{name: "release a terminating lock", old: terminating(heldBy(alice)), edit: end(locksv1alpha1.EndReasonReleased, alice), actor: Actor{Username: alice}},
		{name: "expire a terminating lock", old: terminating(heldBy(alice)), edit: end(locksv1alpha1.EndReasonExpired, ctrlr), actor: Actor{Username: ctrlr, IsController: true}},
		{name: "leave a terminating lock's queue", old: terminating(heldBy(alice, waiter(bob, "b1"))), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter("b1") }, actor: Actor{Username: bob}},
	})
}

// ruleCase is one write of a rule table: allowed, or denied by rule with msg.
type ruleCase struct {
	name  string
	old   *locksv1alpha1.DistributedLock
	edit  func(*locksv1alpha1.DistributedLock)
	actor Actor
	rule  Rule   // "" = allowed
	msg   string // part of the denial, when set
	// crd: the policy engine leaves this denial to the CRD's rules.
	crd bool
}

// runRuleCases checks each case with the webhook's rules, by exact message,
// and with the policy (expectPolicyAgrees).
func runRuleCases(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next := tc.old.DeepCopy()
			tc.edit(next)
			errs := ValidateStatusUpdate(tc.old, next, tc.actor)
			defer func() { expectPolicyAgrees(t, tc.old, next, tc.actor, errs, tc.crd) }()
			if tc.rule == "" {
				if len(errs) > 0 {
					t.Fatalf("denied: %v", errs.ToAggregate())
				}
				return
			}
			want := "[kubelock:" + string(tc.rule) + "] " + tc.msg
			if !strings.Contains(errs.ToAggregate().Error(), want) {
				t.Fatalf("got %v, want a denial with %q", errs.ToAggregate(), want)
			}
		})
	}
}

func generation(l *locksv1alpha1.DistributedLock, g int64) *locksv1alpha1.DistributedLock {
	l.Generation = g
	return l
}

func addCondition(typ string, status metav1.ConditionStatus, reason string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Status.Conditions = append(l.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(now.Time)})
	}
}

func deadlined(w locksv1alpha1.Waiter, d metav1.MicroTime) locksv1alpha1.Waiter {
	w.Deadline = d
	return w
}

func maxWaitOf(l *locksv1alpha1.DistributedLock, s int32) *locksv1alpha1.DistributedLock {
	l.Spec.MaxWaitSeconds = s
	return l
}

func TestValidateRawStatusTimes(t *testing.T) {
	cases := []struct {
		name, json string
		deny       string // "" = allowed, else the path of the denial
	}{
		{"Go's own times", `{"status":{"holder":{"acquireTime":"2026-11-29T09:00:00.123456Z","renewTime":"2026-11-29T09:00:01.000000+01:00"},"waiters":[{"enqueueTime":"2026-11-29T09:00:00.000000Z","deadline":"2026-11-29T10:00:00.000000Z"}],"recentAcquisitions":[{"endTime":"2026-11-29T09:00:00.000000Z"}],"conditions":[{"lastTransitionTime":"2026-11-29T09:00:00Z"},{"lastTransitionTime":"2026-11-29T09:00:00.5-02:30"}]}}`, ""},
		{"no status", `{"metadata":{}}`, ""},
		{"lower-case t in a condition", `{"status":{"conditions":[{"lastTransitionTime":"2026-11-29t09:00:00Z"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"lower-case z in a condition", `{"status":{"conditions":[{"lastTransitionTime":"2026-11-29T09:00:00z"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"local time without zone", `{"status":{"conditions":[{"lastTransitionTime":"2026-11-29T09:00:00"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"leap second", `{"status":{"conditions":[{"lastTransitionTime":"2026-12-31T23:59:60Z"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"30 February", `{"status":{"conditions":[{"lastTransitionTime":"2026-02-30T09:00:00Z"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"year 0 crossing into year -1", `{"status":{"conditions":[{"lastTransitionTime":"0000-01-01T00:30:00+01:00"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"a number", `{"status":{"conditions":[{"lastTransitionTime":1}]}}`, "status.conditions[0].lastTransitionTime"},
		{"micro digits missing", `{"status":{"waiters":[{"enqueueTime":"2026-11-29T09:00:00Z","deadline":"2026-11-29T10:00:00.000000Z"}]}}`, "status.waiters[0].enqueueTime"},
		{"nine fraction digits in a MicroTime", `{"status":{"holder":{"acquireTime":"2026-11-29T09:00:00.123456789Z"}}}`, "status.holder.acquireTime"},
		{"year 9999 crossing into 10000", `{"status":{"recentAcquisitions":[{"endTime":"9999-12-31T23:30:00.000000-01:00"}]}}`, "status.recentAcquisitions[0].endTime"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateRawStatusTimes([]byte(tc.json))
			if tc.deny == "" {
				if len(errs) > 0 {
					t.Fatalf("denied: %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) != 1 || errs[0].Field != tc.deny || !strings.Contains(errs[0].Error(), "[kubelock:time-format] ") {
				t.Fatalf("got %v, want one time-format denial at %s", errs.ToAggregate(), tc.deny)
			}
		})
	}
}

// TestTimePatternsMatchGo holds the CRD patterns to Go's parsers: what Go's
// types marshal is accepted; what they cannot read back is refused.
func TestTimePatternsMatchGo(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 29, 9, 0, 0, 999999999, time.FixedZone("", -9*3600-1800)),
		time.Date(2, 1, 1, 0, 30, 0, 0, time.FixedZone("", 3600)),
		time.Date(9998, 12, 31, 23, 30, 0, 0, time.FixedZone("", -3600)),
		time.Date(9998, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Now(),
	} {
		mb, _ := metav1.NewMicroTime(tm).MarshalJSON()
		tb, _ := metav1.NewTime(tm).MarshalJSON()
		ms, ts := strings.Trim(string(mb), `"`), strings.Trim(string(tb), `"`)
		if !ValidMicroTime(ms) || !microTimeRE.MatchString(ms) {
			t.Errorf("MicroTime %s refused", ms)
		}
		if !ValidTime(ts) || !timeRE.MatchString(ts) {
			t.Errorf("Time %s refused", ts)
		}
	}
	for _, s := range []string{"2026-11-29t09:00:00.000000Z", "2026-11-29T09:00:00.000000z", "2026-11-29T09:00:00Z", "2026-11-29T09:00:00.0000000Z",
		"2026-11-29T09:00:60.000000Z", "2026-11-29T09:00:00.000000", "2026-11-29 09:00:00.000000Z", "0000-01-01T00:30:00.000000+01:00", "9999-12-31T23:30:00.000000-01:00",
		"0001-01-01T00:00:00.000000Z", "0001-12-31T23:00:00.000000+01:00", "9999-01-01T00:00:00.000000+00:00"} {
		if microTimeRE.MatchString(s) {
			t.Errorf("MicroTime pattern accepts %s", s)
		}
	}
}

// managers gives l n managedFields entries.
func managers(l *locksv1alpha1.DistributedLock, n int) *locksv1alpha1.DistributedLock {
	for range n {
		addManager(l)
	}
	return l
}

// addManager adds one managedFields entry, as a server-side apply under a new fieldManager does.
func addManager(l *locksv1alpha1.DistributedLock) {
	l.ManagedFields = append(l.ManagedFields, metav1.ManagedFieldsEntry{
		Manager: "m" + strconv.Itoa(len(l.ManagedFields)), Operation: metav1.ManagedFieldsOperationApply, Subresource: "status",
	})
}
