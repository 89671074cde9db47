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
	// dropPodDeleted: the waiter was bound to a pod (without a session) that
	// no longer exists, or by a reference no pod can have.
	dropPodDeleted dropReason = "PodDeleted"
)

// droppedWaiter is a waiter the controller removes from the queue.
type droppedWaiter struct {
	requestID, identity string
	reason              dropReason
}

// ending ends one holding, exclusive (slot nil) or shared: endReason
// reason, because of why. identity and token are for logs and Events.
type ending struct {
	leaseID, identity string
	token             int64
	slot              *int32
	reason            locksv1alpha1.EndReason
	why               string
	// due is the lease's deadline on this controller's clock, for a lease
	// expiry; zero for other ends.
	due time.Time
}

// decision is what one reconcile does to a lock: end holdings (at most
// MaxRecentAcquisitions, each recorded in the same write), drop waiters,
// delete an idle auto-created lock, and come back after requeueAfter, the
// time to the nearest future deadline (0: none).
type decision struct {
	ends         []ending
	drop         []droppedWaiter
	delete       bool
	requeueAfter time.Duration
}

// acts reports whether d changes the lock.
func (d decision) acts() bool { return len(d.ends) > 0 || len(d.drop) > 0 || d.delete }

// liveness is what the reconciler read, besides the lock, about what its
// holdings and waiters depend on. What it lacks is unknown: a read that
// failed (Reconciler.liveness) leaves it out, and decide then keeps the
// entries that depend on it as they are and decides the rest.
type liveness struct {
	// sessions holds the sessions the lock names that were read, by name.
	sessions map[string]sessionState
	// podsGone holds the pods of holdings and waiters without a session that
	// were read, true for those a live read confirmed gone.
	podsGone map[podRef]bool
}

// session is what live knows of the session name: known is false while its
// read failed. A name no LockSession can have is known not to exist.
func (live liveness) session(name string) (st sessionState, known bool) {
	if !validSessionName(name) {
		return sessionState{name: name}, true
	}
	st, known = live.sessions[name]
	return st, known
}

