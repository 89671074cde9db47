package controllers

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// timing holds the controller's configurable durations.
type timing struct {
	// grace is added to every lease before the controller expires it.
	grace time.Duration
	// idleTimeout is how long an auto-created lock stays idle before it is deleted.
	idleTimeout time.Duration
}

// dropReason says why a waiter left the queue.
type dropReason string

const (
	// dropWaitTimeout: the waiter's own deadline passed.
	dropWaitTimeout dropReason = "WaitTimeout"
	// dropHandoffTimeout: the head did not claim the free lock in time.
	dropHandoffTimeout dropReason = "HandoffTimeout"
)

// droppedWaiter is a waiter the controller removes from the queue.
type droppedWaiter struct {
	requestID string
	identity  string
	reason    dropReason
}

// decision is what one reconcile does to a lock.
type decision struct {
	// expire ends the current holding with endReason Expired.
	expire bool
	// drop removes these waiters from the queue.
	drop []droppedWaiter
	// delete removes an idle auto-created lock.
	delete bool
	// requeueAfter is the time to the nearest future deadline; 0 when there is none.
	requeueAfter time.Duration
}

// decide is the controller's whole judgement about lock, given what it observed
// of it (obs, folded in by observe at or before now). It is a pure function.
func decide(lock *locksv1alpha1.DistributedLock, obs observation, now time.Time, t timing) decision {
	var d decision
	next := deadlines{now: now}
	s := &lock.Status

	// 1. Expiry: no renewal observed for the holder's lease plus grace.
	if h := s.Holder; h != nil && obs.holding != nil {
		at := obs.holding.renewSeen.Add(seconds(h.LeaseDurationSeconds) + t.grace)
		d.expire = next.due(at)
	}

	// 2. Waiters whose wait is over, measured on this controller's clock from
	// when it first saw them: first seen + (deadline - enqueueTime).
	dropped := map[string]bool{}
	for _, w := range s.Waiters {
		seen, ok := obs.waiters[w.RequestID]
		if !ok {
			continue
		}
		if next.due(seen.Add(max(0, w.Deadline.Sub(w.EnqueueTime.Time)))) {
			d.drop = append(d.drop, droppedWaiter{requestID: w.RequestID, identity: w.Identity, reason: dropWaitTimeout})
			dropped[w.RequestID] = true
		}
	}

	// 3. Hand-off: the head of a free lock that has not claimed it in time. Its
	// successor's time starts when this controller sees it at the head.
	if s.Holder == nil && obs.freeHead != "" && !dropped[obs.freeHead] && len(s.Waiters) > 0 && s.Waiters[0].RequestID == obs.freeHead {
		head := s.Waiters[0]
		if next.due(obs.freeHeadSince.Add(seconds(handoffTimeout(lock)))) {
			d.drop = append(d.drop, droppedWaiter{requestID: head.RequestID, identity: head.Identity, reason: dropHandoffTimeout})
		}
	}

	// 4. Garbage collection of auto-created locks that stayed idle.
	if isAutoCreated(lock) && s.Holder == nil && len(s.Waiters) == 0 && obs.idle && obs.idleToken == s.FencingToken {
		d.delete = next.due(obs.idleSince.Add(t.idleTimeout))
	}

	if d.expire || len(d.drop) > 0 || d.delete {
		// Acting changes the lock; the deadlines are computed again from the result.
		return d
	}
	d.requeueAfter = next.after()
	return d
}

