package controllers

import (
	"fmt"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// timing holds the controller's configurable durations (WithExpiryGrace, WithIdleTimeout).
type timing struct{ grace, idleTimeout time.Duration }

// dropReason says why a waiter left the queue.
type dropReason string

const (
	// dropWaitTimeout: the waiter's own deadline passed.
	dropWaitTimeout dropReason = "WaitTimeout"
	// dropHandoffTimeout: the head did not claim the free lock in time.
	dropHandoffTimeout dropReason = "HandoffTimeout"
	// dropSessionExpired and dropSessionClosed: the waiter's session lapsed,
	// or is gone or not the waiter's own.
	dropSessionExpired = dropReason(locksv1alpha1.EndReasonSessionExpired)
	dropSessionClosed  = dropReason(locksv1alpha1.EndReasonSessionClosed)
)

// droppedWaiter is a waiter the controller removes from the queue.
type droppedWaiter struct {
	requestID, identity string
	reason              dropReason
}

// ending ends the current holding: endReason reason, because of why.
type ending struct {
	reason locksv1alpha1.EndReason
	why    string
}

// decision is what one reconcile does to a lock: end the current holding
// (when end.reason is set), drop waiters, delete an idle auto-created lock,
// and come back after requeueAfter, the time to the nearest future deadline
// (0: none).
type decision struct {
	end          ending
	drop         []droppedWaiter
	delete       bool
	requeueAfter time.Duration
}

// liveness is what the reconciler read, besides the lock, about what its
// holdings and waiters depend on.
type liveness struct {
	// sessions holds every session the lock names, by name.
	sessions map[string]sessionState
	// podGone is true when the holder (without a session) is bound to a pod
	// that a live read confirmed gone.
	podGone bool
}

// sessionState is one session a lock names, as the reconciler found it.
type sessionState struct {
	name string
	// session is nil when a live read confirmed it does not exist.
	session *locksv1alpha1.LockSession
	// seen is this controller's observation of its renewals.
	seen sessionObservation
}

// decide is the controller's whole judgement about lock, given what it observed
// of it (obs, folded in by observe at or before now) and what its holdings
// depend on (live). It is a pure function.
func decide(lock *locksv1alpha1.DistributedLock, obs observation, live liveness, now time.Time, t timing) decision {
	var d decision
	next := deadlines{now: now}
	s := &lock.Status

	// 1. The holding ends with its session, with its pod, or when no renewal
	// was observed for its lease plus grace. A session holding has no lease of its own.
	if h := s.Holder; h != nil {
		switch {
		case h.Session != "":
			d.end = sessionEnd(live.sessions[h.Session], lock.Namespace, h.User, h.PodUID, lock.MaxLease(), now, t.grace)
		case live.podGone:
			d.end = ending{locksv1alpha1.EndReasonExpired, fmt.Sprintf("holder pod %s deleted", h.PodName)}
		case obs.holding != nil:
			at := obs.holding.renewSeen.Add(seconds(h.LeaseDurationSeconds) + t.grace)
			if next.due(at) {
				d.end = ending{locksv1alpha1.EndReasonExpired, fmt.Sprintf("no renewal observed for %ds + %s grace", h.LeaseDurationSeconds, t.grace)}
			}
		}
	}

	// 2. Waiters whose wait is over, measured on this controller's clock from
	// when it first saw them: first seen + (deadline - enqueueTime).
	dropped := map[string]bool{}
	for _, w := range s.Waiters {
		if w.Session != "" {
			if e := sessionEnd(live.sessions[w.Session], lock.Namespace, w.User, w.PodUID, 0, now, t.grace); e.reason != "" {
				d.drop = append(d.drop, droppedWaiter{requestID: w.RequestID, identity: w.Identity, reason: dropReason(e.reason)})
				dropped[w.RequestID] = true
				continue
			}
		}
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

	if d.end.reason != "" || len(d.drop) > 0 || d.delete {
		// Acting changes the lock; the deadlines are computed again from the result.
		return d
	}
	d.requeueAfter = next.after()
	return d
}

// sessionEnd says whether, and why, a holding or waiter of user (and podUID)
// in session st ends at now: SessionClosed at once when admission would refuse
// it in that session (v1alpha1.SessionRefusal: gone, terminating, not theirs,
// or, for a holding, a TTL above maxLease), which the policy engine cannot
// check; SessionExpired when this controller observed no renewal of it for its
// TTL plus grace. A zero ending means it lives on.
func sessionEnd(st sessionState, ns, user, podUID string, maxLease int32, now time.Time, grace time.Duration) ending {
	s := st.session
	if why := locksv1alpha1.SessionRefusal(ns, st.name, s, user, podUID, maxLease); why != "" {
		return ending{locksv1alpha1.EndReasonSessionClosed, why}
	}
	if !now.Before(sessionDeadline(s, st.seen, grace)) {
		return ending{locksv1alpha1.EndReasonSessionExpired,
			fmt.Sprintf("no renewal of session %s observed for its TTL %ds + %s grace", st.name, s.TTL(), grace)}
	}
	return ending{}
}

// sessionDeadline is when session s lapses: its TTL plus grace after this
// controller first saw its latest renewal.
func sessionDeadline(s *locksv1alpha1.LockSession, seen sessionObservation, grace time.Duration) time.Time {
	return seen.renewSeen.Add(seconds(s.TTL()) + grace)
}

// sessionDecision is what one reconcile does to a session. lapsed: no
// renewal observed for TTL plus grace; the locks that name it are told first,
// and it is deleted once none does. locks is the status.locks to write (nil:
// the stored one is right); requeueAfter the time to its deadline (0: none).
type sessionDecision struct {
	lapsed, delete bool
	locks          *int32
	requeueAfter   time.Duration
}

// decideSession is the controller's judgement about session s, observed as
// seen; holdings and refs count the locks whose holder, and whose holder or
// waiters, name it. It is a pure function.
func decideSession(s *locksv1alpha1.LockSession, seen sessionObservation, holdings, refs int, now time.Time, grace time.Duration) sessionDecision {
	at := sessionDeadline(s, seen, grace)
	if !now.Before(at) {
		if refs > 0 {
			// Wait for the locks to end their holdings; their writes bring
			// this session back, the TTL is a fallback.
			return sessionDecision{lapsed: true, requeueAfter: seconds(s.TTL())}
		}
		return sessionDecision{lapsed: true, delete: true}
	}
	d := sessionDecision{requeueAfter: at.Sub(now)}
	if n := int32(min(holdings, math.MaxInt32)); n != s.Status.Locks {
		d.locks = &n
	}
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
	if d.end.reason != "" && out.Status.Holder != nil {
		out.EndHolding(d.end.reason, endedBy, metav1.NewMicroTime(now))
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