// podGone reports whether the pod an entry of user with podName and podUID
// is bound to is known to be gone: a live read confirmed it. A reference no
// pod can have says nothing about the client: decide drops a waiter bound
// to one, and lets a holding's lease decide.
func (live liveness) podGone(user, podName, podUID string) bool {
	ref, b := podOf(user, podName, podUID)
	return b == podBound && live.podsGone[ref]
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

	// 1. Each holding, exclusive or shared, ends on its own: with its session,
	// with its pod, or when no renewal of it was observed for its lease plus
	// grace. A write records every holding it ends, so at most
	// MaxRecentAcquisitions end per write; the reconciler writes again for the rest.
	hs := lock.Status.Holdings()
	for _, h := range hs {
		if len(d.ends) == locksv1alpha1.MaxRecentAcquisitions {
			break
		}
		if sharesLeaseID(hs, h.LeaseID) {
			// Observations and writes know a holding by its leaseID, so
			// these cannot be told apart: ending one could end another
			// before its time. Admission never lets two in; a force-release
			// ends them.
			continue
		}
		if e := holdingEnd(h, lock, obs, live, &next, now, t); e.reason != "" {
			d.ends = append(d.ends, e)
		}
	}

	// 2. Waiters whose wait is over: their pod or session is gone, or their
	// deadline passed, measured on this controller's clock from when it first
	// saw them: first seen + (deadline - enqueueTime).
	dropped := map[string]bool{}
	for _, w := range s.Waiters {
		if reason := waiterEnd(w, lock.Namespace, live, now, t.grace); reason != "" {
			d.drop = append(d.drop, droppedWaiter{requestID: w.RequestID, identity: w.Identity, reason: reason})
			dropped[w.RequestID] = true
			continue
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

	// 3. Hand-off: the head that has not claimed a lock admitting its mode in
	// time (observe saw it so). Its successor's time starts when this
	// controller sees it at the head of a lock that admits its mode.
	if head := obs.readyHead; head != "" && !dropped[head] && len(s.Waiters) > 0 && s.Waiters[0].RequestID == head {
		if next.due(obs.readyHeadSince.Add(seconds(handoffTimeout(lock)))) {
			d.drop = append(d.drop, droppedWaiter{requestID: head, identity: s.Waiters[0].Identity, reason: dropHandoffTimeout})
		}
	}

	// 4. Garbage collection of auto-created locks that stayed idle.
	if isAutoCreated(lock) && !lock.IsHeld() && len(s.Waiters) == 0 && obs.idle && obs.idleToken == s.FencingToken {
		d.delete = next.due(obs.idleSince.Add(t.idleTimeout))
	}

	if d.acts() {
		// Acting changes the lock; the deadlines are computed again from the result.
		return d
	}
	d.requeueAfter = next.after()
	return d
}

// sharesLeaseID reports whether more than one of hs has leaseID.
func sharesLeaseID(hs []locksv1alpha1.Holding, leaseID string) bool {
	n := 0
	for _, h := range hs {
		if h.LeaseID == leaseID {
			n++
		}
	}
	return n > 1
}

// holdingEnd says whether, and why, holding h of lock ends at now: with its
// session (a session holding has no lease of its own), with its pod (a
// pod-bound holding without a session), or when no renewal of it was
// observed for its lease plus grace; a future expiry becomes a requeue
// candidate in next. A zero ending means it lives on. Nothing unknown ends
// it: a pod whose read failed leaves it to its lease, a session whose read
// failed keeps it.
func holdingEnd(h locksv1alpha1.Holding, lock *locksv1alpha1.DistributedLock, obs observation, live liveness, next *deadlines, now time.Time, t timing) ending {
	var e ending
	switch seen, observed := obs.holdings[h.LeaseID]; {
	case h.Session != "":
		// While its session is unknown it stays: it has no lease of its own.
		if st, known := live.session(h.Session); known {
			e = sessionEnd(st, lock.Namespace, h.User, h.PodUID, lock.MaxLease(), now, t.grace)
		}
	case live.podGone(h.User, h.PodName, h.PodUID):
		e = ending{reason: locksv1alpha1.EndReasonExpired, why: fmt.Sprintf("holder pod %s deleted", h.PodName)}
	case observed:
		if deadline := seen.renewSeen.Add(seconds(h.LeaseDurationSeconds) + t.grace); next.due(deadline) {
			e = ending{reason: locksv1alpha1.EndReasonExpired, why: fmt.Sprintf("no renewal observed for %ds + %s grace", h.LeaseDurationSeconds, t.grace), due: deadline}
		}
	}
	if e.reason != "" {
		e.leaseID, e.identity, e.token, e.slot = h.LeaseID, h.Identity, h.Token, h.Slot
	}
	return e
}

// sessionEnd says whether, and why, a holding or waiter of user (and podUID)
// in session st ends at now: SessionClosed at once when admission would refuse
// it in that session (v1alpha1.SessionRefusal: gone, terminating, not theirs,
// or, for a holding, a TTL above maxLease), which the policy engine cannot
// check; SessionExpired when this controller observed no renewal of it for its
// TTL plus grace. A zero ending means it lives on.
func sessionEnd(st sessionState, ns, user, podUID string, maxLease int32, now time.Time, grace time.Duration) ending {
	if !validSessionName(st.name) {
		// Not echoed: it is whatever was stored.
		return ending{reason: locksv1alpha1.EndReasonSessionClosed, why: "its session field names no LockSession (not a valid object name)"}
	}
	s := st.session
	if why := locksv1alpha1.SessionRefusal(ns, st.name, s, user, podUID, maxLease); why != "" {
		return ending{reason: locksv1alpha1.EndReasonSessionClosed, why: why}
	}
	if !now.Before(sessionDeadline(s, st.seen, grace)) {
		return ending{reason: locksv1alpha1.EndReasonSessionExpired,
			why: fmt.Sprintf("no renewal of session %s observed for its TTL %ds + %s grace", st.name, s.TTL(), grace)}
	}
	return ending{}
}

// waiterEnd says whether, and why, waiter w of a lock in namespace ns
// leaves with what it depends on at now: its session (lapsed, gone or not
// its own), or, without one, its pod (gone, or named by a reference no pod
// can have). Empty while it stays, and while what it depends on is unknown;
// its deadline and the hand-off still apply (decide).
func waiterEnd(w locksv1alpha1.Waiter, ns string, live liveness, now time.Time, grace time.Duration) dropReason {
	if w.Session != "" {
		st, known := live.session(w.Session)
		if !known {
			return ""
		}
		return dropReason(sessionEnd(st, ns, w.User, w.PodUID, 0, now, grace).reason)
	}
	if _, b := podOf(w.User, w.PodName, w.PodUID); b == boundToNoPod || live.podGone(w.User, w.PodName, w.PodUID) {
		return dropPodDeleted
	}
	return ""
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
// seen; holdings counts the holdings in it (exclusive and shared, over all
// locks), refs the locks whose holdings or waiters name it. It is a pure function.
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
	at := metav1.NewMicroTime(now)
	for _, e := range d.ends {
		switch h := out.Status.Holder; {
		case e.slot != nil:
			out.EndShared(e.leaseID, e.reason, endedBy, at)
		case h != nil && h.LeaseID == e.leaseID:
			out.EndHolding(e.reason, endedBy, at)
		}
	}
	for _, w := range d.drop {
		out.Status.RemoveWaiter(w.requestID)
	}
	// holderCount is bookkeeping the CRD checks; objects stored before it
	// existed carry 0.
	out.Status.HolderCount = int32(len(out.Status.Holdings()))
	out.Status.ObservedGeneration = out.Generation
	if c := heldCondition(out); c != nil {
		meta.SetStatusCondition(&out.Status.Conditions, *c)
	}
	// Held is the only condition a lock has; anything else was written
	// before admission refused foreign conditions, and could fill the list.
	if held := meta.FindStatusCondition(out.Status.Conditions, locksv1alpha1.ConditionHeld); held != nil && len(out.Status.Conditions) > 1 {
		out.Status.Conditions = []metav1.Condition{*held}
	}
	return out
}

// pristine reports whether lock's status was never written: no holdings, no
// queue, no history, no condition.
func pristine(lock *locksv1alpha1.DistributedLock) bool {
	s := &lock.Status
	return s.Holder == nil && len(s.SharedHolders) == 0 && s.Transitions == 0 && len(s.Waiters) == 0 &&
		len(s.RecentAcquisitions) == 0 && len(s.Conditions) == 0 && s.ObservedGeneration == 0
}

// heldCondition is the Held condition lock should carry, or nil when the one it
// carries is consistent with its holdings and the generation: True while
// anything, exclusive or shared, is held. A consistent condition written by a
// client is kept as it is.
func heldCondition(lock *locksv1alpha1.DistributedLock) *metav1.Condition {
	s := &lock.Status
	want := metav1.ConditionFalse
	if lock.IsHeld() {
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
	case lock.IsHeld():
		c.Reason = locksv1alpha1.ReasonAcquired
	case len(s.RecentAcquisitions) > 0:
		c.Reason = string(s.RecentAcquisitions[len(s.RecentAcquisitions)-1].EndReason)
	case s.Transitions > 0:
		c.Reason = locksv1alpha1.ReasonReleased
	default:
		c.Reason = locksv1alpha1.ReasonNeverHeld
	}
	// The same words v1alpha1's setHeld writes: fixed per reason.
	c.Message = locksv1alpha1.HeldMessage(c.Reason)
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

// isAutoCreated reports whether lock is a client's create on first use that
// nobody declared since (docs/design.md, "Names"): it carries the
// auto-created label, and its spec is the one it was created with
// (metadata.generation 1: any change of the spec raises it, so an
// administrator's apply of another spec, client-side or server-side, does).
// The label alone is not enough: a lock user may create a lock with it, and an
// administrator's later apply keeps it. Whether someone wrote the lock
// without changing its spec the cache cannot tell (it keeps no
// managedFields); deleteIdle asks writtenSinceCreated of the live lock.
func isAutoCreated(lock *locksv1alpha1.DistributedLock) bool {
	return lock.Labels[locksv1alpha1.AutoCreatedLabel] == "true" && lock.Generation == 1
}

// writtenSinceCreated reports whether anyone wrote lock's main resource after
// creating it, by its managedFields. A lock as created has one entry for the
// main resource: its creator's, an Update (a create is recorded as one),
// stamped when it was created. Lock users may create locks but never write
// them, so another entry (kubectl-client-side-apply's, a server-side Apply,
// kubectl label's), or the creator's entry stamped later (an administrator's
// kubectl apply under the manager name its creator used), is an
// administrator's write: the lock is theirs from then on. The entry is
// stamped just before creationTimestamp, both to the second; a lock without
// the entry counts as written.
func writtenSinceCreated(lock metav1.Object) bool {
	var main []metav1.ManagedFieldsEntry
	for _, e := range lock.GetManagedFields() {
		if e.Subresource == "" {
			main = append(main, e)
		}
	}
	if len(main) != 1 {
		return true
	}
	e := main[0]
	return e.Operation != metav1.ManagedFieldsOperationUpdate || e.Time == nil || e.Time.After(lock.GetCreationTimestamp().Time)
}