// desiredStatus returns lock with decision d applied and its bookkeeping
// (observedGeneration, the Held condition) made consistent. endedBy is the
// controller's user name. lock itself is not modified.
func desiredStatus(lock *locksv1alpha1.DistributedLock, d decision, endedBy string, now time.Time) *locksv1alpha1.DistributedLock {
	out := lock.DeepCopy()
	if pristine(lock) {
		// Nobody ever wrote this lock's status: leave it alone rather than
		// spend a write per created lock, which at 100,000 new locks queues
		// every expiry behind 100,000 bookkeeping writes.
		return out
	}
	if d.expire && out.Status.Holder != nil {
		out.EndHolding(locksv1alpha1.EndReasonExpired, endedBy, metav1.NewMicroTime(now))
	}
	for _, w := range d.drop {
		out.Status.RemoveWaiter(w.requestID)
	}
	out.Status.ObservedGeneration = out.Generation
	if c := heldCondition(out); c != nil {
		meta.SetStatusCondition(&out.Status.Conditions, *c)
	}
	// Held is the only condition a lock has; anything else was written
	// before admission refused it and could fill the list (issue 13).
	if held := meta.FindStatusCondition(out.Status.Conditions, locksv1alpha1.ConditionHeld); held != nil && len(out.Status.Conditions) > 1 {
		out.Status.Conditions = []metav1.Condition{*held}
	}
	return out
}

// pristine reports whether lock's status was never written: no holding, no
// queue, no history, no condition.
func pristine(lock *locksv1alpha1.DistributedLock) bool {
	s := &lock.Status
	return s.Holder == nil && s.Transitions == 0 && len(s.Waiters) == 0 &&
		len(s.RecentAcquisitions) == 0 && len(s.Conditions) == 0 && s.ObservedGeneration == 0
}

// heldCondition is the Held condition lock should carry, or nil when the one it
// carries is consistent with the holder and the generation. A consistent
// condition written by a client is kept as it is.
func heldCondition(lock *locksv1alpha1.DistributedLock) *metav1.Condition {
	s := &lock.Status
	want := metav1.ConditionFalse
	if s.Holder != nil {
		want = metav1.ConditionTrue
	}
	cur := meta.FindStatusCondition(s.Conditions, locksv1alpha1.ConditionHeld)
	if cur != nil && cur.Status == want {
		if cur.ObservedGeneration == lock.Generation {
			return nil
		}
		c := *cur
		c.ObservedGeneration = lock.Generation
		return &c
	}
	c := metav1.Condition{Type: locksv1alpha1.ConditionHeld, Status: want, ObservedGeneration: lock.Generation}
	switch {
	case s.Holder != nil:
		c.Reason = locksv1alpha1.ReasonAcquired
		c.Message = fmt.Sprintf("held by %s with fencing token %d", s.Holder.Identity, s.FencingToken)
	case len(s.RecentAcquisitions) > 0:
		last := s.RecentAcquisitions[len(s.RecentAcquisitions)-1]
		c.Reason = string(last.EndReason)
		c.Message = fmt.Sprintf("%s by %s", last.EndReason, last.EndedBy)
	case s.Transitions > 0:
		c.Reason = locksv1alpha1.ReasonReleased
		c.Message = "free"
	default:
		c.Reason = locksv1alpha1.ReasonNeverHeld
		c.Message = "never held"
	}
	c.Message = locksv1alpha1.ConditionMessage(c.Message)
	return &c
}

// deadlines tracks the nearest future deadline seen while deciding.
type deadlines struct {
	now     time.Time
	nearest time.Time
}

// due reports whether at has passed; a future at becomes a requeue candidate.
func (n *deadlines) due(at time.Time) bool {
	if !at.After(n.now) {
		return true
	}
	if n.nearest.IsZero() || at.Before(n.nearest) {
		n.nearest = at
	}
	return false
}

// after is the time from now to the nearest future deadline, 0 when there is none.
func (n *deadlines) after() time.Duration {
	if n.nearest.IsZero() {
		return 0
	}
	return n.nearest.Sub(n.now)
}

func seconds(s int32) time.Duration { return time.Duration(s) * time.Second }

// handoffTimeout is spec.handoffTimeoutSeconds with its default applied.
func handoffTimeout(lock *locksv1alpha1.DistributedLock) int32 {
	if lock.Spec.HandoffTimeoutSeconds > 0 {
		return lock.Spec.HandoffTimeoutSeconds
	}
	return locksv1alpha1.DefaultHandoffTimeoutSeconds
}

func isAutoCreated(lock *locksv1alpha1.DistributedLock) bool {
	return lock.Labels[locksv1alpha1.AutoCreatedLabel] == "true"
}
